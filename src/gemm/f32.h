/* Dense fp32 GEMM on the same tile-driver pattern: B (weights) packed in
 * panels of NR columns as [K][NR] fp32; A read in place (row stride lda);
 * a tile epilogue consumes each finished MR×NR fp32 tile. */
#ifndef QL_F32_GEMM_H
#define QL_F32_GEMM_H

#include "../core/core.h"

typedef void (*ql_f32_tile_fn)(int64_t k, const float *a, int64_t lda, const float *b, float *c);

typedef struct ql_f32_kernel {
    const char *name;
    int mr, nr;
    ql_f32_tile_fn tile;
} ql_f32_kernel;

extern const ql_f32_kernel ql_f32_gemm_4x16__generic;
extern const ql_f32_kernel ql_f32_gemm_12x32__avx512;
const ql_f32_kernel *ql_f32_kernel_for(ql_isa isa);

typedef struct ql_packed_f32 {
    int64_t n, k, panels;
    int nr;
    float *data;
} ql_packed_f32;

/* Pack w [n, k] (any float dtype) into panels; scale (NULL, or n_scale = 1 or
 * n values) multiplies each row as it is packed (dequantization). */
ql_status ql_pack_b_f32(const ql_f32_kernel *kern, ql_dtype dt, const void *w, int64_t n, int64_t k, int64_t ldw,
                        ql_packed_f32 *out);
void ql_packed_f32_free(ql_packed_f32 *b);

typedef void (*ql_f32_epilogue_fn)(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);

/* C = A·Bᵀ; returns QL_ERR_OUT_OF_MEMORY if per-thread scratch cannot be had. */
ql_status ql_gemm_f32_run(int threads, const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m,
                          const ql_packed_f32 *b, ql_f32_epilogue_fn epi, void *arg);

#endif
