/* Shared pieces of the linear ops: argument checks and the scalar epilogue
 * every path (reference or vectorized) must reproduce. */
#ifndef QL_LINEAR_H
#define QL_LINEAR_H

#include "../quant/quant.h"
#include "gelu.h"

/* int32 accumulators stay exact while 128·128·K < 2^31 (and 255·128·K for
 * the u8·s8 VNNI trick): K <= 65536. */
#define QL_MAX_K 65536

ql_status ql_check_int8_weight(const char *fn, const ql_int8_weight *w);
ql_status ql_check_forward_args(const char *fn, int64_t n, int64_t k, const void *x, ql_dtype x_dtype, int64_t m,
                                int64_t ldx, const void *y, ql_dtype y_dtype, int64_t ldy, const ql_epilogue *epi);

/* The epilogue terms, resolved for one output dtype: bias converted to the
 * output dtype (as fp32 values), residual scale as fp32. */
typedef struct ql_epi_plan {
    ql_dtype y_dtype;
    const float *bias; /* NULL: none */
    const void *residual;
    int64_t ld_residual;
    const void *residual_scale;
    int act; /* ql_activation */
} ql_epi_plan;

/* y = round(v); y = round(y + bias[n]); y = round(gelu(y)) if act;
 * y = round(res + rs[n]·y): the eager order of roundings. v is the fp32
 * value acc·(s_x·s_w) or a float GEMM's. */
static inline float ql_epilogue_scalar(const ql_epi_plan *e, float v, int64_t row, int64_t col)
{
    ql_dtype dt = e->y_dtype;
    float y = ql_round_to(dt, v);
    if (e->bias) y = ql_round_to(dt, y + e->bias[col]);
    if (e->act) y = ql_round_to(dt, ql_gelu_f32(y));
    if (e->residual) {
        float r = ql_load_f(dt, e->residual, row * e->ld_residual + col);
        float rs = ql_load_f(dt, e->residual_scale, col);
        float t = rs * y;
        y = ql_round_to(dt, r + t);
    }
    return y;
}

/* Bias of `n` elements in bias_dtype, rounded to y_dtype, as fp32 (caller frees). */
ql_status ql_bias_to_f32(const char *fn, const void *bias, ql_dtype bias_dtype, int64_t n, ql_dtype y_dtype,
                         float **out);

/* Weight quantization with exactly the reference's codes and scales
 * (ql_quantize_rowwise for group 0, ql_quantize_convrot_weight otherwise),
 * vectorized where the CPU allows; single-threaded. */
ql_status ql_quantize_weight_rows(ql_dtype dtype, const void *w, int64_t rows, int64_t k, int64_t ldw, int64_t group,
                                  int8_t *q, int64_t ldq, float *scale);

#endif
