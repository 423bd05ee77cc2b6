/* AVX512-VNNI (Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4): zmm int8
 * tiles of 12×32 with vpdpbusd (u8·s8: weights stored + 128). */
#include "cpu/x86/x86.h"

static bool supported(const ql_cpu_features *f)
{
    return f->avx512vnni && f->avx512bw && f->avx512vl && f->avx512dq && f->fma && f->f16c;
}

/* AMD Zen 4 and 5: embedded broadcasts up to 8 rows; from 9 rows each of the tile's two
 * columns of vectors re-loads the broadcast (22 loads per 22 vpdpbusd at 11
 * rows), so a register broadcast per row is faster there (M = 77: 1.17x
 * oneDNN int8's time against 1.27x; M = 16, 8-row tiles: eb 1.31x against 1.41x) */
static const ql_s8_kernel *const rows_eb8[12] = {
    &ql_s8_small_eb_avx512vnni[0], &ql_s8_small_eb_avx512vnni[1], &ql_s8_small_eb_avx512vnni[2], &ql_s8_small_eb_avx512vnni[3],
    &ql_s8_small_eb_avx512vnni[4], &ql_s8_small_eb_avx512vnni[5], &ql_s8_small_eb_avx512vnni[6], &ql_s8_small_eb_avx512vnni[7],
    &ql_s8_small_avx512vnni[8], &ql_s8_small_avx512vnni[9], &ql_s8_small_avx512vnni[10], &ql_s8_gemm_12x32c4__avx512vnni};

static const ql_s8_kernel *const rows[12] = {
    &ql_s8_small_avx512vnni[0], &ql_s8_small_avx512vnni[1], &ql_s8_small_avx512vnni[2], &ql_s8_small_avx512vnni[3],
    &ql_s8_small_avx512vnni[4], &ql_s8_small_avx512vnni[5], &ql_s8_small_avx512vnni[6], &ql_s8_small_avx512vnni[7],
    &ql_s8_small_avx512vnni[8], &ql_s8_small_avx512vnni[9], &ql_s8_small_avx512vnni[10], &ql_s8_gemm_12x32c4__avx512vnni};

/* Per-CPU tuning, keyed by CPUID vendor and family (model from model_min
 * up): what differs from the table below, which is Intel's (and every CPU
 * not listed). Measured with `qlinear bench --profile qwen3-te --weights
 * dram` (docs/MEASUREMENTS.md, 2026-12-02). */
typedef struct tuning {
    int vendor, family, model_min;
    int64_t small_m, decoded_small_m;
    const ql_s8_kernel *const *rows;
} tuning;
static const tuning tunings[] = {
    /* Zen 5: the embedded-broadcast tiles up to 8 rows, M = 16 1.14-1.19x oneDNN int8's time
     * against 1.29-1.37x (the bare int8 GEMM, two paired runs); 9-11 rows: rows_eb8's register broadcasts */
    {QL_VENDOR_AMD, 0x1A, 0x00, 96, 96, rows_eb8},
    /* Zen 4 (family 0x19 from model 0x10; below it Zen 3, no AVX-512): as Zen 5, the
     * embedded-broadcast tiles up to 8 rows (qwen3-te M = 16: 0.97-1.00x oneDNN int8's
     * time against 1.11x with the Intel tiles, docs/MEASUREMENTS.md §14) */
    {QL_VENDOR_AMD, 0x19, 0x10, 96, 96, rows_eb8},
};

static void tune(ql_cpu_kernels *kt, const ql_cpu_features *f)
{
    for (size_t i = 0; i < sizeof tunings / sizeof tunings[0]; i++) {
        const tuning *t = &tunings[i];
        if (f->vendor != t->vendor || f->family != t->family || f->model < t->model_min) continue;
        kt->small_m = t->small_m;
        kt->decoded_small_m = t->decoded_small_m;
        kt->s8_rows = t->rows;
        return;
    }
}

const ql_cpu_kernels ql_cpu_kernels_avx512vnni = {
    .isa = QL_ISA_AVX512VNNI,
    .supported = supported,
    .s8 = &ql_s8_gemm_12x32c4__avx512vnni,
    .s8_rows = rows,
    .s8_rows_max = 12,
    /* measured over `qlinear bench --profile qwen3-te` with QLINEAR_SMALL_M:
     * small-M faster at 8-48, 77 and 96 rows, blocked 3-4 % faster at 64 */
    .small_m = 96,
    .decoded_small_m = 0, /* W4A8/W6A8 packed: blocked (Intel as measured before; AMD: tunings) */
    .tune = tune,
    .prologue = ql_prologue_avx512,
    .w8a8_epilogue = ql_w8a8_epilogue_avx512,
    .wxa8_decode = ql_wxa8_decode_avx512,
    .wxa8_rows = ql_wxa8_rows_avx512,
    .wxa8_rows_ok = ql_wxa8_rows_ok_avx512,
    .wxa8_rows_max = 4, /* Zen 5: 2 rows 1.6x, 4 rows 1.09x the buffered decode; 8 rows 0.8x (docs/MEASUREMENTS.md §12) */
    .lora_t_row = ql_lora_t_row_s8_64__avx512,
    .f32 = &ql_f32_gemm_12x32__avx512,
    .bf16 = &ql_f32_gemm_12x32__avx512, /* bf16 operands widened to fp32 FMAs */
    .f32_epilogue = ql_f32_epilogue_avx512,
    .rows_to_f32 = ql_rows_to_f32_avx512,
    .quantize_rows = ql_quantize_rows_avx512,
    .sr_row = ql_sr_row_avx512,
    .lowrank_add = ql_lowrank_add_avx512,
    .input_act_row = ql_input_act_row_avx512,
};
