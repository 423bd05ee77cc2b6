/* CPU features, detected once per process (the architecture folder's
 * ql_cpu_detect), minus those QLINEAR_DISABLE hides. */
#ifndef QL_CPU_FEATURES_H
#define QL_CPU_FEATURES_H

#include "core/core.h"

enum { QL_VENDOR_OTHER = 0, QL_VENDOR_INTEL = 1, QL_VENDOR_AMD = 2 };

typedef struct ql_cpu_features {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avxvnni, avx512bf16, avx512vbmi, os_avx512;
    /* AMX: CPUID.(7,0):EDX[24] AMX-TILE and [25] AMX-INT8; palette 1 holds 8
     * tiles of 16 rows × 64 bytes (CPUID 0x1D); the OS saves the tile state
     * (XCR0[17] XTILECFG, [18] XTILEDATA). Linux also wants a per-process
     * permission, requested when the amx table is first asked (x86.h). */
    bool amx_tile, amx_int8, amx_palette, os_amx;
    bool amx_bf16; /* CPUID.(7,0):EDX[22] AMX-BF16 (TDPBF16PS) */
    bool neon, asimdhp, dotprod, i8mm, bf16; /* AArch64: Advanced SIMD, fp16 arithmetic, SDOT, SMMLA, BFMMLA */
    /* x86: the vendor (CPUID leaf 0) and the display family and model of
     * leaf 1 (family = base + extended when base is 0xF; model with the
     * extended bits for families 6 and 0xF up), for per-CPU tuning */
    int vendor; /* QL_VENDOR_* */
    int family, model;
} ql_cpu_features;

const ql_cpu_features *ql_cpu(void);

/* Fills f from the hardware and the OS (one implementation per
 * architecture folder: x86, arm, generic). */
void ql_cpu_detect(ql_cpu_features *f);

#endif
