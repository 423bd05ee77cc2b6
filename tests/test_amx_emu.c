/* The AMX-INT8 kernels' code on an emulated tile unit (amx_emu_s8.c): the
 * 32-row kernel through the blocked int8 driver (1-3 threads, K across the
 * amx table's 2048-k slices, so partial sums go back into C tiles) and the
 * fitted 1..32-row kernels through the small-M path, on random codes of the
 * whole int8 range, every tail of M, N and K: exact against int64 sums.
 *
 * The AMX-BF16 kernels' code on an emulated tile unit (amx_emu_kernels.c):
 * bf16_gemm_32x32c2__amx (dense), …i8__amx and …i7__amx (weight-only int8
 * codes) through the library's float driver, blocked (1-3 threads, K across
 * the amx table's 512-k slices) and small-M (1..32-row tiles, one and two
 * panels), bit for bit against the SDM model ql_bf16_tdp_32x32c2__generic
 * (…i8…) run through the same driver: every tail of M (1..100), N (1..97)
 * and K (1..1100: K < 32, odd, not a multiple of 32), NaN/Inf and denormal
 * activations. Where no AMX exists (this test's purpose) it checks what
 * test_kernels and test_bf16 can only check on an AMX CPU: that the tiles
 * are configured, loaded and stored where the layouts say. The real
 * TDPBF16PS is held to the float64 bound there. Skips on CPUs without the
 * decode's AVX-512 subset (F, BW, VL, DQ, VBMI). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/generic/generic.h"
#include "cpu/registry.h"
#include "testutil.h"

#if defined(__x86_64__)
extern const ql_f32_kernel ql_bf16_emu_32x32c2, ql_bf16_emu_32x32c2i8;
long ql_amx_emu_ldtilecfg(void);
extern const ql_s8_kernel ql_s8_amx_emu[32];
long ql_amx_emu8_ldtilecfg(void);
#endif

typedef struct {
    float *y;
    int64_t ldy;
} copy_arg;

static void epi_copy(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const copy_arg *e = arg;
    for (int r = 0; r < mr_eff; r++)
        for (int j = 0; j < nr_eff; j++) e->y[(m0 + r) * e->ldy + n0 + j] = c[r * nr + j];
}

static uint16_t *pack_a(const ql_f32_kernel *kern, const uint16_t *x, int64_t m, int64_t k)
{
    uint16_t *pa = malloc(ql_packed_a_bf16_bytes(kern, m, k) + 2);
    const uint16_t *rows[32];
    for (int64_t ip = 0; ip * kern->mr < m; ip++) {
        for (int r = 0; r < kern->mr; r++) rows[r] = ip * kern->mr + r < m ? x + (ip * kern->mr + r) * k : NULL;
        ql_pack_a_bf16_panel(kern, rows, k, ip, pa);
    }
    return pa;
}

/* outputs whose bits differ (both NaN: equal) */
static int64_t differ(const float *a, const float *b, int64_t count, int64_t *first)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < count; i++)
        if (memcmp(a + i, b + i, 4) && !(isnan(a[i]) && isnan(b[i])) && !bad++) *first = i;
    return bad;
}

#if defined(__x86_64__)
static void emu_case(const ql_f32_kernel *kern, int64_t m, int64_t n, int64_t k, int threads, int special)
{
    const int i8 = kern->kb == 0;
    const ql_f32_kernel *model = i8 ? &ql_bf16_tdp_32x32c2i8__generic : &ql_bf16_tdp_32x32c2__generic;
    const int64_t lda = k + tu_range(0, 5); /* the small path reads rows in place, with a stride */
    uint16_t *x = malloc((size_t)(m * lda) * 2 + 2), *xp = malloc((size_t)(m * k) * 2 + 2);
    float *w = malloc((size_t)(n * k) * 4 + 4);
    int8_t *q = malloc((size_t)(n * k) + 1);
    for (int64_t i = 0; i < m * lda; i++) x[i] = ql_fp32_to_bf16((float)tu_gauss());
    for (int64_t i = 0; i < n * k; i++)
        w[i] = ql_bf16_to_fp32(ql_fp32_to_bf16((float)tu_gauss())), q[i] = (int8_t)(tu_next() & 0xff);
    if (i8 && (tu_next() & 1))
        for (int64_t i = 0; i < n * k; i++) q[i] = q[i] == -128 ? -127 : q[i];
    if (special && m > 3) {
        x[(m - 1) * lda + k / 2] = 0x7fc0;                                             /* NaN */
        x[2 * lda + k - 1] = 0x7f80;                                                   /* +Inf, the last k */
        for (int64_t p = 0; p < k; p += 2) x[1 * lda + p] = (uint16_t)tu_range(1, 0x7f); /* denormals */
    }
    for (int64_t i = 0; i < m; i++) memcpy(xp + i * k, x + i * lda, (size_t)k * 2);
    ql_packed_f32 bk, bm;
    const void *src = i8 ? (const void *)q : (const void *)w;
    CHECK_OK(ql_pack_b_float(kern, i8 ? QL_I8 : QL_F32, src, n, k, k, i8 ? QL_I8 : QL_BF16, 1, &bk));
    CHECK_OK(ql_pack_b_float(model, i8 ? QL_I8 : QL_F32, src, n, k, k, i8 ? QL_I8 : QL_BF16, 1, &bm));
    uint16_t *pa = pack_a(kern, xp, m, k), *pm = pack_a(model, xp, m, k);
    const size_t cnt = (size_t)(m * n) + 1;
    float *ym = malloc(cnt * 4), *yb = malloc(cnt * 4), *ys = malloc(cnt * 4);
    for (size_t i = 0; i < cnt; i++) ym[i] = yb[i] = ys[i] = -7.0f; /* poisoned */
    copy_arg cm = {ym, n}, cb = {yb, n}, cs = {ys, n};
    CHECK_OK(ql_gemm_f32_run(1, model, (const float *)pm, 0, m, &bm, epi_copy, &cm));
    const ql_f32_kernel *runs[2] = {kern, i8 && kern->sym ? kern->sym : NULL};
    int sym = 1;
    for (int64_t i = 0; i < n * k; i++) sym &= q[i] != -128;
    for (int v = 0; v < 2; v++) {
        const ql_f32_kernel *f = runs[v];
        if (!f || (v == 1 && !sym)) continue;
        for (size_t i = 0; i < cnt; i++) yb[i] = ys[i] = -7.0f;
        CHECK_OK(ql_gemm_f32_run(threads, f, (const float *)pa, 0, m, &bk, epi_copy, &cb));
        ql_gemm_f32_small_part(f, (const float *)x, lda, m, &bk, 0, bk.panels, epi_copy, &cs);
        int64_t fb = 0, fs = 0;
        const int64_t db = differ(yb, ym, m * n, &fb), ds = differ(ys, ym, m * n, &fs);
        CHECK(db == 0 && ds == 0,
              "emulated %s t%d M=%lld N=%lld K=%lld%s: %lld blocked (first [%lld,%lld] %a vs %a) and %lld small-M outputs "
              "differ from %s", f->name, threads, (long long)m, (long long)n, (long long)k, special ? " (NaN/Inf/denormal rows)" : "",
              (long long)db, (long long)(fb / (n ? n : 1)), (long long)(fb % (n ? n : 1)), db ? yb[fb] : 0.0f, db ? ym[fb] : 0.0f,
              (long long)ds, model->name);
        CHECK(ym[m * n] == -7.0f && yb[m * n] == -7.0f && ys[m * n] == -7.0f, "a write past the outputs");
    }
    ql_packed_f32_free(&bk);
    ql_packed_f32_free(&bm);
    free(x); free(xp); free(w); free(q); free(pa); free(pm); free(ym); free(yb); free(ys);
}
#endif

#if defined(__x86_64__)
typedef struct {
    int32_t *y;
    int64_t ldy;
} copy_s32_arg;

static void epi_copy_s32(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const copy_s32_arg *e = arg;
    for (int r = 0; r < mr_eff; r++)
        for (int j = 0; j < nr_eff; j++) e->y[(m0 + r) * e->ldy + n0 + j] = c[r * nr + j];
}

/* One shape through the blocked driver (32-row kernel) or the small-M path
 * (the fitted kernel: ceil(M / 32) panels of equal height). */
static void emu_s8_case(int64_t m, int64_t n, int64_t k, int threads, int small)
{
    int8_t *a = malloc((size_t)(m * k) + 1), *w = malloc((size_t)(n * k) + 1);
    for (int64_t i = 0; i < m * k; i++) a[i] = (int8_t)(tu_next() & 0xff);
    for (int64_t i = 0; i < n * k; i++) w[i] = (int8_t)(tu_next() & 0xff);
    const int64_t panels = (m + 31) / 32, r = small ? (m + panels - 1) / panels : 32;
    const ql_s8_kernel *kern = &ql_s8_amx_emu[r - 1];
    ql_packed_b b;
    CHECK_OK(ql_pack_b_s8(kern, w, n, k, k, &b));
    void *pa = ql_aligned_alloc(ql_packed_a_bytes(kern, m, k));
    int32_t *rowsum = malloc((size_t)m * 4), *y = malloc((size_t)(m * n + 1) * 4);
    ql_pack_a_s8(kern, a, m, k, k, pa, rowsum);
    for (int64_t i = 0; i <= m * n; i++) y[i] = (int32_t)0x5a5a5a5a; /* poisoned */
    copy_s32_arg arg = {y, n};
    if (small) ql_gemm_s8_small_part(kern, pa, m, &b, 0, b.panels, epi_copy_s32, &arg);
    else CHECK_OK(ql_gemm_s8_run(threads, kern, pa, m, &b, epi_copy_s32, &arg));
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t exact = 0;
            for (int64_t kk = 0; kk < k; kk++) exact += (int64_t)a[i * k + kk] * w[j * k + kk];
            if (y[i * n + j] != exact && !bad++) first = i * n + j;
        }
    CHECK(bad == 0, "emulated %s %s t%d M=%lld N=%lld K=%lld: %lld sums differ from the exact ones (first [%lld,%lld])",
          kern->name, small ? "small-M" : "blocked", threads, (long long)m, (long long)n, (long long)k, (long long)bad,
          (long long)(first / (n ? n : 1)), (long long)(first % (n ? n : 1)));
    CHECK(y[m * n] == (int32_t)0x5a5a5a5a, "emulated %s M=%lld N=%lld K=%lld: a write past the outputs", kern->name,
          (long long)m, (long long)n, (long long)k);
    ql_packed_b_free(&b);
    ql_aligned_free(pa);
    free(a); free(w); free(rowsum); free(y);
}

static void emu_s8_all(void)
{
    static const int64_t ks[] = {1, 3, 4, 63, 64, 65, 127, 200, 2047, 2048, 2049, 4100};
    static const int64_t ms[] = {1, 2, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100};
    static const int64_t ns[] = {1, 31, 32, 33, 64, 97};
    const int nk = (int)(sizeof ks / sizeof ks[0]), nm = (int)(sizeof ms / sizeof ms[0]), nn = (int)(sizeof ns / sizeof ns[0]);
    int cases = 0;
    for (int c = 0; c < 2 * nm; c++, cases += 2) {
        const int64_t m = ms[c % nm], n = ns[(c * 5 + c / nm) % nn], k = ks[(c * 7 + c / nm) % nk];
        emu_s8_case(m, n, k, 1 + c % 3, 0);
        emu_s8_case(m, n, k, 1, 1);
    }
    for (int c = 0; c < 6; c++, cases += 2) { /* random shapes */
        const int64_t m = tu_range(1, 100), n = tu_range(1, 97), k = tu_range(1, 4200);
        emu_s8_case(m, n, k, 1 + c % 3, 0);
        emu_s8_case(m, n, k, 1, 1);
    }
    printf("  %d int8 shapes: the AMX-INT8 kernels' code on emulated tiles gives the exact sums, blocked (1-3 threads) "
           "and small-M (%ld tile configurations loaded on this thread)\n", cases, ql_amx_emu8_ldtilecfg());
}
#endif

int main(void)
{
    tu_init("test_amx_emu");
#if defined(__x86_64__)
    emu_s8_all();
    const ql_cpu_features *f = ql_cpu();
    if (!(f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->avx512vbmi)) {
        printf("  skipped: this CPU lacks the AVX-512 subset (F, BW, VL, DQ, VBMI) of the kernels' int8 decode\n");
        return tu_finish();
    }
    static const int64_t ks[] = {1, 2, 3, 5, 17, 31, 32, 33, 63, 64, 65, 100, 511, 512, 513, 1025, 1100};
    static const int64_t ms[] = {1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 40, 47, 63, 64, 65, 97, 100};
    static const int64_t ns[] = {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 97};
    const int nk = (int)(sizeof ks / sizeof ks[0]), nm = (int)(sizeof ms / sizeof ms[0]), nn = (int)(sizeof ns / sizeof ns[0]);
    int cases = 0;
    for (int c = 0; c < 3 * nm; c++, cases += 2) {
        const int64_t m = ms[c % nm], n = ns[(c * 5 + c / nm) % nn], k = c < nk ? ks[c] : ks[(c * 7) % nk];
        emu_case(&ql_bf16_emu_32x32c2, m, n, k, 1 + c % 3, c % 4 == 0);
        emu_case(&ql_bf16_emu_32x32c2i8, m, n, k, 1 + (c + 1) % 3, c % 4 == 1);
    }
    for (int c = 0; c < 10; c++, cases += 2) { /* random shapes */
        const int64_t m = tu_range(1, 100), n = tu_range(1, 97), k = tu_range(1, 1100);
        emu_case(&ql_bf16_emu_32x32c2, m, n, k, 2, c % 2);
        emu_case(&ql_bf16_emu_32x32c2i8, m, n, k, 3, c % 2);
    }
    printf("  %d shapes (dense, weight-only int8 and ±127 codes): the kernels' code on emulated tiles equals the SDM "
           "model bit for bit, blocked and small-M (%ld tile configurations loaded on this thread)\n",
           cases, ql_amx_emu_ldtilecfg());
#else
    printf("  skipped: not x86-64\n");
#endif
    return tu_finish();
}
