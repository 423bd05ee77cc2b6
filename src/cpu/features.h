/* CPU features, detected once per process (the architecture folder's
 * ql_cpu_detect), minus those QLINEAR_DISABLE hides. */
#ifndef QL_CPU_FEATURES_H
#define QL_CPU_FEATURES_H

#include "core/core.h"

typedef struct ql_cpu_features {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avxvnni, avx512bf16, os_avx512;
    bool neon, asimdhp, dotprod, i8mm, bf16; /* AArch64: Advanced SIMD, fp16 arithmetic, SDOT, SMMLA, BFMMLA */
} ql_cpu_features;

const ql_cpu_features *ql_cpu(void);

/* Fills f from the hardware and the OS (one implementation per
 * architecture folder: x86, arm, generic). */
void ql_cpu_detect(ql_cpu_features *f);

#endif
