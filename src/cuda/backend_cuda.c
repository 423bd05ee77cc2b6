/* The CUDA backend behind the backend interface: W8A8 layers whose weight,
 * scales and bias live on the context's device (cuda_backend.h, built from
 * the .cu files, or cuda_absent.c that refuses every call). */
#include "backend/backend.h"
#include "cuda/cuda_backend.h"
#include "linear/check.h"
#include "linear/prologue_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A W8A8 layer from its int8 weight: bias widened to fp32, then uploaded. */
static ql_status cuda_create_int8(ql_context *ctx, const ql_int8_weight *w, void **impl, ql_layer_facts *info)
{
    float *bias = NULL;
    if (w->bias) {
        bias = malloc((size_t)(w->n > 0 ? w->n : 1) * sizeof(float));
        if (!bias) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_create: out of memory");
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

/* W4A8/W6A8 as W8A8 (the kind QL_LINEAR_W8A8 with wxa8.bits): the grid
 * decoded once on the host, exactly as the CPU's layer decodes it
 * (ql_wxa8_decode), then resident as int8 with s_channel as the row scale. */
static ql_status cuda_create_wxa8(ql_context *ctx, const ql_linear_desc *d, void **impl, ql_layer_facts *info)
{
    const char *fn = "ql_linear_create";
    const ql_wxa8_weight *w = &d->wxa8; /* checked */
    if (d->kind != QL_LINEAR_W8A8)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "%s: a W%dA8 layer runs on CUDA as QL_LINEAR_W8A8 (decoded once to int8); kind %d (packed "
                       "codes resident) is CPU only",
                       fn, w->bits, (int)d->kind);
    if (w->correction)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "%s: an asymmetric W4A8 layer (with a correction) runs on the CPU only: the CUDA epilogue has "
                       "no correction term",
                       fn);
    int8_t *grid = malloc((size_t)(w->n * w->k) + 1);
    if (!grid) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate the decoded weight (%lld x %lld)", fn,
                              (long long)w->n, (long long)w->k);
    ql_status st = ql_wxa8_decode(w, grid, w->k);
    const ql_int8_weight g = {w->n, w->k, grid, w->k, w->s_channel, w->n, w->convrot_group, w->bias, w->bias_dtype};
    if (st == QL_OK) st = ql_check_int8_weight(fn, &g);
    if (st == QL_OK) st = cuda_create_int8(ctx, &g, impl, info);
    free(grid); /* uploaded */
    return st;
}

static ql_status cuda_create(ql_context *ctx, const ql_linear_desc *d, void **impl, ql_layer_facts *info)
{
    const char *fn = "ql_linear_create";
    if (d->wxa8.bits) return cuda_create_wxa8(ctx, d, impl, info);
    if (d->kind != QL_LINEAR_W8A8)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: only W8A8 linears run on CUDA devices (kind %d asked)", fn, (int)d->kind);
    return cuda_create_int8(ctx, &d->int8, impl, info); /* checked */
}

/* The layout tag of the codes a CUDA prologue writes (the prologue cache's
 * key: codes from the CPU's kernels never match them). */
static const char cuda_codes_layout = 0;

static void cuda_destroy(void *impl) { ql_cuda_linear_destroy(impl); }

static void free_workspace(void *ws) { ql_cuda_workspace_free(ws); }

/* The same input activation (kind, and rms_norm's weight and eps): layers
 * sharing x on CUDA share one prologue, hence one activation. */
static bool same_input_act(const ql_epilogue *a, const ql_epilogue *b)
{
    const int ca = a ? a->input_act : QL_INPUT_ACT_NONE, cb = b ? b->input_act : QL_INPUT_ACT_NONE;
    if (ca != cb) return false;
    return ca != QL_INPUT_ACT_RMS_NORM ||
           (a->input_act_weight == b->input_act_weight && a->input_act_weight_dtype == b->input_act_weight_dtype &&
            memcmp(&a->input_act_eps, &b->input_act_eps, sizeof(float)) == 0);
}

static ql_status cuda_forward(const char *fn, ql_context *ctx, void *const *impls, int count, const void *x, ql_dtype xdt,
                              int64_t m, int64_t ldx, void *const *ys, ql_dtype ydt, const int64_t *ldys,
                              const ql_epilogue *const *epis)
{
    for (int i = 0; epis && i < count; i++) {
        const ql_epilogue *e = epis[i];
        /* an exact erf GELU inlined into the fast epilogues slowed every layer's epilogue, with
         * or without it (docs/MEASUREMENTS.md §13): not served */
        if (e && e->activation)
            return ql_fail(QL_ERR_UNSUPPORTED,
                           "%s: the CUDA backend has no activation epilogue (GELU); apply it after the linear", fn);
        if (e && e->bias)
            return ql_fail(QL_ERR_UNSUPPORTED,
                           "%s: the CUDA backend takes no per-call bias (epilogue bias); use the layer's own bias", fn);
    }
    /* layers sharing x but not its input activation: each its own prologue (as on the CPU) */
    for (int i = 1; epis && i < count; i++)
        if (!same_input_act(epis[0], epis[i])) {
            for (int j = 0; j < count; j++)
                QL_TRY(cuda_forward(fn, ctx, &impls[j], 1, x, xdt, m, ldx, &ys[j], ydt, &ldys[j], &epis[j]));
            return QL_OK;
        }
    ctx->device_state_free = free_workspace; /* the activation workspace, made on first use */
    /* the prologue cache (qlinear.h): the codes stay in the context's device
     * workspace; the cache keeps their key and the workspace's token */
    ql_prologue_cache *pc = epis && epis[0] ? epis[0]->prologue_cache : NULL;
    ql_prologue_key key;
    uint64_t token = 0;
    bool hit = false;
    if (pc) {
        int64_t k, group;
        ql_cuda_linear_dims(impls[0], &k, &group);
        key = ql_prologue_key_of(epis[0], x, xdt, m, ldx, k, group, &cuda_codes_layout);
        hit = pc->valid && ql_prologue_key_equal(&pc->key, &key);
        if (hit) token = pc->device_token;
    }
    const ql_status st = ql_cuda_linear_forward((ql_cuda_linear *const *)impls, count,
                                                (ql_cuda_workspace **)&ctx->device_state, ctx->device_stream, x, xdt, m,
                                                ldx, ys, ydt, ldys, epis, pc ? &token : NULL);
    if (pc && st == QL_OK) {
        if (hit && token == pc->device_token) pc->hits++;
        else pc->key = key, pc->valid = true, pc->device_token = token, pc->misses++;
    } /* a failed forward leaves the cache as it was: its token no longer matches the workspace's if that was overwritten */
    return st;
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
