/* The fused W8A8 pipeline of every ISA equals the eager reference
 * (ql_int8_linear_ref) bit for bit, for every dtype, group, bias/residual,
 * stride, thread count and odd shape; the reference itself is checked
 * against float64; ConvRot helps on outlier activations; bad input fails
 * with a message. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "quant/quant.h" /* ql_load_row_rotated: the rotation, checked against x·H in test_quant */
#include "testutil.h"

/* every ISA this CPU runs, generic first (tu_isas: the registry walked) */
static ql_isa isas[32];
static int n_isas;
static const ql_dtype dts[] = {QL_F32, QL_BF16, QL_F16};
static const int64_t groups[] = {0, 4, 16, 64, 256};
static double x_sigma = 1.0; /* scale of the random activations */
static double w_scale = 1e-3; /* magnitude of the weight scales */

static int same_bits(ql_dtype dt, const void *a, const void *b, int64_t m, int64_t n, int64_t lda, int64_t ldb,
                     int64_t *first)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float x = ql_load_f(dt, a, i * lda + j), y = ql_load_f(dt, b, i * ldb + j);
            if (!(memcmp(&x, &y, 4) == 0 || (isnan(x) && isnan(y)))) {
                *first = i * n + j;
                return 0;
            }
        }
    return 1;
}

static void random_weight(int64_t n, int64_t k, int8_t *q, float *scale, int64_t nscale)
{
    for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)(tu_next() & 0xff);
    for (int64_t i = 0; i < nscale; i++) scale[i] = (float)((0.5 + tu_uniform()) * w_scale);
}

static void case_vs_ref(ql_context *ctx, int64_t m, int64_t n, int64_t k, int64_t g, ql_dtype xdt, ql_dtype ydt,
                        int with_bias, int with_res, int nan_row)
{
    const int64_t ldx = k + tu_range(0, 9), ldy = n + tu_range(0, 9), nscale = tu_range(0, 3) == 0 ? 1 : n;
    int8_t *q = malloc((size_t)(n * k + 1));
    float *scale = malloc((size_t)nscale * 4);
    random_weight(n, k, q, scale, nscale);
    void *x = malloc((size_t)(m * ldx + 1) * 4), *bias = malloc((size_t)n * 4);
    tu_fill_gauss(xdt, x, m * ldx, x_sigma);
    for (int64_t c = 0; c < 3 && c < k; c++) /* a few outlier channels */
        for (int64_t r = 0; r < m; r++) ql_store_f(xdt, x, r * ldx + c * 7 % k, ql_load_f(xdt, x, r * ldx + c * 7 % k) * 40.0f);
    if (nan_row && m > 2) ql_store_f(xdt, x, 2 * ldx + k / 2, NAN);
    ql_dtype bdt = dts[tu_range(0, 2)];
    tu_fill_gauss(bdt, bias, n, 0.5);
    void *res = malloc((size_t)(m * ldy + 1) * 4), *rs = malloc((size_t)n * 4);
    tu_fill_gauss(ydt, res, m * ldy, 1.0);
    tu_fill_gauss(ydt, rs, n, 1.0);
    const int act = (int)tu_range(0, 1); /* GELU after the bias, before the residual */
    ql_epilogue epi = {.residual = with_res ? res : NULL, .ld_residual = ldy, .residual_scale = with_res ? rs : NULL, .activation = act};
    const ql_epilogue *ep = with_res || act ? &epi : NULL;
    ql_int8_weight w = {n, k, q, k, scale, nscale, g, with_bias ? bias : NULL, bdt};
    void *y0 = malloc((size_t)(m * ldy + 1) * 4), *y1 = malloc((size_t)(m * ldy + 1) * 4);
    memset(y0, 0x33, (size_t)(m * ldy) * 4);
    memset(y1, 0x33, (size_t)(m * ldy) * 4);
    CHECK_OK(ql_int8_linear_ref(&w, x, xdt, m, ldx, y0, ydt, ldy, ep));
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    if (lin) CHECK_OK(ql_linear_forward(lin, x, xdt, m, ldx, y1, ydt, ldy, ep));
    int64_t first = -1;
    int ok = same_bits(ydt, y0, y1, m, n, ldy, ldy, &first);
    /* the gaps between rows of y are not written */
    for (int64_t i = 0; ok && i + 1 < m; i++)
        for (int64_t j = n * 4; j < ldy * 4; j++) ok &= ((unsigned char *)y1)[i * ldy * 4 + j] == 0x33 || ydt != QL_F32;
    CHECK(ok, "%s t%d M=%lld N=%lld K=%lld G=%lld x=%s y=%s bias=%d gelu=%d res=%d nscale=%lld: differs from the reference at %lld",
          ql_isa_name(ql_context_isa(ctx)), ql_context_threads(ctx), (long long)m, (long long)n, (long long)k,
          (long long)g, ql_dtype_name(xdt), ql_dtype_name(ydt), with_bias, act, with_res, (long long)nscale, (long long)first);
    if (nan_row && m > 2) {
        int all_nan = 1;
        for (int64_t j = 0; j < n; j++) all_nan &= isnan(ql_load_f(ydt, y1, 2 * ldy + j));
        CHECK(all_nan, "a NaN input row did not give a NaN output row");
    }
    ql_linear_destroy(lin);
    free(q); free(scale); free(x); free(bias); free(res); free(rs); free(y0); free(y1);
}

/* Bias sums that land on bf16 subnormals. vcvtne2ps2bf16 would flush them,
 * so the fast epilogue must step aside. Built so that s_x·s_w is just above
 * 2^-126 and the products small normals: x rows hold 1.0 (code 127, in a
 * column whose weights are 0) and sparse ±c/127 (codes ±c), the weights are
 * sparse ±1 with scale 2^-119; then bias[j] = -(y0[j] less one ulp), so row
 * 0's sums are one ulp of a value below 2^-118: subnormal. */
static void test_subnormal_bias(ql_context *ctx)
{
    const int64_t m = 16, n = 64, k = 256;
    int8_t *q = malloc((size_t)(n * k));
    float *scale = malloc((size_t)n * 4), *x = malloc((size_t)(m * k) * 4);
    uint16_t *bias = malloc((size_t)n * 2), *y0 = malloc((size_t)(m * n) * 2), *y1 = malloc((size_t)(m * n) * 2);
    for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)(i % k && tu_range(0, 7) == 0 ? (tu_next() & 1 ? 1 : -1) : 0);
    for (int64_t i = 0; i < n; i++) scale[i] = 0x1p-119f;
    for (int64_t i = 0; i < m * k; i++)
        x[i] = i % k == 0 ? 1.0f : tu_range(0, 7) == 0 ? (float)(tu_range(1, 3) * (tu_next() & 1 ? 1 : -1)) / 127.0f : 0.0f;
    ql_int8_weight w = {n, k, q, k, scale, n, 0, NULL, QL_BF16};
    CHECK_OK(ql_int8_linear_ref(&w, x, QL_F32, m, k, y0, QL_BF16, n, NULL));
    for (int64_t j = 0; j < n; j++) /* y0[0][j] + bias[j] = ± one ulp of y0[0][j] */
        bias[j] = (y0[j] & 0x7fff) > 1 ? (uint16_t)((((y0[j] & 0x7fff) - 1) | (~y0[j] & 0x8000))) : ql_fp32_to_bf16(0x1p-120f);
    w.bias = bias;
    CHECK_OK(ql_int8_linear_ref(&w, x, QL_F32, m, k, y0, QL_BF16, n, NULL));
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    if (lin) CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, k, y1, QL_BF16, n, NULL));
    int64_t first = -1, subnormal = 0;
    for (int64_t i = 0; i < m * n; i++) subnormal += (y0[i] & 0x7f80) == 0 && (y0[i] & 0x7f) != 0;
    CHECK(subnormal >= n / 2, "the subnormal-bias case produced only %lld subnormal outputs", (long long)subnormal);
    const int same = same_bits(QL_BF16, y0, y1, m, n, n, n, &first);
    CHECK(same, "%s: subnormal bias sums differ from the reference at %lld",
          ql_isa_name(ql_context_isa(ctx)), (long long)first);
    ql_linear_destroy(lin);
    free(q); free(scale); free(x); free(bias); free(y0); free(y1);
}

/* Quotients on and beside every rounding step. The fast prologues divide by
 * multiplying with RN(1/st) and fall back to a true division only where the
 * product lies within 2 ulps of a step (a dtype rounding midpoint, or a
 * half-integer for fp32); rows built only from values whose quotient is in
 * that window, or whose naive product would even give another code, must
 * still give the reference's codes. G = 0, so the values reach the
 * quantizer as they are; the first value, A, fixes the scale. For bf16 no
 * such value exists (v and st both have 8-bit significands, so v/st is at
 * least 2^-17 away from any bf16 midpoint, relatively): the search over 64
 * scales must find none, which the prologues rely on. fp32 values are put
 * on purpose beside half-integer quotients, where the naive product gives
 * other codes; fp16 ones are searched for (rarer, and found in the window). */
static int risky_window(ql_dtype dt, float q)
{
    uint32_t u;
    memcpy(&u, &q, 4);
    if (fabsf(q) < 0x1p-14f) return 0; /* code 0 however it rounds */
    if (dt == QL_BF16) return ((u - 0x7FFEu) & 0xFFFFu) <= 4;
    if (dt == QL_F16) return ((u - 0x0FFEu) & 0x1FFFu) <= 4;
    return fabsf(q - rintf(q)) >= 0.5f - 0x1p-14f;
}

static void test_risky_quotients(ql_context *ctx)
{
    const int64_t k = 1024, m = 4, n = 40;
    for (int di = 0; di < 3; di++) {
        const ql_dtype dt = dts[di];
        float *x = malloc((size_t)(m * k) * 4), *vals = malloc((size_t)k * 4);
        int64_t found = 0, wrong_naive = 0;
        /* row r: the first maximum A (from a seeded start) whose scale admits
         * risky quotients, then those values, cycled, with random signs */
        float amax = 20.0f + (float)tu_range(0, 60);
        for (int64_t r = 0; r < m; r++) {
            int64_t nv = 0;
            for (int tries = 0; nv == 0 && tries < (dt == QL_BF16 ? 64 : 400); tries++) {
                /* the next A whose scale divisor st is another value of the dtype */
                const float st0 = ql_scale_divisor(dt, ql_scale_from_absmax(ql_round_to(dt, amax)));
                while (ql_scale_divisor(dt, ql_scale_from_absmax(ql_round_to(dt, amax))) == st0) amax *= 1.0f + 0x1p-12f;
                const float a = ql_round_to(dt, amax), st = ql_scale_divisor(dt, ql_scale_from_absmax(a)), rcp = 1.0f / st;
                const uint32_t nb = dt == QL_F32 ? 200u * 9u : 0x7C00u; /* fp32: (j + 1/2)·st ± 4 ulps */
                for (uint32_t b = 1; b < nb && nv < k - 1; b++) {
                    float v;
                    if (dt == QL_F32) {
                        v = (float)((int)(b / 9) - 100 + 0.5) * st;
                        for (int u = 0; u < (int)(b % 9); u++) v = nextafterf(v, INFINITY);
                        for (int u = 0; u < 4; u++) v = nextafterf(v, -INFINITY);
                    } else v = dt == QL_BF16 ? ql_bf16_to_fp32((uint16_t)b) : ql_fp16_to_fp32((uint16_t)b);
                    if (!(fabsf(v) < a) || v == 0.0f) continue;
                    const float q = v * rcp;
                    const int naive = (int)rintf(ql_round_to(dt, q)), ref = (int)rintf(ql_round_to(dt, v / st));
                    if (!risky_window(dt, q) && naive == ref) continue;
                    wrong_naive += naive != ref;
                    vals[nv++] = v;
                }
                if (nv) x[r * k] = a;
            }
            found += nv;
            for (int64_t c = 1; c < k; c++) x[r * k + c] = nv ? (tu_next() & 1 ? vals[c % nv] : -vals[c % nv]) : 0.0f;
        }
        void *xd = malloc((size_t)(m * k) * 4);
        CHECK_OK(ql_convert(x, QL_F32, xd, dt, m * k));
        int8_t *q = malloc((size_t)(n * k));
        float scale[40];
        random_weight(n, k, q, scale, n);
        float *y0 = malloc((size_t)(m * n) * 4), *y1 = malloc((size_t)(m * n) * 4);
        ql_int8_weight w = {n, k, q, k, scale, n, 0, NULL, QL_F32};
        CHECK_OK(ql_int8_linear_ref(&w, xd, dt, m, k, y0, QL_F32, n, NULL));
        ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
        ql_linear *lin = NULL;
        CHECK_OK(ql_linear_create(ctx, &d, &lin));
        if (lin) CHECK_OK(ql_linear_forward(lin, xd, dt, m, k, y1, QL_F32, n, NULL));
        int64_t first = -1;
        const int same = same_bits(QL_F32, y0, y1, m, n, n, n, &first);
        if (dt == QL_BF16) CHECK(found == 0, "bf16: %lld quotients of two bf16 values lie within 2 ulps of a bf16 midpoint", (long long)found);
        else CHECK(found >= m * 4 && (dt == QL_F16 || wrong_naive > 0),
                   "%s: only %lld risky quotients, %lld where the naive code is wrong", ql_dtype_name(dt), (long long)found,
                   (long long)wrong_naive);
        CHECK(same, "%s x=%s: %lld risky quotients (%lld where v·RN(1/st) alone gives another code): differs at %lld",
              ql_isa_name(ql_context_isa(ctx)), ql_dtype_name(dt), (long long)found, (long long)wrong_naive, (long long)first);
        ql_linear_destroy(lin);
        free(x); free(vals); free(xd); free(q); free(y0); free(y1);
    }
}

/* The reference against float64 on the unquantized layer. */
static double rel_l2_vs_f64(int64_t m, int64_t n, int64_t k, int64_t g, double outlier)
{
    float *x = malloc((size_t)(m * k) * 4), *w = malloc((size_t)(n * k) * 4), *y = malloc((size_t)(m * n) * 4);
    tu_fill_gauss(QL_F32, x, m * k, 1.0);
    tu_fill_gauss(QL_F32, w, n * k, 0.02);
    for (int64_t c = 0; c < 8; c++)
        for (int64_t r = 0; r < m; r++) x[r * k + (c * 37) % k] *= (float)outlier;
    int8_t *q = malloc((size_t)(n * k));
    float *s = malloc((size_t)n * 4);
    if (g) CHECK_OK(ql_quantize_convrot_weight(QL_F32, w, n, k, k, g, q, k, s));
    else CHECK_OK(ql_quantize_rowwise(QL_F32, w, n, k, k, q, k, s));
    ql_int8_weight qw = {n, k, q, k, s, n, g, NULL, QL_F32};
    CHECK_OK(ql_int8_linear_ref(&qw, x, QL_F32, m, k, y, QL_F32, n, NULL));
    double num = 0, den = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double r = 0;
            for (int64_t p = 0; p < k; p++) r += (double)x[i * k + p] * w[j * k + p];
            num += (y[i * n + j] - r) * (y[i * n + j] - r);
            den += r * r;
        }
    free(x); free(w); free(y); free(q); free(s);
    return sqrt(num / den);
}

static void test_accuracy(void)
{
    double plain = rel_l2_vs_f64(16, 48, 1024, 0, 1.0), rot = rel_l2_vs_f64(16, 48, 1024, 256, 1.0);
    printf("  gaussian: rel L2 vs float64: plain %.4f, ConvRot %.4f\n", plain, rot);
    CHECK(plain < 0.03 && rot < 0.03, "int8_linear rel L2 %.4f / %.4f above the 3%% tolerance", plain, rot);
    double plain_o = rel_l2_vs_f64(16, 48, 1024, 0, 50.0), rot_o = rel_l2_vs_f64(16, 48, 1024, 256, 50.0);
    printf("  outlier channels x50: plain %.4f, ConvRot %.4f\n", plain_o, rot_o);
    CHECK(rot_o < 0.5 * plain_o, "ConvRot (%.4f) does not beat no rotation (%.4f) on outlier data", rot_o, plain_o);
}

/* Dense and dequantize-per-call paths against float64. */
static void test_float_paths(ql_context *ctx)
{
    const int64_t m = 29, n = 45, k = 512;
    float *x = malloc(m * k * 4), *w = malloc(n * k * 4), *y = malloc(m * n * 4), *yd = malloc(m * n * 4);
    tu_fill_gauss(QL_F32, x, m * k, 1.0);
    tu_fill_gauss(QL_F32, w, n * k, 0.02);
    ql_linear_desc d = {.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = w, .ld_weight = k, .weight_dtype = QL_F32,
                        .compute_dtype = QL_F32};
    ql_linear *lin;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, k, y, QL_F32, n, NULL));
    ql_linear_destroy(lin);
    int8_t *q = malloc(n * k);
    float *s = malloc(n * 4);
    CHECK_OK(ql_quantize_convrot_weight(QL_F32, w, n, k, k, 256, q, k, s));
    ql_linear_desc dq = {.kind = QL_LINEAR_DEQUANT, .int8 = {n, k, q, k, s, n, 256, NULL, QL_F32}};
    CHECK_OK(ql_linear_create(ctx, &dq, &lin));
    CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, k, yd, QL_F32, n, NULL));
    ql_linear_destroy(lin);
    double e = 0, ed = 0, den = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double r = 0;
            for (int64_t p = 0; p < k; p++) r += (double)x[i * k + p] * w[j * k + p];
            e = fmax(e, fabs(y[i * n + j] - r));
            ed += (yd[i * n + j] - r) * (yd[i * n + j] - r);
            den += r * r;
        }
    CHECK(e < 1e-4, "%s dense fp32 differs from float64 by %g", ql_isa_name(ql_context_isa(ctx)), e);
    CHECK(sqrt(ed / den) < 0.02, "%s dequant path rel L2 %g", ql_isa_name(ql_context_isa(ctx)), sqrt(ed / den));
    free(x); free(w); free(y); free(yd); free(q); free(s);
}

/* Weight-only (int8 codes decoded to fp32, activations rotated but not
 * quantized) and bf16 dense, against float64 models of exactly what they
 * compute: |y - model| <= 1 ulp of the output dtype (fp16: at least its
 * subnormal spacing 2^-24, where the relative ulp no longer holds) +
 * 2^-20 Σ|terms|. */
static void test_weight_only_and_bf16(ql_context *ctx)
{
    for (int trial = 0; trial < 4; trial++) {
        const int64_t m = tu_range(1, 30), n = tu_range(1, 70), g = trial % 2 ? 256 : 0, k = g ? 512 : tu_range(1, 300);
        const ql_dtype xdt = dts[tu_range(0, 2)], ydt = dts[tu_range(0, 2)];
        void *x = malloc((size_t)(m * k) * 4), *y = malloc((size_t)(m * n) * 4), *yb = malloc((size_t)(m * n) * 4);
        float *xf = malloc((size_t)(m * k) * 4), *w = malloc((size_t)(n * k) * 4), *s = malloc((size_t)n * 4);
        int8_t *q = malloc((size_t)(n * k));
        tu_fill_gauss(xdt, x, m * k, 1.0);
        tu_fill_gauss(QL_F32, w, n * k, 0.05);
        random_weight(n, k, q, s, n);
        for (int64_t r = 0; r < m; r++) ql_load_row_rotated(xdt, ql_row_cptr(xdt, x, r, k), k, g, xf + r * k);
        ql_linear *lin;
        ql_linear_desc d = {.kind = QL_LINEAR_WEIGHT_ONLY, .int8 = {n, k, q, k, s, n, g, NULL, QL_F32}};
        CHECK_OK(ql_linear_create(ctx, &d, &lin));
        CHECK_OK(ql_linear_forward(lin, x, xdt, m, k, y, ydt, n, NULL));
        ql_linear_destroy(lin);
        ql_linear_desc db = {.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = w, .ld_weight = k, .weight_dtype = QL_F32,
                             .compute_dtype = QL_BF16};
        CHECK_OK(ql_linear_create(ctx, &db, &lin));
        CHECK_OK(ql_linear_forward(lin, x, xdt, m, k, yb, ydt, n, NULL));
        ql_linear_destroy(lin);
        int64_t bad = 0, badb = 0;
        const float ulp = ydt == QL_F32 ? 0x1p-23f : ydt == QL_F16 ? 0x1p-10f : 0x1p-7f;
        const double sub = ydt == QL_F16 ? 0x1p-24 : 1e-30; /* fp16's subnormal spacing; 1e-30 covers bf16's and fp32's */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double acc = 0, mag = 0, accb = 0, magb = 0;
                for (int64_t p = 0; p < k; p++) {
                    acc += (double)xf[i * k + p] * q[j * k + p];
                    mag += fabs((double)xf[i * k + p] * q[j * k + p]);
                    double xb = ql_round_to(QL_BF16, ql_load_f(xdt, x, i * k + p)), wb = ql_round_to(QL_BF16, w[j * k + p]);
                    accb += xb * wb;
                    magb += fabs(xb * wb);
                }
                double v = acc * s[j], got = ql_load_f(ydt, y, i * n + j);
                bad += fabs(got - v) > ulp * fabs(v) + 0x1p-20 * mag * s[j] + sub;
                double gotb = ql_load_f(ydt, yb, i * n + j);
                if (fabs(gotb - accb) > ulp * fabs(accb) + 0x1p-20 * magb + sub && !badb++)
                    printf("  first off: m=%lld n=%lld k=%lld [%lld,%lld] got %.9g model %.9g sum|terms| %.9g\n", (long long)m,
                           (long long)n, (long long)k, (long long)i, (long long)j, gotb, accb, magb);
            }
        CHECK(bad == 0, "%s weight-only G=%lld x=%s y=%s: %lld of %lld outputs off the float64 model",
              ql_isa_name(ql_context_isa(ctx)), (long long)g, ql_dtype_name(xdt), ql_dtype_name(ydt), (long long)bad, (long long)(m * n));
        CHECK(badb == 0, "%s bf16 dense x=%s y=%s: %lld of %lld outputs off the float64 model", ql_isa_name(ql_context_isa(ctx)),
              ql_dtype_name(xdt), ql_dtype_name(ydt), (long long)badb, (long long)(m * n));
        free(x); free(y); free(yb); free(xf); free(w); free(s); free(q);
    }
}

/* Several threads calling forward on one linear (one context) at once: the
 * context's workspace goes to one of them, the others allocate their own. */
typedef struct {
    ql_linear *lin;
    const ql_int8_weight *w;
    uint16_t x[40 * 512], y[40 * 64], ref[40 * 64];
    int ok;
} conc_job;

static void *conc_run(void *arg)
{
    conc_job *j = arg;
    j->ok = 1;
    for (int it = 0; it < 20 && j->ok; it++) {
        j->ok = ql_linear_forward(j->lin, j->x, QL_BF16, 40, 512, j->y, QL_BF16, 64, NULL) == QL_OK &&
                memcmp(j->y, j->ref, sizeof j->y) == 0;
    }
    return NULL;
}

static void test_concurrent(ql_context *ctx)
{
    int8_t *q = malloc(64 * 512);
    float s[64];
    random_weight(64, 512, q, s, 64);
    ql_int8_weight w = {64, 512, q, 512, s, 64, 256, NULL, QL_F32};
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
    ql_linear *lin;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    conc_job *jobs = calloc(3, sizeof *jobs);
    pthread_t th[3];
    for (int t = 0; t < 3; t++) {
        jobs[t].lin = lin;
        tu_fill_gauss(QL_BF16, jobs[t].x, 40 * 512, 1.0 + t);
        CHECK_OK(ql_int8_linear_ref(&w, jobs[t].x, QL_BF16, 40, 512, jobs[t].ref, QL_BF16, 64, NULL));
    }
    for (int t = 0; t < 3; t++) pthread_create(&th[t], NULL, conc_run, &jobs[t]);
    for (int t = 0; t < 3; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < 3; t++) CHECK(jobs[t].ok, "concurrent forward %d on one context differs from the reference", t);
    ql_linear_destroy(lin);
    free(jobs);
    free(q);
}

/* ql_linear_forward_shared: each layer's output equals its reference (the
 * same bits as ql_linear_forward), epilogues per layer; layers that do not
 * share K, an output on the input and bad counts are refused. */
static void test_shared(ql_context *ctx)
{
    enum { L = 3 };
    const int64_t m = 29, k = 512, ns[L] = {17, 256, 70}, ldx = k + 3;
    ql_linear *lin[L] = {0};
    int8_t *q[L];
    float *sc[L];
    void *y0[L], *y[L];
    int64_t ldy[L];
    float *x = malloc((size_t)(m * ldx) * 4);
    void *res = malloc((size_t)(m * 256) * 2), *rs = malloc(256 * 2); /* the residual in the output dtype (bf16) */
    tu_fill_gauss(QL_F32, x, m * ldx, 1.0);
    tu_fill_gauss(QL_BF16, res, m * 256, 1.0);
    tu_fill_gauss(QL_BF16, rs, 256, 1.0);
    ql_epilogue with_res = {.residual = res, .ld_residual = 256, .residual_scale = rs};
    const ql_epilogue *epis[L] = {NULL, &with_res, NULL};
    for (int i = 0; i < L; i++) {
        q[i] = malloc((size_t)(ns[i] * k)), sc[i] = malloc((size_t)ns[i] * 4);
        random_weight(ns[i], k, q[i], sc[i], ns[i]);
        ldy[i] = ns[i] + i;
        y0[i] = calloc((size_t)(m * ldy[i]), 2), y[i] = calloc((size_t)(m * ldy[i]), 2);
        ql_int8_weight w = {ns[i], k, q[i], k, sc[i], ns[i], 256, NULL, QL_F32};
        CHECK_OK(ql_int8_linear_ref(&w, x, QL_F32, m, ldx, y0[i], QL_BF16, ldy[i], epis[i]));
        ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
        CHECK_OK(ql_linear_create(ctx, &d, &lin[i]));
    }
    if (lin[0] && lin[1] && lin[2]) {
        CHECK_OK(ql_linear_forward_shared(lin, L, x, QL_F32, m, ldx, y, QL_BF16, ldy, epis));
        for (int i = 0; i < L; i++) {
            int64_t first = -1;
            CHECK(same_bits(QL_BF16, y0[i], y[i], m, ns[i], ldy[i], ldy[i], &first),
                  "shared forward, layer %d (N = %lld): differs from the reference at %lld", i, (long long)ns[i],
                  (long long)first);
        }
        /* refused: a layer of another K, the input as an output, counts out of range */
        int8_t q2[64 * 4];
        float s2[4] = {1, 1, 1, 1};
        memset(q2, 1, sizeof q2);
        ql_int8_weight w2 = {4, 64, q2, 64, s2, 4, 0, NULL, QL_F32};
        ql_linear_desc d2 = {.kind = QL_LINEAR_W8A8, .int8 = w2};
        ql_linear *other = NULL, *mixed[2] = {lin[0], NULL};
        CHECK_OK(ql_linear_create(ctx, &d2, &other));
        mixed[1] = other;
        CHECK(ql_linear_forward_shared(mixed, 2, x, QL_F32, m, ldx, y, QL_BF16, ldy, NULL) == QL_ERR_INVALID_ARGUMENT &&
                  strstr(ql_last_error(), "share"),
              "layers of different K shared an input: %s", ql_last_error());
        void *in_place[L] = {y[0], x, y[2]};
        CHECK(ql_linear_forward_shared(lin, L, x, QL_F32, m, ldx, in_place, QL_BF16, ldy, NULL) == QL_ERR_INVALID_ARGUMENT,
              "an output on the input accepted");
        CHECK(ql_linear_forward_shared(lin, 0, x, QL_F32, m, ldx, y, QL_BF16, ldy, NULL) == QL_ERR_INVALID_ARGUMENT,
              "count 0 accepted");
        CHECK(ql_linear_forward_shared(lin, QL_SHARED_MAX + 1, x, QL_F32, m, ldx, y, QL_BF16, ldy, NULL) ==
                  QL_ERR_INVALID_ARGUMENT,
              "count above QL_SHARED_MAX accepted");
        ql_linear_destroy(other);
    }
    for (int i = 0; i < L; i++) ql_linear_destroy(lin[i]), free(q[i]), free(sc[i]), free(y0[i]), free(y[i]);
    free(x), free(res), free(rs);
}

static void test_bad_input(ql_context *ctx)
{
    int8_t q[64 * 4];
    float s[4] = {1, 1, 1, 1}, x[64], y[4];
    ql_int8_weight w = {4, 64, q, 64, s, 4, 256, NULL, QL_F32};
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
    ql_linear *lin = NULL;
    CHECK(ql_linear_create(ctx, &d, &lin) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "multiple"),
          "K %% G != 0 accepted: %s", ql_last_error());
    d.int8.convrot_group = 0;
    d.int8.n_scale = 3;
    CHECK(ql_linear_create(ctx, &d, &lin) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "weight_scale"),
          "3 scales for N = 4 accepted: %s", ql_last_error());
    d.int8.n_scale = 1;
    d.int8.q = NULL;
    CHECK(ql_linear_create(ctx, &d, &lin) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "weight"), "NULL weight");
    d.int8.q = q;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    CHECK(ql_linear_forward(lin, x, QL_I8, 1, 64, y, QL_F32, 4, NULL) == QL_ERR_UNSUPPORTED, "int8 x accepted");
    CHECK(ql_linear_forward(lin, NULL, QL_F32, 1, 64, y, QL_F32, 4, NULL) == QL_ERR_INVALID_ARGUMENT, "NULL x accepted");
    CHECK(ql_linear_forward(lin, x, QL_F32, 2, 32, y, QL_F32, 4, NULL) == QL_ERR_INVALID_ARGUMENT, "ldx < K accepted");
    ql_epilogue epi = {.residual = y, .ld_residual = 4};
    CHECK(ql_linear_forward(lin, x, QL_F32, 1, 64, y, QL_F32, 4, &epi) == QL_ERR_INVALID_ARGUMENT &&
          strstr(ql_last_error(), "residual_scale"), "residual without scale accepted");
    ql_epilogue bad_act = {.activation = 7};
    CHECK(ql_linear_forward(lin, x, QL_F32, 1, 64, y, QL_F32, 4, &bad_act) == QL_ERR_INVALID_ARGUMENT &&
          strstr(ql_last_error(), "activation"), "activation 7 accepted: %s", ql_last_error());
    CHECK_OK(ql_linear_forward(lin, NULL, QL_F32, 0, 64, NULL, QL_F32, 4, NULL)); /* M = 0 */
    ql_linear_destroy(lin);
    ql_int8_weight big = {4, 1 << 20, q, 1 << 20, s, 4, 0, NULL, QL_F32};
    CHECK(ql_int8_linear_ref(&big, x, QL_F32, 1, 1 << 20, y, QL_F32, 4, NULL) == QL_ERR_UNSUPPORTED, "K = 2^20 accepted");
}

/* A forward called from inside the caller's own OpenMP region gets a team of
 * one (nested regions are off), fewer threads than the context plans its
 * work for (3): the blocks, prologue rows and panels planned for the missing
 * threads are taken by the one that runs (ql_panel_next), and each output is
 * bit for bit the output of the same call from outside any region, for the
 * blocked and small-M int8 routes and the float drivers. */
static void test_nested_region(ql_context *ctx)
{
    CHECK_OK(ql_context_set_threads(ctx, 3));
    static const ql_linear_kind kinds[] = {QL_LINEAR_W8A8, QL_LINEAR_WEIGHT_ONLY, QL_LINEAR_DENSE};
    static const int64_t ms[] = {5, 200};
    const int64_t n = 70, k = 512;
    int8_t *q = malloc((size_t)(n * k));
    float s[70], *wf = malloc((size_t)(n * k) * 4);
    uint16_t *x = malloc((size_t)(200 * k) * 2), *ref = malloc((size_t)(200 * n) * 2), *y[2];
    y[0] = malloc((size_t)(200 * n) * 2);
    y[1] = malloc((size_t)(200 * n) * 2);
    random_weight(n, k, q, s, n);
    tu_fill_gauss(QL_F32, wf, n * k, 0.05);
    tu_fill_gauss(QL_BF16, x, 200 * k, 1.0);
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++)
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int64_t m = ms[mi];
            ql_linear_desc d = {.kind = kinds[ki], .int8 = {n, k, q, k, s, n, 256, NULL, QL_F32}};
            if (kinds[ki] == QL_LINEAR_DENSE)
                d = (ql_linear_desc){.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = wf, .ld_weight = k,
                                     .weight_dtype = QL_F32, .compute_dtype = QL_BF16};
            ql_linear *lin = NULL;
            CHECK_OK(ql_linear_create(ctx, &d, &lin));
            if (!lin) continue;
            CHECK_OK(ql_linear_forward(lin, x, QL_BF16, m, k, ref, QL_BF16, n, NULL));
            int st[2] = {-1, -1}, team[2] = {0, 0};
#pragma omp parallel num_threads(2)
            {
                const int t = omp_get_thread_num();
                if (t < 2) {
                    memset(y[t], 0x5a, (size_t)(m * n) * 2);
                    st[t] = ql_linear_forward(lin, x, QL_BF16, m, k, y[t], QL_BF16, n, NULL);
                    team[t] = 1;
                }
            }
            for (int t = 0; t < 2; t++) {
                if (!team[t]) continue; /* the runtime gave a smaller outer team */
                int64_t first = -1;
                CHECK(st[t] == QL_OK && same_bits(QL_BF16, ref, y[t], m, n, n, n, &first),
                      "%s kind %d M=%lld: the forward from thread %d of the caller's OpenMP region differs from the "
                      "plain call (status %d, first at %lld)", ql_isa_name(ql_context_isa(ctx)), (int)kinds[ki],
                      (long long)m, t, st[t], (long long)first);
            }
            ql_linear_destroy(lin);
        }
    free(q); free(wf); free(x); free(ref); free(y[0]); free(y[1]);
}

/* The single-thread route for tiny layers (QLINEAR_SERIAL_WORK): a layer run
 * on the calling thread alone equals the same layer on 2-3 threads bit for
 * bit, for every kind, dtype, bias and residual, small-M and blocked row
 * counts; and the default threshold, whichever route it picks, too. */
static ql_context *context_with(const char *serial_work, ql_isa isa, int threads)
{
    if (serial_work) setenv("QLINEAR_SERIAL_WORK", serial_work, 1);
    else unsetenv("QLINEAR_SERIAL_WORK");
    ql_context *c = NULL;
    CHECK_OK(ql_context_create(&c));
    setenv("QLINEAR_SERIAL_WORK", "0", 1);
    if (c) {
        CHECK_OK(ql_context_set_isa(c, isa));
        CHECK_OK(ql_context_set_threads(c, threads));
    }
    return c;
}

static void test_serial_route(ql_isa isa)
{
    setenv("QLINEAR_SERIAL_WORK", "12x", 1);
    ql_context *bad = NULL;
    CHECK(ql_context_create(&bad) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "QLINEAR_SERIAL_WORK=12x"),
          "a malformed QLINEAR_SERIAL_WORK was accepted (%s)", ql_last_error());
    ql_context_destroy(bad);
    for (int t = 2; t <= 3; t++) {
        ql_context *par = context_with("0", isa, t), *ser = context_with("1099511627776", isa, t),
                   *def = context_with(NULL, isa, t);
        if (!par || !ser || !def) break;
        static const int64_t ms[] = {1, 2, 13, 96, 97, 150};
        static const ql_linear_kind kinds[] = {QL_LINEAR_W8A8, QL_LINEAR_WEIGHT_ONLY, QL_LINEAR_DENSE, QL_LINEAR_DENSE,
                                               QL_LINEAR_DEQUANT};
        for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const int64_t m = ms[mi], n = tu_range(1, 300), g = tu_range(0, 1) ? 256 : 0,
                              k = g ? 256 * tu_range(1, 3) : tu_range(1, 700);
                const ql_dtype xdt = dts[tu_range(0, 2)], ydt = dts[tu_range(0, 2)], bdt = dts[tu_range(0, 2)];
                const int res = (int)tu_range(0, 1), bias_on = (int)tu_range(0, 1);
                int8_t *q = malloc((size_t)(n * k));
                float *s = malloc((size_t)n * 4), *wf = malloc((size_t)(n * k) * 4);
                void *x = malloc((size_t)(m * k) * 4), *b = malloc((size_t)n * 4), *r = malloc((size_t)(m * n) * 4),
                     *rs = malloc((size_t)n * 4), *y[3];
                random_weight(n, k, q, s, n);
                tu_fill_gauss(QL_F32, wf, n * k, 0.05);
                tu_fill_gauss(xdt, x, m * k, 1.0);
                tu_fill_gauss(bdt, b, n, 0.5);
                tu_fill_gauss(ydt, r, m * n, 1.0);
                tu_fill_gauss(ydt, rs, n, 1.0);
                ql_epilogue epi = {.residual = r, .ld_residual = n, .residual_scale = rs};
                ql_linear_desc d = {.kind = kinds[ki], .int8 = {n, k, q, k, s, n, g, bias_on ? b : NULL, bdt}};
                if (kinds[ki] == QL_LINEAR_DENSE)
                    d = (ql_linear_desc){.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = wf, .ld_weight = k,
                                         .weight_dtype = QL_F32, .compute_dtype = ki == 2 ? QL_F32 : QL_BF16,
                                         .bias = bias_on ? b : NULL, .bias_dtype = bdt};
                ql_context *ctxs[3] = {par, ser, def};
                for (int c = 0; c < 3; c++) {
                    y[c] = malloc((size_t)(m * n) * 4);
                    memset(y[c], 0x5a, (size_t)(m * n) * 4);
                    ql_linear *lin = NULL;
                    CHECK_OK(ql_linear_create(ctxs[c], &d, &lin));
                    if (lin) CHECK_OK(ql_linear_forward(lin, x, xdt, m, k, y[c], ydt, n, res ? &epi : NULL));
                    ql_linear_destroy(lin);
                }
                int64_t f1 = -1, f2 = -1;
                int ok1 = same_bits(ydt, y[0], y[1], m, n, n, n, &f1), ok2 = same_bits(ydt, y[0], y[2], m, n, n, n, &f2);
                CHECK(ok1 && ok2, "%s kind %d t%d M=%lld N=%lld K=%lld G=%lld x=%s y=%s bias=%d res=%d: the serial route "
                      "differs from %d threads at %lld (default threshold: at %lld)", ql_isa_name(isa), (int)kinds[ki], t,
                      (long long)m, (long long)n, (long long)k, (long long)g, ql_dtype_name(xdt), ql_dtype_name(ydt),
                      bias_on, res, t, (long long)f1, (long long)f2);
                free(q); free(s); free(wf); free(x); free(b); free(r); free(rs);
                for (int c = 0; c < 3; c++) free(y[c]);
            }
        ql_context_destroy(par);
        ql_context_destroy(ser);
        ql_context_destroy(def);
    }
}

/* The prologue's hand-over to the blocked GEMM: per unit of rows (the
 * default) and through one barrier (QLINEAR_PROLOGUE_SYNC=barrier) give the
 * same bits for every thread count,
 * more threads than cores included (a thread waiting on rows whose packer
 * is not running yields), with and without an unmerged LoRA (the hand-over
 * then is per panel, after the down projection); malformed values refused. */
static ql_context *context_sync(const char *sync, ql_isa isa, int threads)
{
    setenv("QLINEAR_PROLOGUE_SYNC", sync, 1);
    ql_context *c = NULL;
    CHECK_OK(ql_context_create(&c));
    unsetenv("QLINEAR_PROLOGUE_SYNC");
    if (c) {
        CHECK_OK(ql_context_set_isa(c, isa));
        CHECK_OK(ql_context_set_threads(c, threads));
    }
    return c;
}

static void test_prologue_sync(ql_isa isa)
{
    static const char *const bad[] = {"fence", "Barrier", "panels "};
    for (int i = 0; i < 3; i++) {
        setenv("QLINEAR_PROLOGUE_SYNC", bad[i], 1);
        ql_context *c = NULL;
        const ql_status st = ql_context_create(&c);
        CHECK(st == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "QLINEAR_PROLOGUE_SYNC="),
              "QLINEAR_PROLOGUE_SYNC=%s accepted (%s)", bad[i], ql_last_error());
        ql_context_destroy(c);
    }
    unsetenv("QLINEAR_PROLOGUE_SYNC");
    static const int64_t ms[] = {97, 300, 1031};
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
        const int64_t m = ms[mi], n = tu_range(33, 300), k = 256 * tu_range(1, 5);
        int8_t *q = malloc((size_t)(n * k));
        float *s = malloc((size_t)n * 4), *down = malloc((size_t)(16 * k) * 4), *up = malloc((size_t)(n * 16) * 4);
        uint16_t *x = malloc((size_t)(m * k) * 2), *y0 = malloc((size_t)(m * n) * 2), *y = malloc((size_t)(m * n) * 2);
        random_weight(n, k, q, s, n);
        tu_fill_gauss(QL_BF16, x, m * k, 1.0);
        tu_fill_gauss(QL_F32, down, 16 * k, 0.05);
        tu_fill_gauss(QL_F32, up, n * 16, 0.05);
        const ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = {n, k, q, k, s, n, 256, NULL, QL_F32}};
        const ql_lora_desc ld = {16, down, QL_F32, k, up, QL_F32, 16, 0.5};
        for (int lora = 0; lora < 2; lora++) {
            int first = 1;
            for (int t = 1; t <= 7; t += 2)
                for (int c = 0; c < 2; c++) {
                    ql_context *ctx = context_sync(c ? "panels" : "barrier", isa, t);
                    ql_linear *lin = NULL;
                    if (ctx) CHECK_OK(ql_linear_create(ctx, &d, &lin));
                    if (lin && lora) CHECK_OK(ql_linear_add_lora(lin, &ld, NULL));
                    uint16_t *out = first ? y0 : y;
                    memset(out, 0x5a, (size_t)(m * n) * 2);
                    if (lin) CHECK_OK(ql_linear_forward(lin, x, QL_BF16, m, k, out, QL_BF16, n, NULL));
                    int64_t at = -1;
                    CHECK(first || same_bits(QL_BF16, y0, y, m, n, n, n, &at),
                          "%s M=%lld N=%lld K=%lld lora=%d threads=%d sync=%s: differs from the first run at %lld",
                          ql_isa_name(isa), (long long)m, (long long)n, (long long)k, lora, t, c ? "panels" : "barrier",
                          (long long)at);
                    first = 0;
                    ql_linear_destroy(lin);
                    ql_context_destroy(ctx);
                }
        }
        free(q); free(s); free(down); free(up); free(x); free(y0); free(y);
    }
}

int main(void)
{
    tu_init("test_linear");
    n_isas = tu_isas(isas);
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    for (int i = 0; i < n_isas; i++) {
        if (!ql_isa_supported(isas[i])) { printf("  skip %s: not supported by this CPU\n", ql_isa_name(isas[i])); continue; }
        CHECK_OK(ql_context_set_isa(ctx, isas[i]));
        if (isas[i] == QL_ISA_NEONBF16) { /* i8mm's W8A8 pipeline; only bf16-compute layers change */
            test_weight_only_and_bf16(ctx);
            continue;
        }
        for (int t = 1; t <= 3; t++) {
            CHECK_OK(ql_context_set_threads(ctx, t));
            for (int xi = 0; xi < 3; xi++)
                for (int yi = 0; yi < 3; yi++)
                    for (size_t gi = 0; gi < 5; gi++) {
                        int64_t g = groups[gi];
                        int64_t k = g ? g * tu_range(1, g >= 256 ? 3 : 8) : tu_range(1, 700);
                        case_vs_ref(ctx, tu_range(1, 40), tu_range(1, 70), k, g, dts[xi], dts[yi], (int)tu_range(0, 1),
                                    (int)tu_range(0, 1), (int)tu_range(0, 1));
                    }
            case_vs_ref(ctx, 1, 1, 256, 256, QL_BF16, QL_BF16, 1, 1, 0);   /* one row, one column */
            for (int di = 0; di < 3; di++) { /* tiny rows: subnormal rotated values and quotients */
                x_sigma = dts[di] == QL_F16 ? 1e-6 : 1e-39;
                case_vs_ref(ctx, 13, 33, 512, 256, dts[di], QL_F32, 0, 0, 0);
                case_vs_ref(ctx, 13, 33, 96, 16, dts[di], QL_F32, 0, 0, 0);
                x_sigma = dts[di] == QL_F16 ? 3e3 : 1e36; /* near the top of the range */
                case_vs_ref(ctx, 13, 33, 512, 256, dts[di], dts[di], 0, 0, 0);
                x_sigma = 1.0;
            }
            w_scale = 1e-42; /* denormal outputs: exact rounding to every dtype */
            for (int di = 0; di < 3; di++) case_vs_ref(ctx, 13, 33, 512, 256, QL_BF16, dts[di], 0, 0, 0);
            w_scale = 1e-3;
            case_vs_ref(ctx, 200, 300, 512, 256, QL_BF16, QL_BF16, 1, 0, 1); /* many tiles */
        }
        test_subnormal_bias(ctx);
        test_shared(ctx);
        test_risky_quotients(ctx);
        test_float_paths(ctx);
        test_weight_only_and_bf16(ctx);
        test_concurrent(ctx);
        test_nested_region(ctx);
        test_bad_input(ctx);
        test_serial_route(isas[i]);
        test_prologue_sync(isas[i]);
    }
    test_accuracy();
    ql_context_destroy(ctx);
    return tu_finish();
}
