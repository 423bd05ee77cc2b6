/*
 * qlinear — checkpoint files: a strict safetensors reader (mmap), an atomic
 * streaming writer, ComfyUI quantized-layer discovery (comfy_quant), linears
 * built straight from a checkpoint layer, and checkpoint quantization.
 *
 * (To be folded into qlinear.h; kept apart while the module is developed.)
 *
 * Errors follow the library's convention: every call returns a ql_status and
 * ql_last_error() holds one line naming the file, the tensor (when there is
 * one) and the rule that was broken, e.g.
 *   model.safetensors: tensor 'x.weight': data_offsets [10, 5] are reversed
 * A file that breaks a rule gives QL_ERR_FORMAT; one that cannot be opened,
 * mapped, read or written gives QL_ERR_IO.
 */
#ifndef QLINEAR_CHECKPOINT_H
#define QLINEAR_CHECKPOINT_H

#include "qlinear.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------ safetensors dtypes
 * Every dtype the safetensors format defines, in the order of its reference
 * implementation (the writer sorts tensors by this order, descending). */
typedef enum ql_st_dtype {
    QL_ST_BOOL = 0,
    QL_ST_F4,      /* 4 bits */
    QL_ST_F6_E2M3, /* 6 bits */
    QL_ST_F6_E3M2, /* 6 bits */
    QL_ST_U8,
    QL_ST_I8,
    QL_ST_F8_E5M2,
    QL_ST_F8_E4M3,
    QL_ST_F8_E8M0,
    QL_ST_F8_E4M3FNUZ,
    QL_ST_F8_E5M2FNUZ,
    QL_ST_I16,
    QL_ST_U16,
    QL_ST_F16,
    QL_ST_BF16,
    QL_ST_I32,
    QL_ST_U32,
    QL_ST_F32,
    QL_ST_C64,
    QL_ST_F64,
    QL_ST_I64,
    QL_ST_U64,
    QL_ST_DTYPE_COUNT
} ql_st_dtype;

/* "F32", "BF16", ... ; "?" for an unknown value. */
const char *ql_st_dtype_name(ql_st_dtype dtype);
/* Bits per element (4, 6, 8, 16, 32, 64); 0 for an unknown value. */
int ql_st_dtype_bits(ql_st_dtype dtype);
/* Parse a dtype name; QL_ERR_FORMAT (no message set) if unknown. */
ql_status ql_st_dtype_parse(const char *name, ql_st_dtype *out);
/* The library dtype of a safetensors dtype (F32, F16, BF16, I8, U8, I32);
 * QL_ERR_UNSUPPORTED (no message set) for the others. */
ql_status ql_st_dtype_to_ql(ql_st_dtype dtype, ql_dtype *out);
/* The safetensors dtype of a library dtype. */
ql_st_dtype ql_st_dtype_from_ql(ql_dtype dtype);

/* ------------------------------------------------------------- the reader */

typedef struct ql_checkpoint ql_checkpoint;

/* One tensor of an open checkpoint. Pointers stay valid until the checkpoint
 * is closed. `data` points into the read-only mapping and is only as aligned
 * as the file makes it (the qlinear writer aligns every tensor to its element
 * size; other writers may not): copy before reading it as float/uint16_t. */
typedef struct ql_tensor_info {
    const char *name;
    ql_st_dtype dtype;
    int ndim;
    const int64_t *shape; /* ndim entries */
    int64_t numel;        /* product of shape (1 for a 0-d tensor) */
    const void *data;
    uint64_t offset;      /* of the data, from the start of the file */
    uint64_t bytes;
} ql_tensor_info;

/* Open and validate a safetensors file: the container (FORMATS.md §1) and
 * every quantized layer it declares (§2, see ql_layer_info). The file is
 * memory-mapped read-only; tensor data is not read until used. */
ql_status ql_checkpoint_open(const char *path, ql_checkpoint **out);
/* The same for a file image already in memory (not copied: `data` must stay
 * valid and unchanged until the checkpoint is closed). `label` names the
 * image in error messages. */
ql_status ql_checkpoint_open_memory(const void *data, size_t size, const char *label, ql_checkpoint **out);
void ql_checkpoint_close(ql_checkpoint *ckpt);

const char *ql_checkpoint_path(const ql_checkpoint *ckpt);
uint64_t ql_checkpoint_file_bytes(const ql_checkpoint *ckpt);
uint64_t ql_checkpoint_header_bytes(const ql_checkpoint *ckpt); /* the JSON header's length N */

/* Tensors in the order the header lists them. */
int64_t ql_checkpoint_tensor_count(const ql_checkpoint *ckpt);
ql_status ql_checkpoint_tensor(const ql_checkpoint *ckpt, int64_t index, ql_tensor_info *out);
/* Index of the tensor called `name`, or -1. */
int64_t ql_checkpoint_find(const ql_checkpoint *ckpt, const char *name);

/* __metadata__ entries, in header order. */
int64_t ql_checkpoint_metadata_count(const ql_checkpoint *ckpt);
ql_status ql_checkpoint_metadata(const ql_checkpoint *ckpt, int64_t index, const char **key, const char **value);
/* Value of a metadata key, or NULL. */
const char *ql_checkpoint_metadata_get(const ql_checkpoint *ckpt, const char *key);

/* --------------------------------------------------- quantized layers
 * A layer with prefix P is quantized when the file has a U8 tensor
 * `P.comfy_quant` holding a JSON object, or __metadata__ has
 * `_quantization_metadata` = {"layers": {P: {...}}} (ComfyUI's older form).
 * Keys `convrot`, `convrot_groupsize`, `group_size`, `linear_dtype` are read
 * from the top level, else from a nested "params" object; defaults: convrot
 * false, convrot_groupsize 256, group_size 16 (64 for awq_w4a16),
 * linear_dtype "int4".
 * For int8_tensorwise, opening checks: `P.weight` I8 [N, K]; `P.weight_scale`
 * F32 of shape [], [1], [N] or [N, 1]; K a multiple of the ConvRot group;
 * optional `P.bias` [N]. Other known formats (float8_e4m3fn, float8_e5m2,
 * nvfp4, mxfp8, convrot_w4a4, asym_w4a8_int8, awq_w4a16, w6a8_int8) are
 * listed with supported = 0; an unknown format is a format error. */
typedef enum ql_layer_source {
    QL_LAYER_FROM_TENSOR = 1,   /* P.comfy_quant */
    QL_LAYER_FROM_METADATA = 2, /* __metadata__["_quantization_metadata"] */
    QL_LAYER_FROM_BOTH = 3
} ql_layer_source;

typedef struct ql_layer_info {
    const char *prefix;
    const char *format;        /* comfy_quant "format", e.g. "int8_tensorwise" */
    const char *config_json;   /* the configuration as declared (JSON text) */
    ql_layer_source source;
    int supported;             /* 1: ql_linear_from_checkpoint can build it */
    const char *unsupported_reason; /* NULL when supported */
    int convrot;               /* 1: weights stored rotated, group convrot_group */
    int64_t convrot_group;
    int64_t group_size;        /* W4A8 / AWQ group (informational) */
    const char *linear_dtype;  /* convrot_w4a4 only (informational) */
    int full_precision_matrix_mult;
    int64_t n, k;              /* logical out × in (from P.weight; 0 if unknown) */
    int64_t n_scale;           /* int8: 1 or N */
    /* Tensor indices (ql_checkpoint_tensor), -1 when absent. */
    int64_t weight, weight_scale, bias, comfy_quant;
} ql_layer_info;

int64_t ql_checkpoint_layer_count(const ql_checkpoint *ckpt);
ql_status ql_checkpoint_layer(const ql_checkpoint *ckpt, int64_t index, ql_layer_info *out);
/* Index of the quantized layer with this prefix, or -1. */
int64_t ql_checkpoint_find_layer(const ql_checkpoint *ckpt, const char *prefix);

/* ---------------------------------------------- linears from a checkpoint
 * `layer` is a prefix ("blocks.0.attn.q"; a trailing ".weight" is ignored).
 * A quantized int8_tensorwise layer takes kind QL_LINEAR_W8A8,
 * QL_LINEAR_WEIGHT_ONLY or QL_LINEAR_DEQUANT; a float layer (P.weight
 * F32/F16/BF16 [N, K], no comfy_quant) takes QL_LINEAR_DENSE (fp32 compute).
 * ql_checkpoint_linear_desc fills a descriptor whose pointers refer to the
 * checkpoint (valid until it is closed; aligned copies are made where the
 * file leaves data unaligned), so the caller may adjust it (e.g. drop the
 * bias) before ql_linear_create. Every checkpoint call may be made from
 * several threads at once on one open checkpoint (until it is closed). */
ql_status ql_checkpoint_linear_desc(const ql_checkpoint *ckpt, const char *layer, ql_linear_kind kind,
                                    ql_linear_desc *desc);
/* Shortcut: descriptor + ql_linear_create (the weight is packed once). The
 * linear does not refer to the checkpoint afterwards. */
ql_status ql_linear_from_checkpoint(ql_context *ctx, const ql_checkpoint *ckpt, const char *layer,
                                    ql_linear_kind kind, ql_linear **out);

/* ------------------------------------------------------------- the writer
 * Writes a safetensors file the way the reference writer does: compact JSON
 * header, "__metadata__" first, tensors sorted by dtype (descending, the
 * order of ql_st_dtype) then by name, header padded with spaces to a multiple
 * of 8, data packed back to back (so every tensor is aligned to its element
 * size). The header is written at open; tensor bytes are then streamed with
 * ql_st_writer_write in any order (thread-safe for disjoint ranges). Output
 * goes to a temporary file in the destination's folder, renamed over the
 * destination by ql_st_writer_finish only when every byte was written; abort
 * (or any failure) removes it. */
typedef struct ql_tensor_spec {
    const char *name;
    ql_st_dtype dtype;
    int ndim;
    const int64_t *shape;
} ql_tensor_spec;

typedef struct ql_st_writer ql_st_writer;

/* metadata: n_metadata key/value pairs (keys[i], values[i]); may be 0.
 * protect: a path the output must not replace (the input), or NULL. */
ql_status ql_st_writer_open(const char *path, const ql_tensor_spec *specs, int64_t n_specs,
                            const char *const *meta_keys, const char *const *meta_values, int64_t n_metadata,
                            const char *protect, ql_st_writer **out);
/* Bytes [offset, offset + bytes) of tensor `index` (its index in specs). */
ql_status ql_st_writer_write(ql_st_writer *w, int64_t index, uint64_t offset, const void *data, size_t bytes);
/* Bytes tensor `index` must receive. */
uint64_t ql_st_writer_tensor_bytes(const ql_st_writer *w, int64_t index);
/* Check completeness, flush, rename. Frees the writer in every case. */
ql_status ql_st_writer_finish(ql_st_writer *w);
/* Remove the temporary file and free the writer. NULL is a no-op. */
void ql_st_writer_abort(ql_st_writer *w);

/* ------------------------------------------------ checkpoint quantization */

typedef enum ql_quant_target {
    QL_QUANT_INT8 = 0,         /* int8_tensorwise, per-row scales */
    QL_QUANT_INT8_CONVROT = 1  /* int8_tensorwise with ConvRot */
} ql_quant_target;

typedef struct ql_quantize_progress {
    int64_t layers_done, layers_total; /* quantized weights */
    uint64_t bytes_done, bytes_total;  /* input tensor bytes processed (quantized or copied) */
    double seconds;                    /* since the start */
    const char *current;               /* tensor being processed */
} ql_quantize_progress;

typedef struct ql_quantize_options {
    ql_quant_target target;
    int64_t group;         /* ConvRot group; 0 = 256 */
    const char *include;   /* POSIX extended regex on tensor names; NULL = the default selection */
    const char *exclude;   /* POSIX extended regex; NULL = none */
    int threads;           /* 0 = OpenMP's default */
    /* Called from the calling thread between pieces of work (a few per
     * second at most); return non-zero to cancel (QL_ERR_IO, nothing written). */
    int (*progress)(void *user, const ql_quantize_progress *p);
    void *user;
} ql_quantize_options;

typedef struct ql_quantize_result {
    int64_t layers_quantized;
    int64_t tensors_copied;
    uint64_t bytes_in, bytes_out;
    double seconds;
} ql_quantize_result;

/* Whether a tensor can be quantized: a 2-D F32/F16/BF16 tensor named
 * `P.weight` (P non-empty) with N, K > 0 and K % group == 0 (pass group 1
 * for plain int8). With default_names, also the default name rule: the
 * module name (last component of P) is not an embedding or a norm (contains
 * "norm" or "embed", or is "emb", "wte", "wpe", or starts with "ln"). The
 * quantize command uses the name rule unless --include is given. */
int ql_quantize_selects(const ql_tensor_info *t, int64_t group, int default_names);

/* Quantize a float checkpoint: selected weights become `P.weight` I8 [N, K],
 * `P.weight_scale` F32 [N, 1] and `P.comfy_quant` (Python json.dumps bytes);
 * codes and scales come from ql_quantize_rowwise / ql_quantize_convrot_weight
 * on the tensor in its own dtype. Every other tensor and __metadata__ are
 * copied unchanged. Memory stays bounded (one block of rows per thread); the
 * output is written atomically and never replaces the input. */
ql_status ql_checkpoint_quantize(const char *in_path, const char *out_path, const ql_quantize_options *opt,
                                 ql_quantize_result *result);

/* The comfy_quant bytes qlinear writes (Python json.dumps, default
 * separators, no newline): {"format": "int8_tensorwise"} or
 * {"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": G}.
 * Returns the length (72 for G = 256), like snprintf: writes at most cap
 * bytes including a terminating NUL. */
size_t ql_comfy_quant_json(ql_quant_target target, int64_t group, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* QLINEAR_CHECKPOINT_H */
