/* AVX2 without VNNI (Haswell to Comet Lake, Zen 1-3): int16 tiles of 6×16
 * (vpmaddwd: exact, no int16 saturation). */
#include "cpu/generic/generic.h"
#include "cpu/x86/x86.h"

static bool supported(const ql_cpu_features *f) { return f->avx2 && f->fma && f->f16c; }

static const ql_s8_kernel *const rows[6] = {&ql_s8_small_avx2[0], &ql_s8_small_avx2[1], &ql_s8_small_avx2[2],
                                            &ql_s8_small_avx2[3], &ql_s8_small_avx2[4], &ql_s8_small_avx2[5]};

const ql_cpu_kernels ql_cpu_kernels_avx2 = {
    .isa = QL_ISA_AVX2,
    .supported = supported,
    .s8 = &ql_s8_small_avx2[5],
    .s8_rows = rows,
    .s8_rows_max = 6,
    /* K slices of 512: the widened weight slice (16 KiB) and a 6-row
     * activation slice (6 KiB) stay in a 32 KiB L1 */
    .s8_blocking = {96, 256, 512},
    .small_m = 24, /* an estimate */
    .decoded_small_m = 24,
    /* W4A8/W6A8 packed: decoded into this kernel's own B layout (k in
     * pairs); the asymmetric correction reads int8 A back, which this
     * kernel widens to int16: the generic kernel */
    .s8_decoded = &ql_s8_small_avx2[5],
    .wxa8_decode = ql_wxa8_decode_avx2,
    .wxa8_rows = ql_wxa8_rows_avx2, /* one row: the decode in registers (M = 1) */
    .wxa8_rows_ok = ql_wxa8_rows_ok_avx2,
    .wxa8_rows_max = 1,
    .s8_int8_a = &ql_s8_gemm_4x8c4__generic,
    .prologue = ql_prologue_avx2,
    .w8a8_epilogue = ql_w8a8_epilogue_avx2,
    .f32 = &ql_f32_gemm_6x16__avx2,
    .bf16 = &ql_f32_gemm_6x16__avx2,
    .f32_epilogue = ql_f32_epilogue_avx2,
    .lowrank_add = ql_lowrank_add_avx2,
    .input_act_row = ql_input_act_row_avx2,
};
