/* The CUDA backend behind the backend interface: W8A8 layers whose weight,
 * scales and bias live on the context's device (cuda_backend.h, built from
 * the .cu files, or cuda_absent.c that refuses every call). */
#include "backend/backend.h"
#include "cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>

static ql_status cuda_create(ql_context *ctx, const ql_linear_desc *d, void **impl, ql_layer_facts *info)
{
    const char *fn = "ql_linear_create";
    if (d->kind != QL_LINEAR_W8A8)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: only W8A8 linears run on CUDA devices (kind %d asked)", fn, (int)d->kind);
    if (d->wxa8.bits)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "%s: W4A8/W6A8 layers run on the CPU (on CUDA: decode with ql_wxa8_decode into an int8 layer)", fn);
    const ql_int8_weight *w = &d->int8; /* checked */
    float *bias = NULL;
    if (w->bias) {
        bias = malloc((size_t)(w->n > 0 ? w->n : 1) * sizeof(float));
        if (!bias) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        for (int64_t i = 0; i < w->n; i++) bias[i] = ql_load_f(w->bias_dtype, w->bias, i);
    }
    ql_cuda_linear *l = NULL;
    ql_status st = ql_cuda_linear_create(ctx->device_index, w, bias, &l);
    free(bias);
    if (st != QL_OK) return st;
    *impl = l;
    *info = (ql_layer_facts){QL_LINEAR_W8A8, w->n, w->k, w->convrot_group};
    return QL_OK;
}

static void cuda_destroy(void *impl) { ql_cuda_linear_destroy(impl); }

static void free_workspace(void *ws) { ql_cuda_workspace_free(ws); }

static ql_status cuda_forward(const char *fn, ql_context *ctx, void *const *impls, int count, const void *x, ql_dtype xdt,
                              int64_t m, int64_t ldx, void *const *ys, ql_dtype ydt, const int64_t *ldys,
                              const ql_epilogue *const *epis)
{
    for (int i = 0; epis && i < count; i++) {
        const ql_epilogue *e = epis[i];
        if (e && e->activation)
            return ql_fail(QL_ERR_UNSUPPORTED,
                           "%s: the CUDA backend has no activation epilogue (GELU); apply it after the linear", fn);
        if (e && e->input_act)
            return ql_fail(QL_ERR_UNSUPPORTED,
                           "%s: the CUDA backend has no input activation (input_act %d); apply it before the linear", fn,
                           e->input_act);
        if (e && e->bias)
            return ql_fail(QL_ERR_UNSUPPORTED,
                           "%s: the CUDA backend takes no per-call bias (epilogue bias); use the layer's own bias", fn);
    }
    ctx->device_state_free = free_workspace; /* the activation workspace, made on first use */
    return ql_cuda_linear_forward((ql_cuda_linear *const *)impls, count, (ql_cuda_workspace **)&ctx->device_state,
                                  ctx->device_stream, x, xdt, m, ldx, ys, ydt, ldys, epis);
}

static void cuda_describe(const void *impl, int64_t m, char *buf, size_t len)
{
    (void)impl, (void)m;
    snprintf(buf, len, "cuda");
}

static const char *cuda_last_kernel(const void *impl) { return ql_cuda_linear_kernel(impl); }
static size_t cuda_weight_bytes(const void *impl) { return ql_cuda_linear_weight_bytes(impl); }

static ql_status cuda_gemm_s8s8s32(ql_context *ctx, int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                                   const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc)
{
    return ql_cuda_gemm_s8s8s32(ctx->device_index, ctx->device_stream, m, n, k, a, lda, b, ldb, c, ldc);
}

const ql_backend ql_backend_cuda = {
    .name = "cuda",
    .check_device = ql_cuda_check_device,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .forward = cuda_forward,
    .describe = cuda_describe,
    .last_kernel = cuda_last_kernel,
    .weight_bytes = cuda_weight_bytes,
    .gemm_s8s8s32 = cuda_gemm_s8s8s32, /* no unmerged LoRAs on CUDA */
};
