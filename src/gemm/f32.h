/* Float GEMM on the tile-driver pattern: C = A·Bᵀ with fp32 arithmetic.
 * A is read in place (fp32 rows, stride lda). B (the weight) is packed in
 * panels of NR columns as [K][NR], stored as fp32, bf16 or int8 codes; bf16
 * and int8 panels are decoded to fp32 one K slice at a time into a per-thread
 * buffer that stays in L1/L2 while the block's rows pass by, so the resident
 * weight keeps its compact size. (On CPUs whose bf16 dot product is slower
 * than fp32 FMA — this one — that is also the fastest bf16 path.) */
#ifndef QL_F32_GEMM_H
#define QL_F32_GEMM_H

#include "../core/core.h"

/* c: tile of mr×nr fp32 (row stride nr); accumulate: add to it. */
typedef void (*ql_f32_tile_fn)(int64_t k, const float *a, int64_t lda, const float *b, float *c, int accumulate);
typedef void (*ql_f32_decode_fn)(ql_dtype dt, const void *src, int64_t n, float *dst);

typedef struct ql_f32_kernel {
    const char *name;
    int mr, nr;
    ql_f32_tile_fn tile;
    ql_f32_decode_fn decode; /* bf16 / int8 -> fp32, n elements */
} ql_f32_kernel;

extern const ql_f32_kernel ql_f32_gemm_4x16__generic;
extern const ql_f32_kernel ql_f32_gemm_6x16__avx2;
extern const ql_f32_kernel ql_f32_gemm_12x32__avx512;
extern const ql_f32_kernel ql_f32_gemm_8x8__neon; /* src/arm */
const ql_f32_kernel *ql_f32_kernel_for(ql_isa isa);

typedef struct ql_packed_f32 {
    int64_t n, k, panels;
    int nr;
    ql_dtype dtype; /* QL_F32, QL_BF16 or QL_I8 */
    void *data;     /* panels · k · nr elements */
} ql_packed_f32;

/* Pack w [n, k] (fp32/bf16/fp16 or int8 codes) as `store` (fp32, bf16 or
 * int8; int8 only from int8). */
ql_status ql_pack_b_float(const ql_f32_kernel *kern, ql_dtype src_dt, const void *w, int64_t n, int64_t k,
                          int64_t ldw, ql_dtype store, int threads, ql_packed_f32 *out);
void ql_packed_f32_free(ql_packed_f32 *b);
size_t ql_packed_f32_bytes(const ql_packed_f32 *b);

typedef void (*ql_f32_epilogue_fn)(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);

ql_status ql_gemm_f32_run(int threads, const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m,
                          const ql_packed_f32 *b, ql_f32_epilogue_fn epi, void *arg);

#endif
