/* Unmerged LoRA in the W8A8 linear: every ISA equals the generic twin bit for
 * bit (rank, N and K tails, dtypes, groups, threads); the result against a
 * float64 computation of x·(W + scale·up·down)ᵀ stays within the bound of
 * the rounding model (lora_var), agrees with that model on average, and, for
 * ΔW up to a quarter of W, errs less than the base layer's own
 * quantization; a LoRA that cancels the weight gives exactly 0;
 * strength 0 and add-then-remove are the identity bit for bit; extreme
 * scales give the same, finite result; bad arguments fail with a message. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu/generic/generic.h"
#include "cpu/lora.h"
#include "cpu/registry.h"
#include "quant/wxa8.h"
#include "testutil.h"

/* every ISA this CPU runs, generic first (tu_isas: the registry walked) */
static ql_isa isas[32];
static int n_isas;

typedef struct lcase {
    int64_t m, n, k, g, nscale;
    ql_dtype xdt, ydt;
    int8_t *q;
    float *sw;
    float *bias; /* fp32 [n] or NULL */
    void *x;     /* [m, k] xdt */
    int nl;      /* LoRAs */
    int64_t rank[3];
    float *down[3], *up[3];
    double scale[3];
} lcase;

static void free_case(lcase *c)
{
    free(c->q); free(c->sw); free(c->bias); free(c->x);
    for (int i = 0; i < c->nl; i++) { free(c->down[i]); free(c->up[i]); }
}

/* Float64: the dequantized weight un-rotated with H (double), plus the LoRAs. */
static double *dense64(const lcase *c)
{
    const int64_t n = c->n, k = c->k, g = c->g;
    double *w = calloc((size_t)(n * k), sizeof(double));
    float *h = g ? malloc((size_t)(g * g) * 4) : NULL;
    if (g) ql_hadamard(g, h);
    for (int64_t r = 0; r < n; r++) {
        const double s = c->sw[c->nscale == 1 ? 0 : r];
        for (int64_t j = 0; j < k; j++) {
            if (!g) { w[r * k + j] = c->q[r * k + j] * s; continue; }
            const int64_t b = j / g * g, jj = j % g;
            double acc = 0;
            for (int64_t i = 0; i < g; i++) acc += c->q[r * k + b + i] * s * h[i * g + jj];
            w[r * k + j] = acc;
        }
    }
    free(h);
    return w;
}

static void forward64(const lcase *c, const double *w, int with_lora, double *y)
{
    const int64_t m = c->m, n = c->n, k = c->k;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double acc = 0;
            for (int64_t p = 0; p < k; p++) acc += ql_load_f(c->xdt, c->x, i * k + p) * w[j * k + p];
            y[i * n + j] = acc + (c->bias ? c->bias[j] : 0.0);
        }
        for (int l = 0; with_lora && l < c->nl; l++) {
            const int64_t rk = c->rank[l];
            double *t = calloc((size_t)rk, sizeof(double));
            for (int64_t r = 0; r < rk; r++)
                for (int64_t p = 0; p < k; p++) t[r] += ql_load_f(c->xdt, c->x, i * k + p) * c->down[l][r * k + p];
            for (int64_t j = 0; j < n; j++) {
                double acc = 0;
                for (int64_t r = 0; r < rk; r++) acc += t[r] * c->up[l][j * rk + r];
                y[i * n + j] += c->scale[l] * acc;
            }
            free(t);
        }
    }
}

static ql_linear *make_linear(ql_context *ctx, const lcase *c, int with_lora)
{
    ql_int8_weight w = {c->n, c->k, c->q, c->k, c->sw, c->nscale, c->g, c->bias, QL_F32};
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    for (int l = 0; lin && with_lora && l < c->nl; l++) {
        ql_lora_desc ld = {c->rank[l], c->down[l], QL_F32, c->k, c->up[l], QL_F32, c->rank[l], c->scale[l]};
        CHECK_OK(ql_linear_add_lora(lin, &ld, NULL));
    }
    return lin;
}

static void *run(ql_context *ctx, const lcase *c, int with_lora)
{
    void *y = malloc((size_t)(c->m * c->n + 1) * 4);
    memset(y, 0x5a, (size_t)(c->m * c->n + 1) * 4);
    ql_linear *lin = make_linear(ctx, c, with_lora);
    if (lin) CHECK_OK(ql_linear_forward(lin, c->x, c->xdt, c->m, c->k, y, c->ydt, c->n, NULL));
    ql_linear_destroy(lin);
    return y;
}

static double l2diff(const lcase *c, const void *y, const double *ref, const double *add)
{
    double e = 0;
    for (int64_t i = 0; i < c->m * c->n; i++) {
        double d = ql_load_f(c->ydt, y, i) - ref[i] - (add ? add[i] : 0.0);
        e += d * d;
    }
    return sqrt(e);
}
static double l2(const double *a, const double *b, int64_t n)
{
    double e = 0;
    for (int64_t i = 0; i < n; i++) e += (a[i] - (b ? b[i] : 0)) * (a[i] - (b ? b[i] : 0));
    return sqrt(e);
}

static void random_case(lcase *c, int64_t m, int64_t n, int64_t k, int64_t g, int nl, const int64_t *ranks,
                        double lora_mag)
{
    memset(c, 0, sizeof *c);
    c->m = m; c->n = n; c->k = k; c->g = g;
    c->nscale = tu_range(0, 3) == 0 ? 1 : n;
    const ql_dtype dts[] = {QL_F32, QL_BF16, QL_F16};
    c->xdt = dts[tu_range(0, 2)];
    c->ydt = dts[tu_range(0, 2)];
    c->q = malloc((size_t)(n * k + 1));
    c->sw = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n * k; i++) c->q[i] = (int8_t)tu_range(-127, 127);
    for (int64_t i = 0; i < n; i++) c->sw[i] = (float)((0.5 + tu_uniform()) * 1e-3);
    if (tu_range(0, 1)) {
        c->bias = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) c->bias[i] = (float)(0.1 * tu_gauss());
    }
    c->x = malloc((size_t)(m * k + 1) * 4);
    tu_fill_gauss(c->xdt, c->x, m * k, 1.0);
    c->nl = nl;
    for (int l = 0; l < nl; l++) {
        const int64_t rk = ranks[l];
        c->rank[l] = rk;
        c->down[l] = malloc((size_t)(rk * k) * 4);
        c->up[l] = malloc((size_t)(n * rk) * 4);
        tu_fill_gauss(QL_F32, c->down[l], rk * k, 1.0 / sqrt((double)k));
        tu_fill_gauss(QL_F32, c->up[l], n * rk, lora_mag * 1e-3 * sqrt((double)k / (double)rk) * 58.0);
        c->scale[l] = ql_lora_scale(tu_range(1, 4) * 0.25, (double)rk / 2, tu_range(0, 1), rk);
    }
}

static int same_bits(const lcase *c, const void *a, const void *b, int64_t *first)
{
    for (int64_t i = 0; i < c->m * c->n; i++) {
        float x = ql_load_f(c->ydt, a, i), y = ql_load_f(c->ydt, b, i);
        if (!(memcmp(&x, &y, 4) == 0 || (isnan(x) && isnan(y)))) { *first = i; return 0; }
    }
    return 1;
}

/* t's requantization (lora.h): the AVX-512 row against the generic twin,
 * bit for bit (codes in the T panel, Σ codes, max|t|), and the generic one
 * against exact integer arithmetic: |code·amax − 127·t| <= amax/2, ties to
 * even, every code at the position ql_a_element gives it. Ranks with tails,
 * all-zero rows, ties, large |t| and row corrections. */
static void test_t_row_twins(void)
{
    const int mrs[] = {12, 1, 5, 11};
    for (int it = 0; it < 400; it++) {
        const int64_t rt = it < 5 ? (int64_t[]){1, 3, 17, 64, 128}[it] : tu_range(1, 300), rpad = (rt + 63) / 64 * 64;
        const int mr = mrs[it % 4], i = (int)tu_range(0, mr - 1), kind = (int)tu_range(0, 4);
        const int64_t dpanels = (rt + 31) / 32;
        int32_t *cb = malloc((size_t)(dpanels * mr * 32) * 4 + (size_t)rpad * 5 + 64);
        int8_t *tp0 = malloc((size_t)(rpad * mr)), *tp1 = malloc((size_t)(rpad * mr));
        memset(tp0, 0x11, (size_t)(rpad * mr));
        memset(tp1, 0x22, (size_t)(rpad * mr));
        const int32_t mag = kind == 0 ? 3 : kind == 1 ? 127 * 127 * 300 : 1 << 29;
        const int32_t corr = kind == 4 ? (int32_t)tu_range(-(1 << 28), 1 << 28) : 0;
        for (int64_t j = 0; j < dpanels * mr * 32; j++) cb[j] = (int32_t)tu_range(-mag, mag) + corr;
        if (kind == 2) /* ties: amax 254, odd t give x.5 */
            for (int64_t c = 0; c < rt; c++) cb[((c / 32) * mr + i) * 32 + c % 32] = c == 0 ? 254 : (int32_t)tu_range(-127, 127) * 2 + 1;
        if (it % 37 == 0) /* a zero row */
            for (int64_t c = 0; c < rt; c++) cb[((c / 32) * mr + i) * 32 + c % 32] = corr;
        uint8_t perm[64];
        for (int q = 0; q < 64; q++) perm[q] = (uint8_t)ql_a_element(64, q);
        int32_t s0 = 0, s1 = 0;
        const int32_t a0 = ql_lora_t_row_generic(cb, mr, 32, 64, 1, perm, i, rt, rpad, corr, tp0,
                                                 cb + dpanels * mr * 32, &s0);
        /* exact: amax, rounding, placement, Σ */
        int32_t amax = 0, sum = 0, bad = 0;
        for (int64_t c = 0; c < rt; c++) {
            const int64_t v = (int64_t)cb[((c / 32) * mr + i) * 32 + c % 32] - corr;
            amax = (int32_t)(llabs(v) > amax ? llabs(v) : amax);
        }
        for (int64_t pos = 0; pos < rpad; pos++) {
            const int64_t c = ql_a_element(64, pos);
            const int code = tp0[ql_a_offset(64, mr, i, pos)];
            sum += code;
            if (c >= rt) { bad += code != 0; continue; }
            const int64_t v = (int64_t)cb[((c / 32) * mr + i) * 32 + c % 32] - corr;
            const int64_t d2 = 2 * ((int64_t)code * amax - 127 * v); /* 2·(code − t/σ)·amax */
            bad += amax ? (llabs(d2) > amax || (llabs(d2) == amax && (code & 1))) : code != 0;
        }
        CHECK(a0 == amax && s0 == sum && bad == 0, "t row (rank %lld, mr %d, row %d, kind %d): amax %d/%d sum %d/%d, %d "
              "codes misplaced or misrounded", (long long)rt, mr, i, kind, a0, amax, s0, sum, bad);
        /* every table's own t-row helper for this layout (64-blocks, 32 columns, int8 A) */
        for (int ti = 0; ti < ql_cpu_kernels_count(); ti++) {
            const ql_cpu_kernels *kt = ql_cpu_kernels_at(ti);
            if (!ql_isa_supported(kt->isa) || kt->lora_t_row == ql_lora_t_row_generic || kt->s8->kb != 64 ||
                kt->s8->nr != 32 || (kt->s8->aes ? kt->s8->aes : 1) != 1)
                continue;
            memset(tp1, 0x22, (size_t)(rpad * mr));
            const int32_t a1 = kt->lora_t_row(cb, mr, 32, 64, 1, perm, i, rt, rpad, corr, tp1, cb + dpanels * mr * 32, &s1);
            int64_t diff = -1;
            for (int64_t b = 0; b < rpad / 64 && diff < 0; b++)
                for (int q = 0; q < 64; q++)
                    if (tp0[(b * mr + i) * 64 + q] != tp1[(b * mr + i) * 64 + q]) { diff = b * 64 + q; break; }
            CHECK(a1 == a0 && s1 == s0 && diff < 0, "t row %s (rank %lld, mr %d, row %d, kind %d): amax %d/%d sum %d/%d, "
                  "first differing position %lld", ql_isa_name(kt->isa), (long long)rt, mr, i, kind, a1, a0, s1, s0, (long long)diff);
        }
        free(cb); free(tp0); free(tp1);
    }
}

/* The error model the bounds below rest on. The low-rank term
 * T[m, n] = Σ_r t[m, r]·w[n, r] (t = x·downᵀ, w = scale·up, LoRAs concatenated
 * along r) is computed from four roundings to nearest, each off by at most
 * half its step: x (step s_x = max|x_rot|/127 per row), down (2^e_r per row:
 * the smallest power of two with 127·2^e_r >= max|down_rot[r]|), t (per row:
 * step h_t[r] = 2^e_r·max_r'(|t[r']|·2^-e_r')/127, as t is requantized in
 * units of s_x·2^e_r) and w (per output column: step
 * h_w[n, r] = max_r'(|w[n, r']|·2^e_r')/127·2^-e_r). To first order the error
 * of T[m, n] is Σ_i a_i·ε_i with |ε_i| <= 1/2 and
 *   a: ΔW[n, p]·s_x (x; ΔW = Σ_r w[n, r]·down[r], rotation orthonormal),
 *      w[n, r]·x[p]·2^e_r (down), w[n, r]·h_t[r] (t), t[r]·h_w[n, r] (w).
 * Rounding errors as independent and uniform (the standard model; the data
 * here are random) give it the variance V = Σ a_i²/12, and Hoeffding's
 * inequality P(|Σ a_i ε_i| >= τ) <= 2·exp(−2τ²/Σ a_i²) = 2·exp(−τ²/(6V)).
 * Over the P outputs of a case, with probability >= 1 − 1e-9 every one is
 * within τ_i² = 6·V_i·ln(2P/1e-9), so the L2 error of the term is at most
 * sqrt(6·ln(2P/1e-9)·Σ V_i) (≈ 12–14 × sqrt(Σ V)). A bound relative to the
 * term's own norm is not one: that norm can be small by cancellation (a few
 * outputs of a sum of R random products) while the roundings are not
 * (seed 1013404538240: M = 1, N = 3, rank 128, term 0.091, error 0.0095 =
 * 10 % of it, within 1.6·sqrt(Σ V)). Returns Σ V over the m×n outputs. */
/* s_x of row i: max|x·H|/127 (h: the group's H, or NULL) */
static double sx_row(ql_dtype xdt, const void *x, int64_t i, int64_t k, int64_t g, const float *h)
{
    double xmax = 0, *xr = malloc((size_t)k * 8);
    for (int64_t p = 0; p < k; p++) xr[p] = ql_load_f(xdt, x, i * k + p);
    for (int64_t p = 0; p < k; p++) {
        double v = xr[p];
        if (g) { v = 0; for (int64_t q = 0; q < g; q++) v += xr[p / g * g + q] * h[q * g + p % g]; }
        xmax = fmax(xmax, fabs(v));
    }
    free(xr);
    return xmax / 127.0;
}

static double lora_var(ql_dtype xdt, const void *x, int64_t m, int64_t k, int64_t g, int64_t n, int nl,
                       const int64_t *rank, float *const *down, float *const *up, const double *scale, double *dwf2)
{
    int64_t rt = 0;
    for (int l = 0; l < nl; l++) rt += rank[l];
    double *d = malloc((size_t)(rt * k) * 8), *w = malloc((size_t)(n * rt + 1) * 8), *p2 = malloc((size_t)rt * 8);
    double *dw2 = calloc((size_t)n, 8), *t = malloc((size_t)rt * 8);
    double *xr = malloc((size_t)k * 8), *hw = malloc((size_t)(n * rt + 1) * 8);
    float *h = g ? malloc((size_t)(g * g) * 4) : NULL;
    if (g) ql_hadamard(g, h);
    for (int l = 0, r0 = 0; l < nl; r0 += (int)rank[l], l++)
        for (int64_t r = 0; r < rank[l]; r++) {
            for (int64_t p = 0; p < k; p++) d[(r0 + r) * k + p] = down[l][r * k + p];
            for (int64_t j = 0; j < n; j++) w[j * rt + r0 + r] = scale[l] * up[l][j * rank[l] + r];
        }
    for (int64_t r = 0; r < rt; r++) { /* 2^e_r from the rotated row (a hair large: never below the library's) */
        double a = 0;
        for (int64_t p = 0; p < k; p++) {
            double v = d[r * k + p];
            if (g) { v = 0; for (int64_t i = 0; i < g; i++) v += d[r * k + p / g * g + i] * h[i * g + p % g]; }
            a = fmax(a, fabs(v));
        }
        int e = 0;
        if (a > 0) frexp(a * (1 + 1e-6) / 127.0, &e);
        p2[r] = ldexp(1.0, e);
    }
    for (int64_t j = 0; j < n; j++) {
        double a = 0;
        for (int64_t r = 0; r < rt; r++) a = fmax(a, fabs(w[j * rt + r]) * p2[r]);
        for (int64_t r = 0; r < rt; r++) hw[j * rt + r] = a / 127.0 / p2[r];
        for (int64_t p = 0; p < k; p++) {
            double v = 0;
            for (int64_t r = 0; r < rt; r++) v += w[j * rt + r] * d[r * k + p];
            dw2[j] += v * v;
        }
    }
    double var = 0;
    *dwf2 = 0;
    for (int64_t j = 0; j < n; j++) *dwf2 += dw2[j];
    for (int64_t i = 0; i < m; i++) {
        double x2 = 0, tmax = 0;
        for (int64_t p = 0; p < k; p++) xr[p] = ql_load_f(xdt, x, i * k + p), x2 += xr[p] * xr[p];
        for (int64_t r = 0; r < rt; r++) {
            t[r] = 0;
            for (int64_t p = 0; p < k; p++) t[r] += xr[p] * d[r * k + p];
            tmax = fmax(tmax, fabs(t[r]) / p2[r]);
        }
        const double sx = sx_row(xdt, x, i, k, g, h);
        for (int64_t j = 0; j < n; j++) {
            double v = sx * sx * dw2[j];
            for (int64_t r = 0; r < rt; r++) {
                const double wv = w[j * rt + r], ht = p2[r] * tmax / 127.0;
                v += wv * wv * (x2 * p2[r] * p2[r] + ht * ht) + t[r] * t[r] * hw[j * rt + r] * hw[j * rt + r];
            }
            var += v / 12.0;
        }
    }
    free(d); free(w); free(p2); free(dw2); free(t); free(xr); free(hw); free(h);
    return var;
}

/* Hoeffding's factor for P outputs at a failure probability of 1e-9 (above). */
static double hoeffding(int64_t outputs) { return sqrt(6.0 * log(2.0 * (double)outputs / 1e-9)); }

/* Every ISA (and 1 to max_threads threads) equals the generic twin bit for
 * bit; the generic result meets the float64 bound. M from m_lo to m_hi: up to
 * 30 the small-M path, above 96 the blocked one (AVX-512: 12×32 tiles). */
/* fp32 output, one LoRA: max and sum of the LoRA term's and the base term's
 * relative errors, count; Σ err²/V, count; in the promise's range
 * Σ err_lora²/V_base, Σ err_base²/V_base, count */
static double stats[10];
static void test_isas_and_bound(int iters, int64_t m_lo, int64_t m_hi, int max_threads)
{
    static const int64_t ranks[] = {1, 3, 17, 64, 128};
    static const int64_t groups[] = {0, 16, 256};
    memset(stats, 0, 5 * sizeof stats[0]); /* (the rest sums over both calls: model_totals) */
    for (int it = 0; it < iters; it++) {
        const int64_t g = groups[it % 3];
        int64_t k = g == 256 ? 256 * tu_range(1, 2) : g == 16 ? 16 * tu_range(1, 40) : tu_range(1, 300);
        const int64_t n = tu_range(1, 90), m = tu_range(m_lo, m_hi);
        int64_t rk[3] = {ranks[it % 5], ranks[tu_range(0, 4)], tu_range(1, 9)};
        const int nl = it % 4 == 3 ? 3 : 1;
        lcase c;
        random_case(&c, m, n, k, g, nl, rk, it % 2 ? 1.0 : 0.25);
        ql_context *ctx = NULL;
        CHECK_OK(ql_context_create(&ctx));
        ql_context_set_threads(ctx, 1);
        ql_context_set_isa(ctx, QL_ISA_GENERIC);
        void *y0 = run(ctx, &c, 1);
        for (int ii = 1; ii < n_isas; ii++) {
            if (!ql_isa_supported(isas[ii])) continue;
            for (int th = 1; th <= max_threads; th++) {
                ql_context_set_isa(ctx, isas[ii]);
                ql_context_set_threads(ctx, th);
                void *y1 = run(ctx, &c, 1);
                int64_t first = -1;
                CHECK(same_bits(&c, y0, y1, &first), "%s t%d M=%lld N=%lld K=%lld G=%lld ranks=%lld,%lld,%lld (%d LoRAs) "
                      "x=%s y=%s: differs from generic at %lld", ql_isa_name(isas[ii]), th, (long long)m, (long long)n,
                      (long long)k, (long long)g, (long long)rk[0], (long long)rk[1], (long long)rk[2], nl,
                      ql_dtype_name(c.xdt), ql_dtype_name(c.ydt), (long long)first);
                free(y1);
            }
        }
        /* float64: base and base + LoRA */
        double *w = dense64(&c), *yb = malloc((size_t)(m * n) * 8), *yl = malloc((size_t)(m * n) * 8);
        forward64(&c, w, 0, yb);
        forward64(&c, w, 1, yl);
        ql_context_set_isa(ctx, QL_ISA_GENERIC);
        void *ybase = run(ctx, &c, 0);
        /* the LoRA term's error: (unmerged - base_q) vs (yl - yb) */
        double *lt = malloc((size_t)(m * n) * 8), *lq = malloc((size_t)(m * n) * 8);
        for (int64_t i = 0; i < m * n; i++) {
            lt[i] = yl[i] - yb[i];
            lq[i] = (double)ql_load_f(c.ydt, y0, i) - ql_load_f(c.ydt, ybase, i);
        }
        const double base_err = l2diff(&c, ybase, yb, NULL), lora_err = l2(lq, lt, m * n), lora_norm = l2(lt, NULL, m * n);
        const double out_ulp = c.ydt == QL_F32 ? 0x1p-23 : c.ydt == QL_BF16 ? 0x1p-8 : 0x1p-11;
        const double yl_norm = l2(yl, NULL, m * n);
        /* the bound (the model above), plus output rounding (the difference
         * of two rounded outputs) */
        const double slack = 2 * out_ulp * yl_norm, base_norm = l2(yb, NULL, m * n);
        double dwf2 = 0, wf2 = 0, vb = 0;
        const double var = lora_var(c.xdt, c.x, m, k, g, n, nl, c.rank, c.down, c.up, c.scale, &dwf2);
        const double lim = hoeffding(m * n) * sqrt(var);
        CHECK(lora_err <= lim + slack, "M=%lld N=%lld K=%lld G=%lld ranks %lld,%lld,%lld (%d LoRAs): LoRA-term error %.3g > "
              "its bound %.3g (the model's RMS %.3g; term norm %.3g; + rounding %.3g)", (long long)m, (long long)n,
              (long long)k, (long long)g, (long long)rk[0], (long long)rk[1], (long long)rk[2], nl, lora_err, lim,
              sqrt(var), lora_norm, slack);
        /* The base term's error, activation rounding only (W is the exact
         * dequantized weight here): Σ_m s_x²/12·|W|²_F, the same model. */
        float *h = g ? malloc((size_t)(g * g) * 4) : NULL;
        if (g) ql_hadamard(g, h);
        for (int64_t i = 0; i < n * k; i++) wf2 += w[i] * w[i];
        for (int64_t i = 0; i < m; i++) vb += pow(sx_row(c.xdt, c.x, i, k, g, h), 2) / 12.0 * wf2;
        free(h);
        /* fp32 outputs (bf16/fp16 rounding of the sum would swamp the term's
         * error): the measured errors against the model, aggregated over all
         * outputs of the cases (err²/V per case, weighted by its outputs),
         * and the documented promise: a LoRA whose ΔW is at most a
         * quarter of W (Frobenius: sizes that do not cancel) adds less error
         * than the base layer's own quantization; asserted on the sums over
         * the cases, where chance evens out, below. */
        if (c.ydt == QL_F32 && var > 0 && vb > 0) {
            stats[5] += (double)(m * n) * (lora_err * lora_err / var);
            stats[6] += (double)(m * n);
            if (nl == 1 && sqrt(dwf2) <= 0.25 * sqrt(wf2)) {
                stats[7] += lora_err * lora_err / vb;
                stats[8] += base_err * base_err / vb;
                stats[9] += 1;
            }
            if (getenv("QL_LORA_MODEL"))
                printf("  model M=%lld N=%lld K=%lld G=%lld R=%lld nl=%d: err/sqrt(V) %.3f, |dW|/|W| %.3f, lora err %.3g base err %.3g (model %.3g)\n",
                       (long long)m, (long long)n, (long long)k, (long long)g, (long long)rk[0], nl,
                       lora_err / sqrt(var), sqrt(dwf2 / wf2), lora_err, base_err, sqrt(vb));
        }
        if (c.ydt == QL_F32 && nl == 1 && m * n >= 64 && k >= 32) {
            stats[0] = fmax(stats[0], lora_err / lora_norm);
            stats[1] += lora_err / lora_norm;
            stats[2] = fmax(stats[2], base_err / base_norm);
            stats[3] += base_err / base_norm;
            stats[4] += 1;
        }
        free(lt); free(lq);
        free(w); free(yb); free(yl); free(ybase); free(y0);
        ql_context_destroy(ctx);
        free_case(&c);
    }
    if (stats[4] > 0)
        printf("  relative L2 error vs float64 over %.0f single-LoRA cases: low-rank term mean %.4f max %.4f; base term mean %.4f max %.4f\n",
               stats[4], stats[1] / stats[4], stats[0], stats[3] / stats[4], stats[2]);
}

/* The rounding model against the measured errors, over both calls of
 * test_isas_and_bound. */
static void model_totals(void)
{
    /* the mean of err²/V over the outputs is about 1 when the model holds
     * (0.7–1.4 per call over 300 seeds; both calls together, below); 1.5 leaves room
     * for chance, not for an extra rounding (a doubled step in any one of the
     * four gives ~1.75) */
    if (stats[6] > 0) {
        printf("  LoRA-term error against the rounding model over %.0f outputs: mean err²/V %.3f\n", stats[6], stats[5] / stats[6]);
        CHECK(stats[5] / stats[6] <= 1.5, "the LoRA term's errors exceed the rounding model: mean err²/V %.3f over %.0f outputs",
              stats[5] / stats[6], stats[6]);
    }
    if (stats[9] >= 3) {
        printf("  |dW| <= |W|/4, %.0f cases: LoRA-term error² %.3f vs the base's own %.3f (sums, in units of the base model)\n",
               stats[9], stats[7], stats[8]);
        CHECK(stats[7] <= stats[8], "|dW| <= |W|/4: the LoRA term's error (Σ %.3f) exceeds the base's own (Σ %.3f) over %.0f cases",
              stats[7], stats[8], stats[9]);
    }
}

/* Sums that land on fp32 subnormals (bf16 output): columns whose weight codes
 * are all 0 get only a LoRA term scaled by 2^-130. vcvtne2ps2bf16 would flush
 * those, so the AVX-512 epilogue must take its exact path for the tile; every
 * ISA (small-M and blocked) equals the generic twin bit for bit, and the
 * generic output holds bf16 subnormals. */
static void test_subnormal_sums(void)
{
    for (int it = 0; it < 4; it++) {
        const int64_t m = it < 2 ? tu_range(5, 30) : tu_range(97, 130), n = 64, k = 64 * tu_range(1, 4);
        const int64_t rk[1] = {it % 2 ? 17 : 64};
        lcase c;
        random_case(&c, m, n, k, 0, 1, rk, 1.0);
        free(c.bias);
        c.bias = NULL;
        c.ydt = QL_BF16;
        c.scale[0] = 0x1p-130;
        for (int64_t j = 0; j < n; j += 2) memset(c.q + j * k, 0, (size_t)k);
        ql_context *ctx = NULL;
        CHECK_OK(ql_context_create(&ctx));
        ql_context_set_threads(ctx, 1);
        ql_context_set_isa(ctx, QL_ISA_GENERIC);
        uint16_t *y0 = run(ctx, &c, 1);
        int64_t sub = 0;
        for (int64_t i = 0; i < m * n; i++) sub += (y0[i] & 0x7f80) == 0 && (y0[i] & 0x7f) != 0;
        CHECK(sub >= m * n / 8, "M=%lld K=%lld: only %lld subnormal outputs", (long long)m, (long long)k, (long long)sub);
        for (int ii = 1; ii < n_isas; ii++) {
            if (!ql_isa_supported(isas[ii])) continue;
            for (int th = 1; th <= 2; th++) {
                ql_context_set_isa(ctx, isas[ii]);
                ql_context_set_threads(ctx, th);
                void *y1 = run(ctx, &c, 1);
                int64_t first = -1;
                CHECK(same_bits(&c, y0, y1, &first), "%s t%d M=%lld K=%lld rank %lld: subnormal sums differ from generic at %lld",
                      ql_isa_name(isas[ii]), th, (long long)m, (long long)k, (long long)rk[0], (long long)first);
                free(y1);
            }
        }
        free(y0);
        ql_context_destroy(ctx);
        free_case(&c);
    }
}

/* A LoRA equal to minus the dequantized weight (up = -W_rot, down = H, or
 * the identity without ConvRot): x·(W + up·down)ᵀ = 0 exactly, for any x;
 * the unmerged path must return exactly 0. Weight scales are powers of two,
 * fp32 activations. */
static void test_cancel(void)
{
    for (int ii = 0; ii < n_isas; ii++) {
        if (!ql_isa_supported(isas[ii])) continue;
        const int64_t gs[] = {0, 16, 64};
        for (int gi = 0; gi < 3; gi++) {
            const int64_t g = gs[gi], k = g ? g * 2 : 37, n = tu_range(5, 70), m = tu_range(1, 26);
            lcase c;
            random_case(&c, m, n, k, g, 0, NULL, 1.0);
            c.xdt = QL_F32;
            tu_fill_gauss(QL_F32, c.x, m * k, 1.0);
            c.ydt = (ql_dtype)(ii % 3 == 0 ? QL_F32 : ii % 3 == 1 ? QL_BF16 : QL_F16);
            free(c.bias);
            c.bias = NULL;
            /* real weights have a ±127 code in every row; cancellation is
             * exact where the up row's scale max|up|/127 gives s_w back
             * (fl(fl(127·s_w)/127) = s_w: nearly every s_w) */
            int64_t exact_rows = 0;
            for (int64_t i = 0; i < n; i++) {
                c.q[i * k + tu_range(0, k - 1)] = tu_range(0, 1) ? 127 : -127;
                c.sw[i] = tu_range(0, 3) ? c.sw[i] : ldexpf(1.0f, -(int)tu_range(3, 12));
                if ((float)((double)(127.0f * c.sw[i]) / 127.0) != c.sw[i]) c.sw[i] = ldexpf(1.0f, -7);
                else exact_rows++;
            }
            CHECK(exact_rows >= n * 8 / 10, "only %lld of %lld random weight scales round-trip", (long long)exact_rows,
                  (long long)n);
            c.nscale = n;
            c.nl = 1;
            c.rank[0] = k;
            c.scale[0] = 1.0;
            c.down[0] = calloc((size_t)(k * k), 4);
            c.up[0] = malloc((size_t)(n * k) * 4);
            float *h = g ? malloc((size_t)(g * g) * 4) : NULL;
            if (g) ql_hadamard(g, h);
            for (int64_t r = 0; r < k; r++)
                for (int64_t j = 0; j < k; j++)
                    c.down[0][r * k + j] = !g ? (r == j) : (r / g == j / g) ? h[(r % g) * g + j % g] : 0.0f;
            for (int64_t r = 0; r < n; r++)
                for (int64_t j = 0; j < k; j++) c.up[0][r * k + j] = -(float)c.q[r * k + j] * c.sw[c.nscale == 1 ? 0 : r];
            ql_context *ctx = NULL;
            CHECK_OK(ql_context_create(&ctx));
            ql_context_set_isa(ctx, isas[ii]);
            void *y = run(ctx, &c, 1);
            int64_t nonzero = 0;
            for (int64_t i = 0; i < m * n; i++) nonzero += ql_load_f(c.ydt, y, i) != 0.0f;
            CHECK(nonzero == 0, "%s G=%lld M=%lld N=%lld K=%lld: a cancelling LoRA left %lld of %lld outputs non-zero",
                  ql_isa_name(isas[ii]), (long long)g, (long long)m, (long long)n, (long long)k, (long long)nonzero,
                  (long long)(m * n));
            free(y);
            free(h);
            ql_context_destroy(ctx);
            free_case(&c);
        }
    }
}

/* Strength 0, and adding then removing a LoRA, change no bit; a second LoRA
 * after removing the first equals that LoRA alone. */
static void test_identity(void)
{
    for (int ii = 0; ii < n_isas; ii++) {
        if (!ql_isa_supported(isas[ii])) continue;
        int64_t rk[2] = {tu_range(1, 70), tu_range(1, 20)};
        lcase c;
        random_case(&c, tu_range(1, 40), tu_range(1, 80), 256, 256, 2, rk, 1.0);
        c.ydt = QL_BF16;
        ql_context *ctx = NULL;
        CHECK_OK(ql_context_create(&ctx));
        ql_context_set_isa(ctx, isas[ii]);
        void *y0 = run(ctx, &c, 0), *y1 = malloc((size_t)(c.m * c.n) * 4), *y2 = malloc((size_t)(c.m * c.n) * 4);
        ql_linear *lin = make_linear(ctx, &c, 0);
        ql_lora_desc d0 = {rk[0], c.down[0], QL_F32, c.k, c.up[0], QL_F32, rk[0], ql_lora_scale(0.0, 8.0, 1, rk[0])};
        int id = 0, id2 = 0;
        CHECK_OK(ql_linear_add_lora(lin, &d0, &id));
        CHECK_OK(ql_linear_forward(lin, c.x, c.xdt, c.m, c.k, y1, c.ydt, c.n, NULL));
        int64_t first = -1;
        CHECK(same_bits(&c, y0, y1, &first), "%s: strength 0 changed output %lld", ql_isa_name(isas[ii]), (long long)first);
        CHECK_OK(ql_linear_remove_lora(lin, id));
        d0.scale = 0.7;
        CHECK_OK(ql_linear_add_lora(lin, &d0, &id));
        CHECK_OK(ql_linear_forward(lin, c.x, c.xdt, c.m, c.k, y1, c.ydt, c.n, NULL));
        CHECK(ql_linear_lora_count(lin) == 1 && ql_linear_lora_rank(lin) == rk[0], "count/rank after add");
        CHECK_OK(ql_linear_remove_lora(lin, id));
        CHECK_OK(ql_linear_forward(lin, c.x, c.xdt, c.m, c.k, y2, c.ydt, c.n, NULL));
        CHECK(same_bits(&c, y0, y2, &first), "%s: add + remove changed output %lld", ql_isa_name(isas[ii]), (long long)first);
        CHECK(ql_linear_remove_lora(lin, id) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "no LoRA"),
              "removing twice: %s", ql_last_error());
        /* LoRA 1 after LoRA 0 was removed == LoRA 1 alone on a fresh linear */
        ql_lora_desc d1 = {rk[1], c.down[1], QL_F32, c.k, c.up[1], QL_F32, rk[1], 0.5};
        CHECK_OK(ql_linear_add_lora(lin, &d0, &id));
        CHECK_OK(ql_linear_add_lora(lin, &d1, &id2));
        CHECK_OK(ql_linear_remove_lora(lin, id));
        CHECK_OK(ql_linear_forward(lin, c.x, c.xdt, c.m, c.k, y1, c.ydt, c.n, NULL));
        ql_linear *lin2 = make_linear(ctx, &c, 0);
        CHECK_OK(ql_linear_add_lora(lin2, &d1, NULL));
        CHECK_OK(ql_linear_forward(lin2, c.x, c.xdt, c.m, c.k, y2, c.ydt, c.n, NULL));
        CHECK(same_bits(&c, y1, y2, &first), "%s: remove of the first of two LoRAs differs at %lld", ql_isa_name(isas[ii]),
              (long long)first);
        ql_linear_destroy(lin);
        ql_linear_destroy(lin2);
        free(y0); free(y1); free(y2);
        ql_context_destroy(ctx);
        free_case(&c);
    }
}

/* scale·up and down rescaled by powers of two as large as 2^±100 (up) and 2^+120 / 2^-100 (down) give the
 * same bits as the moderate LoRA, and finite outputs; a strength of 1e-30
 * gives the base result (where the base sum is exactly 0: a term below 2^-80). */
static void test_extreme_scales(void)
{
    for (int ii = 0; ii < n_isas; ii++) {
        if (!ql_isa_supported(isas[ii])) continue;
        int64_t rk[1] = {tu_range(1, 64)};
        lcase c;
        random_case(&c, tu_range(1, 30), tu_range(1, 70), 64, 16, 1, rk, 1.0);
        ql_context *ctx = NULL;
        CHECK_OK(ql_context_create(&ctx));
        ql_context_set_isa(ctx, isas[ii]);
        void *y0 = run(ctx, &c, 1);
        /* (up or down exponent, scale exponent). down is rotated in fp32, so
         * it goes down by 2^-100 only: at 2^-120 its values (~2^-123) and the
         * rotation's products fall below 2^-126, where fp32 rounds to a fixed
         * grain instead of relative to the value, and a code can differ
         * (seed 257242648629144) — not the library's to restore. */
        const int sh[][2] = {{100, -100}, {-100, 100}, {120, 0}, {-100, 0}};
        for (int v = 0; v < 4; v++) {
            lcase d = c;
            float *up = malloc((size_t)(c.n * rk[0]) * 4), *down = malloc((size_t)(rk[0] * c.k) * 4);
            for (int64_t i = 0; i < c.n * rk[0]; i++) up[i] = v < 2 ? ldexpf(c.up[0][i], sh[v][0]) : c.up[0][i];
            for (int64_t i = 0; i < rk[0] * c.k; i++) down[i] = v >= 2 ? ldexpf(c.down[0][i], sh[v][0]) : c.down[0][i];
            d.up[0] = up;
            d.down[0] = down;
            d.scale[0] = ldexp(c.scale[0], v < 2 ? sh[v][1] : -sh[v][0]);
            void *y1 = run(ctx, &d, 1);
            int64_t first = -1, nonfinite = 0;
            for (int64_t i = 0; i < c.m * c.n; i++) nonfinite += !isfinite(ql_load_f(c.ydt, y1, i));
            const int same = same_bits(&c, y0, y1, &first);
            CHECK(nonfinite == 0 && same, "%s: extreme scale variant %d: %lld non-finite, differs at %lld",
                  ql_isa_name(isas[ii]), v, (long long)nonfinite, (long long)first);
            free(y1); free(up); free(down);
        }
        lcase t = c;
        t.scale[0] = 1e-30;
        void *yt = run(ctx, &t, 1), *yb = run(ctx, &c, 0);
        int64_t off = 0;
        for (int64_t i = 0; i < c.m * c.n; i++) {
            float a = ql_load_f(c.ydt, yt, i), b = ql_load_f(c.ydt, yb, i);
            /* (an output whose base sum is exactly 0 shows the tiny term itself) */
            off += !isfinite(a) || (a != b && !(b == 0.0f && fabsf(a) < 0x1p-80f));
        }
        CHECK(off == 0, "%s: strength 1e-30 moved %lld outputs", ql_isa_name(isas[ii]), (long long)off);
        free(yt); free(yb); free(y0);
        ql_context_destroy(ctx);
        free_case(&c);
    }
}

/* NaN activation rows stay NaN rows; M = 0 writes nothing; bad arguments. */
static void test_edges_and_errors(void)
{
    int64_t rk[1] = {5};
    lcase c;
    random_case(&c, 6, 40, 64, 64, 1, rk, 1.0);
    c.xdt = QL_F32;
    tu_fill_gauss(QL_F32, c.x, c.m * c.k, 1.0);
    ((float *)c.x)[2 * c.k + 7] = NAN;
    ql_context *ctx = NULL;
    CHECK_OK(ql_context_create(&ctx));
    void *y = run(ctx, &c, 1);
    int nan_row = 1, finite_other = 1;
    for (int64_t j = 0; j < c.n; j++) {
        nan_row &= isnan(ql_load_f(c.ydt, y, 2 * c.n + j));
        finite_other &= isfinite(ql_load_f(c.ydt, y, 3 * c.n + j));
    }
    CHECK(nan_row && finite_other, "NaN row with a LoRA: nan_row=%d finite_other=%d", nan_row, finite_other);
    free(y);
    ql_linear *lin = make_linear(ctx, &c, 1);
    float dummy = 7.0f;
    CHECK_OK(ql_linear_forward(lin, c.x, c.xdt, 0, c.k, &dummy, c.ydt, c.n, NULL));
    CHECK(dummy == 7.0f, "M = 0 wrote the output");
    ql_lora_desc d = {0, c.down[0], QL_F32, c.k, c.up[0], QL_F32, 5, 1.0};
    CHECK(ql_linear_add_lora(lin, &d, NULL) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "rank"), "rank 0: %s",
          ql_last_error());
    d.rank = 5;
    d.scale = NAN;
    CHECK(ql_linear_add_lora(lin, &d, NULL) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "scale"), "NaN scale: %s",
          ql_last_error());
    d.scale = 1.0;
    c.up[0][3 * 5 + 2] = INFINITY;
    CHECK(ql_linear_add_lora(lin, &d, NULL) == QL_ERR_NONFINITE && strstr(ql_last_error(), "up[3, 2]"), "Inf in up: %s",
          ql_last_error());
    c.up[0][3 * 5 + 2] = 0;
    c.down[0][c.k + 1] = NAN;
    CHECK(ql_linear_add_lora(lin, &d, NULL) == QL_ERR_NONFINITE && strstr(ql_last_error(), "down[1, 1]"), "NaN in down: %s",
          ql_last_error());
    d.ld_down = c.k - 1;
    CHECK(ql_linear_add_lora(lin, &d, NULL) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "down"), "bad ld: %s",
          ql_last_error());
    CHECK(ql_linear_lora_count(lin) == 1, "failed adds left %d LoRAs", ql_linear_lora_count(lin));
    ql_linear_destroy(lin);
    /* other kinds refuse */
    ql_int8_weight w = {c.n, c.k, c.q, c.k, c.sw, c.nscale, c.g, NULL, QL_F32};
    ql_linear_desc ld = {.kind = QL_LINEAR_WEIGHT_ONLY, .int8 = w};
    CHECK_OK(ql_linear_create(ctx, &ld, &lin));
    c.down[0][c.k + 1] = 0;
    d.ld_down = c.k;
    CHECK(ql_linear_add_lora(lin, &d, NULL) == QL_ERR_UNSUPPORTED && strstr(ql_last_error(), "W8A8 and"), "weight-only: %s",
          ql_last_error());
    ql_linear_destroy(lin);
    ql_context_destroy(ctx);
    free_case(&c);
}


/* W4A8 (codebook) and W6A8 layers run the W8A8 pipeline on their decoded
 * grid (kind W8A8) or decode inside the GEMM (WXA8_PACKED): with a LoRA both
 * kinds and every ISA give the same bits, and the LoRA term against float64
 * of x·(W + scale·up·down)ᵀ (W = the dequantized layer) meets the bound. */
static void test_wxa8(void)
{
    float lut[16];
    ql_wxa8_fixed_lut(lut);
    const ql_wxa8_mode modes[2] = {QL_WXA8_CODEBOOK, QL_WXA8_6BIT};
    for (int mi = 0; mi < 2; mi++) {
        const int bits = modes[mi] == QL_WXA8_6BIT ? 6 : 4;
        const int64_t n = tu_range(20, 70), k = 256, g = 16, m = tu_range(5, 30), rk = tu_range(1, 70);
        const int64_t rb = ql_wxa8_row_bytes(bits, k);
        float *w = malloc((size_t)(n * k) * 4), *sc = malloc((size_t)n * 4), *x = malloc((size_t)(m * k) * 4);
        uint8_t *q = malloc((size_t)(n * rb)), *sr = malloc((size_t)(n * k / g));
        float *down = malloc((size_t)(rk * k) * 4), *up = malloc((size_t)(n * rk) * 4);
        tu_fill_gauss(QL_F32, w, n * k, 0.02);
        tu_fill_gauss(QL_F32, x, m * k, 1.0);
        tu_fill_gauss(QL_F32, down, rk * k, 1.0 / 16);
        tu_fill_gauss(QL_F32, up, n * rk, 0.3 / sqrt((double)rk));
        ql_wxa8_qparams p = {modes[mi], g, 256, bits == 4 ? lut : NULL, 0};
        CHECK_OK(ql_wxa8_quantize(QL_F32, w, n, k, k, &p, q, rb, sr, sc, NULL));
        ql_wxa8_weight ww = {.n = n, .k = k, .bits = bits, .q = q, .ldq = rb, .s_rel = sr, .s_channel = sc,
                             .codebook = bits == 4 ? lut : NULL, .group = g, .convrot_group = 256};
        const double scale = 0.5;
        ql_lora_desc ld = {rk, down, QL_F32, k, up, QL_F32, rk, scale};
        float *y0 = malloc((size_t)(m * n) * 4), *y1 = malloc((size_t)(m * n) * 4), *yb = malloc((size_t)(m * n) * 4);
        ql_context *ctx = NULL;
        CHECK_OK(ql_context_create(&ctx));
        int first = 1;
        for (int ii = 0; ii < 4; ii++) {
            if (!ql_isa_supported(isas[ii])) continue;
            ql_context_set_isa(ctx, isas[ii]);
            for (int kind = 0; kind < 2; kind++) {
                ql_linear_desc d = {.kind = kind ? QL_LINEAR_WXA8_PACKED : QL_LINEAR_W8A8, .wxa8 = ww};
                ql_linear *lin = NULL;
                CHECK_OK(ql_linear_create(ctx, &d, &lin));
                if (!lin) continue;
                if (first) CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, k, yb, QL_F32, n, NULL));
                CHECK_OK(ql_linear_add_lora(lin, &ld, NULL));
                CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, k, first ? y0 : y1, QL_F32, n, NULL));
                if (!first)
                    CHECK(!memcmp(y0, y1, (size_t)(m * n) * 4), "W%dA8 %s kind %s: LoRA output differs from generic W8A8",
                          bits, ql_isa_name(isas[ii]), kind ? "WXA8_PACKED" : "W8A8");
                first = 0;
                ql_linear_destroy(lin);
            }
        }
        /* float64 */
        float *deq = malloc((size_t)(n * k) * 4);
        CHECK_OK(ql_wxa8_dequantize(&ww, QL_F32, deq, k));
        double e = 0, nl = 0, y2 = 0;
        for (int64_t i = 0; i < m; i++) {
            double t[80];
            for (int64_t r = 0; r < rk; r++) {
                t[r] = 0;
                for (int64_t j = 0; j < k; j++) t[r] += (double)x[i * k + j] * down[r * k + j];
            }
            for (int64_t c = 0; c < n; c++) {
                double l = 0;
                for (int64_t r = 0; r < rk; r++) l += t[r] * up[c * rk + r];
                l *= scale;
                const double got = (double)y0[i * n + c] - yb[i * n + c];
                e += (got - l) * (got - l);
                nl += l * l;
                y2 += (double)y0[i * n + c] * y0[i * n + c];
            }
        }
        /* the rounding model's bound (lora_var), plus the two outputs' fp32 rounding */
        double dwf2 = 0;
        const int64_t ranks[1] = {rk};
        const double var = lora_var(QL_F32, x, m, k, 256, n, 1, ranks, &down, &up, &scale, &dwf2);
        const double lim = hoeffding(m * n) * sqrt(var) + 2 * 0x1p-23 * sqrt(y2);
        CHECK(sqrt(e) <= lim, "W%dA8 rank %lld: LoRA-term error %.3g > its bound %.3g (the model's RMS %.3g, term norm %.3g)", bits,
              (long long)rk, sqrt(e), lim, sqrt(var), sqrt(nl));
        ql_context_destroy(ctx);
        free(w); free(sc); free(x); free(q); free(sr); free(down); free(up); free(y0); free(y1); free(yb); free(deq);
    }
}

int main(void)
{
    tu_init("test_lora");
    n_isas = tu_isas(isas);
    test_t_row_twins();
    test_isas_and_bound(30, 1, 30, 2);
    test_isas_and_bound(15, 97, 160, 3);
    model_totals();
    test_subnormal_sums();
    test_cancel();
    test_identity();
    test_extreme_scales();
    test_edges_and_errors();
    test_wxa8();
    return tu_finish();
}
