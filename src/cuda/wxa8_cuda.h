/* W4A8 / W6A8 on the GPU (C++ only): the packed weight as the kernels read
 * it (layout in cuda_backend.h, ql_cuda_packed_desc), the launchers of
 * wxa8_decode.cu, and the asymmetric correction's kernels. */
#pragma once
#include <cuda_runtime.h>

#include "common.cuh"

namespace qlc {

/* Device pointers of a packed layer (ql_cuda_packed_desc's arrays, uploaded). */
struct PackedW {
    int bits;          /* 4 or 6 */
    int gs;            /* codes per scale byte: 4, 8 or 16 */
    int64_t n, k;      /* k % 16 == 0 (6 bits: % 32) */
    const uint8_t *nib; /* [n][ldn] low nibbles, natural order */
    int64_t ldn;
    const uint8_t *hi; /* 6 bits: [n][ldh] top bits, one 32-bit word per 16 codes */
    int64_t ldh;
    const uint8_t *sb; /* [n][lds] e4m3 scale bytes, one per gs codes */
    int64_t lds;
    const void *table; /* 4 bits: int8 [256][16] = grid(value(code), e4m3(byte)); 6 bits: fp16 bits [256] of e4m3(byte) */
};

/* The int8 grid [n, ldo] of the packed weight in the prologue's code order
 * (permuted: value i + 16·t of each group of 256 at 16·i + t, as
 * codes_permuted says), on `stream`. An ordinary launch: it starts once the
 * stream's earlier work (a GEMM still reading `out`) has finished, and the
 * GEMM after it must be an ordinary launch too (it loads B before waiting). */
cudaError_t launch_wxa8_decode(const PackedW &w, bool permuted, int8_t *out, int64_t ldo, cudaStream_t stream);

/* Few rows (m <= QLC_GEMV_MAX_M): `split` warps an output column
 * (gemv_split, each a part of K) read its packed row once, decode 32 codes
 * a lane at a time in registers and multiply
 * them with dp4a against the activation codes a [m, lda] (prologue order,
 * staged into shared memory in natural order); the int8 GEMV's epilogue.
 * pdl: a programmatic dependent launch (it waits before reading a or
 * writing y). */
cudaError_t launch_wxa8_gemv(const int8_t *a, int64_t lda, const PackedW &w, bool permuted, int64_t m, int split,
                             const EpiParams &p, cudaStream_t stream, bool pdl);

/* 1 to QLC_PACKED_MMA_MAX_M rows on the tensor cores (sm_80+): mma.sync
 * with the packed codes decoded in registers into B fragments, the rows
 * staged as A; a block of 8·tiles columns (tiles 2 or 4:
 * wxa8_mma16_tiles) whose warps share K; the int8 GEMV's epilogue per
 * output pair. pdl as for launch_wxa8_gemv. */
#define QLC_PACKED_MMA_MAX_M 16
/* the first M it takes by default: on an H200 it beat the packed GEMV at
 * M = 8 (both formats) and lost at M = 2 (both) and at M = 4 (6 bits) */
#define QLC_PACKED_MMA_MIN_M 5
int wxa8_mma16_tiles(int64_t n, int sms);
cudaError_t launch_wxa8_mma16(const int8_t *a, int64_t lda, const PackedW &w, bool permuted, int64_t m, int tiles,
                              const EpiParams &p, cudaStream_t stream, bool pdl);

/* One row of x (dtype xdt) at G = 256 (gemv_row_g256_ok): the packed GEMV
 * that rotates and quantizes the row in each block itself
 * (launch_s8_gemv_row's scheme, cuda_internal.h, `split` warps a column);
 * q [k] and sx [1] receive the codes and scale the prologue kernel would
 * have written. A symmetric layer (no correction term). */
cudaError_t launch_wxa8_gemv_row(const void *x, int xdt, const PackedW &w, int split, const EpiParams &p, int8_t *q,
                                 float *sx, int sms, cudaStream_t stream, bool pdl);

/* Asymmetric layers: s[m, k/group] = Σ_{natural k in group} a[m, k] (exact,
 * as fp32), from the codes in prologue order. */
cudaError_t launch_group_sums(const int8_t *a, int64_t lda, int64_t m, int64_t k, int64_t group, bool permuted, float *s,
                              cudaStream_t stream);

/* The CPU's corrected epilogue (src/cpu/wxa8_linear.c), bit for bit, from
 * the GEMM's raw accumulators acc [m, ldacc]: t = Σ_g fp32(s[m,g]·corr[g,n])
 * summed in g order, v = fp32(acc·(s_x·s_w)) + fp32(s_x·t), then
 * epi_value's roundings (bias, residual) into p.y. */
cudaError_t launch_corr_epilogue(const int32_t *acc, int64_t ldacc, const float *s, const float *corr, int64_t m,
                                 int64_t n, int64_t ng, const EpiParams &p, cudaStream_t stream);

} // namespace qlc
