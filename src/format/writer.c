/* The safetensors writer: the reference writer's header layout, streamed
 * tensor data, atomic replacement of the destination (temp file + rename). */
#include "format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- text buffer */

void ql_sbuf_put(ql_sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void ql_sbuf_puts(ql_sbuf *b, const char *s) { ql_sbuf_put(b, s, strlen(s)); }

void ql_sbuf_printf(ql_sbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        ql_sbuf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    ql_sbuf_put(b, big, (size_t)n);
    free(big);
}

void ql_sbuf_json_string(ql_sbuf *b, const char *s)
{
    ql_sbuf_put(b, "\"", 1);
    const char *run = s;
    for (const char *p = s; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        const char *esc = NULL;
        char u[8];
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (ch < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", ch);
                esc = u;
            }
        }
        if (esc) {
            ql_sbuf_put(b, run, (size_t)(p - run));
            ql_sbuf_puts(b, esc);
            run = p + 1;
        }
    }
    ql_sbuf_puts(b, run);
    ql_sbuf_put(b, "\"", 1);
}

/* ------------------------------------------------------------------ writer */

typedef struct wtensor {
    uint64_t begin, bytes;
    _Atomic uint64_t written;
} wtensor;

struct ql_st_writer {
    char *path, *tmp;
    int fd;
    int64_t n;
    char **own_names; /* for messages */
    wtensor *t;
    uint64_t data_start, total;
};


static void writer_free(ql_st_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->own_names)
        for (int64_t i = 0; i < w->n; i++) free(w->own_names[i]);
    free(w->own_names);
    free(w->t);
    free(w->path);
    free(w->tmp);
    free(w);
}

void ql_st_writer_abort(ql_st_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    if (w->tmp) unlink(w->tmp);
    writer_free(w);
}

static ql_status pwrite_all(const char *path, int fd, const void *data, size_t bytes, uint64_t at)
{
    const char *p = data;
    while (bytes > 0) {
        size_t chunk = bytes > ((size_t)1 << 30) ? ((size_t)1 << 30) : bytes;
        ssize_t r = pwrite(fd, p, chunk, (off_t)at);
        if (r < 0) {
            if (errno == EINTR) continue;
            return ql_fail_path(path, QL_ERR_IO, "write failed at byte %llu: %s", (unsigned long long)at, strerror(errno));
        }
        if (r == 0) return ql_fail_path(path, QL_ERR_IO, "write failed at byte %llu: no progress", (unsigned long long)at);
        p += r;
        bytes -= (size_t)r;
        at += (uint64_t)r;
    }
    return QL_OK;
}

typedef struct sort_ctx {
    const ql_tensor_spec *specs;
} sort_ctx;

/* The reference order: dtype descending, then name (bytewise). */
static int cmp_ref_order(const void *a, const void *b, void *ctx)
{
    const ql_tensor_spec *s = ((const sort_ctx *)ctx)->specs;
    const ql_tensor_spec *x = &s[*(const int64_t *)a], *y = &s[*(const int64_t *)b];
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_names(const void *a, const void *b, void *ctx)
{
    const ql_tensor_spec *s = ((const sort_ctx *)ctx)->specs;
    return strcmp(s[*(const int64_t *)a].name, s[*(const int64_t *)b].name);
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static ql_status check_text(const char *path, const char *what, const char *s)
{
    if (!s) return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    size_t len = strlen(s);
    if (ql_utf8_check((const unsigned char *)s, len) != len) {
        ql_name_buf nb;
        return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "%s '%s' is not valid UTF-8", what, ql_show(&nb, s));
    }
    return QL_OK;
}

/* A temporary name next to the destination: DIR/.BASE.tmp-PID-N */
static ql_status open_temp(ql_st_writer *w)
{
    const char *slash = strrchr(w->path, '/');
    size_t dlen = slash ? (size_t)(slash - w->path) + 1 : 0;
    const char *base = slash ? slash + 1 : w->path;
    if (!*base) return ql_fail_path(w->path, QL_ERR_INVALID_ARGUMENT, "output path names a folder, not a file");
    size_t cap = strlen(w->path) + 64;
    w->tmp = malloc(cap);
    if (!w->tmp) return ql_fail_path(w->path, QL_ERR_OUT_OF_MEMORY, "out of memory");
    static _Atomic unsigned counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        unsigned k = atomic_fetch_add(&counter, 1) ^ (unsigned)time(NULL) * 2654435761u;
        snprintf(w->tmp, cap, "%.*s.%s.tmp-%ld-%08x", (int)dlen, w->path, base, (long)getpid(), k);
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd >= 0) return QL_OK;
        if (errno != EEXIST) break;
    }
    ql_status st = ql_fail_path(w->path, QL_ERR_IO, "cannot create a temporary file next to it: %s", strerror(errno));
    free(w->tmp);
    w->tmp = NULL;
    return st;
}

/* Each spec: a valid UTF-8 name (not __metadata__, not twice), a known
 * dtype, a shape whose size fits; w->t[i].bytes and w->own_names filled,
 * order[] left sorted by name. */
static ql_status check_specs(ql_st_writer *w, const char *path, const ql_tensor_spec *specs, int64_t n, int64_t *order)
{
    ql_status st;
    ql_name_buf nb;
    for (int64_t i = 0; i < n; i++) {
        const ql_tensor_spec *s = &specs[i];
        if ((st = check_text(path, "tensor name", s->name)) != QL_OK) return st;
        if (!strcmp(s->name, "__metadata__"))
            return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "a tensor cannot be called '__metadata__'");
        if ((unsigned)s->dtype >= QL_ST_DTYPE_COUNT || s->ndim < 0 || (s->ndim > 0 && !s->shape))
            return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "tensor '%s': bad dtype or shape", ql_show(&nb, s->name));
        uint64_t numel = 1;
        for (int d = 0; d < s->ndim; d++) {
            if (s->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)s->shape[d], &numel))
                return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "tensor '%s': shape[%d] = %lld is negative or overflows",
                                    ql_show(&nb, s->name), d, (long long)s->shape[d]);
        }
        uint64_t bits;
        if (__builtin_mul_overflow(numel, (uint64_t)ql_st_dtype_bits(s->dtype), &bits) || bits % 8)
            return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT,
                                "tensor '%s': size is not a whole number of bytes or overflows", ql_show(&nb, s->name));
        w->t[i].bytes = bits / 8;
        if (!(w->own_names[i] = strdup(s->name))) return ql_fail_path(path, QL_ERR_OUT_OF_MEMORY, "out of memory");
        order[i] = i;
    }
    sort_ctx sc = {specs};
    qsort_r(order, (size_t)n, sizeof *order, cmp_names, &sc);
    for (int64_t i = 1; i < n; i++)
        if (!strcmp(specs[order[i]].name, specs[order[i - 1]].name))
            return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "tensor '%s' is listed twice",
                                ql_show(&nb, specs[order[i]].name));
    return QL_OK;
}

/* Keys and values valid UTF-8, no key twice; mk[] gets the sorted keys. */
static ql_status check_metadata(const char *path, const char *const *meta_keys, const char *const *meta_values,
                                int64_t n_meta, const char **mk)
{
    ql_status st;
    for (int64_t i = 0; i < n_meta; i++) {
        if ((st = check_text(path, "metadata key", meta_keys[i])) != QL_OK) return st;
        if ((st = check_text(path, "metadata value", meta_values[i])) != QL_OK) return st;
        mk[i] = meta_keys[i];
    }
    qsort(mk, (size_t)n_meta, sizeof *mk, cmp_str_ptr);
    ql_name_buf nb;
    for (int64_t i = 1; i < n_meta; i++)
        if (!strcmp(mk[i], mk[i - 1]))
            return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "metadata key '%s' is listed twice", ql_show(&nb, mk[i]));
    return QL_OK;
}

/* Layout and header, as the reference writer makes them: tensors in the
 * reference order (order[] is re-sorted), the header padded with spaces
 * to a multiple of 8. Sets w->t[].begin, w->data_start and w->total. */
static ql_status build_header(ql_st_writer *w, const char *path, const ql_tensor_spec *specs, int64_t n,
                              int64_t *order, const char *const *meta_keys, const char *const *meta_values,
                              int64_t n_meta, ql_sbuf *h)
{
    sort_ctx sc = {specs};
    qsort_r(order, (size_t)n, sizeof *order, cmp_ref_order, &sc);
    ql_sbuf_put(h, "{", 1);
    int first = 1;
    if (n_meta > 0) {
        ql_sbuf_puts(h, "\"__metadata__\":{");
        for (int64_t i = 0; i < n_meta; i++) {
            if (i) ql_sbuf_put(h, ",", 1);
            ql_sbuf_json_string(h, meta_keys[i]);
            ql_sbuf_put(h, ":", 1);
            ql_sbuf_json_string(h, meta_values[i]);
        }
        ql_sbuf_put(h, "}", 1);
        first = 0;
    }
    uint64_t off = 0;
    for (int64_t j = 0; j < n; j++) {
        const ql_tensor_spec *s = &specs[order[j]];
        wtensor *t = &w->t[order[j]];
        t->begin = off;
        if (__builtin_add_overflow(off, t->bytes, &off))
            return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "total size overflows 64 bits");
        if (!first) ql_sbuf_put(h, ",", 1);
        first = 0;
        ql_sbuf_json_string(h, s->name);
        ql_sbuf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", ql_st_dtype_name(s->dtype));
        for (int d = 0; d < s->ndim; d++) ql_sbuf_printf(h, "%s%lld", d ? "," : "", (long long)s->shape[d]);
        ql_sbuf_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin, (unsigned long long)off);
    }
    ql_sbuf_put(h, "}", 1);
    while (!h->oom && h->len % 8) ql_sbuf_put(h, " ", 1);
    if (h->oom) return ql_fail_path(path, QL_ERR_OUT_OF_MEMORY, "out of memory building the header");
    if (h->len > QL_ST_MAX_HEADER)
        return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "header would be %zu bytes, over the %llu-byte limit", h->len,
                            QL_ST_MAX_HEADER);
    w->data_start = 8 + (uint64_t)h->len;
    w->total = w->data_start + off;
    return QL_OK;
}

/* The temporary file, sized to w->total, with the length and the header
 * written; never over a directory or over `protect`. */
static ql_status create_output(ql_st_writer *w, const char *path, const char *protect, const ql_sbuf *h)
{
    ql_status st;
    struct stat ds;
    if (stat(path, &ds) == 0 && S_ISDIR(ds.st_mode)) return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "is a directory");
    /* Never replace the input. */
    if (protect) {
        struct stat a, b;
        if (stat(protect, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            return ql_fail_path(path, QL_ERR_INVALID_ARGUMENT, "refusing to overwrite the input file");
    }
    if ((st = open_temp(w)) != QL_OK) return st;
    if (ftruncate(w->fd, (off_t)w->total) != 0)
        return ql_fail_path(path, QL_ERR_IO, "cannot size the temporary file to %llu bytes: %s",
                            (unsigned long long)w->total, strerror(errno));
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h->len >> (8 * i));
    if ((st = pwrite_all(path, w->fd, len8, 8, 0)) != QL_OK) return st;
    return pwrite_all(path, w->fd, h->p, h->len, 8);
}

ql_status ql_st_writer_open(const char *path, const ql_tensor_spec *specs, int64_t n, const char *const *meta_keys,
                            const char *const *meta_values, int64_t n_meta, const char *protect, ql_st_writer **out)
{
    const char *fn = "ql_st_writer_open";
    QL_CHECK_PTR(fn, out);
    *out = NULL;
    QL_CHECK_PTR(fn, path);
    if (n < 0 || n_meta < 0) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: negative count", fn);
    if (n > 0) QL_CHECK_PTR(fn, specs);
    if (n_meta > 0 && (!meta_keys || !meta_values)) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: metadata is NULL", fn);

    ql_st_writer *w = calloc(1, sizeof *w);
    int64_t *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    const char **mk = malloc((size_t)(n_meta ? n_meta : 1) * sizeof *mk);
    ql_sbuf h = {0};
    ql_status st = QL_OK;
    if (!w || !order || !mk || !(w->path = strdup(path))) {
        free(order);
        free(mk);
        if (w) free(w->path);
        free(w);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    w->fd = -1;
    w->n = n;
    w->t = calloc((size_t)(n ? n : 1), sizeof *w->t);
    w->own_names = calloc((size_t)(n ? n : 1), sizeof *w->own_names);
    if (!w->t || !w->own_names) st = ql_fail_path(path, QL_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == QL_OK) st = check_specs(w, path, specs, n, order);
    if (st == QL_OK) st = check_metadata(path, meta_keys, meta_values, n_meta, mk);
    if (st == QL_OK) st = build_header(w, path, specs, n, order, meta_keys, meta_values, n_meta, &h);
    if (st == QL_OK) st = create_output(w, path, protect, &h);
    free(h.p);
    free(order);
    free(mk);
    if (st != QL_OK) {
        ql_st_writer_abort(w);
        return st;
    }
    *out = w;
    return QL_OK;
}

uint64_t ql_st_writer_tensor_bytes(const ql_st_writer *w, int64_t index)
{
    return w && index >= 0 && index < w->n ? w->t[index].bytes : 0;
}

ql_status ql_st_writer_write(ql_st_writer *w, int64_t index, uint64_t offset, const void *data, size_t bytes)
{
    const char *fn = "ql_st_writer_write";
    QL_CHECK_PTR(fn, w);
    if (index < 0 || index >= w->n)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: tensor index %lld is outside [0, %lld)", fn, (long long)index,
                       (long long)w->n);
    wtensor *t = &w->t[index];
    uint64_t end;
    if (__builtin_add_overflow(offset, (uint64_t)bytes, &end) || end > t->bytes) {
        ql_name_buf nb;
        return ql_fail_path(w->path, QL_ERR_INVALID_ARGUMENT, "tensor '%s': write of bytes [%llu, +%zu) exceeds its %llu bytes",
                     ql_show(&nb, w->own_names[index]), (unsigned long long)offset, bytes,
                     (unsigned long long)t->bytes);
    }
    if (bytes == 0) return QL_OK;
    QL_CHECK_PTR(fn, data);
    QL_TRY(pwrite_all(w->path, w->fd, data, bytes, w->data_start + t->begin + offset));
    atomic_fetch_add(&t->written, (uint64_t)bytes);
    return QL_OK;
}

ql_status ql_st_writer_finish(ql_st_writer *w)
{
    QL_CHECK_PTR("ql_st_writer_finish", w);
    ql_status st = QL_OK;
    for (int64_t i = 0; i < w->n; i++) {
        uint64_t got = atomic_load(&w->t[i].written);
        if (got != w->t[i].bytes) {
            ql_name_buf nb;
            st = ql_fail_path(w->path, QL_ERR_INVALID_ARGUMENT, "tensor '%s': %llu of its %llu bytes were written",
                       ql_show(&nb, w->own_names[i]), (unsigned long long)got, (unsigned long long)w->t[i].bytes);
            ql_st_writer_abort(w);
            return st;
        }
    }
    if (fsync(w->fd) != 0) {
        st = ql_fail_path(w->path, QL_ERR_IO, "cannot flush the temporary file: %s", strerror(errno));
        ql_st_writer_abort(w);
        return st;
    }
    if (close(w->fd) != 0) {
        w->fd = -1;
        st = ql_fail_path(w->path, QL_ERR_IO, "cannot close the temporary file: %s", strerror(errno));
        ql_st_writer_abort(w);
        return st;
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) {
        st = ql_fail_path(w->path, QL_ERR_IO, "cannot rename the temporary file into place: %s", strerror(errno));
        ql_st_writer_abort(w);
        return st;
    }
    /* Make the rename durable (best effort). */
    const char *slash = strrchr(w->path, '/');
    char *dir = slash ? strndup(w->path, (size_t)(slash - w->path) + 1) : strdup(".");
    if (dir) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    writer_free(w);
    return QL_OK;
}
