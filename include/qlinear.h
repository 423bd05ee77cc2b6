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

/* Version of the library actually linked ("MAJOR.MINOR.PATCH"), which may
 * differ from the QL_VERSION_* of the header a program was compiled with. */
const char *ql_version(void);

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
    QL_ISA_AVX512VNNI = 4, /* AVX512-VNNI, zmm */
    QL_ISA_NEON = 5,       /* AArch64 Advanced SIMD (SMLAL widening multiply-accumulate) */
    QL_ISA_NEONDOT = 6,    /* + dot product (SDOT, ARMv8.2: Apple M1, Neoverse N1, Cortex-A76) */
    QL_ISA_I8MM = 7,       /* + int8 matrix multiply (SMMLA, ARMv8.6: Apple M2, Neoverse V1/N2) */
    QL_ISA_NEONBF16 = 8,   /* i8mm + BF16 (BFMMLA for bf16-compute dense layers: Apple M2, Neoverse V1/N2) */
    QL_ISA_AMX = 9,        /* AMX-INT8 tiles for the int8 GEMM, AVX-512 elsewhere (Sapphire Rapids and later; Linux) */
    QL_ISA_AVX512BF16 = 10 /* avx512vnni + AVX512_BF16 (and VBMI): VDPBF16PS for bf16-compute dense layers and
                              weight-only layers with bf16 activations (Zen 4/5, Sapphire Rapids without AMX) */
} ql_isa;

const char *ql_isa_name(ql_isa isa);
/* Whether this CPU (and OS) can run the ISA's kernels. */
int ql_isa_supported(ql_isa isa);
/* Why it cannot: a one-line reason, "" when it can (e.g. for amx: no AMX in
 * CPUID, the OS without the tile state, or Linux refusing this process the
 * tile data). */
const char *ql_isa_refusal(ql_isa isa);
/* Best ISA of this CPU. */
ql_isa ql_isa_best(void);
/* The ISAs this CPU runs, best first (QL_ISA_GENERIC last), into out (up
 * to capacity of them; out may be NULL); returns how many there are. */
int ql_isa_list(ql_isa *out, int capacity);

typedef struct ql_context ql_context;

/* A context holds the thread count and the ISA choice. Defaults come from the
 * environment: QLINEAR_THREADS (else the number of online CPUs) and
 * QLINEAR_ISA=generic|avx2|avxvnni|avx512vnni|avx512bf16|amx on x86-64, generic|neon|neondot|i8mm|neonbf16
 * on AArch64 (else the best available; one
 * the CPU lacks is refused with QL_ERR_UNSUPPORTED). */
ql_status ql_context_create(ql_context **out);
void ql_context_destroy(ql_context *ctx);
ql_status ql_context_set_threads(ql_context *ctx, int threads);
int ql_context_threads(const ql_context *ctx);
ql_status ql_context_set_isa(ql_context *ctx, ql_isa isa);
ql_isa ql_context_isa(const ql_context *ctx);

/* Devices. A context runs its linears (and ql_gemm_s8s8s32) on the CPU by
 * default. QL_DEVICE_CUDA (index = CUDA device ordinal) moves them to an
 * NVIDIA GPU, compute capability 8.0 or newer (Hopper gets its own wgmma
 * kernels): linears created afterwards upload their weight once, and
 * ql_linear_forward / ql_gemm_s8s8s32 then take DEVICE pointers for x, y and
 * the epilogue tensors and queue the work on the context's stream without
 * waiting for it. QL_LINEAR_W8A8 runs on the GPU, and W4A8/W6A8 as W8A8 (the
 * grid decoded once at creation) or QL_LINEAR_WXA8_PACKED (the 4/6-bit codes
 * resident with e4m3 scales, decoded on the device every forward: the
 * decoded layer's outputs, bit for bit), asymmetric ones included.
 * QL_ERR_UNSUPPORTED when
 * the library was built without CUDA, no device is present or the GPU is too
 * old. Set the device before creating linears; a linear keeps its device. */
typedef enum ql_device { QL_DEVICE_CPU = 0, QL_DEVICE_CUDA = 1 } ql_device;
ql_status ql_context_set_device(ql_context *ctx, ql_device device, int index);
ql_device ql_context_device(const ql_context *ctx);
/* The cudaStream_t (as void *) forwards are queued on; NULL: the default stream. */
ql_status ql_context_set_cuda_stream(ql_context *ctx, void *stream);
/* Number of CUDA devices (0 without a driver, a device, or CUDA support). */
int ql_cuda_device_count(void);
/* "NVIDIA H200 (sm_90, 132 SMs, 60 MB L2)". */
ql_status ql_cuda_device_name(int index, char *buf, size_t len);

/* ------------------------------------------------- reference numerics
 * These follow comfy-kitchen's eager backend (docs/FORMATS.md §3–§4) and are the
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

/* Stochastic rounding, reproducible bit for bit with comfy-kitchen's CUDA
 * int8 quantizers (docs/FORMATS.md §4.2): element idx (flat index in the tensor)
 * gets noise = (pcg_hash(lo32(idx + seed) ^ hi32(idx + seed)) >> 8)·2^-24 in
 * [0, 1); code = clamp(floor(fp32(v/s) + noise), -128, 127) with the CUDA
 * scale s = max(min(max|row|, FLT_MAX)·fp32(1/127), 1e-30). ComfyUI seeds
 * it with the CRC-32 of the parameter key (ql_crc32_key). */
uint32_t ql_pcg_hash(uint32_t x);
float ql_sr_noise(int64_t idx, uint64_t seed);
/* ComfyUI's string_to_seed: CRC-32 (0xEDB88320, init and final xor
 * 0xFFFFFFFF) of the key's characters (code points of the UTF-8 text). */
uint32_t ql_crc32_key(const char *key);
/* Row-wise int8 of fp32 rows with stochastic rounding; row r's element j has
 * flat index idx0 + r·k + j. seed 0 rounds to nearest (as the CUDA kernel
 * does for seed 0). A non-finite row: codes 0, scale NaN, QL_ERR_NONFINITE. */
ql_status ql_quantize_rowwise_sr(const float *x, int64_t rows, int64_t k, int64_t ldx, int64_t idx0, uint64_t seed,
                                 int8_t *q, int64_t ldq, float *scale);

/* torch's CPU random stream (docs/NUMERICS.md §8.1), measured against
 * torch 2.15: torch.Generator("cpu").manual_seed(seed) is the standard
 * 32-bit MT19937 (std::mt19937) initialized with the low 32 bits of the
 * seed; every draw below is one 32-bit output r, taken in element order
 * (row-major, however large the tensor).
 *   torch.rand fp32: (r & 0xFFFFFF)·2^-24;
 *   torch.rand fp16 / bf16: that fp32 value rounded to the dtype (nearest
 *     even), where a result of 1.0 becomes 0.0;
 *   torch.randint(low, high) (int64): low + r % (high - low) while
 *     high - low < 2^28, else low + ((r1 << 32) | r2) % (high - low) with
 *     two draws per element. */
typedef struct ql_mt19937 {
    uint32_t state[624];
    int32_t index; /* next word of state to return; 624: the block is used up */
} ql_mt19937;
void ql_mt19937_seed(ql_mt19937 *g, uint64_t seed);
uint32_t ql_mt19937_next(ql_mt19937 *g);
/* n draws into out (the same words as n calls of ql_mt19937_next). */
void ql_mt19937_fill(ql_mt19937 *g, uint32_t *out, int64_t n);
/* Discard n draws. */
void ql_mt19937_skip(ql_mt19937 *g, int64_t n);
/* The torch.rand value of one draw r in dtype (fp32, fp16 or bf16), as fp32. */
float ql_torch_rand_value(ql_dtype dtype, uint32_t r);
/* The values of torch.rand(shape, dtype=dtype, generator=g.manual_seed(seed))
 * at flat positions skip .. skip + n - 1, as fp32. */
ql_status ql_torch_rand(uint64_t seed, ql_dtype dtype, int64_t skip, int64_t n, float *out);
/* The values of torch.randint(low, high, shape, generator=g.manual_seed(seed))
 * (int64) at flat positions skip .. skip + n - 1; low < high. */
ql_status ql_torch_randint(uint64_t seed, int64_t low, int64_t high, int64_t skip, int64_t n, int64_t *out);

/* Int8 quantization with every option in one call. Stochastic rounding is on
 * when sr_seed != 0 (comfy-kitchen: stochastic_rounding = seed > 0); the
 * stream picks whose noise and arithmetic are reproduced:
 *   QL_SR_CUDA_PCG: comfy-kitchen's CUDA quantizers (ql_quantize_rowwise_sr:
 *     the pcg noise of flat index sr_idx0 + r·k + j, the CUDA scale, fp32
 *     input only; ConvRot rotates in fp32 first);
 *   QL_SR_TORCH_CPU: comfy-kitchen's eager quantizers on the CPU: the eager
 *     scale (as ql_quantize_rowwise), y = dtype(x / s_T), then
 *     code = clamp(floor(dtype(y + U)), -128, 127) with U = torch.rand in x's
 *     dtype at flat position sr_idx0 + r·k + j of the stream seeded with
 *     sr_seed (sr_idx0: the elements of the tensor before x[0, 0], when x is
 *     a block of rows of it; skipping them costs about 0.25 ns each).
 * sr_seed 0: round to nearest, exactly ql_quantize_rowwise / _tensorwise /
 * ql_quantize_convrot_weight. Non-finite rows and tensors are handled as
 * there (their draws are still consumed). */
typedef enum ql_sr_stream { QL_SR_CUDA_PCG = 0, QL_SR_TORCH_CPU = 1 } ql_sr_stream;
typedef struct ql_int8_qoptions {
    int tensorwise;        /* 1: one scale for x (scale[0]); 0: one per row */
    int64_t convrot_group; /* 0: none; else rotate group-wise in x's dtype first (row-wise only) */
    int sr_stream;         /* ql_sr_stream */
    uint64_t sr_seed;      /* 0: round to nearest */
    int64_t sr_idx0;
} ql_int8_qoptions;
/* o NULL: all zero (row-wise, nearest). */
ql_status ql_quantize_int8(ql_dtype dtype, const void *x, int64_t rows, int64_t k, int64_t ldx,
                           const ql_int8_qoptions *o, int8_t *q, int64_t ldq, float *scale);

/* Exact int8×int8→int32: C[M,N] = A[M,K]·B[N,K]ᵀ, plain loops. */
ql_status ql_gemm_s8s8s32_ref(int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                              const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc);

/* The optional per-call terms of a forward: the input activation applied to
 * x before anything else, a bias override and the epilogue terms.
 * Zero-initialize the struct (every field 0 / NULL = none); unknown codes are
 * refused. New fields are added at the end.
 *
 * Epilogue, all in the output dtype as the reference does:
 * y = cast(acc·(s_x·s_w)) + bias; then the activation, if
 * any: y = cast(act(y)) (PyTorch's fc(x) then act, as in an MLP's
 * fc2(gelu(fc1(x)))); then, if residual is set,
 * y = residual + residual_scale ⊙ y (one rounding, computed in fp32).
 * residual [M, N] (row stride ld_residual) and residual_scale [N] have the
 * output dtype.
 * QL_ACTIVATION_GELU is torch.nn.GELU() (erf form), computed in fp32 within
 * a few ulps of the exact value everywhere (tail and subnormals included;
 * measured bound in docs/NUMERICS.md), -Inf -> NaN like torch. The CUDA backend
 * computes the same function, bit for bit with the CPU (bf16 outputs by a
 * table of its values).
 *
 * bias: NULL, or n fp32 values used instead of the layer's own bias for this
 * call, treated as that bias is: rounded to the output dtype (bias.to(out_dtype)),
 * then y = round(y + bias). Pass bias.to(out_dtype) for eager's numerics
 * (fp16/bf16 values are exact in fp32); fp32 values are rounded here.
 *
 * input_act (comfy-kitchen's int8_linear input_act, its codes): applied to
 * each row of x in x's dtype before the rotation and quantization, as
 * eager's apply_input_act (docs/NUMERICS.md §11):
 *   GELU_TANH  gelu(x, approximate="tanh"), in fp32, rounded once;
 *   SWIGLU     x is [M, 2K] (ldx >= 2K): gate | up halves;
 *              silu(gate) rounded, times up, rounded;
 *   RMS_NORM   torch.nn.functional.rms_norm(x, (K,), weight.to(x.dtype),
 *              eps): input_act_weight [K] in input_act_weight_dtype, eps
 *              finite (0.0 as eager's default: a zero row gives NaN, as in torch).
 * The CUDA backend fuses input_act into its prologue (W8A8 layers; the
 * rms_norm weight a device pointer on the layer's device; the activated
 * values bit-identical to the CPU's, docs/NUMERICS.md §11) and takes a
 * per-call bias as a device pointer on the layer's device. */
typedef enum ql_activation { QL_ACTIVATION_NONE = 0, QL_ACTIVATION_GELU = 1 } ql_activation;
typedef enum ql_input_act {
    QL_INPUT_ACT_NONE = 0,
    QL_INPUT_ACT_GELU_TANH = 1,
    QL_INPUT_ACT_SWIGLU = 2,
    QL_INPUT_ACT_RMS_NORM = 3
} ql_input_act;
typedef struct ql_prologue_cache ql_prologue_cache;

typedef struct ql_epilogue {
    const void *residual;
    int64_t ld_residual;
    const void *residual_scale;
    int activation; /* ql_activation */
    int input_act;  /* ql_input_act */
    const void *input_act_weight; /* RMS_NORM: [K] */
    ql_dtype input_act_weight_dtype;
    float input_act_eps;          /* RMS_NORM */
    const float *bias;            /* NULL: the layer's own bias */
    /* NULL, or the prologue cache this forward reads and fills (below), with
     * the caller's generation of x's contents */
    ql_prologue_cache *prologue_cache;
    uint64_t prologue_generation;
} ql_epilogue;

/* A prologue cache: the quantized activation (input activation, rotation,
 * per-row quantization, packed for the kernel) of the last input a forward
 * read through it, reused by the next forward whose input is the same — the
 * same pointer, dtype, m, ldx, K, rotation group, input activation (kind,
 * weight pointer, eps) and kernel layout, and the same caller-supplied
 * generation — so layers a caller runs one at a time on one input (ComfyUI
 * calls q, k and v separately) quantize it once, with the bits of separate
 * forwards. The caller promises that an unchanged generation means unchanged
 * contents of x and of the input activation's weight (bump it whenever either
 * is written or x's buffer is reused). One caller at a time: a cache is not
 * thread-safe. A forward the cache cannot serve — unmerged LoRAs (their down
 * projection reads the prologue), float kinds, m over one internal chunk —
 * runs as without it and leaves it as it was. On a CUDA context the codes
 * stay in the context's device workspace: a hit also needs that no other
 * forward on the context, and no other stream, came between. */
ql_status ql_prologue_cache_create(ql_prologue_cache **out);
void ql_prologue_cache_destroy(ql_prologue_cache *cache);
/* Forwards served from the cache (hits) and that filled it (misses); NULLs allowed. */
void ql_prologue_cache_stats(const ql_prologue_cache *cache, int64_t *hits, int64_t *misses);
/* Forget the held activation (the next forward through it misses). */
void ql_prologue_cache_clear(ql_prologue_cache *cache);

/* The input activation of epi alone (epi->input_act; NONE copies): rows
 * [rows, k] of activated values (x [rows, 2k] for SWIGLU, row stride ldx) into
 * out (row stride ldo >= k), in dtype: the values a forward with this epi
 * quantizes, bit for bit. */
ql_status ql_input_act_apply(const ql_epilogue *epi, ql_dtype dtype, const void *x, int64_t rows, int64_t k,
                             int64_t ldx, void *out, int64_t ldo);

/* Reference int8_linear (eager numerics, docs/FORMATS.md §4.4):
 * x [m, k] (x_dtype; [m, 2k] with a swiglu input activation), weight int8
 * [n, k], weight_scale (n_scale = 1 or n), optional bias [n] (bias_dtype,
 * cast to y_dtype; epi->bias overrides it), convrot_group 0 = no rotation.
 * A row of x holding NaN/Inf (after the input activation) yields a NaN
 * output row. */
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

/* ------------------------------------------------- W4A8 / W6A8 weights
 * ComfyUI's asym_w4a8_int8 (4-bit codes, codebook or uniform, optionally
 * asymmetric) and w6a8_int8 (6-bit) layers (docs/FORMATS.md §5, §5.6): codes
 * packed per row, a relative scale per group of `group` columns (e4m3 or
 * fp32), one fp32 scale per row. They decode exactly to an int8 grid, so a
 * layer runs as W8A8 ConvRot with s_channel as the per-row weight scale. */

/* float8_e4m3fn (torch) <-> fp32. Decoding is exact (subnormals included;
 * 0x7F and 0xFF are NaN). Encoding rounds to nearest even with subnormals
 * and, like PyTorch, maps NaN and |x| >= 480 to NaN (0x7F | sign). */
float ql_e4m3_to_fp32(uint8_t b);
uint8_t ql_fp32_to_e4m3(float x);

typedef struct ql_wxa8_weight {
    int64_t n, k;
    int bits;                 /* 4 or 6 */
    const uint8_t *q;         /* packed codes, row stride ldq bytes: [n, k/2] or [n, 3k/4] */
    int64_t ldq;
    const void *s_rel;        /* [n, k/group], contiguous; e4m3 bytes or fp32 */
    int s_rel_f32;            /* 0: e4m3, 1: fp32 */
    const float *s_channel;   /* [n] */
    const float *codebook;    /* 4-bit: NULL (uniform: level = code - 8) or [16]; 6-bit: NULL */
    const void *correction;   /* NULL, or [k/group, n] in correction_dtype (asymmetric 4-bit) */
    ql_dtype correction_dtype;
    int64_t group;            /* group_size: 4, 8, 16 or a multiple of 16 (6-bit: a multiple of 16) */
    int64_t convrot_group;    /* ConvRot group of the rotation (the format always rotates) */
    const void *bias;         /* NULL or [n] */
    ql_dtype bias_dtype;
} ql_wxa8_weight;

/* Check a W4A8/W6A8 weight: shapes (K % 16, K % 32 for 6 bits, K % group,
 * K % convrot group, group rule), no codebook/correction on 6 bits, finite
 * scales. The message names the rule broken. */
ql_status ql_wxa8_check(const ql_wxa8_weight *w);

/* Decode to the int8 grid, exactly as the reference (docs/FORMATS.md §5.3):
 * grid = clamp(rne(value(code) · fp32(s_rel)), -127, 127) with value =
 * codebook[code], code - 8 (uniform) or code - 32 (6 bits). */
ql_status ql_wxa8_decode(const ql_wxa8_weight *w, int8_t *grid, int64_t ldg);

/* Dequantize to un-rotated floats (the reference's dequantize_w4a8_int8_weight):
 * w_rot = fp32(grid)·s_channel (+ correction), rounded to out_dtype, then
 * rotated back in out_dtype. */
ql_status ql_wxa8_dequantize(const ql_wxa8_weight *w, ql_dtype out_dtype, void *out, int64_t ldo);

typedef enum ql_wxa8_mode {
    QL_WXA8_CODEBOOK = 0, /* 4 bits, 16-level codebook, 2 ALS passes, grid re-assignment */
    QL_WXA8_UNIFORM = 1,  /* 4 bits, symmetric uniform: level = code - 8 */
    QL_WXA8_ASYM = 2,     /* 4 bits, asymmetric: + correction */
    QL_WXA8_6BIT = 3      /* 6 bits (w6a8_int8) */
} ql_wxa8_mode;

typedef struct ql_wxa8_qparams {
    ql_wxa8_mode mode;
    int64_t group;         /* 0: 16 */
    int64_t convrot_group; /* 0: 256 */
    const float *codebook; /* CODEBOOK: 16 ascending levels (ql_wxa8_fit_codebook, or a stored one) */
    int scale_search;      /* 6BIT: grid-aware s_rel search (the reference's default when quantizing;
                            * off when requantizing) */
} ql_wxa8_qparams;

/* The tensor's codebook (docs/FORMATS.md §5.2 step 1): a row sample, rotated and
 * group-normalized; excess kurtosis <= -0.1 selects the fixed 16-entry LUT
 * (*fitted = 0), else Lloyd-Max (*fitted = 1). Both samples are the
 * reference's (torch.randint from the stream seeded with 0, ql_torch_randint),
 * and the fit follows torch's fp32 arithmetic (quantile, cluster sums in its
 * CPU reduction order with one torch thread): given the same rotated rows it
 * equals eager's fitted codebook, sorted, bit for bit (docs/NUMERICS.md §8.1). */
ql_status ql_wxa8_fit_codebook(ql_dtype dtype, const void *w, int64_t n, int64_t k, int64_t ldw,
                               const ql_wxa8_qparams *p, float codebook[16], int *fitted);

/* Quantize rows [rows, k] of a float weight (rotated here, in its dtype):
 * packed codes q (row stride ldq bytes), s_rel [rows, k/group] as e4m3 bytes
 * (ql_wxa8_quantize_ex: or fp32),
 * s_channel [rows], and for ASYM the correction as fp32 [rows, k/group]
 * (stored transposed, in the weight's dtype, by the caller). Rows are
 * independent (any chunking gives the same bytes; with stochastic rounding,
 * when sr_idx0 counts the elements before the chunk). A row holding (or rotating
 * to) NaN/Inf: QL_ERR_NONFINITE naming it. */
ql_status ql_wxa8_quantize(ql_dtype dtype, const void *w, int64_t rows, int64_t k, int64_t ldw,
                           const ql_wxa8_qparams *p, uint8_t *q, int64_t ldq, uint8_t *s_rel, float *s_channel,
                           float *correction);

/* Options of a requantization (ql_wxa8_quantize_ex; NULL = all zero). */
typedef struct ql_wxa8_qoptions {
    int s_rel_f32;    /* 1: s_rel is fp32 (the reference's scale_dtype=float32; the 6-bit search
                       * then tries s, fp32(0.97)·s, fp32(1.03)·s); 0: e4m3 bytes */
    uint64_t sr_seed; /* 0: round to nearest; else stochastic rounding of the final assignment
                       * (LoRA requantize, docs/FORMATS.md §5.2/§5.6) with noise U in [0, 1) for
                       * each rotated element (row, col), from sr_stream.
                       * Codebook / 6-bit: between the bracketing grid levels lo, lo+1 of
                       * t = w/s_channel (lo = clamp(searchsorted-left(t) - 1, 0, levels - 2)),
                       * hi iff t > fp32(U·width) + level_lo; uniform / asymmetric:
                       * floor(x + U). The scales are those of the nearest mode. */
    int64_t sr_idx0;  /* the elements of the whole weight before row 0 of w */
    int sr_stream;    /* QL_SR_CUDA_PCG (0): U = ql_sr_noise(sr_idx0 + row·k + col, sr_seed);
                       * QL_SR_TORCH_CPU: U = the fp32 torch.rand of comfy-kitchen's eager
                       * quantize_w4a8_int8_weight on the CPU: absolute row R = sr_idx0/k + row
                       * (sr_idx0 a multiple of k) lies in the chunk of B = max(1, 2^22 / k) rows
                       * starting at R0 = R - R % B, whose stream is seeded with sr_seed + R0 and
                       * drawn at (R - R0)·k + col. Bytes equal eager's for the same rotated
                       * weight (docs/NUMERICS.md §8.1). */
} ql_wxa8_qoptions;
ql_status ql_wxa8_quantize_ex(ql_dtype dtype, const void *w, int64_t rows, int64_t k, int64_t ldw,
                              const ql_wxa8_qparams *p, const ql_wxa8_qoptions *o, uint8_t *q, int64_t ldq,
                              void *s_rel, float *s_channel, float *correction);

/* ---------------------------------------------------------- linear layers
 * A ql_linear packs its weight once, when created, for the context's ISA;
 * ql_linear_forward then runs the fused pipeline with the context's threads.
 * The context must outlive the linear. */

typedef enum ql_linear_kind {
    QL_LINEAR_W8A8 = 0,        /* int8 weight, activations quantized per row at run time */
    QL_LINEAR_WEIGHT_ONLY = 1, /* int8 weight decoded to float; activations stay float */
    QL_LINEAR_DENSE = 2,       /* float weight (fp32 or bf16 compute) */
    QL_LINEAR_DEQUANT = 3,     /* baseline: dequantize the whole weight on every call, then dense */
    QL_LINEAR_WXA8_PACKED = 4  /* W4A8/W6A8: 4/6-bit codes resident, decoded to int8 inside the GEMM */
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
    /* W4A8/W6A8 (wxa8.bits != 0; then `int8` is unused): kinds W8A8,
     * WEIGHT_ONLY and DEQUANT decode the grid once at creation (the int8
     * layer with s_channel as its scale); WXA8_PACKED keeps the packed
     * codes and decodes K slices inside the GEMM (W8A8 numerics, bit for
     * bit). A correction (asymmetric) is supported by W8A8 and WXA8_PACKED. */
    ql_wxa8_weight wxa8;
} ql_linear_desc;

typedef struct ql_linear ql_linear;

ql_status ql_linear_create(ql_context *ctx, const ql_linear_desc *desc, ql_linear **out);
void ql_linear_destroy(ql_linear *lin);
/* y [m, n] = x·Wᵀ with the terms of epi (NULL: none); x is [m, k], or
 * [m, 2k] with epi->input_act = QL_INPUT_ACT_SWIGLU. Every kind takes
 * input_act and bias on the CPU. */
ql_status ql_linear_forward(ql_linear *lin, const void *x, ql_dtype x_dtype, int64_t m, int64_t ldx, void *y,
                            ql_dtype y_dtype, int64_t ldy, const ql_epilogue *epi);
/* Layers that read one input — q, k and v of an attention block, the
 * modulation projections of a DiT block: the same results as
 * ql_linear_forward on each in turn, bit for bit, but on a CUDA context the
 * input is rotated and quantized once for all of them (one prologue, then
 * each layer's GEMM). The layers must belong to one context and share the
 * kind, K and the rotation group; ys[i], ldys[i] and epis[i] are layer i's
 * (epis, or an entry of it, NULL: no epilogue); no output may overlap x.
 * At most QL_SHARED_MAX layers. On the CPU the layers run one after
 * another (each layer's prologue is fused into its own packing there). */
#define QL_SHARED_MAX 16
ql_status ql_linear_forward_shared(ql_linear *const *lins, int count, const void *x, ql_dtype x_dtype, int64_t m,
                                   int64_t ldx, void *const *ys, ql_dtype y_dtype, const int64_t *ldys,
                                   const ql_epilogue *const *epis);
/* Bytes the packed weight occupies (what stays resident). */
size_t ql_linear_weight_bytes(const ql_linear *lin);
/* The micro-kernel ql_linear_forward runs for m rows, and whether it takes
 * the small-M path (N split across threads, whole-K tiles), as one line of
 * text, e.g. "s8_gemm_1x32c4__avx512vnni small-M" (at most len bytes). */
void ql_linear_describe(const ql_linear *lin, int64_t m, char *buf, size_t len);

/* --------------------------------------------------- unmerged LoRA
 * A low-rank term added inside the W8A8 pipeline: y = x·Wᵀ + Σ_i
 * scale_i·(x·down_iᵀ)·up_iᵀ, with down_i [R_i, K], up_i [N, R_i] and
 * scale_i = strength·alpha/R (ql_lora_scale). The base weight is never
 * repacked: LoRAs are packed on their own, once when added or removed.
 * How it runs (no extra pass over X or Y): down is rotated once (ConvRot:
 * H is symmetric and an involution, so x·downᵀ = (x·H)·(down·H)ᵀ) and
 * quantized to int8 with power-of-two row scales; each activation panel the
 * prologue has just quantized is multiplied by it while hot (t, exact int32),
 * t is requantized per row to int8, and every output tile adds the int8
 * product t_q·u_qᵀ (up with the down scales and `scale` folded in, int8 per
 * row) to acc·(s_x·s_w) in fp32 before the first rounding. The low-rank term
 * thus sees the same quantized activation as the base (a LoRA that cancels
 * the weight gives exactly 0) and carries three more int8 roundings (down,
 * t, up): its relative error is of the order of the base's own (measured
 * figures in docs/NUMERICS.md). Zero-scale LoRAs are ignored (bit-identical to the
 * base). Only QL_LINEAR_W8A8 linears take LoRAs (QL_ERR_UNSUPPORTED
 * otherwise; on the CPU also WXA8_PACKED ones). On a CUDA context the same
 * codes and operations run on the GPU (t on tensor cores, split over K; the
 * low-rank product and the sum inside the GEMV or the Hopper GEMM's bf16
 * epilogue, else in an epilogue kernel after the base GEMM): outputs
 * bit-identical to the CPU's; W4A8/W6A8 layers (packed or asymmetric) are
 * refused there. Not thread-safe against a concurrent forward of the same linear. */
typedef struct ql_lora_desc {
    int64_t rank;          /* R >= 1 */
    const void *down;      /* [R, K], row stride ld_down */
    ql_dtype down_dtype;   /* fp32, fp16 or bf16 */
    int64_t ld_down;
    const void *up;        /* [N, R], row stride ld_up */
    ql_dtype up_dtype;
    int64_t ld_up;
    double scale;          /* strength·alpha/R */
} ql_lora_desc;

/* strength·alpha/rank, with alpha = rank when has_alpha is 0 (what ComfyUI
 * does when the file stores no alpha). */
double ql_lora_scale(double strength, double alpha, int has_alpha, int64_t rank);

/* Add a LoRA; *id (may be NULL) receives a handle for ql_linear_remove_lora.
 * Values must be finite (QL_ERR_NONFINITE otherwise), shapes must match the
 * layer. */
ql_status ql_linear_add_lora(ql_linear *lin, const ql_lora_desc *lora, int *id);
ql_status ql_linear_remove_lora(ql_linear *lin, int id);
/* LoRAs attached (zero-scale ones included) and their total rank. */
int ql_linear_lora_count(const ql_linear *lin);
int64_t ql_linear_lora_rank(const ql_linear *lin);

/* Exact int8 GEMM through the context's packed kernels (same driver as the
 * W8A8 linear): C[M,N] = A[M,K]·B[N,K]ᵀ. Packs B on every call; for repeated
 * use of one B see ql_linear. */
ql_status ql_gemm_s8s8s32(ql_context *ctx, int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                          const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc);

/* ------------------------------------------------- checkpoints (safetensors) */
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

/* Open and validate a safetensors file: the container (docs/FORMATS.md §1) and
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
    /* asym_w4a8_int8 / w6a8_int8: code bits (4 or 6, implied by the packed
     * row width: K/2 or 3K/4 bytes, K = s_rel columns × group_size), whether
     * a codebook / correction (asymmetric) is present, s_rel's dtype, and
     * the tensor indices of weight_s_rel, weight_s_channel, weight_codebook,
     * weight_correction (-1 when absent). Opening checks every rule of
     * FORMATS.md §5 (shapes, dtypes, group rules, finite scales). */
    int bits;
    int has_codebook, asymmetric;
    ql_st_dtype s_rel_dtype;
    int64_t s_rel, s_channel, codebook, correction;
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
    QL_QUANT_INT8 = 0,          /* int8_tensorwise, per-row scales */
    QL_QUANT_INT8_CONVROT = 1,  /* int8_tensorwise with ConvRot */
    QL_QUANT_W4A8 = 2,          /* asym_w4a8_int8, codebook (the reference's default) */
    QL_QUANT_W4A8_UNIFORM = 3,  /* asym_w4a8_int8, symmetric uniform */
    QL_QUANT_W6A8 = 4           /* w6a8_int8 (grid-aware scale search) */
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
    int64_t group_size;    /* W4A8/W6A8 group (group_size); 0 = 16. `group` is the ConvRot group */
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
/* The same for W4A8/W6A8: {"format": "asym_w4a8_int8", "group_size": 16,
 * "convrot_groupsize": 256} ("w6a8_int8" for QL_QUANT_W6A8). */
size_t ql_comfy_quant_json_wxa8(ql_quant_target target, int64_t group_size, int64_t convrot_group, char *buf,
                                size_t cap);

/* ------------------------------------------------------------ LoRA files
 * Which module of a LoRA file targets which linear layer of a base
 * checkpoint (its int8 layers and its 2-D float `P.weight`s). Names:
 *   kohya / ComfyUI: lora_unet_<path, '.' -> '_'>.lora_down.weight,
 *                    .lora_up.weight, .alpha (a scalar);
 *   PEFT / diffusers: <path>.lora_A.weight (down), .lora_B.weight (up),
 *                    optional <path>.alpha;
 * with or without the prefixes diffusion_model., model.diffusion_model.,
 * transformer., unet. (kohya: the same with '_') on either side. Every
 * matched module is checked (both matrices present, 2-D float, ranks equal,
 * down's K and up's N those of the layer, alpha a finite scalar); a module
 * two layers could answer to, two modules for one layer, or a file that
 * matches nothing is a format error naming the file and tensors. Tensors
 * that match no layer are listed (ql_lora_plan_unmatched). */
typedef struct ql_lora_module {
    const char *layer;  /* the base layer's prefix, as the base names it */
    const char *module; /* the module name in the LoRA file (without suffix) */
    int64_t down, up, alpha; /* tensor indices in the LoRA checkpoint; alpha -1: none */
    int64_t rank, n, k;
    int has_alpha;
    double alpha_value; /* the stored alpha, or the rank */
    int quantized;      /* 1: an int8 layer of the base; 0: a float weight */
} ql_lora_module;

typedef struct ql_lora_plan ql_lora_plan;
ql_status ql_lora_plan_create(const ql_checkpoint *base, const ql_checkpoint *lora, ql_lora_plan **out);
void ql_lora_plan_destroy(ql_lora_plan *plan);
int64_t ql_lora_plan_module_count(const ql_lora_plan *plan);
const ql_lora_module *ql_lora_plan_module(const ql_lora_plan *plan, int64_t index);
int64_t ql_lora_plan_unmatched_count(const ql_lora_plan *plan);
const char *ql_lora_plan_unmatched(const ql_lora_plan *plan, int64_t index);
/* down [rank·k] and up [n·rank] as fp32 (QL_ERR_NONFINITE names a NaN/Inf). */
ql_status ql_lora_module_load(const ql_checkpoint *lora, const ql_lora_module *module, float *down, float *up);

/* ------------------------------------------------------- LoRA merge
 * For every layer a LoRA targets: dequantize (int8: w = q·s, ConvRot
 * un-rotated in fp32; float: as stored), add each LoRA's delta in fp32 as
 * ComfyUI does — W += fp32(strength·alpha/R)·(up·down), up·down summed in
 * fp32 in rank order — and requantize into the same layout (tensor-wise or
 * row-wise scale, ConvRot group): stochastically (ql_quantize_rowwise_sr,
 * the CUDA quantizer's arithmetic, seeded by ql_crc32_key(seed_prefix +
 * <layer path without the base's prefix> + ".weight"), ComfyUI's key) or
 * to nearest (the eager quantizers). W4A8 / W6A8: w_rot = grid·s_channel
 * (+ correction) un-rotated in fp32, then ql_wxa8_quantize_ex with the stored
 * codebook, groups and s_rel dtype, no scale search, sr_seed = that CRC-32
 * (or 0 for nearest). Float weights are rounded to nearest
 * in their dtype. Everything else is copied byte for byte; the output is
 * written atomically and never replaces an input. */
typedef struct ql_lora_input {
    const char *path;
    double strength;
} ql_lora_input;

typedef struct ql_merge_options {
    int stochastic;          /* 1: stochastic rounding (ComfyUI's default); 0: nearest */
    const char *seed_prefix; /* NULL: "diffusion_model." */
    int threads;             /* 0 = OpenMP's default */
    int (*progress)(void *user, const ql_quantize_progress *p); /* as for ql_checkpoint_quantize */
    void *user;
} ql_merge_options;

typedef struct ql_merge_result {
    int64_t layers_merged, tensors_copied;
    uint64_t bytes_in, bytes_out;
    double seconds;
} ql_merge_result;

ql_status ql_checkpoint_merge_lora(const char *base_path, const ql_lora_input *loras, int64_t n_loras,
                                   const char *out_path, const ql_merge_options *opt, ql_merge_result *result);

#ifdef __cplusplus
}
#endif
#endif /* QLINEAR_H */
