/* The CPU backend's narrow interface for the format layer and the tools:
 * operations that are not linears (the kernels stay behind it). */
#ifndef QL_CPU_OPS_H
#define QL_CPU_OPS_H

#include "core/core.h"

/* Weight quantization with exactly the reference's codes and scales
 * (ql_quantize_rowwise for group 0, ql_quantize_convrot_weight otherwise),
 * vectorized where the CPU allows; single-threaded. */
ql_status ql_quantize_weight_rows(ql_dtype dtype, const void *w, int64_t rows, int64_t k, int64_t ldw, int64_t group,
                                  int8_t *q, int64_t ldq, float *scale);

/* Group-wise rotation of fp32 rows (dst rows 64-byte aligned, ldd >= k
 * rounded up to 16): the same operations as ql_fwht_f32. */
void ql_rotate_rows_f32(const float *src, int64_t rows, int64_t k, int64_t lds, int64_t group, float *dst, int64_t ldd);

/* W[rows, k] (row stride ld) += c·(up[rows, R]·down[R, k]) as ql_lowrank_add_fn
 * (cpu/kernels.h) defines it: the same bits on every ISA. */
void ql_lowrank_add(float *w, int64_t rows, int64_t k, int64_t ld, const float *up, int64_t rank, const float *down,
                    float c);

/* The bare int8 GEMM with its operands packed once (for timing the GEMM
 * alone): the kernel and path the context's W8A8 linears take for m rows. */
typedef struct ql_s8_prepared ql_s8_prepared;
ql_status ql_s8_prepare(ql_context *ctx, const int8_t *a, int64_t m, const int8_t *b, int64_t n, int64_t k,
                        ql_s8_prepared **out);
/* C[m, n] (row stride ldc) = A·Bᵀ, exact */
ql_status ql_s8_prepared_run(ql_s8_prepared *p, int32_t *c, int64_t ldc);
const char *ql_s8_prepared_kernel(const ql_s8_prepared *p);
size_t ql_s8_prepared_weight_bytes(const ql_s8_prepared *p); /* the packed weight */
void ql_s8_prepared_free(ql_s8_prepared *p);

#endif
