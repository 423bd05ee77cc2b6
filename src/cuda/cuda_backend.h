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
