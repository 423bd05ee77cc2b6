/* Argument checks of the public linear API. */
#include "linear/check.h"

#include "quant/input_act.h"
#include "quant/quant.h"

#include <math.h>
#include "quant/wxa8.h"

/* The input activation's terms; x's columns (2k for swiglu) are checked by the caller. */
static ql_status check_input_act(const char *fn, const ql_epilogue *epi, int64_t m, int64_t k, int64_t ldx)
{
    switch (epi->input_act) {
    case QL_INPUT_ACT_NONE:
    case QL_INPUT_ACT_GELU_TANH: return QL_OK;
    case QL_INPUT_ACT_SWIGLU:
        if (m > 1 && ldx < 2 * k)
            return ql_fail(QL_ERR_INVALID_ARGUMENT,
                           "%s: x row stride %lld is smaller than 2K = %lld (input_act swiglu reads [gate | up] rows)", fn,
                           (long long)ldx, (long long)(2 * k));
        return QL_OK;
    case QL_INPUT_ACT_RMS_NORM:
        if (k > 0 && !epi->input_act_weight)
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: input_act rms_norm needs input_act_weight ([K] values)", fn);
        if (!ql_is_float_dtype(epi->input_act_weight_dtype))
            return ql_fail(QL_ERR_UNSUPPORTED, "%s: input_act_weight dtype %s is not supported (fp32, fp16 or bf16)", fn,
                           ql_dtype_name(epi->input_act_weight_dtype));
        if (!isfinite(epi->input_act_eps))
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: input_act_eps = %g is not finite", fn, (double)epi->input_act_eps);
        return QL_OK;
    default:
        return ql_fail(QL_ERR_INVALID_ARGUMENT,
                       "%s: unknown input_act %d (0 none, 1 gelu_tanh, 2 swiglu, 3 rms_norm)", fn, epi->input_act);
    }
}

ql_status ql_check_forward_args(const char *fn, int64_t n, int64_t k, const void *x, ql_dtype x_dtype, int64_t m,
                                int64_t ldx, const void *y, ql_dtype y_dtype, int64_t ldy, const ql_epilogue *epi)
{
    QL_TRY(ql_check_float_dtype(fn, "x", x_dtype));
    QL_TRY(ql_check_float_dtype(fn, "y", y_dtype));
    if (epi) QL_TRY(check_input_act(fn, epi, m, k, ldx));
    QL_TRY(ql_check_matrix(fn, "x", x, m, epi ? ql_input_act_cols(epi->input_act, k) : k, ldx));
    QL_TRY(ql_check_matrix(fn, "y", y, m, n, ldy));
    if (epi && epi->activation != QL_ACTIVATION_NONE && epi->activation != QL_ACTIVATION_GELU)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown activation %d in the epilogue (0 none, 1 GELU)", fn,
                       epi->activation);
    if (epi && epi->residual) {
        QL_TRY(ql_check_matrix(fn, "residual", epi->residual, m, n, epi->ld_residual));
        if (epi->residual_scale == NULL)
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: residual requires residual_scale", fn);
    }
    return QL_OK;
}

ql_status ql_check_linear_desc(const char *fn, const ql_linear_desc *d)
{
    switch (d->kind) {
    case QL_LINEAR_W8A8:
    case QL_LINEAR_WEIGHT_ONLY:
    case QL_LINEAR_DEQUANT:
    case QL_LINEAR_WXA8_PACKED:
        if (d->wxa8.bits) return ql_wxa8_check(&d->wxa8);
        if (d->kind == QL_LINEAR_WXA8_PACKED)
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: kind WXA8_PACKED needs a W4A8/W6A8 weight (desc.wxa8)", fn);
        return ql_check_int8_weight(fn, &d->int8);
    case QL_LINEAR_DENSE:
        QL_TRY(ql_check_float_dtype(fn, "weight", d->weight_dtype));
        QL_TRY(ql_check_matrix(fn, "weight", d->weight, d->n, d->k, d->ld_weight));
        if (d->compute_dtype != QL_F32 && d->compute_dtype != QL_BF16)
            return ql_fail(QL_ERR_UNSUPPORTED, "%s: dense compute dtype %s is not supported (fp32 or bf16)", fn,
                           ql_dtype_name(d->compute_dtype));
        if (d->bias) QL_TRY(ql_check_float_dtype(fn, "bias", d->bias_dtype));
        return QL_OK;
    default: return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown linear kind %d", fn, (int)d->kind);
    }
}
