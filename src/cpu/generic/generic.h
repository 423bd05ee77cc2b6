/* The portable C twins of every kernel-table entry: the generic table's
 * entries, and the reference the other tables are tested against. */
#ifndef QL_CPU_GENERIC_H
#define QL_CPU_GENERIC_H

#include "cpu/kernels.h"

extern const ql_s8_kernel ql_s8_gemm_4x8c4__generic;
extern const ql_f32_kernel ql_f32_gemm_4x16__generic;
/* bf16 operands with BFMMLA's architected arithmetic, in C: the twin of the
 * NEON BF16 kernel (docs/NUMERICS.md, bf16 compute) */
extern const ql_f32_kernel ql_bf16_gemm_8x8c4__generic;
/* VDPBF16PS's arithmetic, in C: the twins of the AVX512_BF16 kernels (dense
 * bf16 pairs; weight-only int8 codes [K][32]) */
extern const ql_f32_kernel ql_bf16_gemm_12x32c2__generic, ql_bf16_gemm_12x32c2i8__generic;
/* TDPBF16PS's arithmetic as Intel's SDM writes it, in C: a model of the AMX-BF16
 * kernels (dense bf16 pairs; weight-only int8 codes [K][32]); not their bits
 * (the hardware's order is not architected): a reference for the bound */
extern const ql_f32_kernel ql_bf16_tdp_32x32c2__generic, ql_bf16_tdp_32x32c2i8__generic;

void ql_prologue_generic(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                         int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
void ql_w8a8_epilogue_generic(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_f32_epilogue_generic(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_rows_to_f32_generic(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k, int64_t group,
                            int round_bf16, float *out, int64_t ldo);
int64_t ql_quantize_rows_generic(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k,
                                 int64_t group, int8_t *q, int64_t ldq, float *scale, float *scratch);
void ql_sr_row_generic(const float *v, int64_t k, float s, int64_t idx0, uint64_t seed, int8_t *q);
void ql_lowrank_add_generic(float *w, int64_t rows, int64_t k, int64_t ld, const float *up, int64_t rank,
                            const float *down, float c);
void ql_wxa8_decode_generic(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst);
int32_t ql_lora_t_row_generic(const int32_t *cb, int mr, int nr, int kb, int aes, const uint8_t *perm, int i, int64_t rt,
                              int64_t rpad, int32_t corr, int8_t *tp, int32_t *scratch, int32_t *sum);

#endif
