/* i8mm + BF16: the int8 pipeline of i8mm, and BFMMLA for bf16-compute dense
 * layers (Apple M2, Neoverse V1/N2). */
#include "cpu/arm/arm.h"

static bool supported(const ql_cpu_features *f) { return f->neon && f->dotprod && f->i8mm && f->bf16; }

const ql_cpu_kernels ql_cpu_kernels_neonbf16 = {
    .isa = QL_ISA_NEONBF16,
    .supported = supported,
    .s8 = &ql_s8_gemm_8x12c8__i8mm,
    .s8_rows_max = 8,
    .s8_decoded = &ql_s8_gemm_4x8c4__neon,
    .prologue = ql_prologue_neon_k8,
    .input_act_row = ql_input_act_row_neon,
    .w8a8_epilogue = ql_w8a8_epilogue_neon,
    .f32 = &ql_f32_gemm_8x8__neon,
    .bf16 = &ql_bf16_gemm_8x8c4__neonbf16,
    .f32_epilogue = ql_f32_epilogue_neon,
};
