/* W4A8/W6A8 layers on the W8A8 pipeline: creation (decode once, or keep
 * the packed codes for decoding inside the GEMM) and the asymmetric
 * correction term. */
#ifndef QL_WXA8_LINEAR_H
#define QL_WXA8_LINEAR_H

#include "kernels.h"

typedef ql_status (*ql_int8_create_fn)(ql_linear *l, const ql_linear_desc *d, const ql_wxa8_weight *packed);

/* Checks d->wxa8, converts a correction to fp32 [k/group, n] (*corr), and
 * creates the int8 layer through `create`: with the decoded grid, or (kind
 * WXA8_PACKED, e4m3 scales) with the packed codes; *kind becomes the kind
 * the layer runs as. */
ql_status ql_wxa8_linear_create(const ql_linear_desc *d, float **corr, int64_t *corr_group, ql_linear_kind *kind,
                                ql_int8_create_fn create, ql_linear *l);

/* The W8A8 GEMM of an asymmetric layer: y = acc·(s_x·s_w) + s_x·Σ_g S[m,g]·corr[g,n]
 * (fp32, then the usual epilogue roundings), where S[m,g] = Σ_{k in g} x_q[m,k]. */
ql_status ql_wxa8_gemm_corrected(int threads, const ql_s8_kernel *kern, const int8_t *packed_a, int64_t m,
                                 const ql_packed_b *b, const ql_w8a8_epi *e, const float *corr, int64_t group,
                                 int64_t k);

#endif
