/* ARMv8.0 Advanced SIMD (every AArch64 CPU): SMLAL widening int8 tiles of 4×8. */
#include "cpu/arm/arm.h"

static bool supported(const ql_cpu_features *f) { return f->neon; }

const ql_cpu_kernels ql_cpu_kernels_neon = {
    .isa = QL_ISA_NEON,
    .supported = supported,
    .s8 = &ql_s8_gemm_4x8c4__neon,
    .s8_rows_max = 4, /* no fewer-row variants: every height runs the 4-row tile */
    .prologue = ql_prologue_neon,
    .input_act_row = ql_input_act_row_neon,
    .w8a8_epilogue = ql_w8a8_epilogue_neon,
    .f32 = &ql_f32_gemm_8x8__neon,
    .bf16 = &ql_f32_gemm_8x8__neon,
    .f32_epilogue = ql_f32_epilogue_neon,
};
