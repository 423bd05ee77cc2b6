/* avx512vnni + AVX512_BF16 (Zen 4 and 5, Sapphire Rapids and later; with
 * AVX512_VBMI, which the int8 -> bf16 decode uses: Cooper Lake, which lacks
 * it, stays on avx512vnni): avx512vnni's table (its base: every entry not
 * set here is avx512vnni's, whatever that table holds), but bf16-compute
 * dense layers and weight-only layers with bf16 activations run VDPBF16PS
 * (bf16_avx512bf16.c: exact products, fp32 sums in the instruction's order,
 * docs/NUMERICS.md §4) where it is the faster instruction (tune). */
#include "cpu/x86/x86.h"

#include <stdlib.h>
#include <string.h>

extern const ql_cpu_kernels ql_cpu_kernels_avx512vnni;

static bool supported(const ql_cpu_features *f)
{
    return ql_cpu_kernels_avx512vnni.supported(f) && ql_x86_bf16_dot(f);
}

/* Per-CPU tuning: the cores whose VDPBF16PS does fewer multiply-adds a cycle
 * than their FMAs. There bf16 layers run avx512vnni's fp32 kernel, their
 * operands widened to fp32 (bf16·bf16 and int8·bf16 products are exact in
 * fp32 either way; only the order of the fp32 sums differs, NUMERICS.md §4). */
static const struct {
    int vendor, family, model;
} slow_dot[] = {
    /* Emerald Rapids: one zmm VDPBF16PS every 2 cycles (1.35 G/s, 43 G bf16
     * MAC/s a core) against two zmm FMAs a cycle (5.4 G/s, 87 G MAC/s); anima
     * M = 1024, 2 threads: dense bf16 0.62x and weight-only 0.60x oneDNN bf16's
     * time, against 1.03x and 1.05x with VDPBF16PS (docs/MEASUREMENTS.md §25) */
    {QL_VENDOR_INTEL, 6, 0xCF},
    /* Sapphire Rapids: the same core generation and execution ports */
    {QL_VENDOR_INTEL, 6, 0x8F},
};

bool ql_x86_bf16_dot_slow(const ql_cpu_features *f)
{
    const char *force = getenv("QLINEAR_BF16_DOT");
    if (force && !strcmp(force, "vdpbf16ps")) return false;
    if (force && !strcmp(force, "fma")) return true;
    for (size_t i = 0; i < sizeof slow_dot / sizeof slow_dot[0]; i++)
        if (f->vendor == slow_dot[i].vendor && f->family == slow_dot[i].family && f->model == slow_dot[i].model)
            return true;
    return false;
}

static void tune(ql_cpu_kernels *kt, const ql_cpu_features *f)
{
    ql_cpu_kernels_avx512vnni.tune(kt, f); /* the base's per-CPU entries (int8 small-M tiles) */
    if (!ql_x86_bf16_dot_slow(f)) return;
    kt->bf16 = &ql_f32_gemm_12x32__avx512;
    kt->wo_bf16 = NULL; /* weight-only layers take the fp32 kernel whatever their activations */
}

const ql_cpu_kernels ql_cpu_kernels_avx512bf16 = {
    .isa = QL_ISA_AVX512BF16,
    .base = &ql_cpu_kernels_avx512vnni,
    .supported = supported,
    .bf16 = &ql_bf16_gemm_12x32c2__avx512bf16,
    .wo_bf16 = &ql_bf16_gemm_12x32c2i8__avx512bf16,
    .tune = tune,
    /* for the VDPBF16PS kernels (their isa's blocking): K slices of 512 keep a
     * 32 KiB B slice in L1; 256 and 1024, MC 192, NC 128 / 512 measured the
     * same within the VM's noise (docs/MEASUREMENTS.md §10) */
    .f32_blocking = {96, 256, 512},
};
