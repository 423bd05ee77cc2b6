/* Device-side pieces shared by the CUDA kernels: exact dtype conversions (the
 * CPU's ql_round_to, bit for bit), the fused epilogue, launch-check macros. */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "../quant/gelu.h" /* the output GELU: the CPU's function and its bf16 table form */

namespace qlc {

/* Programmatic dependent launch (sm_90+; no-ops before): a kernel of a layer
 * lets the stream's next kernel be launched now — the next layer's
 * prologue, or this layer's GEMM — whose blocks then wait with pdl_wait()
 * for this grid's completion and memory before touching anything it writes
 * or reads. Every kernel of the pipeline calls both, so each call's launch
 * and preamble overlap the tail of the one before. */
__device__ __forceinline__ void pdl_trigger()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void pdl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Hopper: bytes [0, bytes) of a weight row on their way from DRAM into L2,
 * issued by a kernel launched while the one before still runs, before its
 * pdl_wait(). `split` warps share the row: this one (`part`) every
 * split-th 128-byte line of it. */
__device__ __forceinline__ void prefetch_row_l2(const void *row, int64_t bytes, int lane, int part = 0, int split = 1)
{
#if __CUDA_ARCH__ >= 900
    const char *p = (const char *)row;
    for (int64_t o = (int64_t)(lane * split + part) * 128; o < bytes; o += 32 * 128 * (int64_t)split)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

/* ql_dtype values, usable in device code. */
enum : int { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_I32 = 5 };

/* Every float operation below is an explicit _rn intrinsic: the reference
 * rounds after each operation and nvcc would otherwise contract a*b+c. */
__device__ __forceinline__ float round_to(int dt, float v)
{
    if (dt == DT_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (dt == DT_F16) return __half2float(__float2half_rn(v));
    return v;
}

__device__ __forceinline__ float load_f(int dt, const void *p, int64_t i)
{
    if (dt == DT_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (dt == DT_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

/* What the epilogue needs; pointers are device pointers. */
struct EpiParams {
    void *y;
    int64_t ldy;
    int ydt;             /* DT_I32: raw accumulators, nothing else applies */
    const float *sx;     /* [M] activation scales */
    const float *sw;     /* [N] or [1] weight scales */
    int sw_per_row;      /* 1: sw has N entries */
    const float *bias;   /* [N] fp32 or NULL; rounded to ydt here */
    const void *res;     /* [M, ldr] in ydt or NULL */
    int64_t ldr;
    const void *rs;      /* [N] in ydt */
    int vec2;            /* y and ldy allow 2-element vector stores */
    /* an unmerged LoRA's term, added in the GEMM's own epilogue (lks > 0:
     * the GEMV and the Hopper kernel's bf16 epilogue): t's codes [M,
     * 32·lks] row-major, their scales st [M], U's codes in mma fragment
     * order (lora_u_frag), su [N] */
    const int8_t *ltq;
    const float *lst;
    const uint2 *luf;
    const float *lsu;
    int lks; /* k32 steps over the rank (its padding to 32) */
    /* the output GELU (QL_ACTIVATION_GELU), after the bias, before the
     * residual; bf16 outputs read its table (ql_gelu_bf16_bits) */
    int act;
    const uint16_t *gelu_lut;
};

/* s32 += s8·s8 on one 16 x 8 x 32 tensor-core tile (mma.sync, sm_80+).
 * Fragments: A row lane/4 (+8), bytes 4(lane%4) (+16); B column lane/4,
 * the same bytes; C rows lane/4 (+8), columns 2(lane%4) + {0, 1} — per
 * warp, the layout of a wgmma accumulator's 8-column block. */
__device__ __forceinline__ void mma_s8(int32_t (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* A LoRA's t codes for one warp's 16 rows (r0 = a row of lane/4, r0 + 8),
 * as mma A fragments: the first KR k32 steps stay in registers for all the
 * warp's column blocks (KR = 0 where the kernel has none to spare); the
 * rest are read per block (L1). st: the rows' scales (0 past M). */
template <int KR> struct LoraRows {
    uint32_t a[KR > 0 ? KR : 1][4];
    float st0, st1;
};
__device__ __forceinline__ uint32_t lora_a_word(const EpiParams &p, int64_t m, int64_t r, int s, int half, int lane)
{
    return r < m ? *(const uint32_t *)(p.ltq + r * (32 * p.lks) + 32 * s + 16 * half + 4 * (lane % 4)) : 0u;
}
template <int KR>
__device__ __forceinline__ void lora_rows(LoraRows<KR> &R, const EpiParams &p, int64_t m, int64_t r0, int lane)
{
    const int64_t r1 = r0 + 8;
#pragma unroll
    for (int s = 0; s < KR; s++) {
        const bool in = s < p.lks;
        R.a[s][0] = in ? lora_a_word(p, m, r0, s, 0, lane) : 0u;
        R.a[s][1] = in ? lora_a_word(p, m, r1, s, 0, lane) : 0u;
        R.a[s][2] = in ? lora_a_word(p, m, r0, s, 1, lane) : 0u;
        R.a[s][3] = in ? lora_a_word(p, m, r1, s, 1, lane) : 0u;
    }
    R.st0 = r0 < m ? p.lst[r0] : 0.f, R.st1 = r1 < m ? p.lst[r1] : 0.f;
}
/* The exact int32 rank-R product t_q·U_qᵀ of the warp's 16 rows and the
 * 8 columns of one block, in the C layout; u: that block's U fragments
 * (lora_u_global, or a copy of them in shared memory). */
__device__ __forceinline__ const uint2 *lora_u_global(const EpiParams &p, int64_t chunk, int lane)
{
    return p.luf + chunk * p.lks * 32 + lane;
}
template <int KR, int MAXS = 0 /* > 0: the caller guarantees p.lks <= MAXS */>
__device__ __forceinline__ void lora_chunk(int32_t (&l)[4], const LoraRows<KR> &R, const EpiParams &p, int64_t m,
                                           int64_t r0, const uint2 *u /* the block's fragments, + lane */, int lane)
{
    l[0] = l[1] = l[2] = l[3] = 0;
#pragma unroll
    for (int s = 0; s < KR; s++)
        if (s < p.lks) {
            const uint2 b = u[32 * s];
            const uint32_t bb[2] = {b.x, b.y};
            mma_s8(l, R.a[s], bb);
        }
    /* the steps past the rows' registers: unrolled where the caller bounds
     * them (the GEMM epilogues, unrolled over the whole tile, would carry
     * a general loop in every column block: code that misses the
     * instruction cache), else a loop */
    auto step = [&](int s) {
        const uint2 b = u[32 * s];
        const uint32_t bb[2] = {b.x, b.y};
        const uint32_t a[4] = {lora_a_word(p, m, r0, s, 0, lane), lora_a_word(p, m, r0 + 8, s, 0, lane),
                               lora_a_word(p, m, r0, s, 1, lane), lora_a_word(p, m, r0 + 8, s, 1, lane)};
        mma_s8(l, a, bb);
    };
    if constexpr (MAXS > 0) {
#pragma unroll
        for (int s = KR; s < MAXS; s++)
            if (s < p.lks) step(s);
    } else {
        for (int s = KR; s < p.lks; s++) step(s);
    }
}
/* One output's value with its LoRA term, before the first rounding (the
 * CPU's cpu/lora.h order): acc·(s_x·s_w) + fp32(l)·(st·su). */
__device__ __forceinline__ float lora_value(int32_t acc, float sxw, int32_t l, float st, float su)
{
    return __fadd_rn(__fmul_rn(__int2float_rn(acc), sxw), __fmul_rn(__int2float_rn(l), __fmul_rn(st, su)));
}

/* The epilogue after the product v = acc·(s_x·s_w) (plus a corrected
 * layer's or a LoRA's term): y = round(v); y = round(y + round(bias));
 * y = round(res + rs·y): ql_epilogue_scalar's roundings in its order. */
__device__ __forceinline__ float epi_after(const EpiParams &p, float v, int64_t row, int64_t col)
{
    const int dt = p.ydt;
    float y = round_to(dt, v);
    if (p.bias) y = round_to(dt, __fadd_rn(y, round_to(dt, p.bias[col])));
    if (p.act) /* bf16: the table, else the function itself (ql_gelu_f32 compiled for the device) */
        y = dt == DT_BF16 ? __uint_as_float((uint32_t)ql_gelu_bf16_bits((uint16_t)(__float_as_uint(y) >> 16), p.gelu_lut) << 16)
                          : round_to(dt, ql_gelu_f32(y));
    if (p.res) {
        const float r = load_f(dt, p.res, row * p.ldr + col), rs = load_f(dt, p.rs, col);
        y = round_to(dt, __fadd_rn(r, __fmul_rn(rs, y)));
    }
    return y;
}

__device__ __forceinline__ float epi_value(const EpiParams &p, int32_t acc, float sx, int64_t row, int64_t col)
{
    const float sw = p.sw[p.sw_per_row ? col : 0];
    return epi_after(p, __fmul_rn(__int2float_rn(acc), __fmul_rn(sx, sw)), row, col);
}

__device__ __forceinline__ void store_one(const EpiParams &p, int64_t row, int64_t col, float v, int32_t acc)
{
    int64_t i = row * p.ldy + col;
    switch (p.ydt) {
    case DT_I32: ((int32_t *)p.y)[i] = acc; break;
    case DT_BF16: ((__nv_bfloat16 *)p.y)[i] = __float2bfloat16_rn(v); break;
    case DT_F16: ((__half *)p.y)[i] = __float2half_rn(v); break;
    default: ((float *)p.y)[i] = v; break;
    }
}

/* The end of a GEMV warp's column: each lane's MR partial dot products
 * summed over the warp, row r's result stored (through the epilogue) by lane r. */
template <int MR> __device__ __forceinline__ void gemv_finish(int32_t (&acc)[MR], const EpiParams &p, int lane, int64_t col)
{
#pragma unroll
    for (int r = 0; r < MR; r++)
        for (int o = 16; o; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (lane < MR) {
        int32_t v = acc[0];
#pragma unroll
        for (int r = 1; r < MR; r++)
            if (lane == r) v = acc[r];
        if (p.ydt == DT_I32) store_one(p, lane, col, 0.f, v);
        else store_one(p, lane, col, epi_value(p, v, p.sx[lane], lane, col), v);
    }
}

/* body(k) for k = k0, k0 + step, ... below end, four calls at a time in
 * straight-line code, so that their loads are in flight together (a loop
 * with a run-time step, unrolled, tests the bound between its bodies, and
 * a load cannot rise above the test). The last one to three rounds run one
 * by one: batching them with idle calls measured slower (MEASUREMENTS
 * §31.3). */
template <class I, class Body> __device__ __forceinline__ void rounds4(I k0, I end, I step, Body &&body)
{
    for (; k0 + 3 * step < end; k0 += 4 * step) {
        body(k0);
        body(k0 + step);
        body(k0 + 2 * step);
        body(k0 + 3 * step);
    }
    for (; k0 < end; k0 += step) body(k0);
}

/* Split K in the GEMVs: `split` warps of a block share a column, each
 * summing its part of K; where N alone would leave SMs idle, more warps a
 * column put more of the weight's bytes in flight. gemv_split_reduce: the
 * parts meet in shared memory red [2·MR·WARPS], round alternating between
 * its halves (one barrier a round); true in the warp that finishes the
 * column (part 0), its lane 0 then holding the sums, its other lanes zeros.
 * Every warp of the block calls it, once a round. Integer sums: the result
 * does not depend on the split. */
template <int WARPS, int MR>
__device__ __forceinline__ bool gemv_split_reduce(int32_t (&acc)[MR], int split, int32_t *red, int round)
{
    if (split == 1) return true;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int32_t *rr = red + round * MR * WARPS;
#pragma unroll
    for (int r = 0; r < MR; r++) {
        for (int o = 16; o; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        if (lane == 0) rr[r * WARPS + warp] = acc[r];
    }
    __syncthreads();
    if (warp % split) return false;
#pragma unroll
    for (int r = 0; r < MR; r++) {
        acc[r] = 0;
        if (lane == 0)
            for (int j = 0; j < split; j++) acc[r] += rr[r * WARPS + warp + j];
    }
    return true;
}

/* The column loop of a one-row GEMV whose blocks of WARPS warps loop over
 * the columns together, WARPS / split at a time (dot(col, part): a lane's
 * partial sum of its part); the trip count is the block's, so every warp
 * reaches each barrier. */
template <int WARPS, class Dot>
__device__ __forceinline__ void gemv_split_columns(int64_t n, int split, const EpiParams &p, int32_t *red, Dot &&dot)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, cpb = WARPS / split;
    int round = 0;
    for (int64_t c0 = (int64_t)blockIdx.x * cpb; c0 < n; c0 += (int64_t)gridDim.x * cpb, round ^= 1) {
        const int64_t col = c0 + warp / split;
        int32_t acc[1] = {col < n ? dot(col, warp % split) : 0};
        if (gemv_split_reduce<WARPS, 1>(acc, split, red, round) && col < n) gemv_finish<1>(acc, p, lane, col);
    }
}

/* Two adjacent outputs (col, col+1) of one row; col+1 may be past N. */
__device__ __forceinline__ void epi_store2(const EpiParams &p, int64_t row, int64_t col, int64_t n, int32_t a0,
                                           int32_t a1, float sx)
{
    if (p.ydt == DT_I32) {
        if (p.vec2 && col + 1 < n) {
            *(int2 *)((int32_t *)p.y + row * p.ldy + col) = make_int2(a0, a1);
        } else {
            store_one(p, row, col, 0.f, a0);
            if (col + 1 < n) store_one(p, row, col + 1, 0.f, a1);
        }
        return;
    }
    float v0 = epi_value(p, a0, sx, row, col);
    if (col + 1 < n) {
        float v1 = epi_value(p, a1, sx, row, col + 1);
        if (p.vec2) {
            int64_t i = row * p.ldy + col;
            if (p.ydt == DT_BF16) {
                *(__nv_bfloat162 *)((__nv_bfloat16 *)p.y + i) = __floats2bfloat162_rn(v0, v1);
                return;
            }
            if (p.ydt == DT_F16) {
                *(__half2 *)((__half *)p.y + i) = __floats2half2_rn(v0, v1);
                return;
            }
            *(float2 *)((float *)p.y + i) = make_float2(v0, v1);
            return;
        }
        store_one(p, row, col + 1, v1, a1);
    }
    store_one(p, row, col, v0, a0);
}

/* Two adjacent outputs of a row, both inside N, vector store allowed, no
 * residual, no activation; sw and the (already rounded) bias come from the caller. Same
 * roundings as epi_value. */
/* Two adjacent bf16 outputs of a row, packed (the bf16 case of epi_store_pair).
 * One packed conversion rounds both values (RNE, subnormals kept, NaN stays
 * NaN): a third of the instructions of rounding each in integer arithmetic
 * with its NaN test, and the epilogue is what a K = 256 layer is bound by. */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}
/* Two bf16 pairs added, each sum rounded once (RNE, subnormals kept). The
 * reference adds the two bf16 values in fp32 and rounds that to bf16: the
 * same result, since a double rounding through a format of at least
 * 2·8 + 2 significant bits is innocuous for a sum (fp32 has 24), and sums
 * of bf16 values too small for that bound are exact in fp32. One
 * instruction instead of two unpacks, two fp32 adds and a second
 * conversion per pair. */
__device__ __forceinline__ uint32_t add_bf16x2_rn(uint32_t a, uint32_t b)
{
    const __nv_bfloat162 s = __hadd2_rn(*(const __nv_bfloat162 *)&a, *(const __nv_bfloat162 *)&b);
    return *(const uint32_t *)&s;
}
/* A bf16 pair's gated residual: res + scale · y, one rounding (epi_value's
 * operations); (row, col) inside the output, N even and the residual's
 * pairs 4-byte aligned (the launcher's condition for these paths). */
__device__ __forceinline__ uint32_t res_bf16x2(const EpiParams &p, uint32_t r, int64_t row, int64_t col)
{
    const uint32_t rr = *(const uint32_t *)((const __nv_bfloat16 *)p.res + row * p.ldr + col);
    const uint32_t ss = *(const uint32_t *)((const __nv_bfloat16 *)p.rs + col);
    return pack_bf16x2(__fadd_rn(__uint_as_float(rr << 16), __fmul_rn(__uint_as_float(ss << 16), __uint_as_float(r << 16))),
                       __fadd_rn(__uint_as_float(rr & 0xffff0000u),
                                 __fmul_rn(__uint_as_float(ss & 0xffff0000u), __uint_as_float(r & 0xffff0000u))));
}
/* RES: the gated residual too (a separate instantiation: the kernels
 * without one keep their registers). `at` says whether (row, col) is inside
 * the output: only then is the residual read. */
template <bool RES>
__device__ __forceinline__ uint32_t epi_pair_bf16_v(const EpiParams &p, float v0, float v1, float2 bias, int64_t row,
                                                    int64_t col, bool at)
{
    uint32_t r = pack_bf16x2(v0, v1);
    if (p.bias) /* plus the rounded bias (bf16 values held as fp32): one packed bf16 add */
        r = add_bf16x2_rn(r, __byte_perm(__float_as_uint(bias.x), __float_as_uint(bias.y), 0x7632));
    if (RES && at) r = res_bf16x2(p, r, row, col);
    return r;
}
template <bool RES>
__device__ __forceinline__ uint32_t epi_pair_bf16(const EpiParams &p, int32_t a0, int32_t a1, float sx, float2 sw,
                                                  float2 bias, int64_t row, int64_t col, bool at)
{
    return epi_pair_bf16_v<RES>(p, __fmul_rn(__int2float_rn(a0), __fmul_rn(sx, sw.x)),
                                __fmul_rn(__int2float_rn(a1), __fmul_rn(sx, sw.y)), bias, row, col, at);
}

__device__ __forceinline__ void epi_store_pair(const EpiParams &p, int64_t row, int64_t col, int32_t a0, int32_t a1,
                                               float sx, float2 sw, float2 bias)
{
    const int dt = p.ydt;
    const int64_t i = row * p.ldy + col;
    if (dt == DT_BF16) {
        *(uint32_t *)((__nv_bfloat16 *)p.y + i) = epi_pair_bf16<false>(p, a0, a1, sx, sw, bias, row, col, false);
        return;
    }
    float v0 = __fmul_rn(__int2float_rn(a0), __fmul_rn(sx, sw.x));
    float v1 = __fmul_rn(__int2float_rn(a1), __fmul_rn(sx, sw.y));
    v0 = round_to(dt, v0), v1 = round_to(dt, v1);
    if (p.bias) v0 = round_to(dt, __fadd_rn(v0, bias.x)), v1 = round_to(dt, __fadd_rn(v1, bias.y));
    if (dt == DT_BF16) *(__nv_bfloat162 *)((__nv_bfloat16 *)p.y + i) = __floats2bfloat162_rn(v0, v1);
    else if (dt == DT_F16) *(__half2 *)((__half *)p.y + i) = __floats2half2_rn(v0, v1);
    else *(float2 *)((float *)p.y + i) = make_float2(v0, v1);
}

} // namespace qlc
