/* Input activations (ql_epilogue.input_act) and the per-call bias
 * (ql_epilogue.bias):
 *  - the row functions against float64 formulas, within stated bounds;
 *  - the fused W8A8 prologue of every ISA equals ql_int8_linear_ref bit for
 *    bit for every activation, x and y dtype, ConvRot or not, M (0, 1, 3,
 *    77, 300, and one past the M chunk), odd K, thread count, small-M or
 *    blocked, with the layer's or a per-call bias and a residual;
 *  - every other kind (LoRA, W4A8 packed and asymmetric, weight-only, dense,
 *    dequant) gives with input_act what it gives on the pre-activated input;
 *  - a per-call bias equals a layer built with that bias;
 *  - NaN/Inf rows, zero rows under rms_norm (eps 0: NaN; eps > 0: the bias),
 *    swiglu with ldx > 2K, and the argument checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "quant/input_act.h"
#include "testutil.h"

#define N_CTX 3 /* per ISA: 1 thread; 3 threads; 3 threads, small-M path off */

static ql_isa isas[32];
static int n_isas;
static ql_context *ctxs[32][N_CTX];
static const ql_dtype dts[] = {QL_F32, QL_F16, QL_BF16};
static const char *const act_names[] = {"none", "gelu_tanh", "swiglu", "rms_norm"};

static int same_bits(ql_dtype dt, const void *a, const void *b, int64_t m, int64_t n, int64_t lda, int64_t ldb,
                     int64_t *first)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float x = ql_load_f(dt, a, i * lda + j), y = ql_load_f(dt, b, i * ldb + j);
            if (!(memcmp(&x, &y, 4) == 0 || (isnan(x) && isnan(y)))) {
                *first = i * n + j;
                return 0;
            }
        }
    return 1;
}

static const char *ctx_name(int c) { return c == 0 ? "t1" : c == 1 ? "t3" : "t3-blocked"; }

/* ---- the row functions against float64 */

/* One unit in the last place of dt at |v| (subnormal spacing below the normals). */
static double ulp_dt(ql_dtype dt, double v)
{
    const int p = dt == QL_F32 ? 24 : dt == QL_F16 ? 11 : 8, emin = dt == QL_F16 ? -14 : -126;
    int e;
    frexp(fabs(v), &e); /* |v| in [2^(e-1), 2^e) */
    e -= 1;
    if (e < emin || v == 0) e = emin;
    return ldexp(1.0, e - p + 1);
}

static double gelu_tanh64(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

/* Bounds (u = 2^-24, the fp32 unit roundoff; one output ulp for the final
 * rounding to dt, and the straddle of a binade):
 *   gelu_tanh  4u·(|x| + |y|): 1 + tanh(·) is computed to ~4.5u absolute and
 *              scaled by |x|/2, which dominates in the negative tail;
 *   swiglu     |up|·(4u·|s| + ulp(s)) + ulp(y), s = silu(gate) (exp, add,
 *              divide, then s rounded to dt);
 *   rms_norm   ((K + 1)/2 + 4)·u·|y|: a sum of K non-negative fp32 terms in
 *              any order is within (K - 1)u; /K, + eps, sqrt, 1/·, ·r, ·w add
 *              the rest. */
static void test_rows_vs_float64(void)
{
    const double u = 0x1p-24;
    const int64_t ks[] = {1, 5, 8, 33, 300, 1031};
    for (int a = 1; a <= 3; a++)
        for (int di = 0; di < 3; di++) {
            const ql_dtype dt = dts[di];
            double worst = 0; /* the largest error / bound */
            int64_t bad = 0, count = 0;
            for (int ki = 0; ki < 6; ki++) {
                const int64_t k = ks[ki], cols = ql_input_act_cols(a, k);
                for (int rep = 0; rep < 20; rep++) {
                    const double sigma = a == 3 ? ldexp(1.0, (int)tu_range(-20, 12)) : 3.0;
                    void *x = malloc((size_t)cols * 4), *y = malloc((size_t)k * 4), *w = malloc((size_t)k * 4);
                    tu_fill_gauss(dt, x, cols, sigma);
                    const ql_dtype wdt = dts[tu_range(0, 2)];
                    for (int64_t j = 0; j < k; j++) ql_store_f(wdt, w, j, (float)(1.0 + 0.5 * tu_gauss()));
                    const float eps = rep % 2 ? 1e-6f : 0.0f;
                    ql_input_act_plan p = {a, dt, w, wdt, eps};
                    ql_input_act_row(&p, x, k, y);
                    double ms = 0;
                    for (int64_t j = 0; j < k; j++) ms += (double)ql_load_f(dt, x, j) * ql_load_f(dt, x, j);
                    const double r = 1.0 / sqrt(ms / (double)k + (double)eps);
                    for (int64_t j = 0; j < k; j++) {
                        const double xv = ql_load_f(dt, x, j), got = ql_load_f(dt, y, j);
                        double want, bound;
                        if (a == 1) {
                            want = gelu_tanh64(xv);
                            bound = 4 * u * (fabs(xv) + fabs(want)) + ulp_dt(dt, want);
                        } else if (a == 2) {
                            const double up = ql_load_f(dt, x, k + j), s = xv / (1.0 + exp(-xv));
                            want = s * up;
                            bound = fabs(up) * (4 * u * fabs(s) + ulp_dt(dt, s)) + ulp_dt(dt, want);
                        } else {
                            want = xv * r * ql_round_to(dt, ql_load_f(wdt, w, j));
                            bound = ((double)(k + 1) / 2 + 4) * u * fabs(want) + ulp_dt(dt, want);
                        }
                        /* A row that is all zeros with eps = 0 (fp16 underflows small sigmas to it) is 0·(1/0):
                         * NaN in float64 and in the reference; it must be NaN here too. */
                        const double err = isnan(want) && isnan(got) ? 0 : fabs(got - want);
                        if (!(err <= bound) && !(err == 0)) bad++;
                        else if (err / bound > worst) worst = err / bound;
                        count++;
                    }
                    free(x);
                    free(y);
                    free(w);
                }
            }
            CHECK(bad == 0, "%s %s: %lld of %lld values outside the float64 bound", act_names[a], ql_dtype_name(dt),
                  (long long)bad, (long long)count);
            printf("  %s %s vs float64: %lld values, largest error %.2f of the bound\n", act_names[a], ql_dtype_name(dt),
                   (long long)count, worst);
        }
}

/* Special values and the rms_norm zero row, row by row. */
static void test_row_edges(void)
{
    for (int di = 0; di < 3; di++) {
        const ql_dtype dt = dts[di];
        const float in[6] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1.0f};
        float out[6], g[12], o2[6];
        void *xb = malloc(12 * 4), *yb = malloc(12 * 4);
        for (int j = 0; j < 6; j++) ql_store_f(dt, xb, j, in[j]);
        ql_input_act_plan p = {QL_INPUT_ACT_GELU_TANH, dt, NULL, QL_F32, 0.0f};
        ql_input_act_row(&p, xb, 6, yb);
        for (int j = 0; j < 6; j++) out[j] = ql_load_f(dt, yb, j);
        CHECK(out[0] == INFINITY && isnan(out[1]) && isnan(out[2]) && out[3] == 0 && !signbit(out[3]) && out[4] == 0 &&
                  signbit(out[4]),
              "%s gelu_tanh of +Inf, -Inf, NaN, +0, -0: %g %g %g %g %g (want inf nan nan 0 -0)", ql_dtype_name(dt), out[0],
              out[1], out[2], out[3], out[4]);
        for (int j = 0; j < 6; j++) g[j] = in[j], g[6 + j] = 2.0f; /* gate | up */
        for (int j = 0; j < 12; j++) ql_store_f(dt, xb, j, g[j]);
        p.code = QL_INPUT_ACT_SWIGLU;
        ql_input_act_row(&p, xb, 6, yb);
        for (int j = 0; j < 6; j++) o2[j] = ql_load_f(dt, yb, j);
        CHECK(o2[0] == INFINITY && isnan(o2[1]) && isnan(o2[2]) && o2[3] == 0,
              "%s swiglu of gate +Inf, -Inf, NaN, 0 (up 2): %g %g %g %g (want inf nan nan 0)", ql_dtype_name(dt), o2[0],
              o2[1], o2[2], o2[3]);
        /* rms_norm: a zero row gives 0·(1/sqrt(0)) = NaN with eps 0, zeros with eps > 0; an Inf gives r = 0, so Inf·0 = NaN
         * in its place and zeros elsewhere (as in torch) */
        float w[4] = {1.0f, -2.0f, 0.5f, 3.0f};
        p = (ql_input_act_plan){QL_INPUT_ACT_RMS_NORM, dt, w, QL_F32, 0.0f};
        for (int j = 0; j < 4; j++) ql_store_f(dt, xb, j, 0.0f);
        ql_input_act_row(&p, xb, 4, yb);
        int all_nan = 1, all_zero = 1;
        for (int j = 0; j < 4; j++) all_nan &= isnan(ql_load_f(dt, yb, j));
        p.eps = 1e-5f;
        ql_input_act_row(&p, xb, 4, yb);
        for (int j = 0; j < 4; j++) all_zero &= ql_load_f(dt, yb, j) == 0.0f;
        ql_store_f(dt, xb, 2, INFINITY);
        ql_input_act_row(&p, xb, 4, yb);
        CHECK(all_nan && all_zero && ql_load_f(dt, yb, 0) == 0.0f && isnan(ql_load_f(dt, yb, 2)),
              "%s rms_norm: zero row eps 0 -> NaN (%d), eps 1e-5 -> 0 (%d), [0, 0, Inf, 0] -> [0, 0, NaN, 0]",
              ql_dtype_name(dt), all_nan, all_zero);
        free(xb);
        free(yb);
    }
}

/* The summation order of mean(x²) on rows where it shows: squares of 1
 * and 2^-24. K = 9: the tail element first (0 + 2^-24), then lane 0 (+ 1:
 * a tie, to 1), then the other lanes, each lost: exactly 1 (a sum of the
 * small squares first would give 1 + 2^-21). K = 40: one block of 32 slots
 * and a leftover vector, added to lanes 0-7; the four vectors of the block
 * add up lane-wise (lanes 1-7: 5·2^-24 each), then 1 + each lane in turn
 * (a sequential sum gives 1). */
static void test_sum_order(void)
{
    float v[40];
    for (int j = 0; j < 40; j++) v[j] = 0x1p-12f;
    v[0] = 1.0f;
    const float s9 = ql_rms_sum_squares(QL_F32, v, 9), s40 = ql_rms_sum_squares(QL_F32, v, 40);
    float want = 1.0f;
    for (int l = 1; l < 8; l++) want += 5 * 0x1p-24f;
    CHECK(s9 == 1.0f && s40 == want && want != 1.0f, "sum of squares order: K = 9 %a (want 0x1p+0), K = 40 %a (want %a)",
          s9, s40, want);
}

/* ---- the W8A8 pipeline against the reference */

typedef struct {
    int act;
    ql_dtype xdt, ydt;
    int64_t m, n, k, group, ldx;
} lcase;

/* x [m, cols] with some outlier channels, NaN/Inf rows and a zero row where m allows */
static void *make_x(const lcase *c, int specials)
{
    const int64_t cols = ql_input_act_cols(c->act, c->k);
    void *x = malloc((size_t)(c->m * c->ldx + cols + 1) * 4);
    tu_fill_gauss(c->xdt, x, c->m * c->ldx + cols, c->act == 3 ? 4.0 : 1.5);
    for (int64_t r = 0; r < c->m; r++)
        for (int o = 0; o < 2 && o < cols; o++) {
            const int64_t j = (o * 37 + 3) % cols;
            ql_store_f(c->xdt, x, r * c->ldx + j, ql_load_f(c->xdt, x, r * c->ldx + j) * 12.0f);
        }
    if (specials && c->m > 6) {
        ql_store_f(c->xdt, x, 2 * c->ldx + cols / 2, NAN);
        ql_store_f(c->xdt, x, 5 * c->ldx + cols - 1, tu_range(0, 1) ? INFINITY : -INFINITY);
        for (int64_t j = 0; j < cols; j++) ql_store_f(c->xdt, x, 3 * c->ldx + j, 0.0f);
    }
    return x;
}

static void case_vs_ref(const lcase *c, int specials)
{
    const int64_t n = c->n, k = c->k, m = c->m, ldy = n + 3, nscale = tu_range(0, 2) == 0 ? 1 : n;
    int8_t *q = malloc((size_t)(n * k + 1));
    float *scale = malloc((size_t)nscale * 4), *pcb = malloc((size_t)n * 4), *aw = malloc((size_t)k * 4 + 4);
    for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)(tu_next() & 0xff);
    for (int64_t i = 0; i < nscale; i++) scale[i] = (float)((0.5 + tu_uniform()) * 1e-3);
    void *x = make_x(c, specials), *bias = malloc((size_t)n * 4), *res = malloc((size_t)(m * ldy + 1) * 4),
         *rs = malloc((size_t)n * 4);
    const ql_dtype bdt = dts[tu_range(0, 2)], wdt = dts[tu_range(0, 2)];
    tu_fill_gauss(bdt, bias, n, 0.5);
    for (int64_t i = 0; i < n; i++) pcb[i] = (float)(tu_gauss() * 0.7); /* fp32: rounded to y's dtype by the call */
    tu_fill_gauss(c->ydt, res, m * ldy + 1, 1.0);
    tu_fill_gauss(c->ydt, rs, n, 1.0);
    for (int64_t j = 0; j < k; j++) ql_store_f(wdt, aw, j, (float)(1.0 + 0.3 * tu_gauss()));
    const float eps = tu_range(0, 1) ? 1e-6f : 0.0f;
    ql_int8_weight w = {n, k, q, k, scale, nscale, c->group, tu_range(0, 3) ? bias : NULL, bdt};
    /* variant 0: the layer's bias; 1: a per-call bias, a residual and GELU after */
    ql_epilogue e[2] = {{.input_act = c->act, .input_act_weight = aw, .input_act_weight_dtype = wdt, .input_act_eps = eps},
                        {.residual = res, .ld_residual = ldy, .residual_scale = rs, .activation = QL_ACTIVATION_GELU,
                         .input_act = c->act, .input_act_weight = aw, .input_act_weight_dtype = wdt, .input_act_eps = eps,
                         .bias = pcb}};
    const size_t ybytes = (size_t)(m * ldy + 1) * 4;
    void *y0 = malloc(ybytes), *y1 = malloc(ybytes);
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
    for (int v = 0; v < 2; v++) {
        memset(y0, 0x33, ybytes);
        CHECK_OK(ql_int8_linear_ref(&w, x, c->xdt, m, c->ldx, y0, c->ydt, ldy, &e[v]));
        if (specials && m > 6) {
            int nan2 = 1, nan5 = 1, row3 = 1;
            for (int64_t j = 0; j < n; j++) {
                nan2 &= isnan(ql_load_f(c->ydt, y0, 2 * ldy + j));
                nan5 &= isnan(ql_load_f(c->ydt, y0, 5 * ldy + j));
                const float y3 = ql_load_f(c->ydt, y0, 3 * ldy + j);
                /* zero row: gelu_tanh, swiglu -> 0; rms_norm -> NaN (eps 0), 0 (eps > 0); then y = bias */
                if (c->act == 3 && eps == 0.0f) row3 &= isnan(y3);
                else if (v == 0) row3 &= y3 == (w.bias ? ql_round_to(c->ydt, ql_load_f(bdt, bias, j)) : 0.0f);
            }
            CHECK(nan2 && nan5 && row3, "%s x=%s y=%s eps=%g: NaN row -> NaN (%d), Inf row -> NaN (%d), zero row (%d)",
                  act_names[c->act], ql_dtype_name(c->xdt), ql_dtype_name(c->ydt), (double)eps, nan2, nan5, row3);
        }
        for (int i = 0; i < n_isas; i++)
            for (int cx = 0; cx < N_CTX; cx++) {
                ql_linear *lin = NULL;
                CHECK_OK(ql_linear_create(ctxs[i][cx], &d, &lin));
                if (!lin) continue;
                memset(y1, 0x33, ybytes);
                CHECK_OK(ql_linear_forward(lin, x, c->xdt, m, c->ldx, y1, c->ydt, ldy, &e[v]));
                int64_t first = -1;
                const int ok = same_bits(c->ydt, y0, y1, m, n, ldy, ldy, &first);
                CHECK(ok, "%s %s %s M=%lld N=%lld K=%lld G=%lld ldx=%lld x=%s y=%s variant %d: differs from the reference at %lld",
                      act_names[c->act], ql_isa_name(isas[i]), ctx_name(cx), (long long)m, (long long)n, (long long)k,
                      (long long)c->group, (long long)c->ldx, ql_dtype_name(c->xdt), ql_dtype_name(c->ydt), v,
                      (long long)first);
                ql_linear_destroy(lin);
            }
    }
    free(q); free(scale); free(pcb); free(aw); free(x); free(bias); free(res); free(rs); free(y0); free(y1);
}

static void test_w8a8_vs_ref(void)
{
    const int64_t ms[] = {0, 1, 3, 77, 300};
    /* (K, group): odd K and tails without rotation, the G = 256 fast path and a small group with it */
    const int64_t kg[][2] = {{1, 0}, {77, 0}, {131, 0}, {512, 256}, {48, 16}};
    int cases = 0;
    for (int a = 1; a <= 3; a++)
        for (int xi = 0; xi < 3; xi++)
            for (int yi = 0; yi < 3; yi++)
                for (int gi = 0; gi < 5; gi++)
                    for (int mi = 0; mi < 5; mi++) {
                        /* every (act, x, y, ConvRot or not, M) once; the odd K rotate through */
                        if (kg[gi][1] == 0 && gi != (xi + yi + mi) % 3) continue;
                        if (kg[gi][1] != 0 && gi != 3 + (xi + mi) % 2) continue;
                        lcase c = {a, dts[xi], dts[yi], ms[mi], 40, kg[gi][0], kg[gi][1], 0};
                        c.ldx = ql_input_act_cols(a, c.k) + tu_range(0, 5); /* swiglu: often ldx > 2K */
                        case_vs_ref(&c, ms[mi] == 77);
                        cases++;
                    }
    printf("  W8A8 vs the reference: %d cases × 2 epilogues × %d ISAs × %d contexts\n", cases, n_isas, N_CTX);
}

/* One M past the chunk of rows the W8A8 and float drivers take at a time. */
static void test_chunks(void)
{
    for (int a = 1; a <= 3; a++) {
        lcase c = {a, QL_BF16, QL_BF16, 12288 + 37, 9, 20, 0, 0};
        c.ldx = ql_input_act_cols(a, c.k) + 1;
        case_vs_ref(&c, 0);
    }
}

/* ---- every kind: input_act fused = the same layer on the pre-activated input */

static void *preactivate(const ql_epilogue *e, ql_dtype xdt, const void *x, int64_t m, int64_t ldx, int64_t k)
{
    void *xa = malloc((size_t)(m * k + 1) * 4);
    const ql_input_act_plan p = ql_input_act_plan_of(e, xdt);
    for (int64_t r = 0; r < m; r++) ql_input_act_row(&p, ql_row_cptr(xdt, x, r, ldx), k, ql_row_ptr(xdt, xa, r, k));
    return xa;
}

static const char *kind_name(int kd)
{
    static const char *const names[] = {"W8A8+LoRA",          "WXA8_PACKED",   "W4A8 asym (W8A8)", "WEIGHT_ONLY",
                                        "WEIGHT_ONLY ConvRot", "DENSE fp32",    "DENSE bf16",       "DEQUANT ConvRot"};
    return names[kd];
}

/* A layer of kind kd ([n, k]; k a multiple of 256) with an fp32 bias; for
 * W8A8+LoRA a LoRA attached. (A linear keeps copies of what it needs.) */
static ql_linear *make_kind(ql_context *ctx, int kd, int64_t n, int64_t k, const float *bias)
{
    float *wf = malloc((size_t)(n * k) * 4);
    tu_fill_gauss(QL_F32, wf, n * k, 0.02);
    for (int64_t i = 0; i < n * k; i++) wf[i] += kd == 2 ? 0.01f : 0.0f;
    int8_t *q = malloc((size_t)(n * k));
    float *sc = malloc((size_t)n * 4);
    ql_linear_desc d = {0};
    uint8_t *pq = NULL, *sr = NULL;
    float *corr = NULL, *corr_rows = NULL;
    if (kd == 1 || kd == 2) { /* W4A8: uniform (packed) or asymmetric (run as W8A8 with its correction) */
        const int64_t g = 16, ng = k / g;
        pq = malloc((size_t)(n * k / 2));
        sr = malloc((size_t)(n * ng));
        ql_wxa8_qparams p = {kd == 1 ? QL_WXA8_UNIFORM : QL_WXA8_ASYM, g, 256, NULL, 0};
        if (kd == 2) corr_rows = malloc((size_t)(n * ng) * 4), corr = malloc((size_t)(n * ng) * 4);
        CHECK_OK(ql_wxa8_quantize(QL_F32, wf, n, k, k, &p, pq, k / 2, sr, sc, corr_rows));
        for (int64_t r = 0; kd == 2 && r < n; r++)
            for (int64_t gi = 0; gi < ng; gi++) corr[gi * n + r] = corr_rows[r * ng + gi];
        d.kind = kd == 1 ? QL_LINEAR_WXA8_PACKED : QL_LINEAR_W8A8;
        d.wxa8 = (ql_wxa8_weight){.n = n, .k = k, .bits = 4, .q = pq, .ldq = k / 2, .s_rel = sr, .s_channel = sc,
                                  .correction = corr, .correction_dtype = QL_F32, .group = g, .convrot_group = 256,
                                  .bias = bias, .bias_dtype = QL_F32};
    } else if (kd == 5 || kd == 6) {
        d = (ql_linear_desc){.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = wf, .ld_weight = k, .weight_dtype = QL_F32,
                             .compute_dtype = kd == 6 ? QL_BF16 : QL_F32, .bias = bias, .bias_dtype = QL_F32};
    } else {
        const int64_t g = kd == 0 || kd == 4 || kd == 7 ? 256 : 0;
        CHECK_OK(g ? ql_quantize_convrot_weight(QL_F32, wf, n, k, k, g, q, k, sc) : ql_quantize_rowwise(QL_F32, wf, n, k, k, q, k, sc));
        d.kind = kd == 0 ? QL_LINEAR_W8A8 : kd == 7 ? QL_LINEAR_DEQUANT : QL_LINEAR_WEIGHT_ONLY;
        d.int8 = (ql_int8_weight){n, k, q, k, sc, n, g, bias, QL_F32};
    }
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    if (lin && kd == 0) {
        const int64_t rk = 5;
        float *down = malloc((size_t)(rk * k) * 4), *up = malloc((size_t)(n * rk) * 4);
        tu_fill_gauss(QL_F32, down, rk * k, 1.0 / 16);
        tu_fill_gauss(QL_F32, up, n * rk, 0.1);
        ql_lora_desc ld = {rk, down, QL_F32, k, up, QL_F32, rk, 0.5};
        CHECK_OK(ql_linear_add_lora(lin, &ld, NULL));
        free(down);
        free(up);
    }
    free(wf); free(q); free(sc); free(pq); free(sr); free(corr); free(corr_rows);
    return lin;
}

static void test_kinds(void)
{
    const int64_t n = 37, k = 512, ms[] = {1, 5, 130};
    for (int kd = 0; kd < 8; kd++)
        for (int i = 0; i < n_isas; i++) {
            ql_context *ctx = ctxs[i][1 + (kd % 2)];
            float *bias = malloc((size_t)n * 4);
            for (int64_t j = 0; j < n; j++) bias[j] = (float)tu_gauss();
            ql_linear *lin = make_kind(ctx, kd, n, k, bias);
            for (int mi = 0; mi < 3; mi++)
                for (int a = 1; a <= 3 && lin; a++) {
                    const ql_dtype xdt = dts[(mi + a) % 3], ydt = dts[(mi + 2 * a) % 3];
                    lcase c = {a, xdt, ydt, ms[mi], n, k, 0, ql_input_act_cols(a, k) + (a == 2 ? 3 : 0)};
                    void *x = make_x(&c, 0), *aw = malloc((size_t)k * 4);
                    for (int64_t j = 0; j < k; j++) ql_store_f(QL_BF16, aw, j, (float)(1.0 + 0.3 * tu_gauss()));
                    ql_epilogue e = {.input_act = a, .input_act_weight = aw, .input_act_weight_dtype = QL_BF16,
                                     .input_act_eps = 1e-6f};
                    void *xa = preactivate(&e, xdt, x, c.m, c.ldx, k);
                    const size_t yb = (size_t)(c.m * n) * 4;
                    void *y0 = malloc(yb), *y1 = malloc(yb);
                    CHECK_OK(ql_linear_forward(lin, x, xdt, c.m, c.ldx, y1, ydt, n, &e));
                    CHECK_OK(ql_linear_forward(lin, xa, xdt, c.m, k, y0, ydt, n, NULL));
                    int64_t first = -1;
                    CHECK(same_bits(ydt, y0, y1, c.m, n, n, n, &first),
                          "%s %s %s M=%lld x=%s y=%s: input_act differs from the pre-activated input at %lld", kind_name(kd),
                          ql_isa_name(isas[i]), act_names[a], (long long)c.m, ql_dtype_name(xdt), ql_dtype_name(ydt),
                          (long long)first);
                    /* the per-call bias takes the layer bias's route: the layer's own, passed per call, changes nothing */
                    ql_epilogue eb = e;
                    eb.bias = bias;
                    CHECK_OK(ql_linear_forward(lin, x, xdt, c.m, c.ldx, y0, ydt, n, &eb));
                    CHECK(same_bits(ydt, y0, y1, c.m, n, n, n, &first),
                          "%s %s M=%lld y=%s: the layer's own bias passed per call changes the output at %lld", kind_name(kd),
                          ql_isa_name(isas[i]), (long long)c.m, ql_dtype_name(ydt), (long long)first);
                    free(x); free(aw); free(xa); free(y0); free(y1);
                }
            ql_linear_destroy(lin);
            free(bias);
        }
}

/* A per-call bias: fp32 values not in y's dtype act as their rounding; a
 * layer without a bias called with one equals the layer built with it; the
 * override replaces the layer's. W8A8 on every ISA, against the reference. */
static void test_call_bias(void)
{
    const int64_t n = 70, k = 256, m = 33;
    int8_t *q = malloc((size_t)(n * k));
    float *sc = malloc((size_t)n * 4), *b32 = malloc((size_t)n * 4), *brd = malloc((size_t)n * 4);
    float *x = malloc((size_t)(m * k) * 4);
    for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)(tu_next() & 0xff);
    for (int64_t i = 0; i < n; i++) sc[i] = (float)((0.5 + tu_uniform()) * 1e-3);
    tu_fill_gauss(QL_F32, x, m * k, 1.0);
    for (int di = 0; di < 3; di++) {
        const ql_dtype ydt = dts[di];
        for (int64_t i = 0; i < n; i++) {
            b32[i] = (float)tu_gauss() * (i % 7 == 0 ? 1e-38f : 1.0f); /* some near the subnormals */
            brd[i] = ql_round_to(ydt, b32[i]);
        }
        ql_int8_weight built = {n, k, q, k, sc, n, 256, brd, QL_F32}, bare = built;
        bare.bias = NULL;
        const size_t yb = (size_t)(m * n) * 4;
        void *y_built = malloc(yb), *y0 = malloc(yb), *y1 = malloc(yb);
        CHECK_OK(ql_int8_linear_ref(&built, x, QL_F32, m, k, y_built, ydt, n, NULL));
        ql_epilogue e = {.bias = b32};
        CHECK_OK(ql_int8_linear_ref(&bare, x, QL_F32, m, k, y0, ydt, n, &e));
        int64_t first = -1;
        CHECK(same_bits(ydt, y_built, y0, m, n, n, n, &first),
              "reference y=%s: a per-call fp32 bias differs from the layer built with it rounded, at %lld", ql_dtype_name(ydt),
              (long long)first);
        bare.bias = x; /* some other bias, overridden */
        bare.bias_dtype = QL_F32;
        for (int i = 0; i < n_isas; i++) {
            ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = bare};
            ql_linear *lin = NULL;
            CHECK_OK(ql_linear_create(ctxs[i][0], &d, &lin));
            if (!lin) continue;
            CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, k, y1, ydt, n, &e));
            CHECK(same_bits(ydt, y_built, y1, m, n, n, n, &first),
                  "%s y=%s: the per-call bias over another layer bias differs from the layer built with it, at %lld",
                  ql_isa_name(isas[i]), ql_dtype_name(ydt), (long long)first);
            ql_linear_destroy(lin);
        }
        free(y_built); free(y0); free(y1);
    }
    free(q); free(sc); free(b32); free(brd); free(x);
}

/* ---- argument checks */

static int has(const char *msg, const char *a, const char *b)
{
    return strstr(msg, a) != NULL && (b == NULL || strstr(msg, b) != NULL);
}

static void test_checks(void)
{
    const int64_t n = 8, k = 16, m = 4;
    int8_t q[8 * 16] = {0};
    float sc = 1e-3f, x[4 * 32] = {0}, y[4 * 8], aw[16];
    for (int j = 0; j < 16; j++) aw[j] = 1.0f;
    ql_int8_weight w = {n, k, q, k, &sc, 1, 0, NULL, QL_F32};
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctxs[0][0], &d, &lin));
    if (!lin) return;
    struct {
        ql_epilogue e;
        int64_t ldx;
        ql_status want;
        const char *a, *b;
    } bad[] = {
        {{.input_act = 9}, 16, QL_ERR_INVALID_ARGUMENT, "unknown input_act 9", NULL},
        {{.input_act = -1}, 16, QL_ERR_INVALID_ARGUMENT, "unknown input_act -1", NULL},
        {{.input_act = QL_INPUT_ACT_RMS_NORM}, 16, QL_ERR_INVALID_ARGUMENT, "rms_norm", "input_act_weight"},
        {{.input_act = QL_INPUT_ACT_RMS_NORM, .input_act_weight = aw, .input_act_weight_dtype = QL_I8}, 16,
         QL_ERR_UNSUPPORTED, "input_act_weight dtype int8", NULL},
        {{.input_act = QL_INPUT_ACT_RMS_NORM, .input_act_weight = aw, .input_act_eps = NAN}, 16, QL_ERR_INVALID_ARGUMENT,
         "input_act_eps", "not finite"},
        {{.input_act = QL_INPUT_ACT_RMS_NORM, .input_act_weight = aw, .input_act_eps = INFINITY}, 16,
         QL_ERR_INVALID_ARGUMENT, "input_act_eps", "not finite"},
        {{.input_act = QL_INPUT_ACT_SWIGLU}, 16, QL_ERR_INVALID_ARGUMENT, "2K = 32", "swiglu"},
        {{.input_act = QL_INPUT_ACT_SWIGLU}, 31, QL_ERR_INVALID_ARGUMENT, "row stride 31", "swiglu"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ql_status s1 = ql_linear_forward(lin, x, QL_F32, m, bad[i].ldx, y, QL_F32, n, &bad[i].e);
        const int ok1 = s1 == bad[i].want && has(ql_last_error(), "ql_linear_forward: ", bad[i].a) &&
                        has(ql_last_error(), bad[i].b ? bad[i].b : "", NULL);
        CHECK(ok1, "bad epilogue %zu: ql_linear_forward -> %s: \"%s\" (want %s naming \"%s\")", i, ql_status_string(s1),
              ql_last_error(), ql_status_string(bad[i].want), bad[i].a);
        ql_status s2 = ql_int8_linear_ref(&w, x, QL_F32, m, bad[i].ldx, y, QL_F32, n, &bad[i].e);
        CHECK(s2 == bad[i].want && has(ql_last_error(), "ql_int8_linear_ref: ", bad[i].a),
              "bad epilogue %zu: ql_int8_linear_ref -> %s: \"%s\"", i, ql_status_string(s2), ql_last_error());
    }
    /* accepted: swiglu with ldx = 2K, and one row with any stride; rms_norm with eps 0 and a bf16 weight */
    ql_epilogue sw = {.input_act = QL_INPUT_ACT_SWIGLU};
    CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, 32, y, QL_F32, n, &sw));
    CHECK_OK(ql_linear_forward(lin, x, QL_F32, 1, 3, y, QL_F32, n, &sw));
    uint16_t awb[16];
    for (int j = 0; j < 16; j++) awb[j] = ql_fp32_to_bf16(1.0f);
    ql_epilogue rn = {.input_act = QL_INPUT_ACT_RMS_NORM, .input_act_weight = awb, .input_act_weight_dtype = QL_BF16};
    CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, 16, y, QL_F32, n, &rn));
    ql_linear_destroy(lin);
}

int main(void)
{
    tu_init("test_input_act");
    n_isas = tu_isas(isas);
    for (int i = 0; i < n_isas; i++)
        for (int c = 0; c < N_CTX; c++) {
            CHECK_OK(ql_context_create(&ctxs[i][c]));
            CHECK_OK(ql_context_set_isa(ctxs[i][c], isas[i]));
            CHECK_OK(ql_context_set_threads(ctxs[i][c], c == 0 ? 1 : 3));
            if (c > 0) ctxs[i][c]->serial_work = 0; /* split even tiny layers over the threads */
            if (c == 2) ctxs[i][c]->small_m = 0;    /* the blocked path for every M */
        }
    test_rows_vs_float64();
    test_row_edges();
    test_sum_order();
    test_checks();
    test_call_bias();
    test_w8a8_vs_ref();
    test_chunks();
    test_kinds();
    for (int i = 0; i < n_isas; i++)
        for (int c = 0; c < N_CTX; c++) ql_context_destroy(ctxs[i][c]);
    return tu_finish();
}
