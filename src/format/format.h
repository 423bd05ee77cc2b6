/* Internal pieces of the checkpoint module. Not part of the public API.
 *   text.c         UTF-8 checks, printable names, "PATH: message" failures
 *   safetensors.c  the container: map, parse, index, accessors
 *   comfy_quant.c  comfy_quant configurations
 *   layers.c       quantized layers on top of a parsed container
 *   checkpoint.c   ql_checkpoint_open/close: the container, then its layers
 *   writer.c       the safetensors writer
 * text.c depends on nothing here; the container on text.c only; layers.c
 * on the container, comfy_quant.c and text.c; checkpoint.c on both. */
#ifndef QL_FORMAT_H
#define QL_FORMAT_H

#include "qlinear.h"

#include "core/core.h"

#include <jansson.h>
#include <pthread.h>

/* The reference parser's header limit (bytes). */
#define QL_ST_MAX_HEADER 100000000ull

typedef struct ql_st_tensor {
    char *name;
    ql_st_dtype dtype;
    int ndim;
    int64_t *shape; /* into ckpt->dims */
    int64_t numel;
    uint64_t begin, end; /* relative to the data buffer */
} ql_st_tensor;

typedef struct ql_layer {
    ql_layer_info info;
    char *prefix, *format, *json, *linear_dtype, *reason;
} ql_layer;

struct ql_checkpoint {
    char *path; /* or the label of a checkpoint in memory */

    /* The container (safetensors.c). */
    const unsigned char *base; /* the whole file */
    uint64_t size;
    int mapped; /* base is an mmap of size bytes */
    uint64_t header_len;
    const unsigned char *data; /* base + 8 + header_len */
    uint64_t data_size;

    int64_t n_tensors;
    ql_st_tensor *tensors;
    int64_t *sorted; /* tensor indices sorted by name */
    int64_t *dims;   /* all shapes */

    int64_t n_meta;
    char **meta_keys, **meta_values;

    /* Its quantized layers (layers.c). */
    int64_t n_layers;
    ql_layer *layers;
    int64_t *layer_sorted; /* layer indices sorted by prefix */

    /* Aligned copies of unaligned data handed out by linear_desc (layers.c;
     * guarded by lock, made and destroyed with the checkpoint: linear_desc
     * may be called from several threads). */
    pthread_mutex_t lock;
    void **copies;
    int64_t n_copies, cap_copies;
};

/* ---------------------------------------------------------------- text.c */

/* A printable, one-line, bounded rendering of an untrusted string (tensor
 * name, path) for error messages: control bytes become \xNN, long strings
 * are cut (at a UTF-8 boundary) and end in "...". */
typedef struct ql_name_buf {
    char s[112];
} ql_name_buf;
const char *ql_show(ql_name_buf *b, const char *s);

/* UTF-8 validity (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
 * Returns the offset of the first bad byte, or len if valid. */
size_t ql_utf8_check(const unsigned char *s, size_t len);

/* "FILE: message" for ql_last_error(), the path shortened for display. */
ql_status ql_fail_path(const char *path, ql_status st, const char *fmt, ...) QL_PRINTF(3, 4);
/* ql_fail with the checkpoint's path in front: "PATH: message". */
ql_status ql_fail_file(const ql_checkpoint *c, ql_status st, const char *fmt, ...) QL_PRINTF(3, 4);
/* "an object", "a string", ...: a JSON value's kind, for messages. */
const char *ql_json_kind(const json_t *v);

/* --------------------------------------------------------- safetensors.c */

/* Map c->path read-only into c->base / c->size (an empty file maps nothing). */
ql_status ql_st_map_file(ql_checkpoint *c);
/* Parse and validate the container in c->base; c->path names it in messages. */
ql_status ql_st_parse(ql_checkpoint *c);
/* Free what ql_st_map_file and ql_st_parse made (not c itself). */
void ql_st_release(ql_checkpoint *c);

/* Pointer to tensor data inside the mapping. */
static inline const void *ql_st_tensor_data(const ql_checkpoint *c, const ql_st_tensor *t)
{
    return c->data + t->begin;
}

/* -------------------------------------------------------------- layers.c */

/* Discover and validate quantized layers (after ql_st_parse). */
ql_status ql_layers_discover(ql_checkpoint *c);
/* Free what ql_layers_discover and linear_desc made (not c->lock). */
void ql_layers_free(ql_checkpoint *c);

/* --------------------------------------------------------- comfy_quant.c */

/* Parsed comfy_quant configuration. */
typedef struct ql_cq {
    const char *format; /* points into a static table of known formats */
    int known_supported;
    int convrot;
    int64_t convrot_group;
    int64_t group_size;
    char linear_dtype[32];
    int full_precision_matrix_mult;
} ql_cq;

/* Parse one configuration object (JSON text of `len` bytes). `where` says
 * where it came from, for messages ("tensor 'x.comfy_quant'"). */
ql_status ql_cq_parse_text(const char *file, const char *where, const char *text, size_t len, ql_cq *out);

/* The same for an already parsed JSON value (a json_t *). */
ql_status ql_cq_parse_json(const char *file, const char *where, void *json_obj, ql_cq *out);

/* -------------------------------------------------------------- writer.c */

/* Append text to a growable buffer (used by the JSON header writer). */
typedef struct ql_sbuf {
    char *p;
    size_t len, cap;
    int oom;
} ql_sbuf;
void ql_sbuf_put(ql_sbuf *b, const char *s, size_t n);
void ql_sbuf_puts(ql_sbuf *b, const char *s);
void ql_sbuf_printf(ql_sbuf *b, const char *fmt, ...) QL_PRINTF(2, 3);
/* A JSON string literal escaped as serde_json (and Python's json.dumps with
 * ensure_ascii=False) does: \" \\ \b \f \n \r \t, other controls \u00xx. */
void ql_sbuf_json_string(ql_sbuf *b, const char *s);

#endif
