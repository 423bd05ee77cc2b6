/* Every ISA's int8 GEMM against an int64 reference, exactly, on shapes that
 * cover every edge tile, for 1, 2 and 3 threads. */
#include <stdlib.h>
#include <string.h>

#include "cpu/registry.h" /* the packed layouts of every built-in table */
#include "testutil.h"

static void fill(int8_t *p, int64_t n, int mode)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = mode == 0 ? (int8_t)(tu_next() & 0xff) : mode == 1 ? (int8_t)-128 : (int8_t)(tu_next() & 1 ? 127 : -128);
}

static void run_case(ql_context *ctx, int64_t m, int64_t n, int64_t k, int mode)
{
    const int64_t lda = k + tu_range(0, 3), ldb = k + tu_range(0, 3), ldc = n + tu_range(0, 3);
    int8_t *a = malloc((size_t)(m * lda + 1)), *b = malloc((size_t)(n * ldb + 1));
    int32_t *c = malloc((size_t)(m * ldc + 1) * 4);
    fill(a, m * lda, mode);
    fill(b, n * ldb, mode);
    for (int64_t i = 0; i < m * ldc; i++) c[i] = 0x5a5a5a5a; /* the gaps between rows must survive */
    CHECK_OK(ql_gemm_s8s8s32(ctx, m, n, k, a, lda, b, ldb, c, ldc));
    int64_t bad = 0, gaps = 0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            int64_t s = 0;
            for (int64_t p = 0; p < k; p++) s += (int64_t)a[i * lda + p] * b[j * ldb + p];
            bad += c[i * ldc + j] != s;
        }
        for (int64_t j = n; j < ldc && i + 1 < m; j++) gaps += c[i * ldc + j] != 0x5a5a5a5a;
    }
    CHECK(bad == 0 && gaps == 0, "%s threads %d: M=%lld N=%lld K=%lld mode %d: %lld wrong, %lld gap writes",
          ql_isa_name(ql_context_isa(ctx)), ql_context_threads(ctx), (long long)m, (long long)n, (long long)k, mode,
          (long long)bad, (long long)gaps);
    free(a); free(b); free(c);
}

/* The in-block code orders are permutations, and every packed A position of
 * every kernel's layout has its own byte (the GEMM results alone would not
 * notice two positions sharing one if A and B agreed). */
static void test_layouts(void)
{
    for (int kb = 32; kb <= 64; kb *= 2) {
        int seen[64] = {0};
        for (int p = 0; p < kb; p++) {
            const int e = kb == 64 ? ql_k64_element(p) : ql_k32_element(p);
            CHECK(e >= 0 && e < kb && !seen[e]++, "ql_k%d_element(%d) = %d repeats or is out of range", kb, p, e);
        }
    }
    for (int i = 0; i < ql_cpu_kernels_count(); i++) {
        const ql_s8_kernel *kern = ql_cpu_kernels_at(i)->s8;
        const int64_t k = 3 * kern->kb + 5, kp = ql_kpad(kern, k);
        const size_t bytes = (size_t)(kp * kern->mr);
        CHECK(kp % kern->kb == 0 && kp >= k && kp - k < kern->kb, "%s: K %lld padded to %lld", kern->name, (long long)k, (long long)kp);
        unsigned char *hit = calloc(bytes, 1);
        for (int r = 0; r < kern->mr; r++)
            for (int64_t pos = 0; pos < kp; pos++) {
                const size_t o = ql_a_offset(kern->kb, kern->mr, r, pos);
                CHECK(o < bytes && !hit[o]++, "%s: row %d position %lld maps to byte %zu twice or out of the panel", kern->name, r,
                      (long long)pos, o);
            }
        free(hit);
    }
}

int main(void)
{
    tu_init("test_gemm");
    test_layouts();
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    ql_isa isas[32];
    const int n_isas = tu_isas(isas);
    for (int i = 0; i < n_isas; i++) {
        CHECK_OK(ql_context_set_isa(ctx, isas[i]));
        for (int t = 1; t <= 3; t++) {
            CHECK_OK(ql_context_set_threads(ctx, t));
            run_case(ctx, 37, 80, 256, 0); /* the seeds' exactness check */
            const int64_t fixed[][3] = {{1, 1, 1}, {1, 33, 17}, {13, 1, 5}, {12, 32, 4}, {25, 65, 3}, {7, 9, 1023}};
            for (size_t s = 0; s < sizeof fixed / sizeof fixed[0]; s++) run_case(ctx, fixed[s][0], fixed[s][1], fixed[s][2], 0);
            for (int r = 0; r < 6; r++) run_case(ctx, tu_range(1, 70), tu_range(1, 100), tu_range(1, 600), 0);
            run_case(ctx, tu_range(1, 14), tu_range(1, 40), 16384, 1);     /* -128·-128 over K = 16384 */
            run_case(ctx, tu_range(1, 30), tu_range(1, 40), tu_range(1000, 5000), 2); /* extremes */
        }
    }
    /* bad input */
    int8_t a[4] = {1, 2, 3, 4};
    int32_t c[4];
    CHECK(ql_gemm_s8s8s32(ctx, 1, 1, 70000, a, 70000, a, 70000, c, 1) == QL_ERR_UNSUPPORTED, "K > 65536 accepted");
    CHECK(ql_gemm_s8s8s32(ctx, 2, 2, 2, a, 1, a, 2, c, 2) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "stride"),
          "lda < K accepted: %s", ql_last_error());
    CHECK(ql_gemm_s8s8s32(NULL, 1, 1, 1, a, 1, a, 1, c, 1) == QL_ERR_INVALID_ARGUMENT, "NULL context accepted");
    CHECK_OK(ql_gemm_s8s8s32(ctx, 0, 5, 5, NULL, 5, a, 5, NULL, 5));
    ql_context_destroy(ctx);
    return tu_finish();
}
