/* Shared by the structure-aware fuzz targets (fuzz_layers, fuzz_lora): turn
 * any input whose header parses as a JSON object into a well-formed
 * safetensors image, so mutations of names, dtypes, shapes, comfy_quant text
 * and tensor bytes reach the layer and LoRA parsers instead of dying in the
 * container checks (fuzz_checkpoint covers those).
 *
 * The repair: header length clamped to the input, header parsed by jansson
 * (duplicates: last one wins), "__metadata__" kept as it is, every other
 * entry with a known dtype and a shape of non-negative integers that fits
 * the byte budget kept with fresh data_offsets (back to back, in header
 * order; its bytes copied from where its old data_offsets[0] pointed in the
 * input's data section, zeros past its end); entries that cannot be laid out
 * are dropped. Set QL_FUZZ_DUMP=FILE to write the repaired image of each
 * input there (to turn a crash into a regression test). */
#ifndef QL_FUZZ_ST_H
#define QL_FUZZ_ST_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qlinear.h"

#define FZ_FN static __attribute__((unused))
#define FZ_DATA_BUDGET ((uint64_t)1 << 20) /* tensor bytes of a repaired image */

FZ_FN void fz_put_le64(unsigned char *p, uint64_t n)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(n >> (8 * i));
}

/* The repaired image (malloc'd, *out_size bytes), or NULL when the header is
 * not a JSON object. */
static unsigned char *fz_repair(const uint8_t *data, size_t size, size_t *out_size)
{
    if (size < 8) return NULL;
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = (hn << 8) | data[i];
    if (hn > size - 8) hn = size - 8;
    const unsigned char *ds = data + 8 + hn;
    const uint64_t dsize = size - 8 - hn;
    json_error_t err;
    json_t *root = json_loadb((const char *)data + 8, (size_t)hn, 0, &err);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return NULL;
    }
    json_t *out = json_object();
    size_t cap = 64, nt = 0;
    struct piece {
        uint64_t src, bytes;
    } *pc = malloc(cap * sizeof *pc);
    uint64_t total = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (!strcmp(key, "__metadata__")) {
            json_object_set(out, key, v);
            continue;
        }
        if (!json_is_object(v)) continue;
        json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
        ql_st_dtype dt;
        if (!json_is_string(jd) || ql_st_dtype_parse(json_string_value(jd), &dt) != QL_OK || !json_is_array(js) ||
            json_array_size(js) > 64)
            continue;
        uint64_t numel = 1;
        int ok = 1;
        for (size_t d = 0; d < json_array_size(js) && ok; d++) {
            json_t *e = json_array_get(js, d);
            if (!json_is_integer(e) || json_integer_value(e) < 0) ok = 0;
            else if (__builtin_mul_overflow(numel, (uint64_t)json_integer_value(e), &numel)) ok = 0;
        }
        uint64_t bits;
        if (!ok || numel > (uint64_t)INT64_MAX || __builtin_mul_overflow(numel, (uint64_t)ql_st_dtype_bits(dt), &bits) ||
            bits % 8 || bits / 8 > FZ_DATA_BUDGET - total)
            continue;
        uint64_t src = 0;
        if (json_is_array(jo) && json_is_integer(json_array_get(jo, 0)) && json_integer_value(json_array_get(jo, 0)) > 0)
            src = (uint64_t)json_integer_value(json_array_get(jo, 0));
        if (nt == cap) {
            cap *= 2;
            struct piece *np = realloc(pc, cap * sizeof *pc);
            if (!np) break;
            pc = np;
        }
        pc[nt++] = (struct piece){src, bits / 8};
        json_t *e = json_copy(v);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)total, (json_int_t)(total + bits / 8)));
        json_object_set_new(out, key, e);
        total += bits / 8;
    }
    json_decref(root);
    char *h = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    if (!h) {
        free(pc);
        return NULL;
    }
    size_t hl = strlen(h);
    unsigned char *img = malloc(8 + hl + (size_t)total);
    if (!img) {
        free(h), free(pc);
        return NULL;
    }
    fz_put_le64(img, hl);
    memcpy(img + 8, h, hl);
    unsigned char *dd = img + 8 + hl;
    for (size_t i = 0; i < nt; i++) {
        uint64_t have = pc[i].src < dsize ? dsize - pc[i].src : 0;
        if (have > pc[i].bytes) have = pc[i].bytes;
        if (have) memcpy(dd, ds + pc[i].src, (size_t)have);
        memset(dd + have, 0, (size_t)(pc[i].bytes - have));
        dd += pc[i].bytes;
    }
    free(h), free(pc);
    *out_size = 8 + hl + (size_t)total;
    const char *dump = getenv("QL_FUZZ_DUMP");
    if (dump) {
        FILE *f = fopen(dump, "wb");
        if (f) {
            fwrite(img, 1, *out_size, f);
            fclose(f);
        }
    }
    return img;
}

/* A safetensors image from tensors laid out back to back (no alignment:
 * the readers must copy what they read unaligned). */
typedef struct fz_tensor {
    const char *name;
    ql_st_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data; /* NULL: zeros */
} fz_tensor;

FZ_FN uint64_t fz_tensor_bytes(const fz_tensor *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n * (uint64_t)ql_st_dtype_bits(t->dtype) / 8;
}

static unsigned char *fz_build(const fz_tensor *t, int n, size_t *out_size)
{
    json_t *o = json_object();
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *sh = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(sh, json_integer(t[i].shape[d]));
        uint64_t b = fz_tensor_bytes(&t[i]);
        json_object_set_new(o, t[i].name,
                            json_pack("{s:s,s:o,s:[II]}", "dtype", ql_st_dtype_name(t[i].dtype), "shape", sh,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + b)));
        off += b;
    }
    char *h = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    size_t hl = strlen(h);
    unsigned char *img = calloc(1, 8 + hl + (size_t)off);
    fz_put_le64(img, hl);
    memcpy(img + 8, h, hl);
    free(h);
    off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = fz_tensor_bytes(&t[i]);
        if (t[i].data) memcpy(img + 8 + hl + off, t[i].data, (size_t)b);
        off += b;
    }
    *out_size = 8 + hl + (size_t)off;
    return img;
}

/* A refusal: no checkpoint, and one non-empty line starting "LABEL: ". */
FZ_FN void fz_check_refusal(const char *label, const void *handle)
{
    const char *m = ql_last_error();
    size_t l = strlen(label);
    if (handle != NULL || !m || strncmp(m, label, l) != 0 || strncmp(m + l, ": ", 2) != 0 || !m[l + 2] ||
        strchr(m, '\n') != NULL) {
        fprintf(stderr, "fuzz: bad refusal message: %s\n", m ? m : "(null)");
        abort();
    }
}

#endif
