/* AMX-INT8 (Sapphire Rapids and later, on Linux with the tile permission):
 * the int8 GEMM on tiles of 32×32 (ukernel_amx.c: 1024 int8 MAC/cycle/core
 * at peak), exact-height variants of 1..31 rows for small M; bf16-compute
 * dense layers and weight-only layers with bf16 activations on AMX-BF16
 * tiles (bf16_amx.c: TDPBF16PS, 32×32, 512 bf16 MAC/cycle/core at peak);
 * every other entry is avx512vnni's (the prologue, decoder and LoRA helper
 * already write the 64-block layouts the tiles load; the epilogues take any
 * tile height). Weights are stored signed (b_offset128 false): no 128·Σq
 * correction. */
#include "cpu/x86/x86.h"

static const char *refusal(const ql_cpu_features *f) { return ql_amx_refusal(f); }
static bool supported(const ql_cpu_features *f) { return !*ql_amx_refusal(f); }

/* Without AMX-BF16 (a CPU or VM that reports AMX-INT8 alone, or
 * QLINEAR_DISABLE=amx_bf16), or with the VDPBF16PS kernels' features hidden:
 * avx512bf16's kernels, which the registry replaces by the fp32 kernel where
 * those are hidden too (QLINEAR_DISABLE=avx512bf16); the fp32 kernel too
 * where VDPBF16PS is the slower instruction (ql_x86_bf16_dot_slow: every
 * AMX CPU measured so far). */
static void tune(ql_cpu_kernels *kt, const ql_cpu_features *f)
{
    if (ql_x86_amx_bf16(f)) return;
    if (ql_x86_bf16_dot_slow(f)) {
        kt->bf16 = &ql_f32_gemm_12x32__avx512;
        kt->wo_bf16 = NULL;
        return;
    }
    kt->bf16 = &ql_bf16_gemm_12x32c2__avx512bf16;
    kt->wo_bf16 = &ql_bf16_gemm_12x32c2i8__avx512bf16;
}

static const ql_s8_kernel *const rows[32] = {
    &ql_s8_amx[0],  &ql_s8_amx[1],  &ql_s8_amx[2],  &ql_s8_amx[3],  &ql_s8_amx[4],  &ql_s8_amx[5],  &ql_s8_amx[6],
    &ql_s8_amx[7],  &ql_s8_amx[8],  &ql_s8_amx[9],  &ql_s8_amx[10], &ql_s8_amx[11], &ql_s8_amx[12], &ql_s8_amx[13],
    &ql_s8_amx[14], &ql_s8_amx[15], &ql_s8_amx[16], &ql_s8_amx[17], &ql_s8_amx[18], &ql_s8_amx[19], &ql_s8_amx[20],
    &ql_s8_amx[21], &ql_s8_amx[22], &ql_s8_amx[23], &ql_s8_amx[24], &ql_s8_amx[25], &ql_s8_amx[26], &ql_s8_amx[27],
    &ql_s8_amx[28], &ql_s8_amx[29], &ql_s8_amx[30], &ql_s8_amx[31]};

const ql_cpu_kernels ql_cpu_kernels_amx = {
    .isa = QL_ISA_AMX,
    .supported = supported,
    .refusal = refusal,
    .s8 = &ql_s8_amx[31],
    .s8_rows = rows,
    .s8_rows_max = 32,
    /* K slices of 2048: each 32×32 tile call runs 32 64-k blocks before its
     * C tiles drain to memory (the stores wait for the last TDPBSSD), the
     * block's weight slices (NC × KC = 1 MiB) in the 2 MiB L2; no widening
     * for short K (6144×256 at M = 1024: 1.73 ms against 2.56 widened).
     * Measured on a 2-core Sapphire Rapids VM (anima M = 1024, w8a8,
     * interleaved rounds): 1.28-1.32 s against 1.36-1.46 s for
     * {128, 512, 1024} widened, the previous entry. */
    .s8_blocking = {128, 512, 2048},
    .s8_short_k_widen = 1,
    .small_m = 64, /* an estimate: two 32-row panels against each streamed weight panel */
    /* W4A8/W6A8 packed up to 64 rows: each panel's K slice decoded once, then
     * the fitted-height tile (blocked, M = 1 multiplied 31 padding rows and
     * decoded every block's slice again: 1.53x the W8A8 time on the Xeon) */
    .decoded_small_m = 64,
    .prologue = ql_prologue_avx512,
    .w8a8_epilogue = ql_w8a8_epilogue_avx512,
    .wxa8_decode = ql_wxa8_decode_avx512,
    /* a few rows of a packed layer decoded in registers (AVX-512), the
     * signed weights against activations + 128: on the Xeon W4A8 packed at
     * M = 1 read at 28-37 % of the bandwidth through the decoded small-M
     * tile, which decodes each slice to memory first; rows max as
     * avx512vnni's (not measured on AMX) */
    .wxa8_rows = ql_wxa8_rows_avx512,
    .wxa8_rows_ok = ql_wxa8_rows_ok_avx512,
    .wxa8_rows_max = 4,
    .lora_t_row = ql_lora_t_row_s8_64__avx512,
    .tune = tune,
    .f32 = &ql_f32_gemm_12x32__avx512,
    /* TDPBF16PS: exact products, fp32 sums in the instruction's order
     * (docs/NUMERICS.md §4.2); tune falls back to avx512bf16's VDPBF16PS */
    .bf16 = &ql_bf16_gemm_32x32c2__amx,
    .wo_bf16 = &ql_bf16_gemm_32x32c2i8__amx,
    /* for the AMX-BF16 kernels (their isa's blocking), an estimate not yet
     * measured: K slices of 512 keep a panel's B slice (32 KiB of bf16
     * pairs, decoded once per slice for weight-only) in L1 while the block's
     * 8 row panels (MC 256) pass; the block's weight slices (NC × KC bf16 =
     * 512 KiB) in the 2 MiB L2 */
    .f32_blocking = {256, 512, 512},
    .f32_epilogue = ql_f32_epilogue_avx512,
    .rows_to_f32 = ql_rows_to_f32_avx512,
    .quantize_rows = ql_quantize_rows_avx512,
    .sr_row = ql_sr_row_avx512,
    .lowrank_add = ql_lowrank_add_avx512,
    .input_act_row = ql_input_act_row_avx512,
};
