/* The eager reference of int8_linear (docs/FORMATS.md §4.4), in plain C. */
#include "linear/check.h"
#include "quant/epilogue.h"
#include "quant/input_act.h"

#include <stdlib.h>

ql_status ql_int8_linear_ref(const ql_int8_weight *w, const void *x, ql_dtype x_dtype, int64_t m, int64_t ldx,
                             void *y, ql_dtype y_dtype, int64_t ldy, const ql_epilogue *epi)
{
    const char *fn = "ql_int8_linear_ref";
    QL_TRY(ql_check_int8_weight(fn, w));
    QL_TRY(ql_check_forward_args(fn, w->n, w->k, x, x_dtype, m, ldx, y, y_dtype, ldy, epi));
    if (m == 0 || w->n == 0) return QL_OK;
    const int64_t n = w->n, k = w->k;
    ql_epi_plan plan = {y_dtype, NULL, epi ? epi->residual : NULL, epi ? epi->ld_residual : 0,
                        epi ? epi->residual_scale : NULL, epi ? epi->activation : 0};
    float *bias = NULL;
    if (epi && epi->bias) QL_TRY(ql_bias_to_f32(fn, epi->bias, QL_F32, n, y_dtype, &bias));
    else QL_TRY(ql_bias_to_f32(fn, w->bias, w->bias_dtype, n, y_dtype, &bias));
    plan.bias = bias;
    const ql_input_act_plan act = ql_input_act_plan_of(epi, x_dtype);
    float *buf = ql_aligned_alloc((size_t)(k > 0 ? k : 1) * sizeof(float));
    int8_t *xq = ql_aligned_alloc((size_t)(k > 0 ? k : 1));
    void *xa = act.code ? ql_aligned_alloc((size_t)(k > 0 ? k : 1) * ql_dtype_size(x_dtype)) : NULL;
    if (!buf || !xq || (act.code && !xa)) {
        ql_aligned_free(buf);
        ql_aligned_free(xq);
        ql_aligned_free(xa);
        ql_aligned_free(bias);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    for (int64_t r = 0; r < m; r++) {
        float sx;
        const void *xr = ql_row_cptr(x_dtype, x, r, ldx);
        if (act.code) { /* eager's apply_input_act, in x's dtype, before the rotation */
            ql_input_act_row(&act, xr, k, xa);
            xr = xa;
        }
        ql_load_row_rotated(x_dtype, xr, k, w->convrot_group, buf);
        ql_quantize_row_f32(x_dtype, buf, k, xq, &sx); /* non-finite row: sx = NaN -> NaN output row */
        void *yrow = ql_row_ptr(y_dtype, y, r, ldy);
        for (int64_t c = 0; c < n; c++) {
            const int8_t *wr = w->q + c * w->ldq;
            int32_t acc = 0;
            for (int64_t p = 0; p < k; p++) acc += (int32_t)xq[p] * (int32_t)wr[p];
            float sxw = sx * w->scale[w->n_scale == 1 ? 0 : c];
            ql_store_f(y_dtype, yrow, c, ql_epilogue_scalar(&plan, (float)acc * sxw, r, c));
        }
    }
    ql_aligned_free(buf);
    ql_aligned_free(xq);
    ql_aligned_free(xa);
    ql_aligned_free(bias);
    return QL_OK;
}
