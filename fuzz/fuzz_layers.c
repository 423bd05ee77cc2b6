/* libFuzzer target for the comfy layer parser (src/format/layers.c,
 * comfy_quant.c): the input, repaired into a well-formed safetensors image
 * (fuzz_st.h), is opened through the public API; a refusal must be one line
 * naming the input, and an accepted file must keep every promise of
 * ql_layer_info: tensor indices that name P.weight, P.weight_scale, ...;
 * shapes and dtypes as the format requires; descriptors for exactly the
 * kinds the layer runs as, whose pointers are aligned and readable; W4A8 /
 * W6A8 weights that pass ql_wxa8_check, decode and dequantize (int8 layers:
 * dequantize), up to a size cap. Float `P.weight`s get a DENSE descriptor.
 * Built only with -DQL_BUILD_FUZZ=ON (clang). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "fuzz_st.h"

#define CAP_ELEMS 65536 /* decode / dequantize layers up to N·K of this */
#define CAP_LINEAR 4096 /* and build linears up to this */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                                                \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            fprintf(stderr, "fuzz_layers: %s:%d: %s fails (layer '%s')\n", __FILE__, __LINE__, #cond, cur_layer);     \
            abort();                                                                                                 \
        }                                                                                                            \
    } while (0)

static const char *cur_layer = "";
static volatile uint8_t sink;

static void touch(const void *p, uint64_t bytes)
{
    if (!bytes) return;
    const volatile uint8_t *b = p;
    sink ^= b[0] ^ b[bytes / 2] ^ b[bytes - 1];
}

static uint64_t elem_bytes(ql_dtype d) { return d == QL_F32 || d == QL_I32 ? 4 : d == QL_F16 || d == QL_BF16 ? 2 : 1; }

/* Tensor index t (or -1) must be the tensor PREFIX+suffix. */
static void check_index(const ql_checkpoint *c, const char *prefix, const char *suffix, int64_t t)
{
    char name[4096];
    int n = snprintf(name, sizeof name, "%s%s", prefix, suffix);
    if (n < 0 || (size_t)n >= sizeof name) return;
    REQUIRE(t == ql_checkpoint_find(c, name));
    if (t >= 0) {
        ql_tensor_info ti;
        REQUIRE(ql_checkpoint_tensor(c, t, &ti) == QL_OK && !strcmp(ti.name, name));
    }
}

static void check_desc_refused(const ql_checkpoint *c, const char *prefix, ql_linear_kind kind)
{
    ql_linear_desc d;
    REQUIRE(ql_checkpoint_linear_desc(c, prefix, kind, &d) != QL_OK);
    const char *m = ql_last_error();
    REQUIRE(m && *m && !strchr(m, '\n'));
}

static int small_cap(int64_t n, int64_t k, int64_t cap) { return n >= 0 && k >= 0 && (k == 0 || n <= cap / k); }
static int small(int64_t n, int64_t k) { return small_cap(n, k, CAP_ELEMS); }

/* A supported layer's promise: ql_linear_create builds it (must: 1) from
 * this descriptor, or refuses with one line (must: 0). */
static void check_create(const ql_linear_desc *d, int must)
{
    static ql_context *ctx;
    if (!small_cap(d->n, d->k, CAP_LINEAR)) return;
    if (!ctx && (ql_context_create(&ctx) != QL_OK || ql_context_set_threads(ctx, 1) != QL_OK)) abort();
    ql_linear *lin = NULL;
    ql_status st = ql_linear_create(ctx, d, &lin);
    if (st != QL_OK && (must || strchr(ql_last_error(), '\n'))) {
        fprintf(stderr, "fuzz_layers: layer '%s' (kind %d) opened but ql_linear_create refuses it: %s\n", cur_layer,
                (int)d->kind, ql_last_error());
        abort();
    }
    ql_linear_destroy(lin);
}

static void check_int8_layer(const ql_checkpoint *c, const ql_layer_info *l)
{
    ql_tensor_info w, s;
    REQUIRE(l->weight >= 0 && l->weight_scale >= 0);
    REQUIRE(ql_checkpoint_tensor(c, l->weight, &w) == QL_OK && ql_checkpoint_tensor(c, l->weight_scale, &s) == QL_OK);
    REQUIRE(w.dtype == QL_ST_I8 && w.ndim == 2 && w.shape[0] == l->n && w.shape[1] == l->k);
    REQUIRE(s.dtype == QL_ST_F32 && (s.numel == 1 || s.numel == l->n) && s.numel == l->n_scale);
    REQUIRE(!l->convrot || (l->convrot_group >= 4 && l->k % l->convrot_group == 0));
    static const ql_linear_kind ok[] = {QL_LINEAR_W8A8, QL_LINEAR_WEIGHT_ONLY, QL_LINEAR_DEQUANT};
    for (int i = 0; i < 3; i++) {
        ql_linear_desc d;
        REQUIRE(ql_checkpoint_linear_desc(c, l->prefix, ok[i], &d) == QL_OK);
        REQUIRE(d.kind == ok[i] && d.n == l->n && d.k == l->k && d.int8.n == l->n && d.int8.k == l->k);
        REQUIRE(d.int8.ldq == l->k && d.int8.n_scale == l->n_scale && d.int8.q == w.data);
        REQUIRE(d.int8.convrot_group == (l->convrot ? l->convrot_group : 0));
        REQUIRE(((uintptr_t)d.int8.scale & 3) == 0);
        touch(d.int8.scale, (uint64_t)d.int8.n_scale * 4);
        REQUIRE((l->bias >= 0) == (d.int8.bias != NULL));
        if (d.int8.bias) {
            REQUIRE(((uintptr_t)d.int8.bias % elem_bytes(d.int8.bias_dtype)) == 0);
            touch(d.int8.bias, (uint64_t)l->n * elem_bytes(d.int8.bias_dtype));
        }
        touch(d.int8.q, (uint64_t)(l->n * l->k));
        check_create(&d, 1);
        if (i == 0 && small(l->n, l->k)) {
            float *out = malloc((size_t)(l->n * l->k) * sizeof(float) + 1);
            REQUIRE(out && ql_dequantize(d.int8.q, l->n, l->k, l->k, d.int8.scale, d.int8.n_scale, d.int8.convrot_group,
                                         QL_F32, out, l->k) == QL_OK);
            free(out);
        }
    }
    check_desc_refused(c, l->prefix, QL_LINEAR_WXA8_PACKED);
    check_desc_refused(c, l->prefix, QL_LINEAR_DENSE);
}

static void check_wxa8_layer(const ql_checkpoint *c, const ql_layer_info *l)
{
    REQUIRE(l->bits == 4 || l->bits == 6);
    REQUIRE(strcmp(l->format, "w6a8_int8") || l->bits == 6);
    REQUIRE(l->weight >= 0 && l->s_rel >= 0 && l->s_channel >= 0);
    REQUIRE(l->has_codebook == (l->codebook >= 0) && l->asymmetric == (l->correction >= 0));
    REQUIRE(l->bits == 4 || (!l->has_codebook && !l->asymmetric));
    ql_tensor_info w, sr, sc;
    REQUIRE(ql_checkpoint_tensor(c, l->weight, &w) == QL_OK && ql_checkpoint_tensor(c, l->s_rel, &sr) == QL_OK &&
            ql_checkpoint_tensor(c, l->s_channel, &sc) == QL_OK);
    REQUIRE(w.dtype == QL_ST_I8 && w.ndim == 2 && w.shape[0] == l->n);
    REQUIRE(l->group_size > 0 && l->k % l->group_size == 0 && l->k % l->convrot_group == 0);
    REQUIRE(w.shape[1] == (l->bits == 4 ? l->k / 2 : 3 * l->k / 4));
    REQUIRE(sr.ndim == 2 && sr.shape[0] == l->n && sr.shape[1] == l->k / l->group_size && sr.dtype == l->s_rel_dtype);
    REQUIRE(sc.dtype == QL_ST_F32 && sc.numel == l->n);
    static const ql_linear_kind ok[] = {QL_LINEAR_W8A8, QL_LINEAR_WEIGHT_ONLY, QL_LINEAR_DEQUANT, QL_LINEAR_WXA8_PACKED};
    for (int i = 0; i < 4; i++) {
        ql_linear_desc d;
        REQUIRE(ql_checkpoint_linear_desc(c, l->prefix, ok[i], &d) == QL_OK);
        const ql_wxa8_weight *x = &d.wxa8;
        REQUIRE(d.kind == ok[i] && d.n == l->n && d.k == l->k && x->n == l->n && x->k == l->k && x->bits == l->bits);
        REQUIRE(x->group == l->group_size && x->convrot_group == l->convrot_group && x->q == w.data);
        REQUIRE(x->s_rel_f32 == (l->s_rel_dtype == QL_ST_F32));
        REQUIRE(((uintptr_t)x->s_channel & 3) == 0 && (!x->s_rel_f32 || ((uintptr_t)x->s_rel & 3) == 0));
        REQUIRE((x->codebook != NULL) == l->has_codebook && (x->correction != NULL) == l->asymmetric);
        REQUIRE((x->bias != NULL) == (l->bias >= 0));
        if (x->codebook) REQUIRE(((uintptr_t)x->codebook & 3) == 0);
        if (x->correction) {
            REQUIRE(((uintptr_t)x->correction % elem_bytes(x->correction_dtype)) == 0);
            touch(x->correction, (uint64_t)(l->k / l->group_size) * (uint64_t)l->n * elem_bytes(x->correction_dtype));
        }
        if (x->bias) {
            REQUIRE(((uintptr_t)x->bias % elem_bytes(x->bias_dtype)) == 0);
            touch(x->bias, (uint64_t)l->n * elem_bytes(x->bias_dtype));
        }
        touch(x->q, (uint64_t)l->n * (uint64_t)x->ldq);
        touch(x->s_rel, (uint64_t)l->n * (uint64_t)(l->k / l->group_size) * (x->s_rel_f32 ? 4 : 1));
        /* W8A8 takes every W4A8/W6A8 layer; WXA8_PACKED no fp32 s_rel, WEIGHT_ONLY and DEQUANT no
         * correction (documented limits) */
        check_create(&d, ok[i] == QL_LINEAR_W8A8);
        if (ql_wxa8_check(x) != QL_OK) {
            fprintf(stderr, "fuzz_layers: layer '%s' opened but ql_wxa8_check refuses it: %s\n", l->prefix, ql_last_error());
            abort();
        }
        if (i == 0 && small(l->n, l->k)) {
            size_t e = (size_t)(l->n * l->k);
            int8_t *g = malloc(e + 1);
            float *f = malloc(e * sizeof(float) + 1);
            REQUIRE(g && f && ql_wxa8_decode(x, g, l->k) == QL_OK);
            REQUIRE(ql_wxa8_dequantize(x, QL_F32, f, l->k) == QL_OK);
            free(g), free(f);
        }
    }
    check_desc_refused(c, l->prefix, QL_LINEAR_DENSE);
}

static void check_float_weight(const ql_checkpoint *c, const ql_tensor_info *t)
{
    size_t len = strlen(t->name);
    if (len < 7 || strcmp(t->name + len - 7, ".weight")) return;
    char *prefix = strndup(t->name, len - 7);
    if (!prefix || ql_checkpoint_find_layer(c, prefix) >= 0) {
        free(prefix);
        return;
    }
    cur_layer = prefix;
    ql_linear_desc d;
    if (ql_checkpoint_linear_desc(c, prefix, QL_LINEAR_DENSE, &d) == QL_OK) {
        ql_dtype wd;
        REQUIRE(ql_st_dtype_to_ql(t->dtype, &wd) == QL_OK && wd == d.weight_dtype && t->ndim == 2);
        REQUIRE(d.n == t->shape[0] && d.k == t->shape[1] && d.ld_weight == d.k);
        REQUIRE(((uintptr_t)d.weight % elem_bytes(wd)) == 0);
        touch(d.weight, t->bytes);
        check_create(&d, 0);
        if (d.bias) {
            REQUIRE(((uintptr_t)d.bias % elem_bytes(d.bias_dtype)) == 0);
            touch(d.bias, (uint64_t)d.n * elem_bytes(d.bias_dtype));
        }
        check_desc_refused(c, prefix, QL_LINEAR_W8A8);
    } else {
        const char *m = ql_last_error();
        REQUIRE(m && *m && !strchr(m, '\n'));
    }
    cur_layer = "";
    free(prefix);
}

static void check_layer(const ql_checkpoint *c, int64_t idx)
{
    ql_layer_info l;
    REQUIRE(ql_checkpoint_layer(c, idx, &l) == QL_OK);
    cur_layer = l.prefix;
    REQUIRE(l.prefix && l.format && l.config_json && l.linear_dtype);
    REQUIRE(ql_checkpoint_find_layer(c, l.prefix) == idx);
    REQUIRE(l.source >= QL_LAYER_FROM_TENSOR && l.source <= QL_LAYER_FROM_BOTH);
    REQUIRE((l.source & QL_LAYER_FROM_TENSOR) ? l.comfy_quant >= 0 : l.comfy_quant == -1);
    /* The configuration as declared parses again, to the same format. */
    ql_cq cq;
    REQUIRE(ql_cq_parse_text("fuzz", "config_json", l.config_json, strlen(l.config_json), &cq) == QL_OK);
    REQUIRE(!strcmp(cq.format, l.format) && cq.group_size == l.group_size && !cq.convrot == !l.convrot);
    check_index(c, l.prefix, ".comfy_quant", l.comfy_quant);
    check_index(c, l.prefix, ".weight", l.weight);
    check_index(c, l.prefix, ".weight_scale", l.weight_scale);
    check_index(c, l.prefix, ".bias", l.bias);
    check_index(c, l.prefix, ".weight_s_rel", l.s_rel);
    check_index(c, l.prefix, ".weight_s_channel", l.s_channel);
    check_index(c, l.prefix, ".weight_codebook", l.codebook);
    check_index(c, l.prefix, ".weight_correction", l.correction);
    REQUIRE(l.n >= 0 && l.k >= 0);
    if (!l.supported) {
        REQUIRE(l.unsupported_reason && *l.unsupported_reason && !strchr(l.unsupported_reason, '\n'));
        ql_linear_desc d;
        REQUIRE(ql_checkpoint_linear_desc(c, l.prefix, QL_LINEAR_W8A8, &d) == QL_ERR_UNSUPPORTED);
        REQUIRE(!strchr(ql_last_error(), '\n'));
        cur_layer = "";
        return;
    }
    REQUIRE(l.unsupported_reason == NULL && l.k <= 65536); /* QL_MAX_K, the int32 accumulation limit */
    if (l.bias >= 0) {
        ql_tensor_info b;
        REQUIRE(ql_checkpoint_tensor(c, l.bias, &b) == QL_OK && b.ndim == 1 && b.shape[0] == l.n);
        REQUIRE(b.dtype == QL_ST_F32 || b.dtype == QL_ST_F16 || b.dtype == QL_ST_BF16);
    }
    if (!strcmp(l.format, "int8_tensorwise")) {
        REQUIRE(l.bits == 0);
        check_int8_layer(c, &l);
    } else {
        check_wxa8_layer(c, &l);
    }
    cur_layer = "";
}

static void run_one(const uint8_t *data, size_t size)
{
    ql_checkpoint *c = NULL;
    if (ql_checkpoint_open_memory(size ? data : NULL, size, "fuzz", &c) != QL_OK) {
        fz_check_refusal("fuzz", c);
        return;
    }
    for (int64_t i = 0; i < ql_checkpoint_layer_count(c); i++) check_layer(c, i);
    for (int64_t i = 0; i < ql_checkpoint_tensor_count(c); i++) {
        ql_tensor_info t;
        REQUIRE(ql_checkpoint_tensor(c, i, &t) == QL_OK);
        check_float_weight(c, &t);
    }
    /* Names that are no layer and no tensor. */
    if (ql_checkpoint_find_layer(c, "") < 0 && ql_checkpoint_find(c, ".weight") < 0) {
        check_desc_refused(c, "", QL_LINEAR_W8A8);
        check_desc_refused(c, ".weight", QL_LINEAR_DENSE);
    }
    ql_checkpoint_close(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n = 0;
    unsigned char *img = fz_repair(data, size, &n);
    if (img) {
        run_one(img, n);
        free(img);
    } else {
        run_one(data, size);
    }
    return 0;
}
