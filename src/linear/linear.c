/* The public linear API: every argument checked here, once; the work is
 * done by the backend of the layer's context (backend/backend.h). */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "cuda/cuda_backend.h"
#include "linear/check.h"
#include "linear/linear.h"

struct ql_linear {
    const ql_backend *be;
    ql_context *ctx;
    ql_layer_facts info;
    void *impl;
};

ql_status ql_linear_create(ql_context *ctx, const ql_linear_desc *d, ql_linear **out)
{
    const char *fn = "ql_linear_create";
    QL_CHECK_PTR(fn, ctx);
    QL_CHECK_PTR(fn, d);
    QL_CHECK_PTR(fn, out);
    *out = NULL;
    QL_TRY(ql_check_linear_desc(fn, d));
    ql_linear *l = calloc(1, sizeof *l);
    if (!l) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    l->be = ql_backend_for(ctx->device);
    l->ctx = ctx;
    ql_status st = l->be->create(ctx, d, &l->impl, &l->info);
    if (st != QL_OK) {
        free(l);
        return st;
    }
    *out = l;
    return QL_OK;
}

void ql_linear_destroy(ql_linear *l)
{
    if (!l) return;
    l->be->destroy(l->impl);
    free(l);
}

size_t ql_linear_weight_bytes(const ql_linear *l) { return l ? l->be->weight_bytes(l->impl) : 0; }

ql_status ql_linear_cuda_decoded_weight(const ql_linear *l, int8_t *out, int64_t ldo)
{
    if (!l || l->be != &ql_backend_cuda)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "ql_linear_cuda_decoded_weight: not a layer of a CUDA context");
    return ql_cuda_linear_decoded_weight(l->impl, out, ldo);
}

const char *ql_linear_cuda_kernel(const ql_linear *l)
{
    return l && l->be->last_kernel ? l->be->last_kernel(l->impl) : "";
}

void ql_linear_describe(const ql_linear *l, int64_t m, char *buf, size_t len)
{
    if (!buf || !len) return;
    if (!l) {
        snprintf(buf, len, "-");
        return;
    }
    l->be->describe(l->impl, m, buf, len);
}

ql_status ql_linear_forward(ql_linear *l, const void *x, ql_dtype xdt, int64_t m, int64_t ldx, void *y, ql_dtype ydt,
                            int64_t ldy, const ql_epilogue *epi)
{
    const char *fn = "ql_linear_forward";
    QL_CHECK_PTR(fn, l);
    QL_TRY(ql_check_forward_args(fn, l->info.n, l->info.k, x, xdt, m, ldx, y, ydt, ldy, epi));
    if (m == 0 || l->info.n == 0) return QL_OK;
    return l->be->forward(fn, l->ctx, &l->impl, 1, x, xdt, m, ldx, &y, ydt, &ldy, epi ? &epi : NULL);
}

ql_status ql_linear_forward_shared(ql_linear *const *lins, int count, const void *x, ql_dtype xdt, int64_t m, int64_t ldx,
                                   void *const *ys, ql_dtype ydt, const int64_t *ldys, const ql_epilogue *const *epis)
{
    const char *fn = "ql_linear_forward_shared";
    QL_CHECK_PTR(fn, lins);
    QL_CHECK_PTR(fn, ys);
    QL_CHECK_PTR(fn, ldys);
    if (count < 1 || count > QL_SHARED_MAX)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: count = %d is not in 1..%d", fn, count, QL_SHARED_MAX);
    const ql_linear *l0 = lins[0];
    QL_CHECK_PTR(fn, l0);
    void *impls[QL_SHARED_MAX];
    for (int i = 0; i < count; i++) {
        const ql_linear *l = lins[i];
        const ql_epilogue *epi = epis ? epis[i] : NULL;
        QL_CHECK_PTR(fn, l);
        const ql_layer_facts *a = &l->info, *b = &l0->info;
        if (l->ctx != l0->ctx || a->k != b->k || a->kind != b->kind || a->group != b->group || l->be != l0->be)
            return ql_fail(QL_ERR_INVALID_ARGUMENT,
                           "%s: layer %d (kind %d, K = %lld, group %lld) does not share layer 0's context, kind (%d), K (%lld) "
                           "and rotation group (%lld)",
                           fn, i, (int)a->kind, (long long)a->k, (long long)a->group, (int)b->kind, (long long)b->k,
                           (long long)b->group);
        QL_TRY(ql_check_forward_args(fn, a->n, a->k, x, xdt, m, ldx, ys[i], ydt, ldys[i], epi));
        if (ys[i] == x)
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: output %d is the input: the other layers still read it", fn, i);
        impls[i] = l->impl;
    }
    if (m == 0) return QL_OK;
    if (l0->info.k > 0 && count > 1)
        return l0->be->forward(fn, l0->ctx, impls, count, x, xdt, m, ldx, ys, ydt, ldys, epis);
    for (int i = 0; i < count; i++) QL_TRY(ql_linear_forward(lins[i], x, xdt, m, ldx, ys[i], ydt, ldys[i], epis ? epis[i] : NULL));
    return QL_OK;
}

/* ---- unmerged LoRA */

ql_status ql_linear_add_lora(ql_linear *l, const ql_lora_desc *d, int *id)
{
    QL_CHECK_PTR("ql_linear_add_lora", l);
    if (!l->be->add_lora)
        return ql_fail(QL_ERR_UNSUPPORTED, "ql_linear_add_lora: unmerged LoRAs run on the CPU backends only, not on %s devices",
                       l->be == &ql_backend_cuda ? "CUDA" : l->be->name);
    return l->be->add_lora(l->impl, d, id);
}

ql_status ql_linear_remove_lora(ql_linear *l, int id)
{
    QL_CHECK_PTR("ql_linear_remove_lora", l);
    if (!l->be->remove_lora)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "ql_linear_remove_lora: no LoRA with id %d on this linear", id);
    return l->be->remove_lora(l->impl, id);
}

int ql_linear_lora_count(const ql_linear *l) { return l && l->be->lora_count ? l->be->lora_count(l->impl) : 0; }
int64_t ql_linear_lora_rank(const ql_linear *l) { return l && l->be->lora_rank ? l->be->lora_rank(l->impl) : 0; }

/* ---- bare GEMM */

ql_status ql_gemm_s8s8s32(ql_context *ctx, int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                          const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc)
{
    const char *fn = "ql_gemm_s8s8s32";
    QL_CHECK_PTR(fn, ctx);
    QL_TRY(ql_check_matrix(fn, "a", a, m, k, lda));
    QL_TRY(ql_check_matrix(fn, "b", b, n, k, ldb));
    QL_TRY(ql_check_matrix(fn, "c", c, m, n, ldc));
    if (k > QL_MAX_K)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: K = %lld exceeds %d, where int32 accumulation could overflow", fn,
                       (long long)k, QL_MAX_K);
    return ql_backend_for(ctx->device)->gemm_s8s8s32(ctx, m, n, k, a, lda, b, ldb, c, ldc);
}
