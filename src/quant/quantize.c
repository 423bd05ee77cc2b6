/* Int8 quantizers and dequantizers, following comfy-kitchen's eager backend
 * (docs/FORMATS.md §4.2–§4.3). */
#include "quant/quant.h"

#include <math.h>

int8_t ql_quantize_value(ql_dtype dtype, float v, float st)
{
    float y = ql_round_to(dtype, v / st);
    float r = rintf(y); /* default rounding mode: nearest, ties to even */
    if (r > 127.0f) r = 127.0f;
    if (r < -128.0f) r = -128.0f;
    return (int8_t)r;
}

bool ql_quantize_row_f32(ql_dtype dtype, const float *v, int64_t k, int8_t *q, float *scale)
{
    float a = 0.0f;
    bool finite = true;
    for (int64_t j = 0; j < k; j++) {
        float m = fabsf(v[j]);
        if (!(m <= 3.402823466e38f)) finite = false; /* NaN or Inf */
        else if (m > a) a = m;
    }
    if (!finite) {
        memset(q, 0, (size_t)k);
        *scale = NAN;
        return false;
    }
    float s = ql_scale_from_absmax(a);
    float st = ql_scale_divisor(dtype, s);
    for (int64_t j = 0; j < k; j++) q[j] = ql_quantize_value(dtype, v[j], st);
    *scale = s;
    return true;
}

static ql_status check_quant_args(const char *fn, ql_dtype dtype, const void *x, int64_t rows, int64_t k, int64_t ldx,
                                  const int8_t *q, int64_t ldq, const float *scale)
{
    QL_TRY(ql_check_float_dtype(fn, "dtype", dtype));
    QL_TRY(ql_check_matrix(fn, "x", x, rows, k, ldx));
    QL_TRY(ql_check_matrix(fn, "q", q, rows, k, ldq));
    if (rows > 0 && scale == NULL) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: scale is NULL", fn);
    return QL_OK;
}

/* Shared by the row-wise and ConvRot quantizers: load (and rotate) each row,
 * quantize it, and report the first non-finite row. */
static ql_status quantize_rows(const char *fn, ql_dtype dtype, const void *x, int64_t rows, int64_t k, int64_t ldx,
                               int64_t group, int8_t *q, int64_t ldq, float *scale)
{
    if (rows == 0) return QL_OK;
    float *buf = ql_aligned_alloc((size_t)k * sizeof(float));
    if (!buf) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate a row of %lld floats", fn, (long long)k);
    int64_t bad = -1;
    for (int64_t r = 0; r < rows; r++) {
        ql_load_row_rotated(dtype, ql_row_cptr(dtype, x, r, ldx), k, group, buf);
        if (!ql_quantize_row_f32(dtype, buf, k, q + r * ldq, &scale[r]) && bad < 0) bad = r;
    }
    ql_aligned_free(buf);
    if (bad >= 0)
        return ql_fail(QL_ERR_NONFINITE, "%s: row %lld %s NaN or Inf; its codes are 0 and its scale NaN", fn,
                       (long long)bad, group > 0 ? "holds (or rotates to)" : "holds");
    return QL_OK;
}

ql_status ql_quantize_rowwise(ql_dtype dtype, const void *x, int64_t rows, int64_t k, int64_t ldx, int8_t *q,
                              int64_t ldq, float *scale)
{
    QL_TRY(check_quant_args("ql_quantize_rowwise", dtype, x, rows, k, ldx, q, ldq, scale));
    return quantize_rows("ql_quantize_rowwise", dtype, x, rows, k, ldx, 0, q, ldq, scale);
}

ql_status ql_quantize_convrot_weight(ql_dtype dtype, const void *w, int64_t n, int64_t k, int64_t ldw, int64_t group,
                                     int8_t *q, int64_t ldq, float *scale)
{
    const char *fn = "ql_quantize_convrot_weight";
    QL_TRY(check_quant_args(fn, dtype, w, n, k, ldw, q, ldq, scale));
    QL_TRY(ql_check_group(fn, group, k));
    return quantize_rows(fn, dtype, w, n, k, ldw, group, q, ldq, scale);
}

static ql_status quantize_tensorwise(const char *fn, ql_dtype dtype, const void *x, int64_t rows, int64_t k,
                                     int64_t ldx, int8_t *q, int64_t ldq, float *scale)
{
    float a = 0.0f;
    bool finite = true;
    for (int64_t r = 0; r < rows; r++) {
        const void *row = ql_row_cptr(dtype, x, r, ldx);
        for (int64_t j = 0; j < k; j++) {
            float m = fabsf(ql_load_f(dtype, row, j));
            if (!(m <= 3.402823466e38f)) finite = false;
            else if (m > a) a = m;
        }
    }
    if (!finite) {
        for (int64_t r = 0; r < rows; r++) memset(q + r * ldq, 0, (size_t)k);
        *scale = NAN;
        return ql_fail(QL_ERR_NONFINITE, "%s: the tensor holds NaN or Inf; codes are 0 and the scale NaN", fn);
    }
    float s = ql_scale_from_absmax(a);
    float st = ql_scale_divisor(dtype, s);
    for (int64_t r = 0; r < rows; r++) {
        const void *row = ql_row_cptr(dtype, x, r, ldx);
        for (int64_t j = 0; j < k; j++) q[r * ldq + j] = ql_quantize_value(dtype, ql_load_f(dtype, row, j), st);
    }
    *scale = s;
    return QL_OK;
}

ql_status ql_quantize_tensorwise(ql_dtype dtype, const void *x, int64_t rows, int64_t k, int64_t ldx, int8_t *q,
                                 int64_t ldq, float *scale)
{
    const char *fn = "ql_quantize_tensorwise";
    QL_TRY(check_quant_args(fn, dtype, x, rows, k, ldx, q, ldq, scale));
    return quantize_tensorwise(fn, dtype, x, rows, k, ldx, q, ldq, scale);
}

/* ------------------------------------------------------- ql_quantize_int8 */

/* One stochastic code as comfy-kitchen's eager _round_int8 makes it on the
 * CPU, every step a tensor op in x's dtype: y = dtype(v / st) (the quotient
 * the nearest mode rounds), then floor(dtype(y + u)), clamped. */
static inline int8_t torch_sr_code(ql_dtype dtype, float v, float st, float u)
{
    const float y = ql_round_to(dtype, v / st);
    const float f = floorf(ql_round_to(dtype, y + u));
    return (int8_t)(f > 127.0f ? 127.0f : f < -128.0f ? -128.0f : f);
}

/* Codes of one row of values v (representable in dtype), with the divisor
 * st (torch: the eager scale rounded to dtype; pcg: the CUDA scale) and the
 * noise u (torch) or the flat index of v[0] (pcg). */
static void sr_row(const ql_int8_qoptions *o, ql_dtype dtype, const float *v, int64_t k, float st, const float *u,
                   int64_t idx, int8_t *q)
{
    if (o->sr_stream == QL_SR_TORCH_CPU)
        for (int64_t j = 0; j < k; j++) q[j] = torch_sr_code(dtype, v[j], st, u[j]);
    else
        for (int64_t j = 0; j < k; j++) q[j] = ql_sr_code(v[j], st, idx + j, o->sr_seed);
}

static bool row_absmax(const float *v, int64_t k, float *a)
{
    float m = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        const float x = fabsf(v[j]);
        if (!(x <= 3.402823466e38f)) return false;
        m = x > m ? x : m;
    }
    *a = m;
    return true;
}

ql_status ql_quantize_int8(ql_dtype dtype, const void *x, int64_t rows, int64_t k, int64_t ldx,
                           const ql_int8_qoptions *o, int8_t *q, int64_t ldq, float *scale)
{
    const char *fn = "ql_quantize_int8";
    const ql_int8_qoptions none = {0, 0, 0, 0, 0};
    if (!o) o = &none;
    QL_TRY(check_quant_args(fn, dtype, x, rows, k, ldx, q, ldq, scale));
    const int64_t group = o->convrot_group;
    if (o->tensorwise && group)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: ConvRot (convrot_group %lld) is row-wise only, tensorwise is set",
                       fn, (long long)group);
    if (group) QL_TRY(ql_check_group(fn, group, k));
    if (o->sr_stream != QL_SR_CUDA_PCG && o->sr_stream != QL_SR_TORCH_CPU)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown sr_stream %d", fn, o->sr_stream);
    if (o->sr_idx0 < 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: sr_idx0 = %lld is negative", fn, (long long)o->sr_idx0);
    if (rows == 0) return QL_OK;
    if (!o->sr_seed)
        return o->tensorwise ? quantize_tensorwise(fn, dtype, x, rows, k, ldx, q, ldq, scale)
                             : quantize_rows(fn, dtype, x, rows, k, ldx, group, q, ldq, scale);
    const bool torch = o->sr_stream == QL_SR_TORCH_CPU;
    if (!torch && dtype != QL_F32)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: the CUDA stream (QL_SR_CUDA_PCG) takes fp32 input, not %s", fn,
                       ql_dtype_name(dtype));
    float *buf = ql_aligned_alloc((size_t)(2 * k + 1) * sizeof(float));
    if (!buf) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate two rows of %lld floats", fn, (long long)k);
    float *u = buf + k;
    ql_mt19937 g;
    if (torch) {
        ql_mt19937_seed(&g, o->sr_seed);
        ql_mt19937_skip(&g, o->sr_idx0);
    }
    ql_status st = QL_OK;
    if (o->tensorwise) {
        float a = 0.0f;
        bool finite = true;
        for (int64_t r = 0; r < rows && finite; r++) {
            float m;
            ql_load_row_rotated(dtype, ql_row_cptr(dtype, x, r, ldx), k, 0, buf);
            finite = row_absmax(buf, k, &m);
            a = finite && m > a ? m : a;
        }
        if (!finite) {
            for (int64_t r = 0; r < rows; r++) memset(q + r * ldq, 0, (size_t)k);
            *scale = NAN;
            st = ql_fail(QL_ERR_NONFINITE, "%s: the tensor holds NaN or Inf; codes are 0 and the scale NaN", fn);
        } else {
            const float s = torch ? ql_scale_from_absmax(a) : ql_sr_scale(a);
            const float div = torch ? ql_scale_divisor(dtype, s) : s;
            for (int64_t r = 0; r < rows; r++) {
                ql_load_row_rotated(dtype, ql_row_cptr(dtype, x, r, ldx), k, 0, buf);
                if (torch) ql_torch_rand_fill(&g, dtype, k, u);
                sr_row(o, dtype, buf, k, div, u, o->sr_idx0 + r * k, q + r * ldq);
            }
            *scale = s;
        }
    } else {
        int64_t bad = -1;
        for (int64_t r = 0; r < rows; r++) {
            float a;
            ql_load_row_rotated(dtype, ql_row_cptr(dtype, x, r, ldx), k, group, buf);
            if (torch) ql_torch_rand_fill(&g, dtype, k, u); /* drawn for every row, finite or not */
            if (!row_absmax(buf, k, &a)) {
                memset(q + r * ldq, 0, (size_t)k);
                scale[r] = NAN;
                if (bad < 0) bad = r;
                continue;
            }
            const float s = torch ? ql_scale_from_absmax(a) : ql_sr_scale(a);
            scale[r] = s;
            sr_row(o, dtype, buf, k, torch ? ql_scale_divisor(dtype, s) : s, u, o->sr_idx0 + r * k, q + r * ldq);
        }
        if (bad >= 0)
            st = ql_fail(QL_ERR_NONFINITE, "%s: row %lld %s NaN or Inf; its codes are 0 and its scale NaN", fn,
                         (long long)bad, group > 0 ? "holds (or rotates to)" : "holds");
    }
    ql_aligned_free(buf);
    return st;
}

ql_status ql_dequantize(const int8_t *q, int64_t n, int64_t k, int64_t ldq, const float *scale, int64_t n_scale,
                        int64_t group, ql_dtype out_dtype, void *out, int64_t ldo)
{
    const char *fn = "ql_dequantize";
    QL_TRY(ql_check_float_dtype(fn, "out_dtype", out_dtype));
    QL_TRY(ql_check_matrix(fn, "q", q, n, k, ldq));
    QL_TRY(ql_check_matrix(fn, "out", out, n, k, ldo));
    if (n_scale != 1 && n_scale != n)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: weight_scale has %lld elements; expected 1 or N = %lld", fn,
                       (long long)n_scale, (long long)n);
    if (n > 0) QL_CHECK_PTR(fn, scale);
    if (group > 0) QL_TRY(ql_check_group(fn, group, k));
    if (n == 0 || k == 0) return QL_OK;
    float *buf = ql_aligned_alloc((size_t)k * sizeof(float));
    if (!buf) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate a row of %lld floats", fn, (long long)k);
    for (int64_t r = 0; r < n; r++) {
        float s = scale[n_scale == 1 ? 0 : r];
        for (int64_t j = 0; j < k; j++) buf[j] = (float)q[r * ldq + j] * s;
        if (group > 0)
            for (int64_t g0 = 0; g0 < k; g0 += group) ql_fwht_f32(buf + g0, group);
        void *orow = ql_row_ptr(out_dtype, out, r, ldo);
        for (int64_t j = 0; j < k; j++) ql_store_f(out_dtype, orow, j, buf[j]);
    }
    ql_aligned_free(buf);
    return QL_OK;
}

ql_status ql_check_int8_weight(const char *fn, const ql_int8_weight *w)
{
    QL_CHECK_PTR(fn, w);
    QL_TRY(ql_check_matrix(fn, "weight", w->q, w->n, w->k, w->ldq));
    if (w->n_scale != 1 && w->n_scale != w->n)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: weight_scale has %lld elements; expected 1 or N = %lld", fn,
                       (long long)w->n_scale, (long long)w->n);
    if (w->scale == NULL) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: weight_scale is NULL", fn);
    if (w->k > QL_MAX_K)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: K = %lld exceeds %d, where int32 accumulation could overflow", fn,
                       (long long)w->k, QL_MAX_K);
    if (w->convrot_group != 0) QL_TRY(ql_check_group(fn, w->convrot_group, w->k));
    if (w->bias) QL_TRY(ql_check_float_dtype(fn, "bias", w->bias_dtype));
    return QL_OK;
}
