/* The CUDA backend behind the backend interface: W8A8 layers (W4A8/W6A8
 * decoded once or kept packed) whose weight, scales and bias live on the
 * context's device (cuda_backend.h, built from
 * the .cu files, or cuda_absent.c that refuses every call). */
#include "backend/backend.h"
#include "cpu/lora.h"
#include "cuda/cuda_backend.h"
#include "linear/check.h"
#include "linear/prologue_cache.h"
#include "quant/wxa8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bias widened to fp32 (NULL when there is none; caller frees). */
static ql_status bias_f32(const void *bias, ql_dtype dt, int64_t n, float **out)
{
    *out = NULL;
    if (!bias) return QL_OK;
    float *b = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!b) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_create: out of memory");
    for (int64_t i = 0; i < n; i++) b[i] = ql_load_f(dt, bias, i);
    *out = b;
    return QL_OK;
}

/* A W8A8 layer from its int8 weight: bias widened to fp32, then uploaded. */
static ql_status cuda_create_int8(ql_context *ctx, const ql_int8_weight *w, ql_cuda_linear **out)
{
    float *bias = NULL;
    QL_TRY(bias_f32(w->bias, w->bias_dtype, w->n, &bias));
    ql_status st = ql_cuda_linear_create(ctx->device_index, w, bias, out);
    free(bias);
    return st;
}

static int64_t round16(int64_t x) { return (x + 15) / 16 * 16; }

/* A W4A8/W6A8 weight kept packed: the file's rows repacked into the layout
 * the CUDA decoders read (cuda_backend.h, ql_cuda_packed_desc), with the
 * 4-bit table made by the reference's own decode (ql_wxa8_grid), so the
 * device's grid is the CPU's by construction. */
static ql_status cuda_create_packed(ql_context *ctx, const ql_wxa8_weight *w, ql_cuda_linear **out)
{
    const char *fn = "ql_linear_create";
    const int bits = w->bits;
    const int64_t n = w->n, k = w->k, ng = k / w->group, gs = w->group < 16 ? w->group : 16;
    ql_cuda_packed_desc pd = {.bits = bits, .gs = (int)gs, .n = n, .k = k, .convrot_group = w->convrot_group,
                              .ldn = round16(k / 2), .ldh = bits == 6 ? round16(k / 4) : 0, .lds = round16(k / gs),
                              .s_channel = w->s_channel};
    uint8_t *nib = calloc((size_t)(n * pd.ldn) + 1, 1), *hi = bits == 6 ? calloc((size_t)(n * pd.ldh) + 1, 1) : NULL;
    uint8_t *sb = calloc((size_t)(n * pd.lds) + 1, 1), *codes = malloc((size_t)k + 1), *table = malloc(256 * 16);
    float *bias = NULL;
    ql_status st = QL_OK;
    if (!nib || (bits == 6 && !hi) || !sb || !codes || !table)
        st = ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot stage the packed %lld x %lld weight", fn, (long long)n, (long long)k);
    for (int64_t r = 0; st == QL_OK && r < n; r++) {
        const uint8_t *row = w->q + r * w->ldq;
        memcpy(nib + r * pd.ldn, row, (size_t)(k / 2)); /* the file's nibbles, natural order */
        if (bits == 6) {
            ql_wxa8_unpack_row(6, row, k, codes);
            for (int64_t c = 0; c < k / 16; c++) {
                uint32_t word = 0;
                for (int j = 0; j < 16; j++)
                    word |= (uint32_t)(codes[16 * c + j] >> 4) << (2 * (j % 4) + 16 * ((j / 4) % 2) + 8 * (j / 8));
                for (int b = 0; b < 4; b++) hi[r * pd.ldh + 4 * c + b] = (uint8_t)(word >> (8 * b));
            }
        }
        const uint8_t *srel = (const uint8_t *)w->s_rel + r * ng;
        for (int64_t u = 0; u < k / gs; u++) sb[r * pd.lds + u] = srel[u * gs / w->group];
    }
    if (st == QL_OK) {
        float values[64];
        ql_wxa8_values(w, values);
        for (int b = 0; b < 256; b++) { /* NaN scale bytes never reach a layer (ql_wxa8_check) */
            const float e = ql_e4m3_to_fp32((uint8_t)b);
            if (bits == 4)
                for (int c = 0; c < 16; c++) table[16 * b + c] = isnan(e) ? 0 : (uint8_t)ql_wxa8_grid(values[c], e);
            else {
                const uint16_t h = isnan(e) ? 0 : ql_fp32_to_fp16(e); /* exact: e4m3 values are fp16 values */
                memcpy(table + 2 * b, &h, 2);
            }
        }
        pd.nib = nib, pd.hi = hi, pd.sb = sb, pd.table = table;
        st = bias_f32(w->bias, w->bias_dtype, n, &bias);
    }
    if (st == QL_OK) st = ql_cuda_linear_create_packed(ctx->device_index, &pd, bias, out);
    free(nib), free(hi), free(sb), free(codes), free(table), free(bias);
    return st;
}

/* W4A8/W6A8: kind QL_LINEAR_W8A8 decodes the grid once on the host, exactly
 * as the CPU's layer does (ql_wxa8_decode), resident as int8 with s_channel
 * as the row scale; QL_LINEAR_WXA8_PACKED keeps the 4/6-bit codes and
 * decodes them on the device every forward. An asymmetric layer's
 * correction is added in a corrected epilogue (either kind). Both run as
 * W8A8 (the kind they report). */
static ql_status cuda_create_wxa8(ql_context *ctx, const ql_linear_desc *d, void **impl, ql_layer_facts *info)
{
    const char *fn = "ql_linear_create";
    const ql_wxa8_weight *w = &d->wxa8; /* checked */
    const int packed = d->kind == QL_LINEAR_WXA8_PACKED;
    if (d->kind != QL_LINEAR_W8A8 && !packed)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "%s: a W%dA8 layer runs on CUDA as QL_LINEAR_W8A8 (decoded once to int8) or QL_LINEAR_WXA8_PACKED "
                       "(codes resident); kind %d is CPU only",
                       fn, w->bits, (int)d->kind);
    if (packed && w->s_rel_f32)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "%s: WXA8_PACKED decodes e4m3 group scales; this layer's s_rel is fp32 (use W8A8: decode once)", fn);
    ql_cuda_linear *l = NULL;
    ql_status st = QL_OK;
    if (packed && w->n > 0 && w->k > 0) st = cuda_create_packed(ctx, w, &l);
    else {
        int8_t *grid = malloc((size_t)(w->n * w->k) + 1);
        if (!grid)
            return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate the decoded weight (%lld x %lld)", fn,
                           (long long)w->n, (long long)w->k);
        st = ql_wxa8_decode(w, grid, w->k);
        const ql_int8_weight g = {w->n, w->k, grid, w->k, w->s_channel, w->n, w->convrot_group, w->bias, w->bias_dtype};
        if (st == QL_OK) st = ql_check_int8_weight(fn, &g);
        if (st == QL_OK) st = cuda_create_int8(ctx, &g, &l);
        free(grid); /* uploaded */
    }
    if (st == QL_OK && w->correction && w->n > 0 && w->k > 0) {
        const int64_t count = w->k / w->group * w->n;
        float *corr = malloc((size_t)count * sizeof(float));
        if (!corr) st = ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot stage the correction", fn);
        for (int64_t i = 0; corr && i < count; i++) corr[i] = ql_load_f(w->correction_dtype, w->correction, i);
        if (st == QL_OK) st = ql_cuda_linear_set_correction(l, corr, w->group);
        free(corr);
    }
    if (st != QL_OK) {
        ql_cuda_linear_destroy(l);
        return st;
    }
    *impl = l;
    *info = (ql_layer_facts){QL_LINEAR_W8A8, w->n, w->k, w->convrot_group};
    return QL_OK;
}

static ql_status cuda_create(ql_context *ctx, const ql_linear_desc *d, void **impl, ql_layer_facts *info)
{
    const char *fn = "ql_linear_create";
    if (d->wxa8.bits) return cuda_create_wxa8(ctx, d, impl, info);
    if (d->kind != QL_LINEAR_W8A8)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: only W8A8 linears run on CUDA devices (kind %d asked)", fn, (int)d->kind);
    ql_cuda_linear *l = NULL;
    QL_TRY(cuda_create_int8(ctx, &d->int8, &l)); /* checked */
    *impl = l;
    *info = (ql_layer_facts){QL_LINEAR_W8A8, d->int8.n, d->int8.k, d->int8.convrot_group};
    return QL_OK;
}

/* The layout tag of the codes a CUDA prologue writes (the prologue cache's
 * key: codes from the CPU's kernels never match them). */
static const char cuda_codes_layout = 0;

static void cuda_destroy(void *impl)
{
    void **slot = impl ? ql_cuda_linear_lora_slot(impl) : NULL;
    if (slot) ql_lora_set_free(*slot);
    ql_cuda_linear_destroy(impl);
}

/* ---- unmerged LoRAs: the CPU's codes (cpu/lora.c, made without a CPU
 * kernel to pack for), uploaded whenever the set changes */

static ql_status lora_upload(ql_cuda_linear *l)
{
    const int8_t *dq = NULL, *uq = NULL;
    const float *su = NULL;
    double e2 = 1.0;
    const int64_t rt = ql_lora_set_codes(*(ql_lora_set **)ql_cuda_linear_lora_slot(l), &dq, &uq, &su, &e2);
    return ql_cuda_linear_set_lora(l, rt, dq, uq, su, e2);
}

static ql_status cuda_add_lora(void *impl, const ql_lora_desc *d, int *id)
{
    ql_cuda_linear *l = impl;
    QL_TRY(ql_cuda_linear_lora_ok(l));
    int64_t k, group;
    ql_cuda_linear_dims(l, &k, &group);
    ql_lora_set **set = (ql_lora_set **)ql_cuda_linear_lora_slot(l);
    int nid = 0;
    QL_TRY(ql_lora_set_add(set, NULL, ql_cuda_linear_n(l), k, group, d, &nid));
    const ql_status st = lora_upload(l);
    if (st != QL_OK) { /* back to the set before: a failed add changes nothing */
        ql_lora_set_remove(*set, nid);
        lora_upload(l);
        return st;
    }
    if (id) *id = nid;
    return QL_OK;
}

static ql_status cuda_remove_lora(void *impl, int id)
{
    QL_TRY(ql_lora_set_remove(*(ql_lora_set **)ql_cuda_linear_lora_slot(impl), id));
    return lora_upload(impl);
}

static int cuda_lora_count(const void *impl)
{
    return ql_lora_set_count(*(ql_lora_set **)ql_cuda_linear_lora_slot((ql_cuda_linear *)impl));
}

static int64_t cuda_lora_rank(const void *impl)
{
    return ql_lora_set_rank(*(ql_lora_set **)ql_cuda_linear_lora_slot((ql_cuda_linear *)impl));
}

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
    .add_lora = cuda_add_lora,
    .remove_lora = cuda_remove_lora,
    .lora_count = cuda_lora_count,
    .lora_rank = cuda_lora_rank,
    .gemm_s8s8s32 = cuda_gemm_s8s8s32,
};
