/* The AArch64 kernels the ARM tables (table_*.c) point at; each ISA level's
 * file is compiled with its own -march (sources.cmake). */
#ifndef QL_CPU_ARM_H
#define QL_CPU_ARM_H

#include "cpu/kernels.h"

extern const ql_s8_kernel ql_s8_gemm_4x8c4__neon, ql_s8_gemm_8x12c4__neondot, ql_s8_gemm_8x12c8__i8mm;
extern const ql_f32_kernel ql_f32_gemm_8x8__neon;
/* bf16 operands, fp32 sums with BFMMLA's own rounding (docs/NUMERICS.md) */
extern const ql_f32_kernel ql_bf16_gemm_8x8c4__neonbf16;

/* c4 panels (kb = 4) and the SMMLA kernel's 8-k blocks (kb = 8) */
/* the input activations (quant/input_act.c's twin, bit for bit) */
void ql_input_act_row_neon(const ql_input_act_plan *p, const void *src, int64_t k, void *dst);
void ql_prologue_neon(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                      int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
void ql_prologue_neon_k8(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                         int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
void ql_w8a8_epilogue_neon(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_f32_epilogue_neon(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);

#endif
