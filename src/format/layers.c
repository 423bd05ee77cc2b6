/* Quantized-layer discovery (docs/FORMATS.md §2): `P.comfy_quant` tensors and
 * __metadata__["_quantization_metadata"], per-format tensor checks, and
 * ql_linear descriptors built from a layer. */
#include "format.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "quant/quant.h"
#include "quant/wxa8.h"

static const char SUFFIX[] = ".comfy_quant";

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static int64_t find_suffixed(const ql_checkpoint *c, const char *prefix, const char *suffix)
{
    size_t a = strlen(prefix), b = strlen(suffix);
    char stack[256];
    char *name = a + b + 1 <= sizeof stack ? stack : malloc(a + b + 1);
    if (!name) return -2;
    memcpy(name, prefix, a);
    memcpy(name + a, suffix, b + 1);
    int64_t i = ql_checkpoint_find(c, name);
    if (name != stack) free(name);
    return i;
}

static int same_config(const ql_cq *x, const ql_cq *y)
{
    return x->format == y->format && x->convrot == y->convrot && (!x->convrot || x->convrot_group == y->convrot_group) &&
           x->group_size == y->group_size && !strcmp(x->linear_dtype, y->linear_dtype) &&
           x->full_precision_matrix_mult == y->full_precision_matrix_mult;
}

static ql_status add_layer(ql_checkpoint *c, const char *prefix, size_t plen, const ql_cq *cq, ql_layer_source src,
                           const char *json, size_t jlen, int64_t cq_tensor)
{
    ql_layer *l = &c->layers[c->n_layers];
    memset(l, 0, sizeof *l);
    l->prefix = dup_n(prefix, plen);
    l->format = strdup(cq->format);
    l->json = dup_n(json, jlen);
    l->linear_dtype = strdup(cq->linear_dtype);
    if (!l->prefix || !l->format || !l->json || !l->linear_dtype) {
        free(l->prefix), free(l->format), free(l->json), free(l->linear_dtype);
        return ql_fail_file(c, QL_ERR_OUT_OF_MEMORY, "out of memory listing layers");
    }
    c->n_layers++;
    ql_layer_info *i = &l->info;
    i->prefix = l->prefix;
    i->format = l->format;
    i->config_json = l->json;
    i->linear_dtype = l->linear_dtype;
    i->source = src;
    i->supported = cq->known_supported;
    i->convrot = cq->convrot;
    i->convrot_group = cq->convrot ? cq->convrot_group : 0;
    if (strcmp(cq->format, "int8_tensorwise") != 0) i->convrot_group = cq->convrot_group;
    i->group_size = cq->group_size;
    i->full_precision_matrix_mult = cq->full_precision_matrix_mult;
    i->comfy_quant = cq_tensor;
    i->weight = find_suffixed(c, l->prefix, ".weight");
    i->weight_scale = find_suffixed(c, l->prefix, ".weight_scale");
    i->bias = find_suffixed(c, l->prefix, ".bias");
    i->s_rel = find_suffixed(c, l->prefix, ".weight_s_rel");
    i->s_channel = find_suffixed(c, l->prefix, ".weight_s_channel");
    i->codebook = find_suffixed(c, l->prefix, ".weight_codebook");
    i->correction = find_suffixed(c, l->prefix, ".weight_correction");
    if (i->weight < -1 || i->weight_scale < -1 || i->bias < -1 || i->s_rel < -1 || i->s_channel < -1 ||
        i->codebook < -1 || i->correction < -1)
        return ql_fail_file(c, QL_ERR_OUT_OF_MEMORY, "out of memory listing layers");
    return QL_OK;
}

static void set_reason(ql_layer *l, const char *fmt, ...) QL_PRINTF(2, 3);
static void set_reason(ql_layer *l, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    free(l->reason);
    l->reason = strdup(buf);
    l->info.supported = 0;
    l->info.unsupported_reason = l->reason ? l->reason : "unsupported";
}

/* The tensor rules of int8_tensorwise. */
static ql_status check_int8(ql_checkpoint *c, ql_layer *l)
{
    ql_layer_info *i = &l->info;
    ql_name_buf pb, tb;
    const char *p = ql_show(&pb, l->prefix);
    if (i->weight < 0)
        return ql_fail_file(c, QL_ERR_FORMAT, "layer '%s': int8_tensorwise needs tensor '%s.weight', which is missing", p,
                            p);
    const ql_st_tensor *w = &c->tensors[i->weight];
    const char *wn = ql_show(&tb, w->name);
    if (w->dtype != QL_ST_I8)
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': int8_tensorwise weight has dtype %s; it must be I8", wn,
                            ql_st_dtype_name(w->dtype));
    if (w->ndim != 2)
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': int8_tensorwise weight has %d dimensions; it must be [N, K]",
                            wn, w->ndim);
    const int64_t n = w->shape[0], k = w->shape[1];
    if (n > QL_MAX_ELEMENTS) /* only with K = 0: the file holds every other weight's bytes */
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': N = %lld rows is absurdly large (> 2^48)", wn, (long long)n);
    i->n = n;
    i->k = k;
    if (i->convrot && k % i->convrot_group != 0)
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': K = %lld is not a multiple of the ConvRot group %lld", wn,
                            (long long)k, (long long)i->convrot_group);
    if (i->weight_scale < 0)
        return ql_fail_file(c, QL_ERR_FORMAT, "layer '%s': int8_tensorwise needs tensor '%s.weight_scale', which is missing",
                            p, p);
    const ql_st_tensor *s = &c->tensors[i->weight_scale];
    const char *sn = ql_show(&tb, s->name);
    if (s->dtype != QL_ST_F32)
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': int8_tensorwise weight_scale has dtype %s; it must be F32",
                            sn, ql_st_dtype_name(s->dtype));
    int shape_ok = (s->ndim == 0) || (s->ndim == 1 && (s->shape[0] == 1 || s->shape[0] == n)) ||
                   (s->ndim == 2 && s->shape[0] == n && s->shape[1] == 1);
    if (!shape_ok) {
        char sh[64];
        int o = snprintf(sh, sizeof sh, "[");
        for (int d = 0; d < s->ndim && d < 4 && o < (int)sizeof sh; d++)
            o += snprintf(sh + o, sizeof sh - (size_t)o, "%s%lld", d ? ", " : "", (long long)s->shape[d]);
        if (o < (int)sizeof sh) snprintf(sh + o, sizeof sh - (size_t)o, "%s]", s->ndim > 4 ? ", ..." : "");
        return ql_fail_file(c, QL_ERR_FORMAT,
                            "tensor '%s': weight_scale has shape %s (%lld elements); int8_tensorwise needs 1 or N = "
                            "%lld elements, shaped [], [1], [N] or [N, 1]",
                            sn, sh, (long long)s->numel, (long long)n);
    }
    i->n_scale = s->numel;
    if (i->bias >= 0) {
        const ql_st_tensor *b = &c->tensors[i->bias];
        const char *bn = ql_show(&tb, b->name);
        if (b->ndim != 1 || b->shape[0] != n)
            return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': bias must have shape [N] = [%lld]", bn, (long long)n);
        if (b->dtype != QL_ST_F32 && b->dtype != QL_ST_F16 && b->dtype != QL_ST_BF16)
            set_reason(l, "bias dtype %s is not supported (F32, F16 or BF16)", ql_st_dtype_name(b->dtype));
    }
    if (k > QL_MAX_K) set_reason(l, "K = %lld exceeds %d (int32 accumulation limit)", (long long)k, QL_MAX_K);
    return QL_OK;
}

/* The tensor rules of asym_w4a8_int8 / w6a8_int8 (docs/FORMATS.md §5.1, §5.6). */
static ql_status check_wxa8(ql_checkpoint *c, ql_layer *l)
{
    ql_layer_info *i = &l->info;
    ql_name_buf pb, tb, wb, rb, cb;
    const char *p = ql_show(&pb, l->prefix), *f = l->format;
    const char *need[3] = {".weight", ".weight_s_rel", ".weight_s_channel"};
    const int64_t idx[3] = {i->weight, i->s_rel, i->s_channel};
    for (int t = 0; t < 3; t++)
        if (idx[t] < 0)
            return ql_fail_file(c, QL_ERR_FORMAT, "layer '%s': %s needs tensor '%s%s', which is missing", p, f, p, need[t]);
    const ql_st_tensor *w = &c->tensors[i->weight], *sr = &c->tensors[i->s_rel], *sc = &c->tensors[i->s_channel];
    const char *wn = ql_show(&wb, w->name);
    if (w->dtype != QL_ST_I8 || w->ndim != 2)
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': %s weight is %s %d-D; it must be I8 [N, K/2] or [N, 3K/4]", wn,
                            f, ql_st_dtype_name(w->dtype), w->ndim);
    const int64_t n = w->shape[0], width = w->shape[1];
    const char *srn = ql_show(&rb, sr->name);
    if (sr->dtype != QL_ST_F8_E4M3 && sr->dtype != QL_ST_F32 && sr->dtype != QL_ST_U8)
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': s_rel has dtype %s; it must be F8_E4M3, F32 or U8 (e4m3 bytes)",
                            srn, ql_st_dtype_name(sr->dtype));
    if (sr->ndim != 2 || sr->shape[0] != n)
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': s_rel must be [N, K/group_size] with N = %lld", srn,
                            (long long)n);
    const int64_t gs = i->group_size, ng = sr->shape[1];
    if (gs > (int64_t)1 << 20 || ng > QL_MAX_ELEMENTS / (gs > 0 ? gs : 1))
        return ql_fail_file(c, QL_ERR_FORMAT, "layer '%s': group_size %lld is out of range", p, (long long)gs);
    const int64_t k = ng * gs;
    int bits = 0;
    if (k > 0 && k % 2 == 0 && width == k / 2) bits = 4; /* (not 2 * width: N = 0 leaves width unbounded) */
    else if (k > 0 && k % 4 == 0 && width == 3 * (k / 4)) bits = 6;
    else
        return ql_fail_file(c, QL_ERR_FORMAT,
                            "tensor '%s': row width %lld is neither K/2 nor 3K/4 for K = %lld (s_rel columns %lld × "
                            "group_size %lld)",
                            wn, (long long)width, (long long)k, (long long)ng, (long long)gs);
    if (!strcmp(f, "w6a8_int8") && bits != 6)
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': a w6a8_int8 weight must be [N, 3K/4] = [%lld, %lld]", wn,
                            (long long)n, (long long)(3 * k / 4));
    i->bits = bits;
    i->n = n;
    i->k = k;
    i->s_rel_dtype = sr->dtype;
    if (!ql_wxa8_group_ok(bits, gs))
        return ql_fail_file(c, QL_ERR_FORMAT,
                            bits == 6 ? "layer '%s': group_size %lld must be a multiple of 16 for 6-bit codes"
                                      : "layer '%s': group_size %lld neither divides 16 nor is a multiple of it (4 at least)",
                            p, (long long)gs);
    if (k % (bits == 6 ? 32 : 16) != 0)
        return ql_fail_file(c, QL_ERR_FORMAT, "layer '%s': K = %lld is not a multiple of %d (%d-bit codes)", p,
                            (long long)k, bits == 6 ? 32 : 16, bits);
    if (k % i->convrot_group != 0)
        return ql_fail_file(c, QL_ERR_FORMAT, "layer '%s': K = %lld is not a multiple of the ConvRot group %lld", p,
                            (long long)k, (long long)i->convrot_group);
    const char *scn = ql_show(&cb, sc->name);
    if (sc->dtype != QL_ST_F32 || !((sc->ndim == 1 && sc->shape[0] == n) || (sc->ndim == 2 && sc->shape[0] == n && sc->shape[1] == 1)))
        return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': s_channel must be F32 [N] = [%lld] (it is %s, %d-D)", scn,
                            (long long)n, ql_st_dtype_name(sc->dtype), sc->ndim);
    if (i->codebook >= 0) {
        const ql_st_tensor *cb = &c->tensors[i->codebook];
        const char *cn = ql_show(&tb, cb->name);
        if (bits == 6) return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': a 6-bit layer has no codebook", cn);
        if (cb->dtype != QL_ST_F32 || cb->ndim != 1 || cb->shape[0] != 16)
            return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': the codebook must be F32 [16] (it is %s with %lld elements)",
                                cn, ql_st_dtype_name(cb->dtype), (long long)cb->numel);
        i->has_codebook = 1;
    }
    if (i->correction >= 0) {
        const ql_st_tensor *co = &c->tensors[i->correction];
        const char *con = ql_show(&tb, co->name);
        if (bits == 6) return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': a 6-bit layer has no correction", con);
        if ((co->dtype != QL_ST_F32 && co->dtype != QL_ST_F16 && co->dtype != QL_ST_BF16) || co->ndim != 2 ||
            co->shape[0] != ng || co->shape[1] != n)
            return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': the correction must be F32/F16/BF16 [K/group_size, N] = [%lld, %lld]",
                                con, (long long)ng, (long long)n);
        i->asymmetric = 1;
    }
    /* Finite scales (a NaN scale would decode to garbage). */
    const unsigned char *sd = ql_st_tensor_data(c, sr);
    for (int64_t e = 0; e < n * ng; e++) {
        float v;
        if (sr->dtype == QL_ST_F32) memcpy(&v, sd + 4 * e, 4);
        else v = ql_e4m3_to_fp32(sd[e]);
        if (!isfinite(v))
            return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': s_rel[%lld, %lld] is %s", srn, (long long)(e / ng),
                                (long long)(e % ng), isnan(v) ? "NaN" : "infinite");
    }
    const unsigned char *cd = ql_st_tensor_data(c, sc);
    for (int64_t e = 0; e < n; e++) {
        float v;
        memcpy(&v, cd + 4 * e, 4);
        if (!isfinite(v))
            return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': s_channel[%lld] is %s", scn, (long long)e,
                                isnan(v) ? "NaN" : "infinite");
    }
    if (i->codebook >= 0) {
        const unsigned char *bd = ql_st_tensor_data(c, &c->tensors[i->codebook]);
        for (int e = 0; e < 16; e++) {
            float v;
            memcpy(&v, bd + 4 * e, 4);
            if (!isfinite(v))
                return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': codebook[%d] is not finite",
                                    ql_show(&tb, c->tensors[i->codebook].name), e);
        }
    }
    if (i->correction >= 0) { /* [K/group_size, N] */
        const ql_st_tensor *co = &c->tensors[i->correction];
        const unsigned char *od = ql_st_tensor_data(c, co);
        for (int64_t e = 0; e < ng * n; e++) {
            float v;
            uint16_t h;
            if (co->dtype == QL_ST_F32) memcpy(&v, od + 4 * e, 4);
            else {
                memcpy(&h, od + 2 * e, 2);
                v = co->dtype == QL_ST_F16 ? ql_fp16_to_fp32(h) : ql_bf16_to_fp32(h);
            }
            if (!isfinite(v))
                return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': correction[%lld, %lld] is %s",
                                    ql_show(&tb, co->name), (long long)(e / n), (long long)(e % n),
                                    isnan(v) ? "NaN" : "infinite");
        }
    }
    if (i->bias >= 0) {
        const ql_st_tensor *b = &c->tensors[i->bias];
        if (b->ndim != 1 || b->shape[0] != n)
            return ql_fail_file(c, QL_ERR_FORMAT, "tensor '%s': bias must have shape [N] = [%lld]", ql_show(&tb, b->name),
                                (long long)n);
        if (b->dtype != QL_ST_F32 && b->dtype != QL_ST_F16 && b->dtype != QL_ST_BF16)
            set_reason(l, "bias dtype %s is not supported (F32, F16 or BF16)", ql_st_dtype_name(b->dtype));
    }
    if (k > QL_MAX_K) set_reason(l, "K = %lld exceeds %d (int32 accumulation limit)", (long long)k, QL_MAX_K);
    return QL_OK;
}

/* Logical [N, K] of other formats' weights, where the packing is known. */
static void other_shape(ql_checkpoint *c, ql_layer *l)
{
    ql_layer_info *i = &l->info;
    if (i->weight < 0) return;
    const ql_st_tensor *w = &c->tensors[i->weight];
    if (w->ndim != 2) return;
    const char *f = l->format;
    int packed = !strcmp(f, "nvfp4") || !strcmp(f, "convrot_w4a4") || !strcmp(f, "asym_w4a8_int8");
    int plain = !strcmp(f, "float8_e4m3fn") || !strcmp(f, "float8_e5m2") || !strcmp(f, "mxfp8");
    if (!packed && !plain) return;
    if (packed && w->shape[1] > QL_MAX_ELEMENTS) return; /* N = 0 leaves it unbounded: K unknown */
    i->n = w->shape[0];
    i->k = packed ? 2 * w->shape[1] : w->shape[1];
}

static int cmp_prefix(const void *a, const void *b, void *ctx)
{
    const ql_layer *l = ctx;
    return strcmp(l[*(const int64_t *)a].prefix, l[*(const int64_t *)b].prefix);
}

ql_status ql_layers_discover(ql_checkpoint *c)
{
    const size_t sl = sizeof SUFFIX - 1;
    int64_t cap = 0;
    for (int64_t t = 0; t < c->n_tensors; t++) {
        size_t len = strlen(c->tensors[t].name);
        if (len >= sl && !memcmp(c->tensors[t].name + len - sl, SUFFIX, sl)) cap++;
    }
    json_t *qm = NULL, *qlayers = NULL;
    const char *meta = ql_checkpoint_metadata_get(c, "_quantization_metadata");
    if (meta) {
        json_error_t err;
        qm = json_loads(meta, JSON_REJECT_DUPLICATES, &err);
        ql_name_buf nb;
        if (!qm)
            return ql_fail_file(c, QL_ERR_FORMAT, "__metadata__ '_quantization_metadata' is not valid JSON (column %d): %s",
                                err.column, ql_show(&nb, err.text));
        qlayers = json_is_object(qm) ? json_object_get(qm, "layers") : NULL;
        if (!qlayers || !json_is_object(qlayers)) {
            json_decref(qm);
            return ql_fail_file(c, QL_ERR_FORMAT,
                                "__metadata__ '_quantization_metadata' must be a JSON object with a \"layers\" object");
        }
        cap += (int64_t)json_object_size(qlayers);
    }
    ql_status st = QL_OK;
    c->layers = calloc((size_t)(cap ? cap : 1), sizeof *c->layers);
    c->layer_sorted = calloc((size_t)(cap ? cap : 1), sizeof *c->layer_sorted);
    if (!c->layers || !c->layer_sorted) {
        st = ql_fail_file(c, QL_ERR_OUT_OF_MEMORY, "out of memory listing layers");
        goto done;
    }
    /* 1. comfy_quant tensors, in header order. */
    for (int64_t t = 0; t < c->n_tensors; t++) {
        const ql_st_tensor *ct = &c->tensors[t];
        size_t len = strlen(ct->name);
        if (len < sl || memcmp(ct->name + len - sl, SUFFIX, sl) != 0) continue;
        ql_name_buf nb;
        char where[160];
        snprintf(where, sizeof where, "tensor '%s'", ql_show(&nb, ct->name));
        if (ct->dtype != QL_ST_U8 || ct->ndim != 1) {
            st = ql_fail_file(c, QL_ERR_FORMAT, "%s: comfy_quant must be a 1-D U8 tensor of JSON bytes (it is %s, %d-D)",
                              where, ql_st_dtype_name(ct->dtype), ct->ndim);
            goto done;
        }
        const char *text = ql_st_tensor_data(c, ct);
        size_t tlen = (size_t)(ct->end - ct->begin);
        ql_cq cq;
        if ((st = ql_cq_parse_text(c->path, where, text, tlen, &cq)) != QL_OK) goto done;
        if ((st = add_layer(c, ct->name, len - sl, &cq, QL_LAYER_FROM_TENSOR, text, tlen, t)) != QL_OK) goto done;
    }
    /* 2. _quantization_metadata layers (ComfyUI's convert_old_quants). */
    if (qlayers) {
        /* Sort what we have so far to merge declarations of the same layer. */
        for (int64_t i = 0; i < c->n_layers; i++) c->layer_sorted[i] = i;
        qsort_r(c->layer_sorted, (size_t)c->n_layers, sizeof(int64_t), cmp_prefix, c->layers);
        int64_t n_from_tensors = c->n_layers;
        const char *key;
        json_t *v;
        json_object_foreach(qlayers, key, v)
        {
            ql_name_buf nb;
            char where[200];
            snprintf(where, sizeof where, "__metadata__ '_quantization_metadata' layer '%s'", ql_show(&nb, key));
            ql_cq cq;
            if ((st = ql_cq_parse_json(c->path, where, v, &cq)) != QL_OK) goto done;
            /* Binary search among the tensor-declared layers. */
            int64_t lo = 0, hi = n_from_tensors, hit = -1;
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                int r = strcmp(c->layers[c->layer_sorted[mid]].prefix, key);
                if (r == 0) {
                    hit = c->layer_sorted[mid];
                    break;
                }
                if (r < 0) lo = mid + 1;
                else hi = mid;
            }
            if (hit >= 0) {
                ql_layer *l = &c->layers[hit];
                ql_cq other;
                ql_cq_parse_text(c->path, where, l->json, strlen(l->json), &other); /* parsed before: cannot fail */
                if (!same_config(&cq, &other)) {
                    st = ql_fail_file(c, QL_ERR_FORMAT,
                                      "layer '%s': tensor '%s.comfy_quant' and __metadata__ '_quantization_metadata' "
                                      "declare different configurations",
                                      ql_show(&nb, key), ql_show(&nb, key));
                    goto done;
                }
                l->info.source = QL_LAYER_FROM_BOTH;
                continue;
            }
            char *js = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
            if (!js) {
                st = ql_fail_file(c, QL_ERR_OUT_OF_MEMORY, "out of memory listing layers");
                goto done;
            }
            st = add_layer(c, key, strlen(key), &cq, QL_LAYER_FROM_METADATA, js, strlen(js), -1);
            free(js);
            if (st != QL_OK) goto done;
        }
    }
    /* 3. Per-format tensor rules. */
    for (int64_t i = 0; i < c->n_layers; i++) {
        ql_layer *l = &c->layers[i];
        if (!strcmp(l->format, "int8_tensorwise")) {
            if ((st = check_int8(c, l)) != QL_OK) goto done;
        } else if (!strcmp(l->format, "asym_w4a8_int8") || !strcmp(l->format, "w6a8_int8")) {
            if ((st = check_wxa8(c, l)) != QL_OK) goto done;
        } else {
            set_reason(l, "format %s is not supported by qlinear yet", l->format);
            other_shape(c, l);
        }
    }
    for (int64_t i = 0; i < c->n_layers; i++) c->layer_sorted[i] = i;
    qsort_r(c->layer_sorted, (size_t)c->n_layers, sizeof(int64_t), cmp_prefix, c->layers);
done:
    json_decref(qm);
    return st;
}

void ql_layers_free(ql_checkpoint *c)
{
    for (int64_t i = 0; i < c->n_layers; i++) {
        ql_layer *l = &c->layers[i];
        free(l->prefix);
        free(l->format);
        free(l->json);
        free(l->linear_dtype);
        free(l->reason);
    }
    free(c->layers);
    free(c->layer_sorted);
    for (int64_t i = 0; i < c->n_copies; i++) ql_aligned_free(c->copies[i]);
    free(c->copies);
}

int64_t ql_checkpoint_layer_count(const ql_checkpoint *c) { return c ? c->n_layers : 0; }

ql_status ql_checkpoint_layer(const ql_checkpoint *c, int64_t index, ql_layer_info *out)
{
    const char *fn = "ql_checkpoint_layer";
    QL_CHECK_PTR(fn, c);
    QL_CHECK_PTR(fn, out);
    if (index < 0 || index >= c->n_layers)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: index %lld is outside [0, %lld)", fn, (long long)index,
                       (long long)c->n_layers);
    *out = c->layers[index].info;
    return QL_OK;
}

int64_t ql_checkpoint_find_layer(const ql_checkpoint *c, const char *prefix)
{
    if (!c || !prefix) return -1;
    int64_t lo = 0, hi = c->n_layers;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->layers[c->layer_sorted[mid]].prefix, prefix);
        if (r == 0) return c->layer_sorted[mid];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* ------------------------------------------------------------ linears */

/* Keep an aligned copy of `bytes` bytes alive as long as the checkpoint
 * (guarded: linear_desc may be called from several threads at once). */
static ql_status keep_copy(ql_checkpoint *c, const void *src, size_t bytes, const void **out)
{
    void *d = ql_aligned_alloc(bytes ? bytes : 1);
    if (!d) return ql_fail(QL_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes", bytes);
    if (bytes) memcpy(d, src, bytes);
    pthread_mutex_lock(&c->lock);
    if (c->n_copies == c->cap_copies) {
        int64_t cap = c->cap_copies ? 2 * c->cap_copies : 8;
        void **p = realloc(c->copies, (size_t)cap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&c->lock);
            ql_aligned_free(d);
            return ql_fail(QL_ERR_OUT_OF_MEMORY, "out of memory");
        }
        c->copies = p;
        c->cap_copies = cap;
    }
    c->copies[c->n_copies++] = d;
    pthread_mutex_unlock(&c->lock);
    *out = d;
    return QL_OK;
}

/* The tensor's data, copied to aligned memory owned by the checkpoint when
 * the file leaves it unaligned for its element size. */
static ql_status aligned_data(ql_checkpoint *c, const ql_st_tensor *t, const void **out)
{
    const void *p = ql_st_tensor_data(c, t);
    size_t align = (size_t)ql_st_dtype_bits(t->dtype) / 8;
    if (align <= 1 || ((uintptr_t)p % align) == 0) {
        *out = p;
        return QL_OK;
    }
    return keep_copy(c, p, (size_t)(t->end - t->begin), out);
}

static ql_status wxa8_desc(ql_checkpoint *c, const ql_layer_info *i, ql_linear_kind kind, ql_linear_desc *desc)
{
    ql_name_buf pb;
    if (kind != QL_LINEAR_W8A8 && kind != QL_LINEAR_WEIGHT_ONLY && kind != QL_LINEAR_DEQUANT &&
        kind != QL_LINEAR_WXA8_PACKED)
        return ql_fail_file(c, QL_ERR_INVALID_ARGUMENT,
                            "layer '%s': a %s layer runs as W8A8, WXA8_PACKED, WEIGHT_ONLY or DEQUANT, not kind %d",
                            ql_show(&pb, i->prefix), i->format, (int)kind);
    desc->kind = kind;
    desc->n = i->n;
    desc->k = i->k;
    ql_wxa8_weight *w = &desc->wxa8;
    w->n = i->n;
    w->k = i->k;
    w->bits = i->bits;
    w->q = ql_st_tensor_data(c, &c->tensors[i->weight]);
    w->ldq = ql_wxa8_row_bytes(i->bits, i->k);
    w->s_rel_f32 = i->s_rel_dtype == QL_ST_F32;
    w->group = i->group_size;
    w->convrot_group = i->convrot_group;
    const void *p;
    QL_TRY(aligned_data(c, &c->tensors[i->s_rel], &p));
    w->s_rel = p;
    QL_TRY(aligned_data(c, &c->tensors[i->s_channel], &p));
    w->s_channel = p;
    if (i->codebook >= 0) {
        QL_TRY(aligned_data(c, &c->tensors[i->codebook], &p));
        w->codebook = p;
    }
    if (i->correction >= 0) {
        const ql_st_tensor *co = &c->tensors[i->correction];
        QL_TRY(aligned_data(c, co, &p));
        w->correction = p;
        ql_st_dtype_to_ql(co->dtype, &w->correction_dtype);
    }
    if (i->bias >= 0) {
        const ql_st_tensor *b = &c->tensors[i->bias];
        QL_TRY(aligned_data(c, b, &p));
        w->bias = p;
        ql_st_dtype_to_ql(b->dtype, &w->bias_dtype);
    }
    return QL_OK;
}

ql_status ql_checkpoint_linear_desc(const ql_checkpoint *cc, const char *layer, ql_linear_kind kind,
                                    ql_linear_desc *desc)
{
    const char *fn = "ql_checkpoint_linear_desc";
    QL_CHECK_PTR(fn, cc);
    QL_CHECK_PTR(fn, layer);
    QL_CHECK_PTR(fn, desc);
    /* The checkpoint stays logically const: only its cache of aligned copies grows. */
    ql_checkpoint *c = (ql_checkpoint *)cc;
    memset(desc, 0, sizeof *desc);
    size_t plen = strlen(layer);
    if (plen >= 7 && !strcmp(layer + plen - 7, ".weight")) plen -= 7;
    char *prefix = dup_n(layer, plen);
    if (!prefix) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    ql_name_buf pb, tb;
    const char *p = ql_show(&pb, prefix);
    ql_status st = QL_OK;
    int64_t li = ql_checkpoint_find_layer(c, prefix);
    if (li >= 0) {
        const ql_layer *l = &c->layers[li];
        const ql_layer_info *i = &l->info;
        if (!i->supported) {
            st = ql_fail_file(c, QL_ERR_UNSUPPORTED, "layer '%s': %s", p, i->unsupported_reason);
            goto out;
        }
        if (i->bits) {
            st = wxa8_desc(c, i, kind, desc);
            goto out;
        }
        if (kind != QL_LINEAR_W8A8 && kind != QL_LINEAR_WEIGHT_ONLY && kind != QL_LINEAR_DEQUANT) {
            st = ql_fail_file(c, QL_ERR_INVALID_ARGUMENT,
                              "layer '%s': an int8 layer runs as W8A8, WEIGHT_ONLY or DEQUANT, not kind %d", p, (int)kind);
            goto out;
        }
        const ql_st_tensor *w = &c->tensors[i->weight], *s = &c->tensors[i->weight_scale];
        desc->kind = kind;
        desc->n = i->n;
        desc->k = i->k;
        ql_int8_weight *q = &desc->int8;
        q->n = i->n;
        q->k = i->k;
        q->q = ql_st_tensor_data(c, w);
        q->ldq = i->k;
        q->n_scale = i->n_scale;
        q->convrot_group = i->convrot ? i->convrot_group : 0;
        const void *sp;
        if ((st = aligned_data(c, s, &sp)) != QL_OK) goto out;
        q->scale = sp;
        if (i->bias >= 0) {
            const ql_st_tensor *b = &c->tensors[i->bias];
            const void *bp;
            if ((st = aligned_data(c, b, &bp)) != QL_OK) goto out;
            ql_st_dtype_to_ql(b->dtype, &q->bias_dtype);
            q->bias = bp;
        }
        goto out;
    }
    /* A float layer. */
    int64_t wi = find_suffixed(c, prefix, ".weight");
    if (wi < 0) {
        st = ql_fail_file(c, QL_ERR_INVALID_ARGUMENT, "layer '%s': no quantized layer and no tensor '%s.weight'", p, p);
        goto out;
    }
    const ql_st_tensor *w = &c->tensors[wi];
    ql_dtype wdt;
    if (ql_st_dtype_to_ql(w->dtype, &wdt) != QL_OK || !ql_is_float_dtype(wdt) || w->ndim != 2) {
        st = ql_fail_file(c, QL_ERR_UNSUPPORTED,
                          "tensor '%s': a float layer needs an F32, F16 or BF16 weight [N, K] (it is %s, %d-D)",
                          ql_show(&tb, w->name), ql_st_dtype_name(w->dtype), w->ndim);
        goto out;
    }
    if (kind != QL_LINEAR_DENSE) {
        st = ql_fail_file(c, QL_ERR_INVALID_ARGUMENT, "layer '%s': a float layer runs as DENSE, not kind %d", p, (int)kind);
        goto out;
    }
    desc->kind = kind;
    desc->n = w->shape[0];
    desc->k = w->shape[1];
    desc->ld_weight = desc->k;
    desc->weight_dtype = wdt;
    desc->compute_dtype = QL_F32;
    const void *wp;
    if ((st = aligned_data(c, w, &wp)) != QL_OK) goto out;
    desc->weight = wp;
    int64_t bi = find_suffixed(c, prefix, ".bias");
    if (bi >= 0) {
        const ql_st_tensor *b = &c->tensors[bi];
        ql_dtype bdt;
        if (ql_st_dtype_to_ql(b->dtype, &bdt) != QL_OK || !ql_is_float_dtype(bdt) || b->ndim != 1 ||
            b->shape[0] != desc->n) {
            st = ql_fail_file(c, QL_ERR_UNSUPPORTED, "tensor '%s': bias must be F32, F16 or BF16 [N] = [%lld]",
                              ql_show(&tb, b->name), (long long)desc->n);
            goto out;
        }
        const void *bp;
        if ((st = aligned_data(c, b, &bp)) != QL_OK) goto out;
        desc->bias = bp;
        desc->bias_dtype = bdt;
    }
out:
    free(prefix);
    return st;
}

ql_status ql_linear_from_checkpoint(ql_context *ctx, const ql_checkpoint *c, const char *layer, ql_linear_kind kind,
                                    ql_linear **out)
{
    const char *fn = "ql_linear_from_checkpoint";
    QL_CHECK_PTR(fn, out);
    *out = NULL;
    QL_CHECK_PTR(fn, ctx);
    ql_linear_desc d;
    QL_TRY(ql_checkpoint_linear_desc(c, layer, kind, &d));
    return ql_linear_create(ctx, &d, out);
}
