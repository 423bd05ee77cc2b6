/* avx512vnni + AVX512_BF16 (Zen 4 and 5, Sapphire Rapids and later; with
 * AVX512_VBMI, which the int8 -> bf16 decode uses: Cooper Lake, which lacks
 * it, stays on avx512vnni): avx512vnni's table (its base: every entry not
 * set here is avx512vnni's, whatever that table holds), but bf16-compute
 * dense layers and weight-only layers with bf16 activations run VDPBF16PS
 * (bf16_avx512bf16.c: exact products, fp32 sums in the instruction's order,
 * docs/NUMERICS.md §4). */
#include "cpu/x86/x86.h"

extern const ql_cpu_kernels ql_cpu_kernels_avx512vnni;

static bool supported(const ql_cpu_features *f)
{
    return ql_cpu_kernels_avx512vnni.supported(f) && ql_x86_bf16_dot(f);
}

const ql_cpu_kernels ql_cpu_kernels_avx512bf16 = {
    .isa = QL_ISA_AVX512BF16,
    .base = &ql_cpu_kernels_avx512vnni,
    .supported = supported,
    .bf16 = &ql_bf16_gemm_12x32c2__avx512bf16,
    .wo_bf16 = &ql_bf16_gemm_12x32c2i8__avx512bf16,
    /* for the VDPBF16PS kernels (their isa's blocking): K slices of 512 keep a
     * 32 KiB B slice in L1; 256 and 1024, MC 192, NC 128 / 512 measured the
     * same within the VM's noise (docs/MEASUREMENTS.md §10) */
    .f32_blocking = {96, 256, 512},
};
