/* The generic table: portable C for every entry, on any CPU. The other
 * tables fall back to these entries where they leave one empty. */
#include "cpu/generic/generic.h"

const ql_cpu_kernels ql_cpu_kernels_generic = {
    .isa = QL_ISA_GENERIC,
    .supported = NULL, /* always */
    .s8 = &ql_s8_gemm_4x8c4__generic,
    .s8_rows_max = 4,
    /* K slices of 2048 beat 512 by 2-5 % on the AVX-512 kernel; MC·NC·4
     * bytes of partial tiles per thread */
    .s8_blocking = {96, 256, 2048},
    .small_m = 16, /* an estimate where nothing was measured */
    .prologue = ql_prologue_generic,
    .w8a8_epilogue = ql_w8a8_epilogue_generic,
    .wxa8_decode = ql_wxa8_decode_generic,
    .lora_t_row = ql_lora_t_row_generic,
    .f32 = &ql_f32_gemm_4x16__generic,
    .bf16 = &ql_f32_gemm_4x16__generic,
    .f32_epilogue = ql_f32_epilogue_generic,
    .f32_blocking = {96, 256, 256},
    .rows_to_f32 = ql_rows_to_f32_generic,
    .quantize_rows = ql_quantize_rows_generic,
    .sr_row = ql_sr_row_generic,
    .lowrank_add = ql_lowrank_add_generic,
    .input_act_row = ql_input_act_row,
};
