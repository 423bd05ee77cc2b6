/* AVX-VNNI (Alder Lake and later without AVX-512): ymm int8 tiles of 6×16
 * with vpdpbusd; the AVX2 prologue, epilogues and float kernel. */
#include "cpu/x86/x86.h"

static bool supported(const ql_cpu_features *f) { return f->avxvnni && f->fma && f->f16c; }

static const ql_s8_kernel *const rows[6] = {&ql_s8_small_avxvnni[0], &ql_s8_small_avxvnni[1], &ql_s8_small_avxvnni[2],
                                            &ql_s8_small_avxvnni[3], &ql_s8_small_avxvnni[4], &ql_s8_gemm_6x16c4__avxvnni};

const ql_cpu_kernels ql_cpu_kernels_avxvnni = {
    .isa = QL_ISA_AVXVNNI,
    .supported = supported,
    .s8 = &ql_s8_gemm_6x16c4__avxvnni,
    .s8_rows = rows,
    .s8_rows_max = 6,
    .small_m = 24, /* an estimate */
    .wxa8_decode = ql_wxa8_decode_avx2, /* its 16-column, 32-block layout with k in quads, weights + 128 */
    .prologue = ql_prologue_avx2,
    .w8a8_epilogue = ql_w8a8_epilogue_avx2,
    .f32 = &ql_f32_gemm_6x16__avx2,
    .bf16 = &ql_f32_gemm_6x16__avx2,
    .f32_epilogue = ql_f32_epilogue_avx2,
    .lowrank_add = ql_lowrank_add_avx2,
    .input_act_row = ql_input_act_row_avx2,
};
