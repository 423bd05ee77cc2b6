/* The amx table (AMX-INT8 tiles, x86-64 Linux): when it is chosen, why it is
 * refused, and its int8 GEMM and W8A8 linears against the generic table.
 *   test_amx           where CPUID, XCR0 and the OS permission allow AMX it
 *                      must be the best ISA (else it is refused with a
 *                      one-line reason, and the pick is the next ISA);
 *   test_amx deny      run with QLINEAR_AMX_DENY=1 (the test hook that
 *                      simulates Linux refusing the tile data): amx refused
 *                      with the hook's message where the CPU has AMX, the
 *                      pick is avx512bf16 (or avx512vnni), QLINEAR_ISA=amx refused with it;
 *   test_amx disabled  run with QLINEAR_DISABLE=amx: hidden, and the
 *                      permission never requested.
 * Every mode also checks ql_amx_judge (the verdict) on made-up probes, so
 * each refusal reason is tested on any x86 CPU; the plain mode then runs
 * the comparisons:
 *  - ql_gemm_s8s8s32 exact against int64 sums for M 1..40, N 1..70, K
 *    1..300 (every tail of the 32×32 tile, its 16-row and 16-column halves
 *    and the 64-k blocks), 1..4 threads, random and ±extreme (-128, 127)
 *    codes, K = 65536 of -128 · -128, and 512×2048×2048 against the
 *    generic table's result (itself exact, test_gemm / test_kernels);
 *  - W8A8 linears (fp32/fp16/bf16, ConvRot groups, bias, residual, GELU)
 *    bit-identical to the generic table's, from M = 1 to 512×2048×2048,
 *    on 1, 3 and all threads;
 *  - the float paths on AMX-BF16 tiles: dense bf16-compute linears and
 *    weight-only linears with bf16 activations within the float64 bound of
 *    docs/NUMERICS.md §4.2 (TDPBF16PS: exact products, fp32 sums in the
 *    instruction's order), for every tail of M (1..200 across the small-M
 *    limit of 64 and the 32-row panels), N (16/32-column tiles) and K (odd,
 *    < 32, not a multiple of 32, across the 512-k slices), on 1, 3 and all
 *    threads, NaN/Inf and denormal activations; a row gives the same bits
 *    alone (small-M, 1-row tiles) as in its batch; the layers name the
 *    tile kernels where AMX-BF16 runs;
 *  - with AMX: the same results after this thread's tiles were configured
 *    another way or released (other AMX code in the thread, e.g. oneDNN),
 *    int8 and bf16.
 * The comparisons run on amx where this CPU runs it, else on the best ISA
 * (so the test's own code runs everywhere). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/registry.h"
#include "testutil.h"
#if defined(__x86_64__)
#include "cpu/x86/x86.h"
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static ql_isa target; /* the ISA under test: amx, or the best this CPU runs */

/* ------------------------------------------------------------- verdict */

#if defined(__x86_64__)
static void judge_case(ql_amx_probe p, const char *want)
{
    char why[256];
    memset(why, 'x', sizeof why);
    const bool ok = ql_amx_judge(&p, why, sizeof why);
    if (!want) CHECK(ok && why[0] == '\0', "judge: a clean probe refused: '%s'", why);
    else CHECK(!ok && strstr(why, want) && !strchr(why, '\n'), "judge: expected a reason with '%s', got %d '%s'", want, ok, why);
}

static void test_judge(void)
{
    const ql_amx_probe all = {true, true, true, true, true, false, 0};
    judge_case(all, NULL);
    ql_amx_probe p = all;
    p.avx512 = false;
    judge_case(p, "AVX-512");
    p = all, p.tile = false;
    judge_case(p, "AMX-TILE");
    p = all, p.int8 = false;
    judge_case(p, "AMX-INT8");
    p = all, p.palette = false;
    judge_case(p, "palette");
    p = all, p.os = false;
    judge_case(p, "XCR0");
    p = all, p.hook_deny = true;
    judge_case(p, "QLINEAR_AMX_DENY");
    p = all, p.perm_errno = EPERM;
    judge_case(p, "ARCH_REQ_XCOMP_PERM");
    p.perm_errno = ENOSPC; /* a sigaltstack too small for the tile state */
    judge_case(p, strerror(ENOSPC));
    p = all, p.perm_errno = ENOSYS;
    judge_case(p, "arch_prctl");
    /* the first obstacle is the one named */
    p = all, p.tile = false, p.hook_deny = true, p.perm_errno = EPERM;
    judge_case(p, "CPUID");
    p = all, p.os = false, p.hook_deny = true;
    judge_case(p, "XCR0");
    char tiny[8];
    p = all, p.hook_deny = true;
    CHECK(!ql_amx_judge(&p, tiny, sizeof tiny) && strlen(tiny) == 7, "judge: a short buffer is not cut to its size");
    printf("  ql_amx_judge: every reason on made-up probes\n");
}
#endif

/* ARCH_GET_XCOMP_PERM: whether this process holds the tile data permission
 * (-1: cannot tell). */
static int holds_tile_permission(void)
{
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, 0x1022 /* ARCH_GET_XCOMP_PERM */, &mask) != 0) return -1;
    return (mask >> 18) & 1; /* XFEATURE_XTILEDATA */
#else
    return -1;
#endif
}

/* ----------------------------------------------------- choice, refusal */

static bool cpu_has_amx(void)
{
    const ql_cpu_features *f = ql_cpu();
    return f->amx_tile && f->amx_int8 && f->amx_palette && f->os_amx && f->avx512vnni && f->avx512bw && f->avx512vl &&
           f->avx512dq;
}

static void test_choice(const char *mode)
{
    const ql_cpu_features *f = ql_cpu();
    const bool hw = cpu_has_amx(), deny = !strcmp(mode, "deny"), hidden = !strcmp(mode, "disabled");
    printf("  CPUID AMX-TILE %d AMX-INT8 %d, palette 1 %d, XCR0 tile state %d (mode %s)\n", f->amx_tile, f->amx_int8,
           f->amx_palette, f->os_amx, mode);
    if (deny) {
        const char *d = getenv("QLINEAR_AMX_DENY");
        CHECK(d && *d && strcmp(d, "0"), "mode deny needs QLINEAR_AMX_DENY=1 in the environment");
    }
    if (hidden) CHECK(getenv("QLINEAR_DISABLE") && strstr(getenv("QLINEAR_DISABLE"), "amx"), "mode disabled needs QLINEAR_DISABLE=amx");
    const int have = ql_isa_supported(QL_ISA_AMX);
    const char *why = ql_isa_refusal(QL_ISA_AMX);
    printf("  amx: %s%s\n", have ? "supported" : "refused: ", why);
    CHECK(!have == !!*why && !strchr(why, '\n'), "amx supported %d but refusal '%s'", have, why);
    if (deny) {
        CHECK(!have, "QLINEAR_AMX_DENY=1: amx still supported");
        if (hw) CHECK(strstr(why, "QLINEAR_AMX_DENY") != NULL, "QLINEAR_AMX_DENY=1 on an AMX CPU: reason '%s'", why);
    } else if (hidden) { /* (another architecture's build has no amx table to hide) */
        const char *want = ql_cpu_kernels_for(QL_ISA_AMX) ? "hidden by QLINEAR_DISABLE" : "another architecture";
        CHECK(!have && strstr(why, want), "QLINEAR_DISABLE=amx: supported %d, reason '%s'", have, why);
    } else if (hw)
        CHECK(have, "this CPU and OS have AMX (CPUID, XCR0) but amx is refused: %s", why);
    /* the permission: asked exactly when nothing else ruled AMX out */
    const int perm = holds_tile_permission();
    if (hw && perm >= 0) {
        CHECK(perm == (have ? 1 : 0), "tile data permission %d with amx supported %d (mode %s)", perm, have, mode);
        printf("  the process %s the tile data permission\n", perm ? "holds" : "does not hold");
    }
    const ql_isa best = ql_isa_best();
    if (have) {
        CHECK(best == QL_ISA_AMX, "amx supported but the best ISA is %s", ql_isa_name(best));
    } else {
        CHECK(best != QL_ISA_AMX, "amx refused but picked");
        const ql_isa next = ql_isa_supported(QL_ISA_AVX512BF16) ? QL_ISA_AVX512BF16 : QL_ISA_AVX512VNNI;
        if (ql_isa_supported(QL_ISA_AVX512VNNI))
            CHECK(best == next, "amx refused: the pick is %s, not the next ISA %s", ql_isa_name(best), ql_isa_name(next));
        /* forcing it: refused with the reason, on one line */
        setenv("QLINEAR_ISA", "amx", 1);
        ql_context *c = NULL;
        const ql_status st = ql_context_create(&c);
        CHECK(st == QL_ERR_UNSUPPORTED && c == NULL && strstr(ql_last_error(), "does not support amx") &&
                  strstr(ql_last_error(), why) && !strchr(ql_last_error(), '\n'),
              "QLINEAR_ISA=amx where refused: status %d, message '%s'", (int)st, ql_last_error());
        printf("  QLINEAR_ISA=amx: %s\n", ql_last_error());
        unsetenv("QLINEAR_ISA");
        ql_context_destroy(c);
        CHECK_OK(ql_context_create(&c));
        CHECK(ql_context_set_isa(c, QL_ISA_AMX) == QL_ERR_UNSUPPORTED && strstr(ql_last_error(), why),
              "ql_context_set_isa(amx) where refused: '%s'", ql_last_error());
        ql_context_destroy(c);
    }
    /* the default context and its W8A8 kernel */
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    CHECK(ql_context_isa(ctx) == best, "default context on %s, best %s", ql_isa_name(ql_context_isa(ctx)), ql_isa_name(best));
    static int8_t q[64 * 64];
    static float s[64];
    for (int i = 0; i < 64; i++) s[i] = 1e-3f;
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = {64, 64, q, 64, s, 64, 0, NULL, QL_F32}};
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    char kb[128] = "";
    if (lin) ql_linear_describe(lin, 200, kb, sizeof kb);
    CHECK(!strstr(kb, "__amx") == !have, "W8A8 on the default context runs %s (amx supported %d)", kb, have);
    if (lin) ql_linear_describe(lin, 5, kb, sizeof kb);
    if (have) CHECK(!strcmp(kb, "s8_gemm_5x32c4__amx small-M"), "5 rows run %s", kb);
    printf("  a W8A8 linear of the default context runs %s\n", kb);
    ql_linear_destroy(lin);
    ql_context_destroy(ctx);
}

/* ------------------------------------------------------------ int8 GEMM */

static void fill_codes(int8_t *p, int64_t n, int mode)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = mode == 0 ? (int8_t)(tu_next() & 0xff) : mode == 1 ? (int8_t)-128 : (int8_t)(tu_next() & 1 ? 127 : -128);
}

/* C on the target against int64 sums; the gaps between C rows untouched. */
static int64_t gemm_vs_int64(ql_context *ctx, int64_t m, int64_t n, int64_t k, int mode)
{
    const int64_t lda = k + tu_range(0, 3), ldb = k + tu_range(0, 3), ldc = n + tu_range(0, 3);
    int8_t *a = malloc((size_t)(m * lda)), *b = malloc((size_t)(n * ldb));
    int32_t *c = malloc((size_t)(m * ldc) * 4);
    fill_codes(a, m * lda, mode);
    fill_codes(b, n * ldb, mode);
    for (int64_t i = 0; i < m * ldc; i++) c[i] = 0x5a5a5a5a;
    CHECK_OK(ql_gemm_s8s8s32(ctx, m, n, k, a, lda, b, ldb, c, ldc));
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            int64_t sum = 0;
            for (int64_t p = 0; p < k; p++) sum += (int64_t)a[i * lda + p] * b[j * ldb + p];
            bad += c[i * ldc + j] != sum;
        }
        for (int64_t j = n; j < ldc && i + 1 < m; j++) bad += c[i * ldc + j] != 0x5a5a5a5a;
    }
    CHECK(bad == 0, "%s gemm t%d M=%lld N=%lld K=%lld mode %d: %lld wrong", ql_isa_name(ql_context_isa(ctx)),
          ql_context_threads(ctx), (long long)m, (long long)n, (long long)k, mode, (long long)bad);
    free(a);
    free(b);
    free(c);
    return bad;
}

/* A large GEMM on the target against the generic table's (exact int32). */
static void gemm_vs_generic(ql_context *ctx, ql_context *gen, int64_t m, int64_t n, int64_t k, int mode)
{
    int8_t *a = malloc((size_t)(m * k)), *b = malloc((size_t)(n * k));
    int32_t *c = malloc((size_t)(m * n) * 4), *g = malloc((size_t)(m * n) * 4);
    fill_codes(a, m * k, mode);
    fill_codes(b, n * k, mode);
    CHECK_OK(ql_gemm_s8s8s32(ctx, m, n, k, a, k, b, k, c, n));
    CHECK_OK(ql_gemm_s8s8s32(gen, m, n, k, a, k, b, k, g, n));
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < m * n; i++)
        if (c[i] != g[i]) bad++, first = first < 0 ? i : first;
    CHECK(bad == 0, "%s gemm t%d M=%lld N=%lld K=%lld mode %d: %lld differ from generic (first %lld)",
          ql_isa_name(ql_context_isa(ctx)), ql_context_threads(ctx), (long long)m, (long long)n, (long long)k, mode,
          (long long)bad, (long long)first);
    free(a);
    free(b);
    free(c);
    free(g);
}

static void test_gemm(ql_context *ctx, ql_context *gen, int big)
{
    static const int64_t ks[] = {1, 2, 3, 4, 5, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300};
    int cases = 0;
    for (int64_t m = 1; m <= 40; m++) {
        CHECK_OK(ql_context_set_threads(ctx, 1 + (int)(m % 4)));
        for (int r = 0; r < 3; r++, cases++) {
            const int64_t n = r == 0 ? (m * 7) % 70 + 1 : tu_range(1, 70);
            const int64_t k = r == 2 ? tu_range(1, 300) : ks[(m + 5 * r) % 15];
            gemm_vs_int64(ctx, m, n, k, (int)((m + r) % 3));
        }
    }
    CHECK_OK(ql_context_set_threads(ctx, 3));
    gemm_vs_int64(ctx, 7, 70, 65536, 1), cases++; /* the largest sum: 2^30 */
    gemm_vs_int64(ctx, 33, 65, 2049, 2), cases++; /* across K slices */
    printf("  gemm: %d shapes exact against int64 (M 1..40, N 1..70, K 1..300, 65536, 2049)\n", cases);
    const int64_t bm = big ? 512 : 96, bn = big ? 2048 : 512, bk = big ? 2048 : 1024;
    for (int t = 0; t < 2; t++) {
        CHECK_OK(ql_context_set_threads(ctx, t ? ql_context_threads(gen) : 1));
        gemm_vs_generic(ctx, gen, bm, bn, bk, t == 0 ? 0 : 2);
    }
    gemm_vs_generic(ctx, gen, 77, 1000, 3000, 0);
    printf("  gemm: %lldx%lldx%lld (random; ±extreme) and 77x1000x3000 identical to generic\n", (long long)bm, (long long)bn,
           (long long)bk);
}

/* -------------------------------------------------------------- linears */

static void linear_case(ql_context *ctx, ql_context *gen, int64_t m, int64_t n, int64_t k, int64_t g)
{
    static const ql_dtype dts[] = {QL_F32, QL_F16, QL_BF16};
    const ql_dtype xdt = dts[tu_range(0, 2)], ydt = dts[tu_range(0, 2)];
    const int64_t ldx = k + tu_range(0, 3), ldy = n + tu_range(0, 3), nscale = tu_range(0, 3) ? n : 1;
    int8_t *q = malloc((size_t)(n * k));
    float *s = malloc((size_t)nscale * 4), *bias = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)(tu_next() & 0xff);
    if (tu_range(0, 4) == 0) /* ±extreme codes */
        for (int64_t i = 0; i < n * k; i++) q[i] = tu_next() & 1 ? 127 : -128;
    for (int64_t i = 0; i < nscale; i++) s[i] = (float)((0.5 + tu_uniform()) * 1e-3);
    for (int64_t i = 0; i < n; i++) bias[i] = (float)tu_gauss();
    const size_t es = ql_dtype_size(xdt), ys = ql_dtype_size(ydt);
    void *x = malloc((size_t)(m * ldx) * es), *res = malloc((size_t)(m * ldy) * ys), *rs = malloc((size_t)n * ys);
    void *y = malloc((size_t)(m * ldy) * ys), *yg = malloc((size_t)(m * ldy) * ys);
    tu_fill_gauss(xdt, x, m * ldx, 1.0);
    tu_fill_gauss(ydt, res, m * ldy, 1.0);
    tu_fill_gauss(ydt, rs, n, 1.0);
    memset(y, 0x5a, (size_t)(m * ldy) * ys);
    memset(yg, 0x5a, (size_t)(m * ldy) * ys);
    const int with_res = tu_range(0, 2) == 0, gelu = tu_range(0, 3) == 0;
    ql_epilogue epi = {.residual = with_res ? res : NULL, .ld_residual = ldy, .residual_scale = with_res ? rs : NULL,
                       .activation = gelu ? QL_ACTIVATION_GELU : QL_ACTIVATION_NONE};
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = {n, k, q, k, s, nscale, g, tu_range(0, 1) ? bias : NULL, QL_F32}};
    ql_linear *lt = NULL, *lg = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lt));
    CHECK_OK(ql_linear_create(gen, &d, &lg));
    if (lt && lg) {
        CHECK_OK(ql_linear_forward(lt, x, xdt, m, ldx, y, ydt, ldy, &epi));
        CHECK_OK(ql_linear_forward(lg, x, xdt, m, ldx, yg, ydt, ldy, &epi));
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < ldy && (j < n || i + 1 < m); j++) { /* the gaps too */
                const size_t o = (size_t)(i * ldy + j) * ys;
                if (memcmp((char *)y + o, (char *)yg + o, ys)) {
                    const float a = ql_load_f(ydt, y, i * ldy + j), b = ql_load_f(ydt, yg, i * ldy + j);
                    if (j < n && isnan(a) && isnan(b)) continue;
                    if (first < 0) first = i * ldy + j;
                    bad++;
                }
            }
        char kn[128];
        ql_linear_describe(lt, m, kn, sizeof kn);
        CHECK(bad == 0, "%s linear (%s) t%d M=%lld N=%lld K=%lld G=%lld x %s y %s res %d gelu %d: %lld outputs differ from "
                        "generic (first %lld)",
              ql_isa_name(ql_context_isa(ctx)), kn, ql_context_threads(ctx), (long long)m, (long long)n, (long long)k,
              (long long)g, ql_dtype_name(xdt), ql_dtype_name(ydt), with_res, gelu, (long long)bad, (long long)first);
    }
    ql_linear_destroy(lt);
    ql_linear_destroy(lg);
    free(q); free(s); free(bias); free(x); free(res); free(rs); free(y); free(yg);
}

static void test_linears(ql_context *ctx, ql_context *gen, int big, int all_threads)
{
    static const int64_t ms[] = {1, 2, 5, 15, 16, 17, 31, 32, 33, 40, 64, 65, 77, 200};
    static const int64_t ns[] = {1, 31, 32, 33, 70, 257};
    static const int64_t ks[] = {1, 3, 63, 64, 65, 300, 512};
    const int threads[] = {1, 3, all_threads};
    int cases = 0;
    for (int t = 0; t < 3; t++) {
        CHECK_OK(ql_context_set_threads(ctx, threads[t]));
        for (int i = 0; i < 14; i++, cases++) {
            const int64_t k = ks[(i + t) % 7], g = k % 256 == 0 && tu_range(0, 1) ? 256 : k % 64 == 0 && tu_range(0, 1) ? 64 : 0;
            linear_case(ctx, gen, ms[i], ns[(i + 2 * t) % 6], k, g);
        }
    }
    const int64_t bm = big ? 512 : 96, bn = big ? 2048 : 512, bk = big ? 2048 : 1024;
    CHECK_OK(ql_context_set_threads(ctx, all_threads));
    linear_case(ctx, gen, bm, bn, bk, 256), cases++;
    linear_case(ctx, gen, bm, bn, bk, 0), cases++;
    linear_case(ctx, gen, 3, bn, bk, 256), cases++; /* small-M, the whole K per tile */
    printf("  linears: %d W8A8 layers bit-identical to generic (M 1..%lld, threads 1, 3, %d)\n", cases, (long long)bm,
           all_threads);
}

/* ---------------------------------------------------- bf16 float paths */

/* The float64 bound of docs/NUMERICS.md §4.2 on y = s·Σ x·w (s = 1 for
 * dense) with the final fp32 rounding of s·acc: NaN where float64 gives NaN,
 * the signed Inf where it leaves the fp32 range. x: m bf16 rows (stride ldx),
 * w: the n × k weight values; y: m × n fp32 (stride ldy). */
static int64_t bf16_off_bound(const uint16_t *x, int64_t m, int64_t ldx, const float *w, const float *s, int64_t n,
                              int64_t k, const float *y, int64_t ldy, int64_t *first)
{
    const double u = 0x1p-24, g = (double)(k + 1) * u / (1 - (double)(k + 1) * u);
    const double f = (double)(k + 2 * ((k + 31) / 32)) * 0x1p-126;
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, sum = 0, d = 0;
            for (int64_t p = 0; p < k; p++) {
                const float xv = ql_bf16_to_fp32(x[i * ldx + p]);
                const double t = (double)xv * w[j * k + p];
                ref += t;
                sum += fabs(t);
                if (xv != 0 && fabsf(xv) < 0x1p-126f) d += fabs(t);
            }
            const double sc = s ? s[j] : 1.0, got = y[i * ldy + j];
            const int ok = isnan(ref) ? isnan(got)
                           : fabs(ref * sc) >= 0x1p128 ? got == copysign(INFINITY, ref * sc)
                                                        : fabs(got - sc * ref) <= sc * (g * sum + d + (1 + g) * f) + 0x1p-23 * fabs(got) + 0x1p-149;
            if (!ok && !bad++) *first = i * ldy + j;
        }
    return bad;
}

static int same_or_nan(float a, float b) { return !memcmp(&a, &b, 4) || (isnan(a) && isnan(b)); }

/* One dense bf16 (wo = 0) or weight-only (wo = 1) layer of m × n × k on ctx. */
static void bf16_linear_case(ql_context *ctx, int wo, int64_t m, int64_t n, int64_t k, int special)
{
    const int64_t ldx = k + tu_range(0, 3), ldy = n + tu_range(0, 3);
    uint16_t *x = malloc((size_t)(m * ldx) * 2);
    float *w = malloc((size_t)(n * k) * 4), *s = malloc((size_t)n * 4), *y = malloc((size_t)(m * ldy) * 4), *y1 = malloc((size_t)ldy * 4);
    int8_t *q = malloc((size_t)(n * k));
    tu_fill_gauss(QL_BF16, x, m * ldx, 1.0);
    for (int64_t i = 0; i < n * k; i++) {
        q[i] = (int8_t)(tu_next() & 0xff);
        w[i] = wo ? (float)q[i] : ql_bf16_to_fp32(ql_fp32_to_bf16((float)(0.05 * tu_gauss())));
    }
    for (int64_t j = 0; j < n; j++) s[j] = (float)((0.5 + tu_uniform()) * 1e-2);
    if (special && m > 2) {
        x[(m - 1) * ldx + tu_range(0, k - 1)] = 0x7fc0;                                    /* a NaN row */
        x[(m / 2) * ldx + k - 1] = tu_next() & 1 ? 0x7f80 : 0xff80;                        /* ±Inf at the last k */
        for (int64_t p = tu_range(0, 2); p < k; p += 3) x[ldx + p] = (uint16_t)tu_range(1, 0x807f) & 0x807f; /* denormals */
    }
    ql_linear_desc d = {.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = w, .ld_weight = k, .weight_dtype = QL_F32,
                        .compute_dtype = QL_BF16};
    if (wo) d = (ql_linear_desc){.kind = QL_LINEAR_WEIGHT_ONLY, .int8 = {n, k, q, k, s, n, 0, NULL, QL_F32}};
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    if (lin) {
        for (int64_t i = 0; i < m * ldy; i++) y[i] = -7.0f; /* poisoned: an unwritten output shows */
        CHECK_OK(ql_linear_forward(lin, x, QL_BF16, m, ldx, y, QL_F32, ldy, NULL));
        char kn[200];
        ql_linear_describe(lin, m, kn, sizeof kn);
        int64_t first = -1;
        const int64_t bad = bf16_off_bound(x, m, ldx, w, wo ? s : NULL, n, k, y, ldy, &first);
        int64_t gaps = 0;
        for (int64_t i = 0; i + 1 < m; i++)
            for (int64_t j = n; j < ldy; j++) gaps += y[i * ldy + j] != -7.0f;
        CHECK(bad == 0 && gaps == 0,
              "%s %s bf16 x (%s) t%d M=%lld N=%lld K=%lld%s: %lld outputs off the float64 bound (first [%lld,%lld] = %a), %lld "
              "gap elements written",
              ql_isa_name(ql_context_isa(ctx)), wo ? "weight-only" : "dense bf16", kn, ql_context_threads(ctx), (long long)m,
              (long long)n, (long long)k, special ? " NaN/Inf/denormal rows" : "", (long long)bad,
              (long long)(bad ? first / ldy : 0), (long long)(bad ? first % ldy : 0), bad ? y[first] : 0.0f, (long long)gaps);
        /* the first and last rows alone (M = 1: the small-M path, 1-row tiles) */
        for (int r = 0; r < 2 && m > 1; r++) {
            const int64_t row = r ? m - 1 : 0;
            CHECK_OK(ql_linear_forward(lin, x + row * ldx, QL_BF16, 1, ldx, y1, QL_F32, ldy, NULL));
            int64_t diff = 0;
            for (int64_t j = 0; j < n; j++) diff += !same_or_nan(y1[j], y[row * ldy + j]);
            CHECK(diff == 0, "%s %s M=%lld N=%lld K=%lld: row %lld alone differs from the batch at %lld outputs",
                  ql_isa_name(ql_context_isa(ctx)), wo ? "weight-only" : "dense bf16", (long long)m, (long long)n, (long long)k,
                  (long long)row, (long long)diff);
        }
        if (target == QL_ISA_AMX && ql_isa_supported(QL_ISA_AMX) && ql_cpu()->amx_bf16)
            CHECK(strstr(kn, wo ? "c2i7__amx" : "c2__amx") || strstr(kn, "c2i8__amx"), "%s layer of %lld rows runs %s, not a tile kernel",
                  wo ? "a weight-only" : "a dense bf16", (long long)m, kn);
    }
    ql_linear_destroy(lin);
    free(x); free(w); free(s); free(y); free(y1); free(q);
}

static void test_bf16_linears(ql_context *ctx, int all_threads)
{
    static const int64_t ms[] = {1, 2, 5, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 77, 100, 200};
    static const int64_t ns[] = {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70, 257};
    static const int64_t ks[] = {1, 2, 3, 5, 17, 31, 32, 33, 63, 64, 65, 300, 511, 512, 513, 1025};
    const int threads[] = {1, 3, all_threads};
    int cases = 0;
    for (int t = 0; t < 3; t++) {
        CHECK_OK(ql_context_set_threads(ctx, threads[t]));
        for (int i = 0; i < 16; i++, cases += 2) {
            const int64_t m = ms[i], n = ns[(i + 5 * t) % 12], k = ks[(i * 3 + t) % 16];
            bf16_linear_case(ctx, 0, m, n, k, (i + t) % 3 == 0);
            bf16_linear_case(ctx, 1, m, n, k, (i + t) % 3 == 1);
        }
    }
    char kn[200] = "";
    ql_linear *lin = NULL;
    static float w[64 * 64];
    ql_linear_desc d = {.kind = QL_LINEAR_DENSE, .n = 64, .k = 64, .weight = w, .ld_weight = 64, .weight_dtype = QL_F32,
                        .compute_dtype = QL_BF16};
    if (ql_linear_create(ctx, &d, &lin) == QL_OK) {
        ql_linear_describe(lin, 1, kn, sizeof kn);
        strcat(kn, " / ");
        ql_linear_describe(lin, 200, kn + strlen(kn), sizeof kn - strlen(kn));
    }
    ql_linear_destroy(lin);
    printf("  bf16 float paths: %d dense bf16 and weight-only layers within the float64 bound, rows alone = in batch "
           "(M 1..200, threads 1, 3, %d; dense runs %s)\n", cases, all_threads, kn);
}

/* ------------------------------------------- tiles configured elsewhere */

#if defined(__x86_64__)
/* Another thread-local tile state, as other AMX code would leave it: a
 * configuration of 8 rows × 32 bytes, or the tiles released (INIT). */
static void foreign_tiles(int release)
{
    if (release) {
        __asm__ volatile("tilerelease" ::: "memory");
        return;
    }
    _Alignas(64) unsigned char cfg[64] = {1};
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = 32;
        cfg[48 + t] = 8;
    }
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg) : "memory");
}

static void test_foreign_tiles(void)
{
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    CHECK_OK(ql_context_set_isa(ctx, QL_ISA_AMX));
    CHECK_OK(ql_context_set_threads(ctx, 1)); /* on this thread */
    for (int i = 0; i < 6; i++) {
        foreign_tiles(i % 2);
        const int64_t m = (int64_t[]){100, 5, 32, 77, 5, 100}[i]; /* blocked (25 and 26 rows) and small-M (5, 32 rows) */
        gemm_vs_int64(ctx, m, 70, 300 + 64 * i, i % 3);
    }
    printf("  gemm after this thread's tiles were configured otherwise or released: exact\n");
    /* the bf16 tile kernels: blocked (100 rows) and small-M (5, 32 rows) */
    for (int i = 0; i < 6; i++) {
        foreign_tiles(i % 2);
        const int64_t m = (int64_t[]){100, 5, 32, 77, 5, 100}[i];
        bf16_linear_case(ctx, i % 2, m, 70, 300 + 64 * i, 0);
    }
    printf("  bf16 linears after this thread's tiles were configured otherwise or released: within the bound\n");
    ql_context_destroy(ctx);
}
#endif

int main(int argc, char **argv)
{
    tu_init("test_amx");
    const char *mode = argc > 1 ? argv[1] : "plain";
    CHECK(!strcmp(mode, "plain") || !strcmp(mode, "deny") || !strcmp(mode, "disabled"), "unknown mode %s", mode);
#if defined(__x86_64__)
    test_judge();
#endif
    test_choice(mode);
    if (strcmp(mode, "plain")) return tu_finish(); /* the comparisons: in the plain mode */
    target = ql_isa_supported(QL_ISA_AMX) ? QL_ISA_AMX : ql_isa_best();
    const int big = target == QL_ISA_AMX;
    printf("  comparisons on %s%s\n", ql_isa_name(target), big ? "" : " (amx is not run here; smaller large shapes)");
    ql_context *ctx, *gen;
    CHECK_OK(ql_context_create(&ctx));
    CHECK_OK(ql_context_create(&gen));
    CHECK_OK(ql_context_set_isa(ctx, target));
    CHECK_OK(ql_context_set_isa(gen, QL_ISA_GENERIC));
    const int all = ql_context_threads(gen);
    test_gemm(ctx, gen, big);
    test_linears(ctx, gen, big, all);
    test_bf16_linears(ctx, all);
#if defined(__x86_64__)
    if (target == QL_ISA_AMX) test_foreign_tiles();
#endif
    ql_context_destroy(ctx);
    ql_context_destroy(gen);
    return tu_finish();
}
