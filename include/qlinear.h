/*
 * qlinear — quantized linear layers in the formats ComfyUI checkpoints use
 * (INT8 tensorwise / row-wise, INT8 ConvRot), with numerics that follow
 * comfy-kitchen's eager backend, and fast per-ISA backends.
 *
 * One public header. Every call returns a ql_status; on failure a one-line
 * message naming the argument and the problem is available from
 * ql_last_error() on the same thread. The library never aborts or prints.
 *
 * Conventions
 *   - Y = X·Wᵀ. X is [M, K] (rows = tokens), W is [N, K] (out × in).
 *   - Matrices are row-major with an explicit row stride ("ld", in elements),
 *     so views into larger buffers work. All sizes and strides are int64_t.
 *   - M = 0 is valid and returns at once. A 1-D input is one row (M = 1).
 *   - Float tensors are fp32, fp16 or bf16 (ql_dtype); fp16/bf16 are passed
 *     as raw uint16_t bit patterns.
 */
#ifndef QLINEAR_H
#define QLINEAR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QL_VERSION_MAJOR 0
#define QL_VERSION_MINOR 1
#define QL_VERSION_PATCH 0

/* ---------------------------------------------------------------- status */

typedef enum ql_status {
    QL_OK = 0,
    QL_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad or mismatched shape, bad stride */
    QL_ERR_UNSUPPORTED = 2,      /* dtype, group size, ISA or shape not supported */
    QL_ERR_OUT_OF_MEMORY = 3,
    QL_ERR_NONFINITE = 4,        /* NaN/Inf met where a finite value is required (see quantizers) */
    QL_ERR_IO = 5,               /* a file could not be read or written */
    QL_ERR_FORMAT = 6            /* a file breaks its format's rules */
} ql_status;

/* Short name of a status ("invalid argument", ...). Never NULL. */
const char *ql_status_string(ql_status status);

/* Message of the last failing call on this thread ("" if none). Thread-local;
 * valid until the next failing call on this thread. */
const char *ql_last_error(void);

/* ----------------------------------------------------------------- dtypes */

typedef enum ql_dtype {
    QL_F32 = 0,
    QL_F16 = 1,
    QL_BF16 = 2,
    QL_I8 = 3,
    QL_U8 = 4,
    QL_I32 = 5
} ql_dtype;

const char *ql_dtype_name(ql_dtype dtype); /* "fp32", "fp16", "bf16", "int8", ... */
size_t ql_dtype_size(ql_dtype dtype);      /* bytes per element; 0 if unknown */

/* Conversions with round-to-nearest-even; subnormals, ±Inf and NaN exact
 * (NaN stays NaN, quietened). */
uint16_t ql_fp32_to_bf16(float x);
float ql_bf16_to_fp32(uint16_t x);
uint16_t ql_fp32_to_fp16(float x);
float ql_fp16_to_fp32(uint16_t x);

/* Convert n elements between float dtypes (fp32/fp16/bf16). */
ql_status ql_convert(const void *src, ql_dtype src_dtype, void *dst, ql_dtype dst_dtype, int64_t n);

/* -------------------------------------------------------------- context */

/* Instruction sets the int8 GEMM can run on. QL_ISA_AUTO = best available. */
typedef enum ql_isa {
    QL_ISA_AUTO = 0,
    QL_ISA_GENERIC = 1,    /* portable C, the reference twin of every kernel */
    QL_ISA_AVX2 = 2,       /* AVX2 without VNNI (exact, no int16 saturation) */
    QL_ISA_AVXVNNI = 3,    /* AVX-VNNI, ymm */
    QL_ISA_AVX512VNNI = 4  /* AVX512-VNNI, zmm */
} ql_isa;

const char *ql_isa_name(ql_isa isa);
/* Whether this CPU (and OS) can run the ISA's kernels. */
int ql_isa_supported(ql_isa isa);
/* Best ISA of this CPU. */
ql_isa ql_isa_best(void);

typedef struct ql_context ql_context;

/* A context holds the thread count and the ISA choice. Defaults come from the
 * environment: QLINEAR_THREADS (else the number of online CPUs) and
 * QLINEAR_ISA=generic|avx2|avxvnni|avx512vnni (else the best available; one
 * the CPU lacks is refused with QL_ERR_UNSUPPORTED). */
ql_status ql_context_create(ql_context **out);
void ql_context_destroy(ql_context *ctx);
ql_status ql_context_set_threads(ql_context *ctx, int threads);
int ql_context_threads(const ql_context *ctx);
ql_status ql_context_set_isa(ql_context *ctx, ql_isa isa);
ql_isa ql_context_isa(const ql_context *ctx);

/* ------------------------------------------------- reference numerics
 * These follow comfy-kitchen's eager backend (FORMATS.md §3–§4) and are the
 * twins every fast path is tested against. Single-threaded, plain C. */

/* The normalized Hadamard matrix H_G (G = 4^p, G >= 4) as fp32, G×G,
 * row-major: Kronecker power of H4 = [[1,1,1,-1],[1,1,-1,1],[1,-1,1,1],
 * [-1,1,1,1]] divided by sqrt(G). Other G: QL_ERR_UNSUPPORTED. */
ql_status ql_hadamard(int64_t group, float *h);

/* In-place group-wise rotation of the last dimension: each contiguous group of
 * `group` elements of each row becomes x·H_G (= x·H_Gᵀ, H is symmetric). Done
 * as a fast Walsh–Hadamard transform in fp32 and rounded to `dtype`, as the
 * reference rotates in the operand's dtype. k % group != 0: invalid argument. */
ql_status ql_rotate(ql_dtype dtype, void *x, int64_t rows, int64_t k, int64_t ldx, int64_t group);

/* Row-wise int8 quantization (one fp32 scale per row), exactly as the eager
 * reference: a = max|x| in dtype; s = max(a/127, 1e-30) (fp32, stored);
 * q = clamp(rne(x / s_T), -128, 127) with s_T = s rounded to dtype (smallest
 * normal of dtype if that is 0) and the quotient rounded to dtype.
 * A row holding NaN or ±Inf gets codes 0 and scale NaN; the other rows are
 * quantized normally and the call returns QL_ERR_NONFINITE naming the first
 * such row. */
ql_status ql_quantize_rowwise(ql_dtype dtype, const void *x, int64_t rows, int64_t k, int64_t ldx,
                              int8_t *q, int64_t ldq, float *scale);

/* Tensor-wise: one scale for the whole [rows, k] tensor. A non-finite value
 * anywhere gives all codes 0, scale NaN and QL_ERR_NONFINITE. */
ql_status ql_quantize_tensorwise(ql_dtype dtype, const void *x, int64_t rows, int64_t k, int64_t ldx,
                                 int8_t *q, int64_t ldq, float *scale);

/* ConvRot weight quantization: rotate W [n, k] group-wise in its dtype, then
 * row-wise quantize. Rows that overflow to Inf while rotating (or hold
 * NaN/Inf) are handled as in ql_quantize_rowwise. scale has n entries. */
ql_status ql_quantize_convrot_weight(ql_dtype dtype, const void *w, int64_t n, int64_t k, int64_t ldw,
                                     int64_t group, int8_t *q, int64_t ldq, float *scale);

/* Dequantize int8 codes [n, k]: w = fp32(q)·scale (n_scale = 1 or n), and for
 * ConvRot (group > 0) un-rotate in fp32; then round to out_dtype. */
ql_status ql_dequantize(const int8_t *q, int64_t n, int64_t k, int64_t ldq, const float *scale,
                        int64_t n_scale, int64_t group, ql_dtype out_dtype, void *out, int64_t ldo);

/* Exact int8×int8→int32: C[M,N] = A[M,K]·B[N,K]ᵀ, plain loops. */
ql_status ql_gemm_s8s8s32_ref(int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                              const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc);

/* Optional epilogue terms of a linear, all applied in the output dtype as the
 * reference does: y = cast(acc·(s_x·s_w)) + bias; then, if residual is set,
 * y = residual + residual_scale ⊙ y (one rounding, computed in fp32).
 * residual [M, N] (row stride ld_residual) and residual_scale [N] have the
 * output dtype. Pass NULL for "none". */
typedef struct ql_epilogue {
    const void *residual;
    int64_t ld_residual;
    const void *residual_scale;
} ql_epilogue;

/* Reference int8_linear (eager numerics, FORMATS.md §4.4):
 * x [m, k] (x_dtype), weight int8 [n, k], weight_scale (n_scale = 1 or n),
 * optional bias [n] (bias_dtype, cast to y_dtype), convrot_group 0 = no
 * rotation. A row of x holding NaN/Inf yields a NaN output row. */
typedef struct ql_int8_weight {
    int64_t n, k;
    const int8_t *q;
    int64_t ldq;
    const float *scale;
    int64_t n_scale;
    int64_t convrot_group; /* 0: plain int8; else rotated with H_group */
    const void *bias;      /* NULL or [n] */
    ql_dtype bias_dtype;
} ql_int8_weight;

ql_status ql_int8_linear_ref(const ql_int8_weight *w, const void *x, ql_dtype x_dtype, int64_t m, int64_t ldx,
                             void *y, ql_dtype y_dtype, int64_t ldy, const ql_epilogue *epi);

/* ---------------------------------------------------------- linear layers
 * A ql_linear packs its weight once, when created, for the context's ISA;
 * ql_linear_forward then runs the fused pipeline with the context's threads.
 * The context must outlive the linear. */

typedef enum ql_linear_kind {
    QL_LINEAR_W8A8 = 0,        /* int8 weight, activations quantized per row at run time */
    QL_LINEAR_WEIGHT_ONLY = 1, /* int8 weight decoded to float; activations stay float */
    QL_LINEAR_DENSE = 2,       /* float weight (fp32 or bf16 compute) */
    QL_LINEAR_DEQUANT = 3      /* baseline: dequantize the whole weight on every call, then dense */
} ql_linear_kind;

typedef struct ql_linear_desc {
    ql_linear_kind kind;
    ql_int8_weight int8; /* for W8A8, WEIGHT_ONLY, DEQUANT */
    /* for DENSE: float weight [n, k] (row stride ld_weight) and its dtype;
     * compute_dtype QL_F32 or QL_BF16 selects the arithmetic. */
    int64_t n, k;
    const void *weight;
    int64_t ld_weight;
    ql_dtype weight_dtype;
    ql_dtype compute_dtype;
    const void *bias;
    ql_dtype bias_dtype;
} ql_linear_desc;

typedef struct ql_linear ql_linear;

ql_status ql_linear_create(ql_context *ctx, const ql_linear_desc *desc, ql_linear **out);
void ql_linear_destroy(ql_linear *lin);
ql_status ql_linear_forward(ql_linear *lin, const void *x, ql_dtype x_dtype, int64_t m, int64_t ldx, void *y,
                            ql_dtype y_dtype, int64_t ldy, const ql_epilogue *epi);
/* Bytes the packed weight occupies (what stays resident). */
size_t ql_linear_weight_bytes(const ql_linear *lin);

/* Exact int8 GEMM through the context's packed kernels (same driver as the
 * W8A8 linear): C[M,N] = A[M,K]·B[N,K]ᵀ. Packs B on every call; for repeated
 * use of one B see ql_linear. */
ql_status ql_gemm_s8s8s32(ql_context *ctx, int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                          const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc);

#ifdef __cplusplus
}
#endif
#endif /* QLINEAR_H */
