/* The CUDA backend as the rest of the library sees it: plain C, no CUDA
 * types. Built from the .cu files beside it when nvcc is found; otherwise
 * cuda_absent.c answers every call with QL_ERR_UNSUPPORTED. */
#ifndef QL_CUDA_BACKEND_H
#define QL_CUDA_BACKEND_H

#include "qlinear.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ql_cuda_linear ql_cuda_linear;

/* QL_OK when device `index` exists and can run the backend (sm_80 or newer). */
ql_status ql_cuda_check_device(const char *fn, int index);

/* Per-context device state: the activation workspace (codes and scales of
 * one call), reused by every layer of the context on its stream. */
typedef struct ql_cuda_workspace ql_cuda_workspace;
void ql_cuda_workspace_free(ql_cuda_workspace *ws);

/* Uploads the int8 weight [n, k] (rows padded to 16 bytes), its scales and
 * the bias once. The caller has validated the weight (ql_check_int8_weight)
 * and converted the bias to fp32 (bias_f32: NULL or n values). */
ql_status ql_cuda_linear_create(int device, const ql_int8_weight *w, const float *bias_f32, ql_cuda_linear **out);
/* A W4A8/W6A8 layer kept packed on the device, in the layout the CUDA
 * decoders read (backend_cuda.c repacks the file's rows into it), all
 * arrays host memory here, uploaded once:
 *   nib [n, ldn]: code j's low 4 bits in byte j/2 (low half for even j): the
 *     file's first k/2 bytes of a row; ldn >= k/2, a multiple of 16;
 *   hi [n, ldh] (6 bits): per 16 codes one little-endian 32-bit word of the
 *     top two bits, code j (0..3) at bits 2j, j + 4 at 16 + 2j, j + 8 at
 *     8 + 2j, j + 12 at 24 + 2j; ldh >= k/4, a multiple of 16;
 *   sb [n, lds]: the e4m3 s_rel byte of codes [u·gs, u·gs + gs) at u, gs =
 *     min(group, 16) (a group longer than 16 repeats its byte); lds >= k/gs,
 *     a multiple of 16; zero padding everywhere;
 *   table: 4 bits: int8 [256][16] = ql_wxa8_grid(value(code), e4m3(byte))
 *     (0 for the NaN bytes); 6 bits: fp16 bits [256] of e4m3(byte).
 * s_channel [n] is the weight scale; k % 16 == 0 (6 bits: % 32). */
typedef struct ql_cuda_packed_desc {
    int bits, gs;
    int64_t n, k, convrot_group;
    const uint8_t *nib, *hi, *sb;
    int64_t ldn, ldh, lds;
    const void *table;
    const float *s_channel;
} ql_cuda_packed_desc;
ql_status ql_cuda_linear_create_packed(int device, const ql_cuda_packed_desc *d, const float *bias_f32,
                                       ql_cuda_linear **out);
/* An asymmetric layer's correction, fp32 [k/group, n], uploaded (either kind
 * of layer): y gets s_x·Σ_g (Σ_{k in g} x_q[k])·corr[g, n] before its first
 * rounding, as the CPU adds it (bit for bit). */
ql_status ql_cuda_linear_set_correction(ql_cuda_linear *l, const float *corr, int64_t group);
/* Unmerged LoRAs: QL_OK where the layer takes them (W8A8 with an int8
 * weight; packed and asymmetric layers: QL_ERR_UNSUPPORTED, named). */
ql_status ql_cuda_linear_lora_ok(const ql_cuda_linear *l);
/* The active LoRAs' codes as cpu/lora.h's ql_lora_set_codes gives them
 * (D [rtot, k] rotated down codes, U [n, rtot], su [n], e2 = 2^E), uploaded
 * (the host arrays may be freed after); rtot 0 removes the term. */
ql_status ql_cuda_linear_set_lora(ql_cuda_linear *l, int64_t rtot, const int8_t *dq, const int8_t *uq, const float *su,
                                  double e2);
/* The layer's N, and the slot where the backend keeps its host-side LoRA
 * set (the backend frees it before the layer). */
int64_t ql_cuda_linear_n(const ql_cuda_linear *l);
void **ql_cuda_linear_lora_slot(ql_cuda_linear *l);
void ql_cuda_linear_destroy(ql_cuda_linear *l);
size_t ql_cuda_linear_weight_bytes(const ql_cuda_linear *l);
/* count layers (sharing K and the rotation group) on one input x: one
 * prologue (with epis[0]'s input activation, which every epis[i] must
 * share), then each layer's GEMM into ys[i] (row stride ldys[i]) with
 * epis[i] (epis or an entry NULL: none). x, the outputs and the epilogue
 * tensors are device pointers on the layers' device; the work is queued on
 * `stream` (cudaStream_t; NULL: the default stream). */
/* token (may be NULL): the prologue cache's handle on the quantized input.
 * In: the token a previous forward returned for this very input (0: none);
 * when the workspace still holds that prologue's codes (no other forward on
 * it since, same stream) the prologue is skipped. Out: the token of the
 * codes the GEMMs read. */
ql_status ql_cuda_linear_forward(ql_cuda_linear *const *ls, int count, ql_cuda_workspace **ws, void *stream, const void *x,
                                 ql_dtype xdt, int64_t m, int64_t ldx, void *const *ys, ql_dtype ydt, const int64_t *ldys,
                                 const ql_epilogue *const *epis, uint64_t *token);
/* K and the rotation group of a layer. */
void ql_cuda_linear_dims(const ql_cuda_linear *l, int64_t *k, int64_t *group);
/* Name of the GEMM kernel the last forward of `l` ran ("sm90 128x256", ...). */
const char *ql_cuda_linear_kernel(const ql_cuda_linear *l);

/* The int8 grid a layer multiplies, copied to host rows out [n, ldo >= k]
 * (test hook): a packed layer's decode kernel output, an int8 layer's
 * resident weight; in the prologue's code order (ql_cuda_codes_permuted). */
ql_status ql_cuda_linear_decoded_weight(const ql_cuda_linear *l, int8_t *out, int64_t ldo);
/* Whether the prologue stores a row of k codes rotated with `group` in its
 * permuted order (value i + 16·t of each group of 256 at 16·i + t). */
int ql_cuda_codes_permuted(int64_t k, int64_t group);
/* ql_cuda_linear_decoded_weight of a ql_linear on a CUDA context. */
ql_status ql_linear_cuda_decoded_weight(const ql_linear *l, int8_t *out, int64_t ldo);

/* The GEMM kernel the last forward of a ql_linear ran on its CUDA device
 * ("" on the CPU; src/linear/linear.c, through the backend interface). */
const char *ql_linear_cuda_kernel(const ql_linear *l);

/* The prologue alone (for the bench and tests): x [m, k] (ldx elements,
 * device) -> codes q [m, ldq] and scales sx [m], rotated with `group`
 * (0: none); where group = 256, k % 256 = 0 and ldq = k the codes of each
 * group are in the layer's permuted order (value i + 16·t at 16·i + t).
 * epi: NULL, or a ql_epilogue whose input activation alone is applied to
 * each row first (x [m, 2k] for swiglu; the rms_norm weight a device
 * pointer). *ws: a workspace (made on first use; ql_cuda_workspace_free)
 * that keeps the launch shape of the last K and rms_norm's row factors. */
ql_status ql_cuda_quantize_rows(ql_cuda_workspace **ws, int device, void *stream, const void *x, ql_dtype xdt,
                                int64_t m, int64_t k, int64_t ldx, int64_t group, int8_t *q, int64_t ldq, float *sx,
                                const ql_epilogue *epi);

/* How many Hopper GEMM tiles QLINEAR_CUDA_TILE can force (0 without CUDA). */
int ql_cuda_sm90_tile_count(void);

/* Exact C[M,N] = A[M,K]·B[N,K]ᵀ with device pointers. */
ql_status ql_cuda_gemm_s8s8s32(int device, void *stream, int64_t m, int64_t n, int64_t k, const int8_t *a,
                               int64_t lda, const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc);

#ifdef __cplusplus
}
#endif

#endif
