/* avx512vnni + AVX512_BF16 (Zen 4 and 5, Sapphire Rapids and later; with
 * AVX512_VBMI, which the int8 -> bf16 decode uses: Cooper Lake, which lacks
 * it, stays on avx512vnni): every entry avx512vnni's, but bf16-compute dense
 * layers and weight-only layers with bf16 activations run VDPBF16PS
 * (bf16_avx512bf16.c: exact products, fp32 sums in the instruction's order,
 * docs/NUMERICS.md §4). */
#include "cpu/x86/x86.h"

extern const ql_cpu_kernels ql_cpu_kernels_avx512vnni;

static bool supported(const ql_cpu_features *f)
{
    return ql_cpu_kernels_avx512vnni.supported(f) && ql_x86_bf16_dot(f);
}

static const ql_s8_kernel *const rows[12] = {
    &ql_s8_small_avx512vnni[0], &ql_s8_small_avx512vnni[1], &ql_s8_small_avx512vnni[2], &ql_s8_small_avx512vnni[3],
    &ql_s8_small_avx512vnni[4], &ql_s8_small_avx512vnni[5], &ql_s8_small_avx512vnni[6], &ql_s8_small_avx512vnni[7],
    &ql_s8_small_avx512vnni[8], &ql_s8_small_avx512vnni[9], &ql_s8_small_avx512vnni[10], &ql_s8_gemm_12x32c4__avx512vnni};

const ql_cpu_kernels ql_cpu_kernels_avx512bf16 = {
    .isa = QL_ISA_AVX512BF16,
    .supported = supported,
    .s8 = &ql_s8_gemm_12x32c4__avx512vnni,
    .s8_rows = rows,
    .s8_rows_max = 12,
    .small_m = 96, /* as avx512vnni (the same int8 kernels) */
    .prologue = ql_prologue_avx512,
    .w8a8_epilogue = ql_w8a8_epilogue_avx512,
    .wxa8_decode = ql_wxa8_decode_avx512,
    .lora_t_row = ql_lora_t_row_s8_64__avx512,
    .f32 = &ql_f32_gemm_12x32__avx512,
    .bf16 = &ql_bf16_gemm_12x32c2__avx512bf16,
    .wo_bf16 = &ql_bf16_gemm_12x32c2i8__avx512bf16,
    .f32_epilogue = ql_f32_epilogue_avx512,
    .f32_blocking = {96, 256, 512},
    .rows_to_f32 = ql_rows_to_f32_avx512,
    .quantize_rows = ql_quantize_rows_avx512,
    .sr_row = ql_sr_row_avx512,
    .lowrank_add = ql_lowrank_add_avx512,
};
