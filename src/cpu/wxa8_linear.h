/* W4A8/W6A8 layers on the W8A8 pipeline: creation (decode once, or keep
 * the packed codes for decoding inside the GEMM) and the asymmetric
 * correction term. */
#ifndef QL_WXA8_LINEAR_H
#define QL_WXA8_LINEAR_H

#include "cpu/kernels.h"

/* A W4A8/W6A8 layer as the int8 layer it runs as: desc (kind W8A8 for
 * WXA8_PACKED, else the asked kind) with its int8 view: the decoded grid
 * (grid, caller frees) or, for WXA8_PACKED (e4m3 scales), the packed codes
 * (packed) to decode inside the GEMM; an asymmetric layer's correction as
 * fp32 [k/corr_group, n] (corr, owned by the caller from here on). */
typedef struct ql_wxa8_prepared {
    ql_linear_desc desc;
    const ql_wxa8_weight *packed;
    int8_t *grid;
    float *corr;
    int64_t corr_group;
} ql_wxa8_prepared;
ql_status ql_wxa8_linear_prepare(const ql_linear_desc *d, ql_wxa8_prepared *out);

/* The W8A8 GEMM of an asymmetric layer: y = acc·(s_x·s_w) + s_x·Σ_g S[m,g]·corr[g,n]
 * (fp32, then the usual epilogue roundings), where S[m,g] = Σ_{k in g} x_q[m,k]. */
ql_status ql_wxa8_gemm_corrected(int threads, const ql_s8_kernel *kern, const int8_t *packed_a, int64_t m,
                                 const ql_packed_b *b, const ql_w8a8_epi *e, const float *corr, int64_t group,
                                 int64_t k);

#endif
