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
