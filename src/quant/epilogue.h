/* The epilogue's rounding order, as the eager reference applies it: the
 * scalar form every path (reference, vectorized, CUDA) must reproduce. */
#ifndef QL_EPILOGUE_H
#define QL_EPILOGUE_H

#include "quant/gelu.h"
#include "quant/quant.h"

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

/* The table ql_gelu_bf16_bits reads: QL_GELU_LUT_SIZE entries. */
void ql_gelu_bf16_lut_fill(uint16_t *lut);

/* Bias of `n` elements in bias_dtype, rounded to y_dtype, as fp32 (caller frees). */
ql_status ql_bias_to_f32(const char *fn, const void *bias, ql_dtype bias_dtype, int64_t n, ql_dtype y_dtype,
                         float **out);

#endif
