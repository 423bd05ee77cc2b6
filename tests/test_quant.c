/* Hadamard, rotation and quantizers against independent float64 / integer
 * models, with the edge cases: zero rows, subnormals, values near the dtype
 * maximum, exact .5 ties, ±Inf and NaN, K = 1, empty inputs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu/ops.h"
#include "quant/quant.h"
#include "model.h"
#include "testutil.h"

static const ql_dtype dtypes[3] = {QL_F32, QL_BF16, QL_F16};

static void test_hadamard(void)
{
    for (int64_t g = 4; g <= 1024; g *= 4) {
        float *h = malloc((size_t)(g * g) * sizeof(float));
        CHECK_OK(ql_hadamard(g, h));
        double worst = 0;
        int sym = 1, entries = 1;
        for (int64_t i = 0; i < g; i++)
            for (int64_t j = 0; j < g; j++) {
                sym &= h[i * g + j] == h[j * g + i];
                entries &= fabs(fabs((double)h[i * g + j]) - 1.0 / sqrt((double)g)) == 0.0;
                double s = 0;
                for (int64_t t = 0; t < g; t++) s += (double)h[i * g + t] * h[t * g + j];
                worst = fmax(worst, fabs(s - (i == j)));
            }
        CHECK(sym && entries, "H%lld not symmetric or entries not ±1/sqrt(G)", (long long)g);
        CHECK(worst < 1e-12, "H%lld·H%lld differs from I by %g", (long long)g, (long long)g, worst);
        /* the fast transform equals the matrix product (float64) */
        float *x = malloc((size_t)(3 * g) * sizeof(float));
        tu_fill_gauss(QL_F32, x, 3 * g, 1.0);
        float *y = malloc((size_t)(3 * g) * sizeof(float));
        memcpy(y, x, (size_t)(3 * g) * sizeof(float));
        CHECK_OK(ql_rotate(QL_F32, y, 1, 3 * g, 3 * g, g));
        double err = 0, norm = 0;
        for (int64_t b = 0; b < 3; b++)
            for (int64_t j = 0; j < g; j++) {
                double s = 0;
                for (int64_t t = 0; t < g; t++) s += (double)x[b * g + t] * h[t * g + j];
                err = fmax(err, fabs(s - y[b * g + j]));
                norm = fmax(norm, fabs(s));
            }
        CHECK(err <= 1e-5 * norm, "FWHT G=%lld differs from x·H by %g", (long long)g, err);
        free(x);
        free(y);
        free(h);
    }
    const int64_t bad[] = {0, 1, 2, 8, 32, 128, 500, -4, 1 << 18};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float h[4];
        CHECK(ql_hadamard(bad[i], h) == QL_ERR_UNSUPPORTED, "G=%lld accepted", (long long)bad[i]);
    }
    float x[12];
    CHECK(ql_rotate(QL_F32, x, 1, 12, 12, 16) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "multiple"),
          "K=12 with G=16 accepted: %s", ql_last_error());
}

/* ConvRot identity in float64: (X·H)(W·H)ᵀ = X·Wᵀ. */
static void test_identity(void)
{
    const int64_t m = 5, n = 7, k = 512, g = 256;
    float *x = malloc(m * k * 4), *w = malloc(n * k * 4), *xr = malloc(m * k * 4), *wr = malloc(n * k * 4);
    tu_fill_gauss(QL_F32, x, m * k, 1.0);
    tu_fill_gauss(QL_F32, w, n * k, 0.05);
    memcpy(xr, x, m * k * 4);
    memcpy(wr, w, n * k * 4);
    CHECK_OK(ql_rotate(QL_F32, xr, m, k, k, g));
    CHECK_OK(ql_rotate(QL_F32, wr, n, k, k, g));
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double a = 0, b = 0, s = 0;
            for (int64_t t = 0; t < k; t++) {
                a += (double)x[i * k + t] * w[j * k + t];
                b += (double)xr[i * k + t] * wr[j * k + t];
                s += fabs((double)x[i * k + t] * w[j * k + t]);
            }
            worst = fmax(worst, fabs(a - b) / s);
        }
    CHECK(worst < 1e-6, "ConvRot identity off by %g (relative to Σ|x·w|)", worst);
    free(x); free(w); free(xr); free(wr);
}

static void fill_row(ql_dtype dt, void *p, int64_t k, int kind, float *out)
{
    for (int64_t j = 0; j < k; j++) {
        double v;
        switch (kind) {
        case 0: v = tu_gauss() * 0.02; break;                                 /* weights */
        case 1: v = 0.0; break;                                               /* zero row */
        case 2: v = tu_gauss() * (dt == QL_F16 ? 1e-6 : 1e-39); break;         /* subnormal */
        case 3: v = (tu_uniform() * 2 - 1) * (dt == QL_F16 ? 65504.0 : 3.3e38); break; /* near max */
        case 4: v = (double)tu_range(-127, 126) + 0.5; break;                 /* ties: absmax 127 below */
        default: v = tu_gauss() * pow(10.0, (double)tu_range(-8, dt == QL_F16 ? 3 : 8)); break; /* mixed scales */
        }
        if (kind == 4 && j == 0) v = 127.0;
        ql_store_f(dt, p, j, (float)v);
        out[j] = ql_load_f(dt, p, j);
    }
}

static void test_quantizers(void)
{
    for (int di = 0; di < 3; di++) {
        const ql_dtype dt = dtypes[di];
        for (int kind = 0; kind < 6; kind++) {
            const int64_t rows = tu_range(1, 9), k = tu_range(1, 300), ld = k + tu_range(0, 5);
            void *x = malloc((size_t)(rows * ld) * 4);
            float *v = malloc((size_t)(rows * ld) * 4);
            int8_t *q = malloc((size_t)(rows * ld)), mq[300];
            float *s = malloc((size_t)rows * 4), ms;
            for (int64_t r = 0; r < rows; r++)
                fill_row(dt, ql_row_ptr(dt, x, r, ld), k, kind == 5 ? (int)tu_range(0, 5) : kind, v + r * ld);
            CHECK_OK(ql_quantize_rowwise(dt, x, rows, k, ld, q, ld, s));
            for (int64_t r = 0; r < rows; r++) {
                model_quantize_row(dt, v + r * ld, k, (signed char *)mq, &ms);
                CHECK(memcmp(&ms, &s[r], 4) == 0, "%s kind %d row %lld: scale %a, model %a", ql_dtype_name(dt), kind,
                      (long long)r, s[r], ms);
                CHECK(memcmp(mq, q + r * ld, (size_t)k) == 0, "%s kind %d row %lld: codes differ from the model",
                      ql_dtype_name(dt), kind, (long long)r);
            }
            /* tensor-wise: the model on the whole tensor as one row */
            float ts;
            float *flat = malloc((size_t)(rows * k) * 4);
            int8_t *fq = malloc((size_t)(rows * k)), *tq = malloc((size_t)(rows * ld));
            for (int64_t r = 0; r < rows; r++) memcpy(flat + r * k, v + r * ld, (size_t)k * 4);
            model_quantize_row(dt, flat, rows * k, (signed char *)fq, &ms);
            CHECK_OK(ql_quantize_tensorwise(dt, x, rows, k, ld, tq, ld, &ts));
            int same = memcmp(&ts, &ms, 4) == 0;
            for (int64_t r = 0; r < rows; r++) same &= memcmp(tq + r * ld, fq + r * k, (size_t)k) == 0;
            CHECK(same, "%s kind %d: tensor-wise differs from the model", ql_dtype_name(dt), kind);
            /* dequantize (plain) = fp32(q)·scale rounded once */
            float *dq = malloc((size_t)(rows * k) * 4);
            CHECK_OK(ql_dequantize(q, rows, k, ld, s, rows, 0, QL_F32, dq, k));
            int ok = 1;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < k; j++) ok &= dq[r * k + j] == (float)q[r * ld + j] * s[r];
            CHECK(ok, "%s kind %d: plain dequantization is not fp32(q)·scale", ql_dtype_name(dt), kind);
            free(x); free(v); free(q); free(s); free(flat); free(fq); free(tq); free(dq);
        }
    }
    /* ties: absmax 127 -> scale 1 exactly; x.5 goes to the even neighbour */
    float t[6] = {127.0f, 0.5f, 1.5f, 2.5f, -2.5f, -126.5f};
    int8_t tq[6];
    float ts;
    CHECK_OK(ql_quantize_rowwise(QL_F32, t, 1, 6, 6, tq, 6, &ts));
    CHECK(ts == 1.0f && tq[1] == 0 && tq[2] == 2 && tq[3] == 2 && tq[4] == -2 && tq[5] == -126,
          "ties: scale %g codes %d %d %d %d %d", ts, tq[1], tq[2], tq[3], tq[4], tq[5]);
    /* fp16 all-zero row: scale 1e-30, divisor fp16's tiny, codes 0 */
    uint16_t z[5] = {0, 0x8000, 0, 0, 0};
    CHECK_OK(ql_quantize_rowwise(QL_F16, z, 1, 5, 5, tq, 5, &ts));
    CHECK(ts == 1e-30f && !tq[0] && !tq[1], "fp16 zero row: scale %g", ts);
}

static void test_nonfinite(void)
{
    for (int di = 0; di < 3; di++) {
        const ql_dtype dt = dtypes[di];
        const int64_t rows = 4, k = 64;
        void *x = malloc(rows * k * 4);
        tu_fill_gauss(dt, x, rows * k, 1.0);
        ql_store_f(dt, x, 1 * k + 7, NAN);
        ql_store_f(dt, x, 3 * k + 63, -INFINITY);
        int8_t q[4 * 64], q0[64];
        float s[4], s0;
        ql_status st = ql_quantize_rowwise(dt, x, rows, k, k, q, k, s);
        CHECK(st == QL_ERR_NONFINITE && strstr(ql_last_error(), "row 1"), "%s: NaN row: %s / %s", ql_dtype_name(dt),
              ql_status_string(st), ql_last_error());
        CHECK(isnan(s[1]) && isnan(s[3]) && !q[k + 7] && !q[3 * k], "%s: bad rows not codes 0 / scale NaN", ql_dtype_name(dt));
        CHECK_OK(ql_quantize_rowwise(dt, ql_row_cptr(dt, x, 2, k), 1, k, k, q0, k, &s0));
        CHECK(s0 == s[2] && !memcmp(q0, q + 2 * k, k), "%s: a good row changed next to bad ones", ql_dtype_name(dt));
        float ts;
        CHECK(ql_quantize_tensorwise(dt, x, rows, k, k, q, k, &ts) == QL_ERR_NONFINITE && isnan(ts),
              "%s: tensorwise with NaN", ql_dtype_name(dt));
        /* near-max rows can overflow while rotating: reported, not garbage */
        float h[64 * 64];
        CHECK_OK(ql_hadamard(64, h)); /* x along H's first row: (x·H)[0] = 8·max overflows */
        for (int64_t j = 0; j < k; j++) ql_store_f(dt, x, j, (h[j] > 0 ? 1.0f : -1.0f) * (dt == QL_F16 ? 60000.0f : 3.0e38f));
        st = ql_quantize_convrot_weight(dt, x, 1, k, k, 64, q, k, s);
        CHECK(st == QL_ERR_NONFINITE && isnan(s[0]), "%s: rotation overflow not reported (%s)", ql_dtype_name(dt),
              ql_status_string(st));
        free(x);
    }
}

static void test_bad_args(void)
{
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, s[2];
    int8_t q[8];
    CHECK(ql_quantize_rowwise(QL_F32, NULL, 2, 4, 4, q, 4, s) == QL_ERR_INVALID_ARGUMENT, "NULL x");
    CHECK(ql_quantize_rowwise(QL_F32, x, 2, 4, 4, q, 4, NULL) == QL_ERR_INVALID_ARGUMENT, "NULL scale");
    CHECK(ql_quantize_rowwise(QL_I32, x, 2, 4, 4, q, 4, s) == QL_ERR_UNSUPPORTED, "int32 input");
    CHECK(ql_quantize_rowwise(QL_F32, x, 2, 4, 3, q, 4, s) == QL_ERR_INVALID_ARGUMENT, "ld < k");
    CHECK(ql_quantize_rowwise(QL_F32, x, -1, 4, 4, q, 4, s) == QL_ERR_INVALID_ARGUMENT, "negative rows");
    CHECK(ql_quantize_rowwise(QL_F32, x, (int64_t)1 << 40, (int64_t)1 << 20, (int64_t)1 << 20, q, 4, s) ==
              QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "large"), "absurd size: %s", ql_last_error());
    CHECK_OK(ql_quantize_rowwise(QL_F32, x, 0, 4, 4, q, 4, s)); /* empty */
    CHECK(ql_quantize_convrot_weight(QL_F32, x, 2, 4, 4, 16, q, 4, s) == QL_ERR_INVALID_ARGUMENT, "K % G");
    CHECK(ql_quantize_convrot_weight(QL_F32, x, 1, 8, 8, 8, q, 8, s) == QL_ERR_UNSUPPORTED, "G = 8");
    CHECK(ql_dequantize(q, 2, 4, 4, s, 3, 0, QL_F32, x, 4) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "weight_scale"),
          "3 scales for 2 rows: %s", ql_last_error());
    CHECK(strlen(ql_status_string(QL_ERR_FORMAT)) > 0 && strcmp(ql_status_string((ql_status)99), "unknown status") == 0,
          "status strings");
}

/* The vectorized weight quantizer (used by `qlinear quantize`) gives the
 * reference's codes, scales and status, bit for bit. */
static void test_fast_weight_quantizer(void)
{
    const int64_t groups[] = {0, 4, 16, 64, 256, 1024};
    for (int di = 0; di < 3; di++)
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++)
            for (int kind = 0; kind < 7; kind++) {
                const ql_dtype dt = dtypes[di];
                const int64_t g = groups[gi], rows = tu_range(1, 9);
                const int64_t k = g ? g * tu_range(1, g >= 1024 ? 2 : 4) : tu_range(1, 300), ld = k + tu_range(0, 3);
                void *x = malloc((size_t)(rows * ld) * 4);
                float *v = malloc((size_t)(rows * ld) * 4);
                for (int64_t r = 0; r < rows; r++)
                    fill_row(dt, ql_row_ptr(dt, x, r, ld), k, kind >= 5 ? (int)tu_range(0, 5) : kind, v + r * ld);
                if (kind == 6) ql_store_f(dt, x, (rows - 1) * ld + k / 2, tu_range(0, 1) ? NAN : -INFINITY);
                int8_t *q0 = malloc((size_t)(rows * k)), *q1 = malloc((size_t)(rows * k));
                float *s0 = malloc((size_t)rows * 4), *s1 = malloc((size_t)rows * 4);
                ql_status st0 = g ? ql_quantize_convrot_weight(dt, x, rows, k, ld, g, q0, k, s0)
                                  : ql_quantize_rowwise(dt, x, rows, k, ld, q0, k, s0);
                ql_status st1 = ql_quantize_weight_rows(dt, x, rows, k, ld, g, q1, k, s1);
                int same = st0 == st1 && !memcmp(q0, q1, (size_t)(rows * k));
                for (int64_t r = 0; r < rows; r++) same &= !memcmp(&s0[r], &s1[r], 4) || (isnan(s0[r]) && isnan(s1[r]));
                CHECK(same, "fast weight quantizer %s G=%lld kind %d rows %lld K=%lld differs from the reference (%s / %s)",
                      ql_dtype_name(dt), (long long)g, kind, (long long)rows, (long long)k, ql_status_string(st0),
                      ql_status_string(st1));
                free(x); free(v); free(q0); free(q1); free(s0); free(s1);
            }
}

/* Quotients at and next to the code steps (x.5 after the division, and
 * values one ulp either side): where a reciprocal-based shortcut would pick
 * the other code. The vectorized quantizer must still match the reference. */
static void test_fast_quantizer_steps(void)
{
    for (int di = 0; di < 3; di++)
        for (int trial = 0; trial < 40; trial++) {
            const ql_dtype dt = dtypes[di];
            const int64_t k = 16 * tu_range(1, 8);
            float *x = malloc((size_t)k * 4);
            uint16_t *xh = malloc((size_t)k * 2);
            /* absmax sets the scale; the rest sit on or beside (j + 0.5)·st */
            double c = (0.5 + tu_uniform()) * (dt == QL_F16 ? 1e-2 : pow(2.0, (double)tu_range(-20, 20)));
            float amax = ql_round_to(dt, (float)(127.0 * c));
            float st = ql_scale_divisor(dt, ql_scale_from_absmax(amax));
            x[0] = amax;
            for (int64_t j = 1; j < k; j++) {
                float h = (float)tu_range(-127, 126) + 0.5f;
                float v = ql_round_to(dt, h * st);
                int step = (int)tu_range(-1, 1); /* the value, or one dtype ulp either side */
                uint16_t bits = dt == QL_F16 ? ql_fp32_to_fp16(v) : ql_fp32_to_bf16(v);
                if (dt != QL_F32 && step) v = dt == QL_F16 ? ql_fp16_to_fp32((uint16_t)(bits + step)) : ql_bf16_to_fp32((uint16_t)(bits + step));
                if (dt == QL_F32 && step) v = nextafterf(v, step > 0 ? INFINITY : -INFINITY);
                x[j] = fabsf(v) <= amax ? v : 0.0f;
            }
            const void *src = x;
            if (dt != QL_F32) {
                for (int64_t j = 0; j < k; j++) xh[j] = dt == QL_F16 ? ql_fp32_to_fp16(x[j]) : ql_fp32_to_bf16(x[j]);
                src = xh;
            }
            int8_t q0[128], q1[128];
            float s0, s1;
            ql_status a = ql_quantize_rowwise(dt, src, 1, k, k, q0, k, &s0);
            ql_status b = ql_quantize_weight_rows(dt, src, 1, k, k, 0, q1, k, &s1);
            CHECK(a == b && s0 == s1 && !memcmp(q0, q1, (size_t)k), "%s: codes at the steps differ (st = %a)",
                  ql_dtype_name(dt), st);
            free(x);
            free(xh);
        }
}

int main(void)
{
    tu_init("test_quant");
    test_fast_weight_quantizer();
    test_fast_quantizer_steps();
    test_hadamard();
    test_identity();
    test_quantizers();
    test_nonfinite();
    test_bad_args();
    return tu_finish();
}
