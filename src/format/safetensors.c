/* The strict safetensors reader (docs/FORMATS.md §1): mmap the file, check
 * every rule of the container, index the tensors. JSON is parsed by jansson.
 * The container only: quantized layers are found on top of it (layers.c),
 * and checkpoint.c puts the two together. */
#include "format.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ dtypes */

static const struct {
    const char *name;
    int bits;
} st_dtypes[QL_ST_DTYPE_COUNT] = {
    [QL_ST_BOOL] = {"BOOL", 8},           [QL_ST_F4] = {"F4", 4},
    [QL_ST_F6_E2M3] = {"F6_E2M3", 6},     [QL_ST_F6_E3M2] = {"F6_E3M2", 6},
    [QL_ST_U8] = {"U8", 8},               [QL_ST_I8] = {"I8", 8},
    [QL_ST_F8_E5M2] = {"F8_E5M2", 8},     [QL_ST_F8_E4M3] = {"F8_E4M3", 8},
    [QL_ST_F8_E8M0] = {"F8_E8M0", 8},     [QL_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [QL_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8}, [QL_ST_I16] = {"I16", 16},
    [QL_ST_U16] = {"U16", 16},            [QL_ST_F16] = {"F16", 16},
    [QL_ST_BF16] = {"BF16", 16},          [QL_ST_I32] = {"I32", 32},
    [QL_ST_U32] = {"U32", 32},            [QL_ST_F32] = {"F32", 32},
    [QL_ST_C64] = {"C64", 64},            [QL_ST_F64] = {"F64", 64},
    [QL_ST_I64] = {"I64", 64},            [QL_ST_U64] = {"U64", 64},
};

const char *ql_st_dtype_name(ql_st_dtype dt)
{
    return (unsigned)dt < QL_ST_DTYPE_COUNT ? st_dtypes[dt].name : "?";
}

int ql_st_dtype_bits(ql_st_dtype dt) { return (unsigned)dt < QL_ST_DTYPE_COUNT ? st_dtypes[dt].bits : 0; }

ql_status ql_st_dtype_parse(const char *name, ql_st_dtype *out)
{
    for (int i = 0; i < QL_ST_DTYPE_COUNT; i++)
        if (!strcmp(name, st_dtypes[i].name)) {
            *out = (ql_st_dtype)i;
            return QL_OK;
        }
    return QL_ERR_FORMAT;
}

ql_status ql_st_dtype_to_ql(ql_st_dtype dt, ql_dtype *out)
{
    switch (dt) {
    case QL_ST_F32: *out = QL_F32; return QL_OK;
    case QL_ST_F16: *out = QL_F16; return QL_OK;
    case QL_ST_BF16: *out = QL_BF16; return QL_OK;
    case QL_ST_I8: *out = QL_I8; return QL_OK;
    case QL_ST_U8: *out = QL_U8; return QL_OK;
    case QL_ST_I32: *out = QL_I32; return QL_OK;
    default: return QL_ERR_UNSUPPORTED;
    }
}

ql_st_dtype ql_st_dtype_from_ql(ql_dtype dt)
{
    switch (dt) {
    case QL_F32: return QL_ST_F32;
    case QL_F16: return QL_ST_F16;
    case QL_BF16: return QL_ST_BF16;
    case QL_I8: return QL_ST_I8;
    case QL_U8: return QL_ST_U8;
    case QL_I32: return QL_ST_I32;
    }
    return QL_ST_DTYPE_COUNT;
}

/* ------------------------------------------------------------------ parse */

#define FAIL(c, st, ...) ql_fail_file(c, st, __VA_ARGS__)

/* Render a shape for messages: "[2, 3]". */
static void shape_str(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t o = 0;
    o += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++) {
        if (i == 6 && ndim > 8) {
            o += (size_t)snprintf(buf + o, cap - o, ", ... (%d dims)", ndim);
            break;
        }
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static int cmp_by_offset(const void *a, const void *b, void *ctx)
{
    const ql_st_tensor *t = ctx;
    const ql_st_tensor *x = &t[*(const int64_t *)a], *y = &t[*(const int64_t *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_by_name(const void *a, const void *b, void *ctx)
{
    const ql_st_tensor *t = ctx;
    return strcmp(t[*(const int64_t *)a].name, t[*(const int64_t *)b].name);
}

/* One tensor entry of the header. */
static ql_status parse_tensor(ql_checkpoint *c, const char *name, json_t *v, ql_st_tensor *t, int64_t **dims_cursor)
{
    ql_name_buf nb;
    const char *nm = ql_show(&nb, name);
    if (!json_is_object(v)) return FAIL(c, QL_ERR_FORMAT, "tensor '%s': entry is %s, not an object", nm, ql_json_kind(v));
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!jd) return FAIL(c, QL_ERR_FORMAT, "tensor '%s': no \"dtype\"", nm);
    if (!json_is_string(jd))
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': \"dtype\" is %s, not a string", nm, ql_json_kind(jd));
    if (ql_st_dtype_parse(json_string_value(jd), &t->dtype) != QL_OK) {
        ql_name_buf db;
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': unknown dtype '%s'", nm, ql_show(&db, json_string_value(jd)));
    }
    if (!js) return FAIL(c, QL_ERR_FORMAT, "tensor '%s': no \"shape\"", nm);
    if (!json_is_array(js))
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': \"shape\" is %s, not an array", nm, ql_json_kind(js));
    size_t nd = json_array_size(js);
    if (nd > 1000000) return FAIL(c, QL_ERR_FORMAT, "tensor '%s': shape has %zu dimensions", nm, nd);
    t->ndim = (int)nd;
    t->shape = *dims_cursor;
    *dims_cursor += nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        json_t *e = json_array_get(js, i);
        if (json_is_real(e))
            return FAIL(c, QL_ERR_FORMAT, "tensor '%s': shape[%zu] = %g is not an integer", nm, i, json_real_value(e));
        if (!json_is_integer(e))
            return FAIL(c, QL_ERR_FORMAT, "tensor '%s': shape[%zu] is %s, not an integer", nm, i, ql_json_kind(e));
        json_int_t d = json_integer_value(e);
        if (d < 0) return FAIL(c, QL_ERR_FORMAT, "tensor '%s': shape[%zu] = %lld is negative", nm, i, (long long)d);
        t->shape[i] = (int64_t)d;
        /* Left to right with overflow checks, as the reference validates. */
        if (!overflow && __builtin_mul_overflow(numel, (uint64_t)d, &numel)) overflow = 1;
    }
    char sh[96];
    shape_str(sh, sizeof sh, t->shape, t->ndim);
    if (overflow || numel > (uint64_t)INT64_MAX)
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': shape %s has more elements than fit in 64 bits", nm, sh);
    t->numel = (int64_t)numel;
    uint64_t bits;
    if (__builtin_mul_overflow(numel, (uint64_t)ql_st_dtype_bits(t->dtype), &bits))
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': %s %s takes more bits than fit in 64 bits", nm,
                    ql_st_dtype_name(t->dtype), sh);
    if (bits % 8)
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': %s %s is %llu bits, not a whole number of bytes", nm,
                    ql_st_dtype_name(t->dtype), sh, (unsigned long long)bits);
    uint64_t nbytes = bits / 8;

    if (!jo) return FAIL(c, QL_ERR_FORMAT, "tensor '%s': no \"data_offsets\"", nm);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': \"data_offsets\" must be an array [begin, end]", nm);
    json_int_t off[2];
    for (int i = 0; i < 2; i++) {
        json_t *e = json_array_get(jo, (size_t)i);
        if (!json_is_integer(e))
            return FAIL(c, QL_ERR_FORMAT, "tensor '%s': data_offsets[%d] is %s, not an integer", nm, i, ql_json_kind(e));
        off[i] = json_integer_value(e);
        if (off[i] < 0)
            return FAIL(c, QL_ERR_FORMAT, "tensor '%s': data_offsets[%d] = %lld is negative", nm, i, (long long)off[i]);
    }
    t->begin = (uint64_t)off[0];
    t->end = (uint64_t)off[1];
    if (t->begin > t->end)
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] are reversed", nm,
                    (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > c->data_size)
        return FAIL(c, QL_ERR_FORMAT,
                    "tensor '%s': data_offsets [%llu, %llu] run past the end of the data buffer (%llu bytes)", nm,
                    (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)c->data_size);
    if (t->end - t->begin != nbytes)
        return FAIL(c, QL_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s %s needs %llu",
                    nm, (unsigned long long)t->begin, (unsigned long long)t->end,
                    (unsigned long long)(t->end - t->begin), ql_st_dtype_name(t->dtype), sh,
                    (unsigned long long)nbytes);
    return QL_OK;
}

static ql_status parse_metadata(ql_checkpoint *c, json_t *m)
{
    if (!json_is_object(m))
        return FAIL(c, QL_ERR_FORMAT, "__metadata__ is %s; it must be an object of strings", ql_json_kind(m));
    size_t n = json_object_size(m);
    c->meta_keys = calloc(n ? n : 1, sizeof(char *));
    c->meta_values = calloc(n ? n : 1, sizeof(char *));
    if (!c->meta_keys || !c->meta_values) return FAIL(c, QL_ERR_OUT_OF_MEMORY, "out of memory reading __metadata__");
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v)
    {
        ql_name_buf nb;
        if (!json_is_string(v))
            return FAIL(c, QL_ERR_FORMAT, "__metadata__ key '%s' has %s value; only strings are allowed",
                        ql_show(&nb, k), ql_json_kind(v));
        c->meta_keys[c->n_meta] = strdup(k);
        c->meta_values[c->n_meta] = strdup(json_string_value(v));
        c->n_meta++;
        if (!c->meta_keys[c->n_meta - 1] || !c->meta_values[c->n_meta - 1])
            return FAIL(c, QL_ERR_OUT_OF_MEMORY, "out of memory reading __metadata__");
    }
    return QL_OK;
}

ql_status ql_st_parse(ql_checkpoint *c)
{
    if (c->size == 0)
        return FAIL(c, QL_ERR_FORMAT, "file is empty; a safetensors file starts with an 8-byte header length");
    if (c->size < 8)
        return FAIL(c, QL_ERR_FORMAT, "file is %llu bytes, shorter than the 8-byte header length",
                    (unsigned long long)c->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | c->base[i];
    c->header_len = n;
    if (n > QL_ST_MAX_HEADER)
        return FAIL(c, QL_ERR_FORMAT, "header length %llu exceeds the %llu-byte limit", (unsigned long long)n,
                    QL_ST_MAX_HEADER);
    if (n > c->size - 8)
        return FAIL(c, QL_ERR_FORMAT, "header length %llu runs past the end of the file (%llu bytes after the length)",
                    (unsigned long long)n, (unsigned long long)(c->size - 8));
    const unsigned char *h = c->base + 8;
    c->data = h + n;
    c->data_size = c->size - 8 - n;
    size_t bad = ql_utf8_check(h, (size_t)n);
    if (bad != n)
        return FAIL(c, QL_ERR_FORMAT, "header is not valid UTF-8 (byte %zu of the header, 0x%02x)", bad, h[bad]);
    if (n == 0 || h[0] != '{')
        return FAIL(c, QL_ERR_FORMAT, "header is not a JSON object: it must start with '{'");

    json_error_t err;
    json_t *root = json_loadb((const char *)h, (size_t)n, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        ql_name_buf nb;
        if (json_error_code(&err) == json_error_duplicate_key)
            return FAIL(c, QL_ERR_FORMAT, "header has a duplicate key (line %d, column %d): %s", err.line,
                        err.column, ql_show(&nb, err.text));
        if (json_error_code(&err) == json_error_out_of_memory)
            return FAIL(c, QL_ERR_OUT_OF_MEMORY, "out of memory parsing the header");
        return FAIL(c, QL_ERR_FORMAT, "header is not valid JSON (line %d, column %d): %s", err.line, err.column,
                    ql_show(&nb, err.text));
    }
    ql_status st = QL_OK;
    if (!json_is_object(root)) {
        st = FAIL(c, QL_ERR_FORMAT, "header is %s, not a JSON object", ql_json_kind(root));
        goto done;
    }
    /* Count tensors and dimensions first, so storage is allocated once. */
    size_t nt = 0, nd = 0;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (!strcmp(key, "__metadata__")) continue;
        nt++;
        json_t *s = json_is_object(v) ? json_object_get(v, "shape") : NULL;
        if (s && json_is_array(s)) nd += json_array_size(s);
    }
    c->tensors = calloc(nt ? nt : 1, sizeof *c->tensors);
    c->dims = calloc(nd ? nd : 1, sizeof *c->dims);
    c->sorted = calloc(nt ? nt : 1, sizeof *c->sorted);
    if (!c->tensors || !c->dims || !c->sorted) {
        st = FAIL(c, QL_ERR_OUT_OF_MEMORY, "out of memory indexing %zu tensors", nt);
        goto done;
    }
    int64_t *cursor = c->dims;
    json_t *meta = json_object_get(root, "__metadata__");
    if (meta && (st = parse_metadata(c, meta)) != QL_OK) goto done;
    json_object_foreach(root, key, v)
    {
        if (!strcmp(key, "__metadata__")) continue;
        ql_st_tensor *t = &c->tensors[c->n_tensors];
        t->name = strdup(key);
        if (!t->name) {
            st = FAIL(c, QL_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        c->n_tensors++;
        if ((st = parse_tensor(c, key, v, t, &cursor)) != QL_OK) goto done;
    }

    /* Coverage: sorted by offsets, each tensor starts where the previous one
     * ended, and the last one ends at the end of the file. */
    for (int64_t i = 0; i < c->n_tensors; i++) c->sorted[i] = i;
    qsort_r(c->sorted, (size_t)c->n_tensors, sizeof(int64_t), cmp_by_offset, c->tensors);
    uint64_t expect = 0;
    for (int64_t i = 0; i < c->n_tensors; i++) {
        const ql_st_tensor *t = &c->tensors[c->sorted[i]];
        ql_name_buf a, b;
        if (t->begin < expect) {
            const ql_st_tensor *p = &c->tensors[c->sorted[i - 1]];
            st = FAIL(c, QL_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' [%llu, %llu]",
                      ql_show(&a, t->name), (unsigned long long)t->begin, (unsigned long long)t->end,
                      ql_show(&b, p->name), (unsigned long long)p->begin, (unsigned long long)p->end);
            goto done;
        }
        if (t->begin > expect) {
            st = FAIL(c, QL_ERR_FORMAT,
                      "tensor '%s': data buffer bytes [%llu, %llu) before it belong to no tensor (a hole)",
                      ql_show(&a, t->name), (unsigned long long)expect, (unsigned long long)t->begin);
            goto done;
        }
        expect = t->end;
    }
    if (expect != c->data_size) {
        st = FAIL(c, QL_ERR_FORMAT, "data buffer bytes [%llu, %llu) at the end of the file belong to no tensor",
                  (unsigned long long)expect, (unsigned long long)c->data_size);
        goto done;
    }
    for (int64_t i = 0; i < c->n_tensors; i++) c->sorted[i] = i;
    qsort_r(c->sorted, (size_t)c->n_tensors, sizeof(int64_t), cmp_by_name, c->tensors);
done:
    json_decref(root);
    return st;
}

/* ------------------------------------------------------------ map/release */

ql_status ql_st_map_file(ql_checkpoint *c)
{
    /* O_NONBLOCK: a FIFO must not hang the open; it is refused below. */
    int fd = open(c->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return FAIL(c, QL_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ql_status st = S_ISDIR(sb.st_mode) ? FAIL(c, QL_ERR_IO, "is a directory, not a file")
                                           : FAIL(c, QL_ERR_IO, "is not a regular file");
        close(fd);
        return st;
    }
    c->size = (uint64_t)sb.st_size;
    if (c->size > 0) {
        void *p = mmap(NULL, (size_t)c->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            ql_status st = FAIL(c, QL_ERR_IO, "cannot map %llu bytes: %s", (unsigned long long)c->size, strerror(errno));
            close(fd);
            return st;
        }
        c->base = p;
        c->mapped = 1;
    }
    close(fd);
    return QL_OK;
}

void ql_st_release(ql_checkpoint *c)
{
    if (c->mapped) munmap((void *)c->base, (size_t)c->size);
    for (int64_t i = 0; i < c->n_tensors; i++) free(c->tensors[i].name);
    free(c->tensors);
    free(c->sorted);
    free(c->dims);
    for (int64_t i = 0; i < c->n_meta; i++) {
        free(c->meta_keys[i]);
        free(c->meta_values[i]);
    }
    free(c->meta_keys);
    free(c->meta_values);
}

/* --------------------------------------------------------------- accessors */

const char *ql_checkpoint_path(const ql_checkpoint *c) { return c ? c->path : ""; }
uint64_t ql_checkpoint_file_bytes(const ql_checkpoint *c) { return c ? c->size : 0; }
uint64_t ql_checkpoint_header_bytes(const ql_checkpoint *c) { return c ? c->header_len : 0; }
int64_t ql_checkpoint_tensor_count(const ql_checkpoint *c) { return c ? c->n_tensors : 0; }

ql_status ql_checkpoint_tensor(const ql_checkpoint *c, int64_t i, ql_tensor_info *out)
{
    const char *fn = "ql_checkpoint_tensor";
    QL_CHECK_PTR(fn, c);
    QL_CHECK_PTR(fn, out);
    if (i < 0 || i >= c->n_tensors)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: index %lld is outside [0, %lld)", fn, (long long)i,
                       (long long)c->n_tensors);
    const ql_st_tensor *t = &c->tensors[i];
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    out->shape = t->shape;
    out->numel = t->numel;
    out->data = ql_st_tensor_data(c, t);
    out->offset = 8 + c->header_len + t->begin;
    out->bytes = t->end - t->begin;
    return QL_OK;
}

int64_t ql_checkpoint_find(const ql_checkpoint *c, const char *name)
{
    if (!c || !name) return -1;
    int64_t lo = 0, hi = c->n_tensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->tensors[c->sorted[mid]].name, name);
        if (r == 0) return c->sorted[mid];
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

int64_t ql_checkpoint_metadata_count(const ql_checkpoint *c) { return c ? c->n_meta : 0; }

ql_status ql_checkpoint_metadata(const ql_checkpoint *c, int64_t i, const char **key, const char **value)
{
    const char *fn = "ql_checkpoint_metadata";
    QL_CHECK_PTR(fn, c);
    if (i < 0 || i >= c->n_meta)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: index %lld is outside [0, %lld)", fn, (long long)i,
                       (long long)c->n_meta);
    if (key) *key = c->meta_keys[i];
    if (value) *value = c->meta_values[i];
    return QL_OK;
}

const char *ql_checkpoint_metadata_get(const ql_checkpoint *c, const char *key)
{
    if (!c || !key) return NULL;
    for (int64_t i = 0; i < c->n_meta; i++)
        if (!strcmp(c->meta_keys[i], key)) return c->meta_values[i];
    return NULL;
}
