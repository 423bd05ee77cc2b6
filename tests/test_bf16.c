/* The bf16 kernels (operands bf16, fp32 sums in the instruction's own way):
 *  - BFMMLA (AArch64 FEAT_BF16): bf16_gemm_8x8c4__neonbf16 equals its
 *    portable twin bit for bit, and both stay within a float64 bound derived
 *    from K and the operand magnitudes;
 *  - VDPBF16PS (x86 AVX512_BF16): bf16_gemm_12x32c2__avx512bf16 (dense) and
 *    bf16_gemm_12x32c2i8__avx512bf16 (weight-only: int8 codes, bf16
 *    activations) equal their twins bit for bit on the blocked path (any K
 *    slicing, 1-3 threads) and the small-M path, and the twins meet the
 *    float64 bound of a sequential fp32 chain with denormals flushed;
 * odd M/N/K tails (K not a multiple of 2, 4, 32), 1-row and empty inputs,
 * bf16 NaN, Inf, the largest and smallest values and denormals; the dense
 * bf16-compute linear and the weight-only linear with bf16 activations
 * (group 0 and ConvRot) that dispatch to them. Where the CPU lacks an
 * instruction only the twin runs (and test_dispatch checks that the ISA is
 * refused).
 *  - TDPBF16PS (x86 AMX-BF16): the model of Intel's SDM pseudo-code
 *    (bf16_tdp_32x32c2__generic, …i8…) meets the §4.2 bound below on every
 *    CPU; where the amx table runs its tile kernels, bf16_gemm_32x32c2__amx
 *    and …i8__amx (…i7… for codes within ±127) meet it too, give the same
 *    bits blocked (1-3 threads) and small-M, and the count of outputs whose
 *    bits differ from the model is printed (the order inside the instruction
 *    is not architected, so it is not required to be 0); the weight-only
 *    linear equals s·kernel bit for bit.
 *
 * The BFMMLA bound. Per output the kernel computes, for each 2-k half i of the
 * ceil(K/4) blocks (h = 2·ceil(K/4) halves, padding terms exact zeros),
 * t_i = RO(p_2i + p_2i+1), s_i+1 = RO(s_i + t_i), with exact products p
 * (bf16·bf16 has 16 significant bits) and RO rounding to fp32 "to odd":
 * |RO(v) - v| < ulp(v) <= 2^-23·|v| (u = 2^-23, twice nearest-even's). A term
 * passes through at most h + 1 roundings, so (the usual recursive-sum
 * argument)  |y - Σ x·w| <= γ_{h+1}·S + D + (1 + γ_{h+1})·F  with
 * γ_n = n·u / (1 - n·u), S = Σ|x·w|, D = Σ|x·w| over terms with a denormal
 * operand (flushed to 0 by BFMMLA), F = (K + 2h)·2^-126 (products and sums
 * below 2^-126 flushed). The float64 reference Σ x·w has error <= K·2^-53·S,
 * far below. γ_{h+1} ≈ (K/2 + 3)·2^-23 — the same order as a sequential
 * fp32 FMA chain's γ_K with u = 2^-24.
 *
 * The VDPBF16PS bound. Per output one chain of 2·ceil(K/2) FMAs with exact
 * products (k+1 before k in each pair; a padding term adds an exact 0), each
 * rounded to nearest even (u = 2^-24), denormal operands read as 0 and results
 * below 2^-126 flushed: |y - Σ x·w| <= γ_K·S + D + (1 + γ_K)·K·2^-126, inside
 * the BFMMLA bound (γ_K <= γ_{h+1}, K <= K + 2h).
 *
 * The TDPBF16PS bound. Exact products, fp32 additions in an order of the
 * instruction's (any tree: a term passes at most K - 1 roundings of nearest
 * even; one more allowed), denormal operands read as 0, results below 2^-126
 * flushed in at most K + 2·ceil(K/32) operations (a product's FMA, and per
 * 32-k block the two chains' sum and its addition to C):
 * |y - Σ x·w| <= γ_{K+1}·S + D + (1 + γ_{K+1})·(K + 2·ceil(K/32))·2^-126,
 * u = 2^-24; inside the BFMMLA bound too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu/generic/generic.h"
#include "cpu/registry.h"
#include "testutil.h"

typedef struct {
    float *y;
    int64_t ldy;
} epi_arg;

static void epi_copy(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const epi_arg *e = arg;
    for (int r = 0; r < mr_eff; r++)
        for (int j = 0; j < nr_eff; j++) e->y[(m0 + r) * e->ldy + n0 + j] = c[r * nr + j];
}

static float bf(double v) { return ql_bf16_to_fp32(ql_fp32_to_bf16((float)v)); }
static int is_denormal(float v) { return v != 0 && fabsf(v) < 0x1p-126f; }

/* y = x·wᵀ through the float driver with kernel `kern` (x: m rows of k
 * bf16 values as fp32, stride k; w: n × k bf16 values as fp32). */
static void run(const ql_f32_kernel *kern, int threads, const float *x, int64_t m, const float *w, int64_t n, int64_t k,
                float *y)
{
    ql_packed_f32 b;
    CHECK_OK(ql_pack_b_float(kern, QL_F32, w, n, k, k, QL_BF16, 1, &b));
    epi_arg e = {y, n};
    CHECK_OK(ql_gemm_f32_run(threads, kern, x, k, m, &b, epi_copy, &e));
    ql_packed_f32_free(&b);
}

/* Outputs off the bound (or, where the float64 value is NaN or beyond the
 * fp32 range, not NaN / not that Inf). rel: a final rounding of relative
 * size rel (the output dtype's half ulp), 0 for fp32 sums. */
enum { BOUND_BFMMLA, BOUND_VDP, BOUND_TDP };
static int64_t off_bound_of(const float *x, int64_t m, const float *w, int64_t n, int64_t k, const float *y, double rel,
                            int mode)
{
    const int64_t h = 2 * ((k + 3) / 4);
    const double u = mode ? 0x1p-24 : 0x1p-23;
    const double nr = mode == BOUND_VDP ? (double)k : mode == BOUND_TDP ? (double)(k + 1) : (double)(h + 1);
    const double g = nr * u / (1 - nr * u);
    const double f = (double)(mode == BOUND_VDP ? k : mode == BOUND_TDP ? k + 2 * ((k + 31) / 32) : k + 2 * h) * 0x1p-126;
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, s = 0, d = 0;
            for (int64_t p = 0; p < k; p++) {
                const double t = (double)x[i * k + p] * w[j * k + p];
                ref += t;
                s += fabs(t);
                if (is_denormal(x[i * k + p]) || is_denormal(w[j * k + p])) d += fabs(t);
            }
            const double got = y[i * n + j];
            if (isnan(ref) || fabs(ref) >= 0x1p128) { /* NaN / Inf operands, overflow */
                bad += !(isnan(ref) ? isnan(got) : got == copysign(INFINITY, ref));
                continue;
            }
            const double bound = g * s + d + (1 + g) * f;
            bad += !(fabs(got - ref) <= bound * (1 + rel) + rel * fabs(ref));
        }
    return bad;
}

static int64_t off_bound(const float *x, int64_t m, const float *w, int64_t n, int64_t k, const float *y, double rel)
{
    return off_bound_of(x, m, w, n, k, y, rel, BOUND_BFMMLA);
}

static int64_t diff_bits(const float *a, const float *b, int64_t count)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < count; i++) bad += memcmp(a + i, b + i, 4) != 0;
    return bad;
}

/* Random bf16 operands: x ~ N(0, 1), w ~ N(0, 2^e) with e in [-20, 20]. */
static void fill(float *x, int64_t m, float *w, int64_t n, int64_t k)
{
    const double ws = ldexp(1.0, (int)tu_range(-20, 20));
    for (int64_t i = 0; i < m * k; i++) x[i] = bf(tu_gauss());
    for (int64_t i = 0; i < n * k; i++) w[i] = bf(tu_gauss() * ws);
}

/* The best table's own bf16 kernel (BFMMLA's layout, kb = 4) where this
 * CPU runs one; NULL where bf16 layers widen to the fp32 kernel. */
static const ql_f32_kernel *fast_kernel(void)
{
    for (int i = 0; i < ql_cpu_kernels_count(); i++) {
        const ql_cpu_kernels *kt = ql_cpu_kernels_at(i);
        if (ql_isa_supported(kt->isa) && kt->bf16->kb == 4 && kt->bf16 != &ql_bf16_gemm_8x8c4__generic) return kt->bf16;
    }
    return NULL;
}

/* One shape: the twin against float64, the fast kernel against the twin
 * (1 and 2 threads), x and w as given. */
static void check_case(const char *what, const float *x, int64_t m, const float *w, int64_t n, int64_t k)
{
    const ql_f32_kernel *fast = fast_kernel();
    float *yt = malloc((size_t)(m * n + 1) * 4), *yf = malloc((size_t)(m * n + 1) * 4);
    run(&ql_bf16_gemm_8x8c4__generic, 1, x, m, w, n, k, yt);
    const int64_t bad = off_bound(x, m, w, n, k, yt, 0);
    CHECK(bad == 0, "%s M=%lld N=%lld K=%lld: twin off the float64 bound at %lld of %lld outputs", what, (long long)m,
          (long long)n, (long long)k, (long long)bad, (long long)(m * n));
    for (int t = 1; fast && t <= 2; t++) {
        run(fast, t, x, m, w, n, k, yf);
        const int64_t d = diff_bits(yt, yf, m * n);
        CHECK(d == 0, "%s M=%lld N=%lld K=%lld t%d: %s differs from its twin at %lld of %lld outputs", what, (long long)m,
              (long long)n, (long long)k, t, fast->name, (long long)d, (long long)(m * n));
    }
    free(yt);
    free(yf);
}

static void test_shapes(void)
{
    static const int64_t ks[] = {1, 2, 3, 4, 5, 7, 255, 256, 257, 515};
    for (int c = 0; c < 24; c++) {
        const int64_t m = c < 3 ? 1 : tu_range(1, 40), n = c % 4 == 1 ? 1 : tu_range(1, 40),
                      k = c < 10 ? ks[c] : tu_range(1, 600);
        float *x = malloc((size_t)(m * k) * 4), *w = malloc((size_t)(n * k) * 4);
        fill(x, m, w, n, k);
        check_case("random", x, m, w, n, k);
        free(x);
        free(w);
    }
}

/* bf16 limits: the largest finite value against tiny weights, the smallest
 * normal against huge ones, denormal operands (flushed by BFMMLA: the D term
 * of the bound), NaN and Inf, overflow of a product and of a sum. */
static void test_limits(void)
{
    const int64_t m = 13, n = 11, k = 37;
    float *x = malloc((size_t)(m * k) * 4), *w = malloc((size_t)(n * k) * 4), *y = malloc((size_t)(m * n) * 4),
          *yf = malloc((size_t)(m * n) * 4);
    const float big = ql_bf16_to_fp32(0x7f7f), tiny = 0x1p-126f;
    for (int v = 0; v < 3; v++) {
        fill(x, m, w, n, k);
        for (int64_t i = 0; i < m * k; i++) {
            const double r = tu_uniform();
            if (v == 0 && r < 0.3) x[i] = r < 0.15 ? big : -big;                      /* products ~2^8 below */
            if (v == 1 && r < 0.3) x[i] = r < 0.15 ? tiny : -tiny;                    /* ~2^-106 */
            if (v == 2 && r < 0.3) x[i] = ql_bf16_to_fp32((uint16_t)tu_range(1, 0x7f)); /* denormals */
        }
        for (int64_t i = 0; i < n * k; i++) w[i] = bf(tu_gauss() * (v == 0 ? 0x1p-120 : v == 1 ? 0x1p20 : 1.0));
        if (v == 2)
            for (int64_t i = 0; i < n * k; i += 3) w[i] = ql_bf16_to_fp32((uint16_t)(0x8000 | tu_range(1, 0x7f)));
        check_case(v == 0 ? "bf16 max" : v == 1 ? "bf16 min normal" : "bf16 denormals", x, m, w, n, k);
    }
    /* NaN / Inf: x row 1 holds a NaN, row 2 +Inf at k0, row 3 -Inf at k0;
     * w column k0 holds zeros and normals (no denormals: flushed, they would
     * meet Inf as zeros and give NaN where float64 gives Inf); w row 4 holds
     * -Inf at k1. Expected: NaN rows, ±Inf or NaN (Inf·0) by sign. */
    fill(x, m, w, n, k);
    const int64_t k0 = 5, k1 = 30;
    x[1 * k + 17] = NAN;
    x[2 * k + k0] = INFINITY;
    x[3 * k + k0] = -INFINITY;
    for (int64_t j = 0; j < n; j++) w[j * k + k0] = j % 3 == 0 ? 0.0f : bf(tu_gauss());
    w[4 * k + k1] = -INFINITY;
    x[6 * k + k1] = 0.0f;
    check_case("NaN/Inf", x, m, w, n, k);
    run(&ql_bf16_gemm_8x8c4__generic, 1, x, m, w, n, k, y);
    int64_t wrong = 0;
    for (int64_t j = 0; j < n; j++) {
        wrong += !isnan(y[1 * n + j]);
        const float s = w[j * k + k0];
        if (j == 4) continue; /* -Inf at k1 meets these rows too */
        wrong += s == 0 ? !isnan(y[2 * n + j]) : y[2 * n + j] != copysignf(INFINITY, s);
        wrong += s == 0 ? !isnan(y[3 * n + j]) : y[3 * n + j] != copysignf(INFINITY, -s);
    }
    wrong += !isnan(y[6 * n + 4]); /* 0 · -Inf */
    CHECK(wrong == 0, "NaN/Inf: %lld outputs not the expected NaN / signed Inf", (long long)wrong);
    /* overflow: one product above 2^128 (big · 2), a sum of two big·1 */
    fill(x, m, w, n, k);
    for (int64_t p = 0; p < k; p++) w[0 * k + p] = w[1 * k + p] = 0.0f;
    for (int64_t j = 2; j < n; j++) w[j * k + 3] = w[j * k + 8] = w[j * k + 9] = 0.0f; /* no Inf - Inf elsewhere */
    x[0 * k + 3] = big;
    w[0 * k + 3] = 2.0f;
    x[0 * k + 8] = x[0 * k + 9] = big;
    w[1 * k + 8] = w[1 * k + 9] = 1.0f;
    check_case("overflow", x, m, w, n, k);
    run(&ql_bf16_gemm_8x8c4__generic, 1, x, m, w, n, k, y);
    CHECK(y[0] == INFINITY && y[1] == INFINITY, "overflow: %g %g, expected +Inf", y[0], y[1]);
    const ql_f32_kernel *fast = fast_kernel();
    if (fast) {
        run(fast, 1, x, m, w, n, k, yf);
        CHECK(yf[0] == INFINITY && yf[1] == INFINITY, "overflow: %s gives %g %g, expected +Inf", fast->name, yf[0], yf[1]);
    }
    free(x); free(w); free(y); free(yf);
}

/* The dense bf16-compute linear on the best ISA: the kernel it names, the
 * same bound against float64 on bf16-rounded operands (plus the output's own
 * rounding), x in fp32 / bf16 / fp16 and y in fp32 / bf16, 1 row, M = 0, K = 0. */
static void test_linear(void)
{
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    const ql_isa isa = ql_context_isa(ctx);
    char desc[96];
    static const ql_dtype xdts[] = {QL_F32, QL_BF16, QL_F16};
    for (int c = 0; c < 8; c++) {
        const int64_t m = c == 0 ? 1 : tu_range(1, 50), n = tu_range(1, 40), k = tu_range(1, 700);
        const ql_dtype xdt = xdts[c % 3], ydt = c % 2 ? QL_BF16 : QL_F32;
        float *w = malloc((size_t)(n * k) * 4), *xb = malloc((size_t)(m * k) * 4), *wb = malloc((size_t)(n * k) * 4);
        void *x = malloc((size_t)(m * k) * 4), *y = malloc((size_t)(m * n) * 4);
        float *yf = malloc((size_t)(m * n) * 4);
        tu_fill_gauss(xdt, x, m * k, 1.0);
        tu_fill_gauss(QL_F32, w, n * k, 0.05);
        for (int64_t i = 0; i < m * k; i++) xb[i] = bf(ql_load_f(xdt, x, i));
        for (int64_t i = 0; i < n * k; i++) wb[i] = bf(w[i]);
        ql_linear_desc d = {.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = w, .ld_weight = k, .weight_dtype = QL_F32,
                            .compute_dtype = QL_BF16};
        ql_linear *lin = NULL;
        CHECK_OK(ql_linear_create(ctx, &d, &lin));
        if (!lin) break;
        ql_linear_describe(lin, 100, desc, sizeof desc);
        CHECK(!strcmp(desc, ql_cpu_kernels_for(isa)->bf16->name), "%s: a dense bf16 layer runs %s", ql_isa_name(isa), desc);
        CHECK_OK(ql_linear_forward(lin, x, xdt, m, k, y, ydt, n, NULL));
        for (int64_t i = 0; i < m * n; i++) yf[i] = ql_load_f(ydt, y, i);
        const int64_t bad = off_bound(xb, m, wb, n, k, yf, ydt == QL_BF16 ? 0x1p-8 : 0); /* bf16 half ulp: 2^-8 relative */
        CHECK(bad == 0, "%s dense bf16 x=%s M=%lld N=%lld K=%lld: %lld outputs off the float64 bound", ql_isa_name(isa),
              ql_dtype_name(xdt), (long long)m, (long long)n, (long long)k, (long long)bad);
        /* empty: M = 0 writes nothing */
        memset(y, 0x5a, (size_t)(m * n) * 4);
        CHECK_OK(ql_linear_forward(lin, x, xdt, 0, k, y, ydt, n, NULL));
        int64_t touched = 0;
        for (int64_t i = 0; i < m * n * (int64_t)ql_dtype_size(ydt); i++) touched += ((unsigned char *)y)[i] != 0x5a;
        CHECK(touched == 0, "M = 0 wrote %lld bytes", (long long)touched);
        ql_linear_destroy(lin);
        free(w); free(xb); free(wb); free(x); free(y); free(yf);
    }
    /* K = 0: y = bias */
    float bias[3] = {1.5f, -2.0f, 0.25f}, y0[6], x0[2] = {0};
    ql_linear_desc d0 = {.kind = QL_LINEAR_DENSE, .n = 3, .k = 0, .weight = x0, .ld_weight = 0, .weight_dtype = QL_F32,
                         .compute_dtype = QL_BF16, .bias = bias, .bias_dtype = QL_F32};
    ql_linear *l0 = NULL;
    CHECK_OK(ql_linear_create(ctx, &d0, &l0));
    if (l0) {
        CHECK_OK(ql_linear_forward(l0, x0, QL_F32, 2, 0, y0, QL_F32, 3, NULL));
        CHECK(y0[0] == 1.5f && y0[4] == -2.0f && y0[5] == 0.25f, "K = 0: %g %g %g, expected the bias", y0[0], y0[4], y0[5]);
        ql_linear_destroy(l0);
    }
    ql_context_destroy(ctx);
}

/* ---------------------------------------------------------------- VDPBF16PS */

/* The table whose bf16 entry is a VDPBF16PS kernel (kb = 2) this CPU runs,
 * or NULL. */
static const ql_cpu_kernels *vdp_table(void)
{
    for (int i = 0; i < ql_cpu_kernels_count(); i++) {
        const ql_cpu_kernels *kt = ql_cpu_kernels_at(i);
        if (ql_isa_supported(kt->isa) && kt->bf16->kb == 2 && !kt->bf16->tile_k && kt->bf16->isa != QL_ISA_GENERIC && kt->wo_bf16)
            return kt;
    }
    return NULL;
}

static uint16_t top16(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16);
}

/* y = x·wᵀ through a VDPBF16PS kernel (or its twin): x m bf16 rows (values
 * as fp32, stride k), w n rows of bf16 values as fp32 (dense) or int8 codes
 * (w8, weight-only); the blocked driver with `threads`, or (small) the
 * small-M path over all panels. */
static void vrun(const ql_f32_kernel *kern, int threads, int small, const float *x, int64_t m, const float *w,
                 const int8_t *w8, int64_t n, int64_t k, float *y)
{
    ql_packed_f32 b;
    if (w8) CHECK_OK(ql_pack_b_float(kern, QL_I8, w8, n, k, k, QL_I8, 1, &b));
    else CHECK_OK(ql_pack_b_float(kern, QL_F32, w, n, k, k, QL_BF16, 1, &b));
    uint16_t *xr = malloc((size_t)(m * k + 1) * 2);
    for (int64_t i = 0; i < m * k; i++) xr[i] = top16(x[i]);
    epi_arg e = {y, n};
    if (small) {
        if (m > 0) ql_gemm_f32_small_part(kern, (const float *)xr, k, m, &b, 0, b.panels, epi_copy, &e);
    } else {
        uint16_t *pa = malloc(ql_packed_a_bf16_bytes(kern, m, k) + 2);
        const uint16_t *rows[32];
        for (int64_t ip = 0; ip * kern->mr < m; ip++) {
            for (int r = 0; r < kern->mr; r++) rows[r] = ip * kern->mr + r < m ? xr + (ip * kern->mr + r) * k : NULL;
            ql_pack_a_bf16_panel(kern, rows, k, ip, pa);
        }
        CHECK_OK(ql_gemm_f32_run(threads, kern, (const float *)pa, 0, m, &b, epi_copy, &e));
        free(pa);
    }
    free(xr);
    ql_packed_f32_free(&b);
}

/* NaNs compare equal here only with the same bits (the twin models the payloads). */
static void vcheck_case(const char *what, const float *x, int64_t m, const float *w, const int8_t *w8, int64_t n, int64_t k)
{
    const ql_cpu_kernels *kt = vdp_table();
    const ql_f32_kernel *twin = w8 ? &ql_bf16_gemm_12x32c2i8__generic : &ql_bf16_gemm_12x32c2__generic;
    const ql_f32_kernel *fast = kt ? (w8 ? kt->wo_bf16 : kt->bf16) : NULL;
    const size_t cnt = (size_t)(m * n + 1);
    float *yt = malloc(cnt * 4), *yf = malloc(cnt * 4), *weff = malloc((size_t)(n * k + 1) * 4);
    for (int64_t i = 0; i < n * k; i++) weff[i] = w8 ? (float)w8[i] : w[i];
    vrun(twin, 1, 0, x, m, w, w8, n, k, yt);
    const int64_t bad = off_bound_of(x, m, weff, n, k, yt, 0, BOUND_VDP);
    CHECK(bad == 0, "%s M=%lld N=%lld K=%lld (%s): twin off the float64 bound at %lld of %lld outputs", what, (long long)m,
          (long long)n, (long long)k, w8 ? "int8 codes" : "bf16", (long long)bad, (long long)(m * n));
    int sym = w8 != NULL; /* codes without -128: the kernel's sym variant too */
    for (int64_t i = 0; sym && i < n * k; i++) sym = w8[i] != -128;
    for (int v = 0; fast && v < (sym && fast->sym ? 8 : 4); v++) { /* blocked with 1, 2, 3 threads; small-M */
        const ql_f32_kernel *f = v < 4 ? fast : fast->sym;
        for (size_t i = 0; i < cnt; i++) yf[i] = -1.0f;
        vrun(f, v % 4 < 3 ? v % 4 + 1 : 1, v % 4 == 3, x, m, w, w8, n, k, yf);
        const int64_t d = diff_bits(yt, yf, m * n);
        CHECK(d == 0, "%s M=%lld N=%lld K=%lld %s: %s differs from its twin at %lld of %lld outputs", what, (long long)m,
              (long long)n, (long long)k, v % 4 == 3 ? "small-M" : v % 4 == 0 ? "t1" : v % 4 == 1 ? "t2" : "t3", f->name,
              (long long)d, (long long)(m * n));
    }
    free(yt); free(yf); free(weff);
}

/* Random codes with the extremes -128 and 127, or (sym) within ±127. */
static void vfill_codes_sym(int8_t *q, int64_t count, int sym)
{
    for (int64_t i = 0; i < count; i++) q[i] = (int8_t)(tu_next() & 0xff);
    for (int64_t i = 0; sym && i < count; i++) q[i] = q[i] == -128 ? -127 : q[i];
    if (count > 0) q[0] = sym ? -127 : -128; /* one layer of 1 × 1 too */
    if (count > 1) q[1] = 127;
}
static void vfill_codes(int8_t *q, int64_t count) { vfill_codes_sym(q, count, 0); }

static void test_vdp_shapes(void)
{
    static const int64_t ks[] = {1, 2, 3, 31, 32, 33, 63, 64, 65, 255, 256, 257, 511, 512, 513, 1025, 1536};
    const int nk = (int)(sizeof ks / sizeof ks[0]);
    for (int c = 0; c < 40; c++) {
        const int64_t m = c < 3 ? 1 : c == 3 ? 0 : c % 5 == 0 ? tu_range(60, 130) : tu_range(1, 40);
        const int64_t n = c % 4 == 1 ? 1 : tu_range(1, 90) | (c % 2), k = c < nk ? ks[c] : tu_range(1, 1200);
        float *x = malloc((size_t)(m * k + 1) * 4), *w = malloc((size_t)(n * k + 1) * 4);
        int8_t *q = malloc((size_t)(n * k + 1));
        fill(x, m, w, n, k);
        vfill_codes(q, n * k);
        vcheck_case("random", x, m, w, NULL, n, k);
        vcheck_case("random", x, m, NULL, q, n, k);
        vfill_codes_sym(q, n * k, 1);
        vcheck_case("random ±127", x, m, NULL, q, n, k);
        free(x); free(w); free(q);
    }
}

/* The limits of test_limits through the VDPBF16PS kernels and twins (dense;
 * the weight-only ones with the activations' extremes against int8 codes). */
static void test_vdp_limits(void)
{
    const int64_t m = 13, n = 37, k = 71;
    float *x = malloc((size_t)(m * k) * 4), *w = malloc((size_t)(n * k) * 4), *y = malloc((size_t)(m * n) * 4);
    int8_t *q = malloc((size_t)(n * k));
    const float big = ql_bf16_to_fp32(0x7f7f), tiny = 0x1p-126f;
    for (int v = 0; v < 3; v++) {
        fill(x, m, w, n, k);
        vfill_codes(q, n * k);
        for (int64_t i = 0; i < m * k; i++) {
            const double r = tu_uniform();
            if (v == 0 && r < 0.3) x[i] = r < 0.15 ? big : -big;
            if (v == 1 && r < 0.3) x[i] = r < 0.15 ? tiny : -tiny;
            if (v == 2 && r < 0.3) x[i] = ql_bf16_to_fp32((uint16_t)tu_range(1, 0x7f)); /* denormals */
        }
        for (int64_t i = 0; i < n * k; i++) w[i] = bf(tu_gauss() * (v == 0 ? 0x1p-120 : v == 1 ? 0x1p20 : 1.0));
        if (v == 2)
            for (int64_t i = 0; i < n * k; i += 3) w[i] = ql_bf16_to_fp32((uint16_t)(0x8000 | tu_range(1, 0x7f)));
        const char *what = v == 0 ? "bf16 max" : v == 1 ? "bf16 min normal" : "bf16 denormals";
        vcheck_case(what, x, m, w, NULL, n, k);
        if (v == 0) /* big·127 summed could overflow: the activations scaled down for the codes */
            for (int64_t i = 0; i < m * k; i++) x[i] = bf(x[i] * 0x1p-20);
        vcheck_case(what, x, m, NULL, q, n, k);
    }
    /* NaN / Inf (as test_limits: row 1 a NaN, rows 2/3 ±Inf at k0 against zeros
     * and normals, w row 4 -Inf at k1 meeting x row 6's 0), and a sum that
     * overflows; the twin's NaN payloads must be the kernel's */
    fill(x, m, w, n, k);
    vfill_codes(q, n * k);
    const int64_t k0 = 5, k1 = 30;
    x[1 * k + 17] = NAN;
    x[2 * k + k0] = INFINITY;
    x[3 * k + k0] = -INFINITY;
    for (int64_t j = 0; j < n; j++) w[j * k + k0] = j % 3 == 0 ? 0.0f : bf(tu_gauss());
    for (int64_t j = 0; j < n; j++) q[j * k + k0] = j % 3 == 0 ? 0 : (int8_t)tu_range(-128, 127) | 1;
    w[4 * k + k1] = -INFINITY;
    w[5 * k + 9] = NAN;
    x[6 * k + k1] = 0.0f;
    vcheck_case("NaN/Inf", x, m, w, NULL, n, k);
    vcheck_case("NaN/Inf", x, m, NULL, q, n, k);
    vrun(&ql_bf16_gemm_12x32c2__generic, 1, 0, x, m, w, NULL, n, k, y);
    int64_t wrong = 0;
    for (int64_t j = 0; j < n; j++) {
        wrong += !isnan(y[1 * n + j]);
        const float s = w[j * k + k0];
        if (j == 4 || j == 5) continue;
        wrong += s == 0 ? !isnan(y[2 * n + j]) : y[2 * n + j] != copysignf(INFINITY, s);
        wrong += s == 0 ? !isnan(y[3 * n + j]) : y[3 * n + j] != copysignf(INFINITY, -s);
    }
    wrong += !isnan(y[6 * n + 4]);
    for (int64_t i = 0; i < m; i++) wrong += !isnan(y[i * n + 5]);
    CHECK(wrong == 0, "VDPBF16PS NaN/Inf: %lld outputs not the expected NaN / signed Inf", (long long)wrong);
    fill(x, m, w, n, k);
    for (int64_t p = 0; p < k; p++) w[0 * k + p] = w[1 * k + p] = 0.0f;
    for (int64_t j = 2; j < n; j++) w[j * k + 3] = w[j * k + 8] = w[j * k + 9] = 0.0f;
    x[0 * k + 3] = big;
    w[0 * k + 3] = 2.0f;
    x[0 * k + 8] = x[0 * k + 9] = big;
    w[1 * k + 8] = w[1 * k + 9] = 1.0f;
    vcheck_case("overflow", x, m, w, NULL, n, k);
    vrun(&ql_bf16_gemm_12x32c2__generic, 1, 0, x, m, w, NULL, n, k, y);
    CHECK(y[0] == INFINITY && y[1] == INFINITY, "VDPBF16PS overflow: %g %g, expected +Inf", y[0], y[1]);
    free(x); free(w); free(y); free(q);
}

/* The weight-only linear with bf16 activations (group 0 and ConvRot 256) on
 * the best ISA: exactly fl(s·twin(x̂, q)) with x̂ the activation as the
 * generic table converts it (rotated, rounded to bf16), for M = 0, 1, small
 * and blocked, threads 1-3; with fp32 activations the fp32 path (its own
 * float64 bound: test_linear). A tile kernel (TDPBF16PS: no bit-exact twin)
 * stands for its own twin, through the blocked driver on one thread, and
 * that is checked against the float64 bound. */
static void test_vdp_linear(void)
{
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    const ql_cpu_kernels *kt = ql_cpu_kernels_for(ql_context_isa(ctx)), *gen = ql_cpu_kernels_for(QL_ISA_GENERIC);
    const int vdp = kt->wo_bf16 != NULL, tiles = vdp && kt->wo_bf16->tile_k;
    const ql_f32_kernel *ref = tiles ? kt->wo_bf16 : &ql_bf16_gemm_12x32c2i8__generic;
    printf("  weight-only with bf16 x on %s: %s%s\n", ql_isa_name(ql_context_isa(ctx)),
           vdp ? kt->wo_bf16->name : "the fp32 kernel (no VDPBF16PS): not compared here",
           tiles ? " (against itself through the blocked driver, and that against float64)" : "");
    for (int c = 0; vdp && c < 10; c++) {
        const int64_t g = c % 3 == 2 ? 256 : 0, k = g ? 256 * tu_range(1, 3) : (c == 0 ? 1 : tu_range(1, 700));
        const int64_t n = tu_range(1, 80) | 1, m = c == 1 ? 1 : c % 2 ? tu_range(2, 80) : tu_range(81, 150);
        const int threads = 1 + c % 3;
        ql_context_set_threads(ctx, threads);
        uint16_t *x = malloc((size_t)(m * k) * 2);
        int8_t *q = malloc((size_t)(n * k));
        float *s = malloc((size_t)n * 4), *y = malloc((size_t)(m * n + 1) * 4), *yt = malloc((size_t)(m * n + 1) * 4);
        float *xh = malloc((size_t)(m * ((k + 15) & ~15) + 16) * 4);
        tu_fill_gauss(QL_BF16, x, m * k, 1.0);
        if (m * k > 3) x[3] = 0x0005; /* a denormal */
        vfill_codes_sym(q, n * k, c % 2); /* ±127: the sym kernel */
        for (int64_t i = 0; i < n; i++) s[i] = (float)((0.5 + tu_uniform()) * 1e-2);
        ql_linear_desc d = {.kind = QL_LINEAR_WEIGHT_ONLY, .int8 = {n, k, q, k, s, n, g, NULL, QL_F32}};
        ql_linear *lin = NULL;
        CHECK_OK(ql_linear_create(ctx, &d, &lin));
        if (!lin) break;
        char desc[200];
        ql_linear_describe(lin, 200, desc, sizeof desc);
        const ql_f32_kernel *want = c % 2 && kt->wo_bf16->sym ? kt->wo_bf16->sym : kt->wo_bf16;
        CHECK(strstr(desc, want->name) != NULL, "weight-only (codes %s): describe says '%s', not %s", c % 2 ? "±127" : "with -128",
              desc, want->name);
        CHECK_OK(ql_linear_forward(lin, x, QL_BF16, m, k, y, QL_F32, n, NULL));
        const int64_t ldo = (k + 15) & ~15;
        gen->rows_to_f32(QL_BF16, x, k, 0, m, k, g, 0, xh, ldo);
        float *xc = malloc((size_t)(m * k + 1) * 4);
        for (int64_t i = 0; i < m; i++)
            for (int64_t p = 0; p < k; p++) xc[i * k + p] = xh[i * ldo + p];
        vrun(ref, 1, 0, xc, m, NULL, q, n, k, yt);
        if (tiles) {
            float *qf = malloc((size_t)(n * k + 1) * 4);
            for (int64_t i = 0; i < n * k; i++) qf[i] = q[i];
            const int64_t off = off_bound_of(xc, m, qf, n, k, yt, 0, BOUND_TDP);
            CHECK(off == 0, "weight-only bf16 x G=%lld M=%lld N=%lld K=%lld: %s off the float64 bound at %lld outputs",
                  (long long)g, (long long)m, (long long)n, (long long)k, ref->name, (long long)off);
            free(qf);
        }
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) yt[i * n + j] *= s[j];
        const int64_t dd = diff_bits(y, yt, m * n);
        CHECK(dd == 0, "weight-only bf16 x G=%lld M=%lld N=%lld K=%lld t%d: %lld of %lld outputs differ from s·%s", (long long)g,
              (long long)m, (long long)n, (long long)k, threads, (long long)dd, (long long)(m * n), ref->name);
        /* M = 0 writes nothing */
        memset(y, 0x5a, (size_t)(m * n) * 4);
        CHECK_OK(ql_linear_forward(lin, x, QL_BF16, 0, k, y, QL_F32, n, NULL));
        int64_t touched = 0;
        for (int64_t i = 0; i < m * n * 4; i++) touched += ((unsigned char *)y)[i] != 0x5a;
        CHECK(touched == 0, "weight-only bf16 x M = 0 wrote %lld bytes", (long long)touched);
        ql_linear_destroy(lin);
        free(x); free(q); free(s); free(y); free(yt); free(xh); free(xc);
    }
    ql_context_destroy(ctx);
}

/* ---------------------------------------------------------------- TDPBF16PS */

/* The table whose bf16 entry is a tile kernel (tile_k) this CPU runs, or NULL. */
static const ql_cpu_kernels *tdp_table(void)
{
    for (int i = 0; i < ql_cpu_kernels_count(); i++) {
        const ql_cpu_kernels *kt = ql_cpu_kernels_at(i);
        if (ql_isa_supported(kt->isa) && kt->bf16->tile_k && kt->wo_bf16 && kt->wo_bf16->tile_k) return kt;
    }
    return NULL;
}

static int64_t tdp_outputs, tdp_model_diff; /* the tile kernels' outputs, and those with other bits than the model */

/* Bits equal, or both NaN (payloads are the hardware's own). */
static int64_t diff_nan_any(const float *a, const float *b, int64_t count)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < count; i++) bad += memcmp(a + i, b + i, 4) != 0 && !(isnan(a[i]) && isnan(b[i]));
    return bad;
}

/* The model against float64; where tiles run, the kernel against float64,
 * its paths against each other, and its bits against the model (counted). */
static void tcheck_case(const char *what, const float *x, int64_t m, const float *w, const int8_t *w8, int64_t n, int64_t k)
{
    const ql_cpu_kernels *kt = tdp_table();
    const ql_f32_kernel *model = w8 ? &ql_bf16_tdp_32x32c2i8__generic : &ql_bf16_tdp_32x32c2__generic;
    const ql_f32_kernel *fast = kt ? (w8 ? kt->wo_bf16 : kt->bf16) : NULL;
    const size_t cnt = (size_t)(m * n + 1);
    float *ym = malloc(cnt * 4), *yf = malloc(cnt * 4), *yv = malloc(cnt * 4), *weff = malloc((size_t)(n * k + 1) * 4);
    for (int64_t i = 0; i < n * k; i++) weff[i] = w8 ? (float)w8[i] : w[i];
    vrun(model, 1, 0, x, m, w, w8, n, k, ym);
    int64_t bad = off_bound_of(x, m, weff, n, k, ym, 0, BOUND_TDP);
    CHECK(bad == 0, "%s M=%lld N=%lld K=%lld (%s): the TDPBF16PS model off the float64 bound at %lld of %lld outputs", what,
          (long long)m, (long long)n, (long long)k, w8 ? "int8 codes" : "bf16", (long long)bad, (long long)(m * n));
    int sym = w8 != NULL;
    for (int64_t i = 0; sym && i < n * k; i++) sym = w8[i] != -128;
    if (fast) {
        for (size_t i = 0; i < cnt; i++) yf[i] = -1.0f;
        vrun(fast, 1, 0, x, m, w, w8, n, k, yf);
        bad = off_bound_of(x, m, weff, n, k, yf, 0, BOUND_TDP);
        CHECK(bad == 0, "%s M=%lld N=%lld K=%lld: %s off the float64 bound at %lld of %lld outputs", what, (long long)m,
              (long long)n, (long long)k, fast->name, (long long)bad, (long long)(m * n));
        tdp_outputs += m * n;
        tdp_model_diff += diff_nan_any(yf, ym, m * n);
        for (int v = 1; v < (sym && fast->sym ? 8 : 4); v++) { /* blocked with 2, 3 threads; small-M; the sym variant */
            const ql_f32_kernel *f = v < 4 ? fast : fast->sym;
            for (size_t i = 0; i < cnt; i++) yv[i] = -1.0f;
            vrun(f, v % 4 < 3 ? v % 4 + 1 : 1, v % 4 == 3, x, m, w, w8, n, k, yv);
            const int64_t d = diff_nan_any(yf, yv, m * n);
            CHECK(d == 0, "%s M=%lld N=%lld K=%lld %s: %s differs from %s t1 at %lld of %lld outputs", what, (long long)m,
                  (long long)n, (long long)k, v % 4 == 3 ? "small-M" : v % 4 == 0 ? "t1" : v % 4 == 1 ? "t2" : "t3", f->name,
                  fast->name, (long long)d, (long long)(m * n));
        }
    }
    free(ym); free(yf); free(yv); free(weff);
}

static void test_tdp_shapes(void)
{
    /* every tail of the 32-k block (K < 32, odd, not a multiple of 32), K
     * across the amx table's 512-k slices; M across 32-row panels and the
     * small-M limit (64); N across 16- and 32-column tiles */
    static const int64_t ks[] = {1, 2, 3, 5, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 511, 512, 513, 1025, 1536};
    const int nk = (int)(sizeof ks / sizeof ks[0]);
    for (int c = 0; c < 36; c++) {
        const int64_t m = c < 3 ? 1 : c == 3 ? 0 : c % 5 == 0 ? tu_range(60, 130) : tu_range(1, 40);
        const int64_t n = c % 4 == 1 ? 1 : c % 4 == 2 ? 16 * tu_range(1, 4) + tu_range(-1, 1) : tu_range(1, 90) | (c % 2);
        const int64_t k = c < nk ? ks[c] : tu_range(1, 1200);
        float *x = malloc((size_t)(m * k + 1) * 4), *w = malloc((size_t)(n * k + 1) * 4);
        int8_t *q = malloc((size_t)(n * k + 1));
        fill(x, m, w, n, k);
        vfill_codes(q, n * k);
        tcheck_case("random", x, m, w, NULL, n, k);
        tcheck_case("random", x, m, NULL, q, n, k);
        vfill_codes_sym(q, n * k, 1);
        tcheck_case("random ±127", x, m, NULL, q, n, k);
        free(x); free(w); free(q);
    }
}

/* The limits of test_vdp_limits through the model and the tile kernels:
 * bf16 max and min normal, denormal activations and weights (read as 0: the
 * D term), tiny partial sums (flushed), NaN and Inf activations (NaN rows,
 * ±Inf by the weight's sign, NaN where Inf meets a 0 weight), a NaN weight,
 * and sums that overflow. */
static void test_tdp_limits(void)
{
    const int64_t m = 37, n = 37, k = 71;
    float *x = malloc((size_t)(m * k) * 4), *w = malloc((size_t)(n * k) * 4), *y = malloc((size_t)(m * n) * 4);
    int8_t *q = malloc((size_t)(n * k));
    const float big = ql_bf16_to_fp32(0x7f7f), tiny = 0x1p-126f;
    for (int v = 0; v < 4; v++) {
        fill(x, m, w, n, k);
        vfill_codes(q, n * k);
        for (int64_t i = 0; i < m * k; i++) {
            const double r = tu_uniform();
            if (v == 0 && r < 0.3) x[i] = r < 0.15 ? big : -big;
            if (v == 1 && r < 0.3) x[i] = r < 0.15 ? tiny : -tiny;
            if (v == 2 && r < 0.3) x[i] = ql_bf16_to_fp32((uint16_t)((r < 0.15 ? 0x8000 : 0) | tu_range(1, 0x7f))); /* denormals */
            if (v == 3) x[i] = bf(x[i] * 0x1p-124); /* products and sums near 2^-126: flushed */
        }
        for (int64_t i = 0; i < n * k; i++) w[i] = bf(tu_gauss() * (v == 0 ? 0x1p-120 : v == 1 ? 0x1p20 : 1.0));
        if (v == 2)
            for (int64_t i = 0; i < n * k; i += 3) w[i] = ql_bf16_to_fp32((uint16_t)(0x8000 | tu_range(1, 0x7f)));
        const char *what = v == 0 ? "bf16 max" : v == 1 ? "bf16 min normal" : v == 2 ? "bf16 denormals" : "sums near 2^-126";
        tcheck_case(what, x, m, w, NULL, n, k);
        if (v == 0)
            for (int64_t i = 0; i < m * k; i++) x[i] = bf(x[i] * 0x1p-20);
        tcheck_case(what, x, m, NULL, q, n, k);
    }
    fill(x, m, w, n, k);
    vfill_codes(q, n * k);
    const int64_t k0 = 5, k1 = 30;
    x[1 * k + 17] = NAN;
    x[2 * k + k0] = INFINITY;
    x[3 * k + k0] = -INFINITY;
    x[33 * k + 70] = INFINITY; /* the last k of an odd K, in rows 16-31 of the second panel */
    for (int64_t j = 0; j < n; j++) w[j * k + k0] = j % 3 == 0 ? 0.0f : bf(tu_gauss());
    for (int64_t j = 0; j < n; j++) q[j * k + k0] = j % 3 == 0 ? 0 : (int8_t)(tu_range(-128, 127) | 1);
    w[4 * k + k1] = -INFINITY;
    w[5 * k + 9] = NAN;
    x[6 * k + k1] = 0.0f;
    tcheck_case("NaN/Inf", x, m, w, NULL, n, k);
    tcheck_case("NaN/Inf", x, m, NULL, q, n, k);
    fill(x, m, w, n, k);
    for (int64_t p = 0; p < k; p++) w[0 * k + p] = w[1 * k + p] = 0.0f;
    for (int64_t j = 2; j < n; j++) w[j * k + 3] = w[j * k + 8] = w[j * k + 9] = 0.0f;
    x[0 * k + 3] = big;
    w[0 * k + 3] = 2.0f;
    x[0 * k + 8] = x[0 * k + 9] = big;
    w[1 * k + 8] = w[1 * k + 9] = 1.0f;
    tcheck_case("overflow", x, m, w, NULL, n, k);
    vrun(&ql_bf16_tdp_32x32c2__generic, 1, 0, x, m, w, NULL, n, k, y);
    CHECK(y[0] == INFINITY && y[1] == INFINITY, "TDPBF16PS model overflow: %g %g, expected +Inf", y[0], y[1]);
    free(x); free(w); free(y); free(q);
}

int main(void)
{
    tu_init("test_bf16");
    const ql_f32_kernel *fast = fast_kernel();
    printf("  %s\n", fast ? "bf16_gemm_8x8c4__neonbf16 against its twin and float64"
                          : "no BF16 kernel on this CPU: the twin against float64 only");
    test_shapes();
    test_limits();
    test_linear();
    const ql_cpu_kernels *vt = vdp_table();
    printf("  %s\n", vt ? "VDPBF16PS kernels against their twins and float64"
                        : "no AVX512_BF16 kernels on this CPU: the VDPBF16PS twins against float64 only");
    test_vdp_shapes();
    test_vdp_limits();
    test_vdp_linear();
    const ql_cpu_kernels *tt = tdp_table();
    printf("  %s\n", tt ? "TDPBF16PS tile kernels against float64, across their paths, and beside the SDM model"
                        : "no AMX-BF16 tiles on this CPU: the TDPBF16PS model against float64 only");
    test_tdp_shapes();
    test_tdp_limits();
    if (tt)
        printf("  %s / %s: %lld of %lld outputs with other bits than the SDM pseudo-code's model (a measurement, not a "
               "requirement: the contract is the bound)\n",
               tt->bf16->name, tt->wo_bf16->name, (long long)tdp_model_diff, (long long)tdp_outputs);
    return tu_finish();
}
