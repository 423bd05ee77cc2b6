#include "quant/epilogue.h"

ql_status ql_bias_to_f32(const char *fn, const void *bias, ql_dtype bias_dtype, int64_t n, ql_dtype y_dtype,
                         float **out)
{
    *out = NULL;
    if (!bias) return QL_OK;
    float *b = ql_aligned_alloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!b) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate the bias", fn);
    for (int64_t i = 0; i < n; i++) b[i] = ql_round_to(y_dtype, ql_load_f(bias_dtype, bias, i));
    *out = b;
    return QL_OK;
}

void ql_gelu_bf16_lut_fill(uint16_t *lut)
{
    const uint32_t span = QL_GELU_LUT_HI - QL_GELU_LUT_LO;
    for (uint32_t i = 0; i < 2 * span; i++) {
        const uint16_t h = (uint16_t)((i >= span ? 0x8000u : 0u) | (QL_GELU_LUT_LO + i % span));
        lut[i] = ql_fp32_to_bf16(ql_gelu_f32(ql_bf16_to_fp32(h)));
    }
}
