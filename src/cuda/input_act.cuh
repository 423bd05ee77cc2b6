/* comfy-kitchen's input activations (ql_epilogue.input_act) on the GPU, for
 * the prologue kernels: the values the CPU's ql_input_act_row writes (each
 * computed in fp32 and rounded once to x's dtype), as fp32 numbers the
 * kernel then rotates and quantizes. docs/NUMERICS.md §11 gives the order of
 * operations; every step here is an explicit _rn intrinsic so nvcc contracts
 * nothing the CPU does not, and exp and tanh are the CPU's own
 * (quant/act_math.h, compiled for the device), so every activation is
 * bit-identical to the CPU's: rms_norm's sum of squares follows the CPU's
 * (PyTorch's) order exactly (rms_sum_squares_block).
 *
 * Use: a kernel holding 16 consecutive values j..j+15 of a row (j a
 * multiple of 16) calls activate<16> on them, or load16_act loads and
 * activates them; rms_norm's per-row factor is computed before the prologue
 * by launch_rms_factors (cuda_internal.h) into InputAct::rms. */
#pragma once
#include "common.cuh"
#include "../quant/act_math.h"

namespace qlc {

/* One forward's input activation (pointers on the layer's device). */
struct InputAct {
    int code;       /* ql_input_act (QL_INPUT_ACT_NONE: the row as it is) */
    const void *w;  /* RMS_NORM: weight [k], dtype wdt; used as w.to(x.dtype) */
    int wdt;
    float eps;      /* RMS_NORM, finite */
    float *rms;     /* RMS_NORM: [m] row factors 1/sqrt(Σx²/k + eps), filled by launch_rms_factors */
    const uint16_t *tab; /* GELU_TANH / SWIGLU on bf16 or fp16 rows: the CPU's table of the function over every
                          * bit pattern (ql_act_table16), on the device; NULL: computed (the same bits, slower) */
    bool ahead = false;  /* with tab: the G = 256 kernel looks an item's values up one item ahead (prologue.cu) */
};

/* 16 consecutive values j..j+15 of a row as fp32; vec: 16-byte loads (row
 * 16-byte aligned, j a multiple of 16). */
__device__ __forceinline__ void load16(int dt, const char *row, int64_t j, bool vec, float (&v)[16])
{
    if (vec && dt != DT_F32) {
        const uint4 *p = (const uint4 *)(row + j * 2);
        uint4 u[2] = {p[0], p[1]};
        const uint16_t *h = (const uint16_t *)u;
#pragma unroll
        for (int i = 0; i < 16; i++)
            v[i] = dt == DT_BF16 ? __bfloat162float(__ushort_as_bfloat16(h[i])) : __half2float(__ushort_as_half(h[i]));
        return;
    }
    if (vec) {
        const float4 *p = (const float4 *)(row + j * 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 f = p[i];
            v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = load_f(dt, row, j + i);
}

/* tab's entry for x, a value of dt (bf16 or fp16, exact in fp32): one load
 * where the function costs an exp, a division and a tanh per value, which the
 * low-occupancy prologue cannot hide. */
__device__ __forceinline__ float act_lookup(int dt, const uint16_t *tab, float x)
{
    const unsigned short b =
        dt == DT_BF16 ? (unsigned short)(__float_as_uint(x) >> 16) : __half_as_ushort(__float2half_rn(x));
    const unsigned short r = __ldg(tab + b);
    return dt == DT_BF16 ? __bfloat162float(__ushort_as_bfloat16(r)) : __half2float(__ushort_as_half(r));
}

/* gelu(x, approximate="tanh") = (0.5·x)·(1 + tanh(β·(x + κ·((x·x)·x)))), fp32, rounded once to dt. */
__device__ __forceinline__ float act_gelu_tanh(int dt, float x, const uint16_t *tab)
{
    return tab && dt != DT_F32 ? act_lookup(dt, tab, x) : round_to(dt, ql_act_gelu_tanh(x));
}

/* swiglu: s = round(gate / (1 + e^-gate)), then round(s·up). */
__device__ __forceinline__ float act_swiglu(int dt, float gate, float up, const uint16_t *tab)
{
    const float s = tab && dt != DT_F32 ? act_lookup(dt, tab, gate) : round_to(dt, ql_act_silu(gate));
    return round_to(dt, __fmul_rn(s, up));
}

/* rms_norm of one value: round((x·r)·w), r the row's factor, w the weight already rounded to dt. */
__device__ __forceinline__ float act_rms_norm(int dt, float x, float r, float w)
{
    return round_to(dt, __fmul_rn(__fmul_rn(x, r), w));
}

/* The row factor from Σx²: 1/sqrt(Σx²/k + eps) (a zero row with eps 0: Inf, so 0·Inf = NaN as in torch). */
__device__ __forceinline__ float rms_factor(float sum_squares, int64_t k, float eps)
{
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum_squares, (float)k), eps)));
}

/* Σ x[j]² of a row of k values, bit-identical to the CPU's
 * ql_rms_sum_squares (PyTorch's order: 32 slots over blocks of four 8-lane
 * vectors, cascaded every 16 / 256 / 4096 blocks; the 0-3 leftover vectors
 * into the first vector's lanes; the four vectors added lane-wise; a
 * scalar sum of the tail, then of the 8 lanes). Lane s of a warp is slot s
 * (it reads x[32u + s], so a warp reads each block coalesced).
 *
 * The order is one long chain per slot, but the chain restarts every 16
 * blocks (the cascade adds each 16-block partial into the next level), so
 * the partials are independent: the block's warps compute them side by
 * side, each partial's 16 loads issued before its adds (one memory round
 * trip, not 16), into `part` (shared, RMS_PARTS × 32 floats), and warp 0
 * adds them into the cascade in order. A warp a row, adding as it loaded,
 * was latency-bound (the rms_norm layer at M = 1024, K = 2048 took 1.7× the
 * plain layer's time; 1.3× this way).
 * Every thread of the block calls it (it has barriers); warp 0's lanes get
 * the sum. */
constexpr int RMS_PARTS = 32;
__device__ __forceinline__ float rms_sum_squares_block(int dt, const char *row, int64_t k, float *part)
{
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    auto sq = [&](int64_t j) {
        const float v = load_f(dt, row, j);
        return __fmul_rn(v, v);
    };
    if (k < 8) { /* four scalar slots (the first 4⌊k/4⌋ values), the rest into slot 0; each lane alike */
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t j = 0; j < k / 4 * 4; j++) t[j] = __fadd_rn(t[j], sq(j));
        for (int64_t j = k / 4 * 4; j < k; j++) t[0] = __fadd_rn(t[0], sq(j));
        return __fadd_rn(__fadd_rn(__fadd_rn(t[0], t[1]), t[2]), t[3]);
    }
    const int64_t vecs = k / 8, blocks = vecs / 4, groups = blocks / 16;
    float l0 = 0.0f, l1 = 0.0f, l2 = 0.0f, l3 = 0.0f;
    for (int64_t g0 = 0; g0 < groups; g0 += RMS_PARTS) {
        const int64_t n = groups - g0 < RMS_PARTS ? groups - g0 : RMS_PARTS;
        for (int64_t g = warp; g < n; g += warps) {
            const int64_t u0 = 16 * (g0 + g);
            float e[16];
#pragma unroll
            for (int i = 0; i < 16; i++) e[i] = sq(32 * (u0 + i) + lane);
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < 16; i++) p = __fadd_rn(p, e[i]);
            part[g * 32 + lane] = p;
        }
        __syncthreads();
        if (warp == 0)
            for (int64_t g = 0; g < n; g++) {
                const int64_t u = 16 * (g0 + g + 1); /* blocks done after this partial */
                l1 = __fadd_rn(l1, part[g * 32 + lane]);
                if (u % 256 == 0) {
                    l2 = __fadd_rn(l2, l1), l1 = 0.0f;
                    if (u % 4096 == 0) l3 = __fadd_rn(l3, l2), l2 = 0.0f;
                }
            }
        __syncthreads();
    }
    if (warp != 0) return 0.0f;
    {
        const int left = (int)(blocks - 16 * groups); /* 0..15 blocks, into l0 in order */
        float e[15];
#pragma unroll
        for (int i = 0; i < 15; i++) e[i] = i < left ? sq(32 * (16 * groups + i) + lane) : 0.0f;
#pragma unroll
        for (int i = 0; i < 15; i++)
            if (i < left) l0 = __fadd_rn(l0, e[i]);
    }
    float tot = __fadd_rn(__fadd_rn(__fadd_rn(l0, l1), l2), l3);
    if (lane < 8)
        for (int64_t v = 4 * blocks; v < vecs; v++) tot = __fadd_rn(tot, sq(8 * v + lane));
    /* lane l < 8: ((tot[l] + tot[8 + l]) + tot[16 + l]) + tot[24 + l] */
    const float t8 = __shfl_down_sync(all, tot, 8), t16 = __shfl_down_sync(all, tot, 16),
                t24 = __shfl_down_sync(all, tot, 24);
    const float lanesum = __fadd_rn(__fadd_rn(__fadd_rn(tot, t8), t16), t24);
    float s = 0.0f;
    for (int64_t j = 8 * vecs; j < k; j++) s = __fadd_rn(s, sq(j));
#pragma unroll
    for (int l = 0; l < 8; l++) s = __fadd_rn(s, __shfl_sync(all, lanesum, l));
    return s;
}

/* In registers: v holds x's values j..j+N-1 of one row (N = 16: j a
 * multiple of 16) -> their activations. up: the up half's values (SWIGLU
 * only); r: the row's factor a.rms[row] (RMS_NORM only; the weight's values
 * j..j+N-1 are read here). code: a.code, or the same as a compile-time
 * constant (the switch then folds away). */
template <int N>
__device__ __forceinline__ void activate(int code, const InputAct &a, int dt, float (&v)[N], const float (&up)[N], float r,
                                         int64_t j)
{
    if (code == QL_INPUT_ACT_GELU_TANH) {
#pragma unroll
        for (int t = 0; t < N; t++) v[t] = act_gelu_tanh(dt, v[t], a.tab);
    } else if (code == QL_INPUT_ACT_SWIGLU) {
#pragma unroll
        for (int t = 0; t < N; t++) v[t] = act_swiglu(dt, v[t], up[t], a.tab);
    } else if (code == QL_INPUT_ACT_RMS_NORM) {
        float w[N];
        if constexpr (N == 16) load16(a.wdt, (const char *)a.w, j, ((uintptr_t)a.w & 15) == 0, w);
        else {
#pragma unroll
            for (int t = 0; t < N; t++) w[t] = load_f(a.wdt, a.w, j + t);
        }
#pragma unroll
        for (int t = 0; t < N; t++) v[t] = act_rms_norm(dt, v[t], r, round_to(dt, w[t]));
    }
}

/* Values j..j+15 of a row after the activation. row: x's row (SWIGLU: gate
 * | up, the up half k values on); r: the row's rms factor (RMS_NORM);
 * vec: the row is 16-byte aligned (j a multiple of 16). */
__device__ __forceinline__ void load16_act(const InputAct &a, int dt, const char *row, float r, int64_t k, int64_t j,
                                           bool vec, float (&v)[16])
{
    load16(dt, row, j, vec, v);
    if (a.code == QL_INPUT_ACT_SWIGLU) {
        const int es = dt == DT_F32 ? 4 : 2;
        float up[16];
        load16(dt, row + k * es, j, vec && (k * es) % 16 == 0, up);
        activate<16>(QL_INPUT_ACT_SWIGLU, a, dt, v, up, r, j);
    } else activate<16>(a.code, a, dt, v, v, r, j);
}

/* Value j of a row after the activation (as load16_act, one value). */
__device__ __forceinline__ float act_value(const InputAct &a, int dt, const char *row, float r, int64_t k, int64_t j)
{
    const float x = load_f(dt, row, j);
    switch (a.code) {
    case QL_INPUT_ACT_GELU_TANH: return act_gelu_tanh(dt, x, a.tab);
    case QL_INPUT_ACT_SWIGLU: return act_swiglu(dt, x, load_f(dt, row, k + j), a.tab);
    case QL_INPUT_ACT_RMS_NORM: return act_rms_norm(dt, x, r, round_to(dt, load_f(a.wdt, a.w, j)));
    default: return x;
    }
}

} // namespace qlc
