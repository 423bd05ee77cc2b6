/* + int8 matrix multiply (SMMLA, ARMv8.6: Apple M2, Neoverse V1/N2): 8×12
 * tiles over 8-k blocks. */
#include "cpu/arm/arm.h"

static bool supported(const ql_cpu_features *f) { return f->neon && f->dotprod && f->i8mm; }

const ql_cpu_kernels ql_cpu_kernels_i8mm = {
    .isa = QL_ISA_I8MM,
    .supported = supported,
    .s8 = &ql_s8_gemm_8x12c8__i8mm,
    .s8_rows_max = 8, /* no fewer-row variants */
    /* the W4A8/W6A8 decoders write 8-column c4 panels: the NEON kernel's */
    .s8_decoded = &ql_s8_gemm_4x8c4__neon,
    .prologue = ql_prologue_neon_k8,
    .input_act_row = ql_input_act_row_neon,
    .w8a8_epilogue = ql_w8a8_epilogue_neon,
    .f32 = &ql_f32_gemm_8x8__neon,
    .bf16 = &ql_f32_gemm_8x8__neon,
    .f32_epilogue = ql_f32_epilogue_neon,
};
