/* AVX512-VNNI (Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4): zmm int8
 * tiles of 12×32 with vpdpbusd (u8·s8: weights stored + 128). */
#include "cpu/x86/x86.h"

static bool supported(const ql_cpu_features *f)
{
    return f->avx512vnni && f->avx512bw && f->avx512vl && f->avx512dq && f->fma && f->f16c;
}

static const ql_s8_kernel *const rows[12] = {
    &ql_s8_small_avx512vnni[0], &ql_s8_small_avx512vnni[1], &ql_s8_small_avx512vnni[2], &ql_s8_small_avx512vnni[3],
    &ql_s8_small_avx512vnni[4], &ql_s8_small_avx512vnni[5], &ql_s8_small_avx512vnni[6], &ql_s8_small_avx512vnni[7],
    &ql_s8_small_avx512vnni[8], &ql_s8_small_avx512vnni[9], &ql_s8_small_avx512vnni[10], &ql_s8_gemm_12x32c4__avx512vnni};

const ql_cpu_kernels ql_cpu_kernels_avx512vnni = {
    .isa = QL_ISA_AVX512VNNI,
    .supported = supported,
    .s8 = &ql_s8_gemm_12x32c4__avx512vnni,
    .s8_rows = rows,
    .s8_rows_max = 12,
    /* measured over `qlinear bench --profile qwen3-te` with QLINEAR_SMALL_M:
     * small-M faster at 8-48, 77 and 96 rows, blocked 3-4 % faster at 64 */
    .small_m = 96,
    .prologue = ql_prologue_avx512,
    .w8a8_epilogue = ql_w8a8_epilogue_avx512,
    .wxa8_decode = ql_wxa8_decode_avx512,
    .lora_t_row = ql_lora_t_row_s8_64__avx512,
    .f32 = &ql_f32_gemm_12x32__avx512,
    .bf16 = &ql_f32_gemm_12x32__avx512, /* bf16 operands widened to fp32 FMAs */
    .f32_epilogue = ql_f32_epilogue_avx512,
    .rows_to_f32 = ql_rows_to_f32_avx512,
    .quantize_rows = ql_quantize_rows_avx512,
    .sr_row = ql_sr_row_avx512,
    .lowrank_add = ql_lowrank_add_avx512,
};
