/* The G = 256 prologue with the row held in registers.
 *
 * Same arithmetic as quantize_rows_g256_kernel (prologue.cu) — the
 * reference's butterflies in the reference's order, the same roundings, the
 * same permuted code order within each group of 256 — so its codes and
 * scales are bit-identical to it. What differs is where the rotated row
 * waits for its absmax: there, in a shared-memory row buffer (written once,
 * read back once, and sized by K, which caps the warps resident per SM);
 * here, in the registers of the team of warps that owns the row (packed
 * pairs for 16-bit dtypes). A warp holds at most MAXPW items (pairs of
 * groups: a half-warp rotates one group), so a row of K = 2048 is one warp's
 * (4 items) and K = 8192 is a team of four. Shared memory is left to the
 * 16 x 16 transposes (2.6 KB a warp), and the next row's loads are in
 * flight while a row is rotated and quantized. */
#include "common.cuh"
#include "cuda_internal.h"

namespace qlc {
namespace {

constexpr int RG_WARPS = 4;                   /* warps per block */
constexpr int RG_TB_PITCH = 20, RG_TB_HALF = 336; /* the transpose buffer: prologue.cu's layout */

__device__ __forceinline__ void rg_bfly(float &a, float &b, float &c, float &d)
{
    float t0 = __fadd_rn(a, b), t1 = __fadd_rn(c, d), t2 = __fsub_rn(a, b), t3 = __fsub_rn(c, d);
    a = __fadd_rn(t0, t3);
    b = __fsub_rn(t0, t3);
    c = __fadd_rn(t1, t2);
    d = __fsub_rn(t1, t2);
}

__device__ __forceinline__ float rg_tiny(int dt) { return dt == DT_F16 ? 6.103515625e-05f : 1.17549435e-38f; }

/* 32-bit words a lane loads for its 16 values, and keeps after rounding */
template <int DT> __host__ __device__ constexpr int rg_words() { return DT == DT_F32 ? 16 : 8; }

/* Rotated values of one item for one lane: bf16/fp16 pairs, or fp32. */
template <int DT> struct RgVals {
    uint32_t w[rg_words<DT>()];
};

/* 16 rounded values -> 16 codes (prologue.cu's quantize16, from registers). */
template <int DT> __device__ __forceinline__ uint4 rg_quantize16(const RgVals<DT> &v, float st, float rcp)
{
    uint32_t out[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t b[4];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const int i = 4 * j + t;
            float quo;
            if constexpr (DT == DT_BF16) {
                /* bf16: x·RN(1/st) rounds to the bf16 of x/st (prologue.cu) */
                const float e = __uint_as_float(i % 2 ? v.w[i / 2] & 0xffff0000u : v.w[i / 2] << 16);
                quo = __bfloat162float(__float2bfloat16_rn(__fmul_rn(e, rcp)));
            } else if constexpr (DT == DT_F16) {
                const float e = __half2float(__ushort_as_half((uint16_t)(i % 2 ? v.w[i / 2] >> 16 : v.w[i / 2] & 0xffff)));
                quo = __half2float(__float2half_rn(__fdiv_rn(e, st)));
            } else {
                quo = __fdiv_rn(__uint_as_float(v.w[i]), st);
            }
            /* |quo| <= 127.5: only the top needs the clamp; 1.5·2^23 rounds to an integer whose low byte is the code */
            b[t] = __float_as_uint(__fadd_rn(fminf(quo, 127.0f), 12582912.0f));
        }
        out[j] = __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

/* HALVES: K = 256, a row per half-warp (a unit is two rows); else a unit is a
 * row, owned by a team of roww warps, pw items each (pw <= MAXPW). */
template <int DT, int MAXPW, bool HALVES>
__global__ void __launch_bounds__(RG_WARPS * 32, MAXPW == 4 ? 3 : 4) quantize_rows_g256_regs_kernel(const char *x, int64_t ldx_bytes,
                                                                               int64_t m, int k, int roww, int8_t *q,
                                                                               float *sx)
{
    pdl_trigger(); /* see quantize_rows_g256_kernel */
    pdl_wait();
    constexpr int ESZ = DT == DT_F32 ? 4 : 2;
    constexpr int RAW = DT == DT_F32 ? 4 : 2; /* uint4 loads per lane and item */
    __shared__ __align__(16) float tbuf[RG_WARPS][2 * RG_TB_HALF];
    __shared__ float team_amax[2][RG_WARPS];
    __shared__ unsigned team_bad[2][RG_WARPS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, i = lane % 16;
    float *tb = tbuf[warp] + half * RG_TB_HALF;
    const int G = k / 256, items = HALVES ? 1 : (G + 1) / 2, pw = items / roww, p0 = warp % roww * pw;
    const int64_t units = HALVES ? (m + 1) / 2 : m;
    const int64_t nw = (int64_t)gridDim.x * RG_WARPS / roww;
    int parity = 0;

    auto load = [&](int64_t u, uint4 (&r)[MAXPW][RAW]) {
#pragma unroll
        for (int p = 0; p < MAXPW; p++) {
            const int64_t row = HALVES ? 2 * u + half : u;
            const int g = HALVES ? 0 : 2 * (p0 + p) + half;
            if (p < pw && u < units && row < m && g < G) {
                const uint4 *src = (const uint4 *)(x + row * ldx_bytes + (size_t)(g * 256 + i * 16) * ESZ);
#pragma unroll
                for (int j = 0; j < RAW; j++) r[p][j] = __ldcs(src + j);
            } else {
#pragma unroll
                for (int j = 0; j < RAW; j++) r[p][j] = make_uint4(0, 0, 0, 0);
            }
        }
    };

    auto run = [&](int64_t u, const uint4 (&raw)[MAXPW][RAW]) {
        RgVals<DT> vals[MAXPW];
        __nv_bfloat162 amax_b = __float2bfloat162_rn(0.0f);
        __half2 amax_h = __float2half2_rn(0.0f);
        float amax_f = 0.0f;
        unsigned bad_f = 0;
#pragma unroll
        for (int p = 0; p < MAXPW; p++) {
            if (p >= pw) break;
            float e[16];
            const uint32_t *w = (const uint32_t *)raw[p];
#pragma unroll
            for (int t = 0; t < 16; t++) {
                if constexpr (DT == DT_F32) e[t] = __uint_as_float(w[t]);
                else if constexpr (DT == DT_BF16) e[t] = __uint_as_float(t % 2 ? w[t / 2] & 0xffff0000u : w[t / 2] << 16);
                else e[t] = __half2float(__ushort_as_half((uint16_t)(t % 2 ? w[t / 2] >> 16 : w[t / 2] & 0xffff)));
            }
#pragma unroll
            for (int t = 0; t < 16; t++) e[t] = __fmul_rn(e[t], 0.0625f); /* 1/sqrt(256) first, as the reference */
#pragma unroll
            for (int t = 0; t < 16; t += 4) rg_bfly(e[t], e[t + 1], e[t + 2], e[t + 3]);
#pragma unroll
            for (int t = 0; t < 4; t++) rg_bfly(e[t], e[t + 4], e[t + 8], e[t + 12]);
#pragma unroll
            for (int t = 0; t < 4; t++)
                ((float4 *)(tb + i * RG_TB_PITCH))[t] = make_float4(e[4 * t], e[4 * t + 1], e[4 * t + 2], e[4 * t + 3]);
            __syncwarp();
#pragma unroll
            for (int t = 0; t < 16; t++) e[t] = tb[t * RG_TB_PITCH + i]; /* value i + 16·t */
            __syncwarp();
#pragma unroll
            for (int t = 0; t < 16; t += 4) rg_bfly(e[t], e[t + 1], e[t + 2], e[t + 3]);
#pragma unroll
            for (int t = 0; t < 4; t++) rg_bfly(e[t], e[t + 4], e[t + 8], e[t + 12]);
#pragma unroll
            for (int t = 0; t < 16; t += 2) {
                if constexpr (DT == DT_BF16) {
                    const __nv_bfloat162 v = __floats2bfloat162_rn(e[t], e[t + 1]); /* NaN stays NaN */
                    amax_b = __hmax2_nan(amax_b, __habs2(v));
                    vals[p].w[t / 2] = *(const uint32_t *)&v;
                } else if constexpr (DT == DT_F16) {
                    const __half2 v = __floats2half2_rn(e[t], e[t + 1]);
                    amax_h = __hmax2_nan(amax_h, __habs2(v));
                    vals[p].w[t / 2] = *(const uint32_t *)&v;
                } else {
                    const float a0 = fabsf(e[t]), a1 = fabsf(e[t + 1]);
                    bad_f |= (a0 != a0) | (a1 != a1);
                    amax_f = fmaxf(amax_f, fmaxf(a0, a1));
                    vals[p].w[t] = __float_as_uint(e[t]), vals[p].w[t + 1] = __float_as_uint(e[t + 1]);
                }
            }
        }
        float amax;
        unsigned bad = bad_f;
        if constexpr (DT == DT_BF16) {
            amax = fmaxf(__low2float(amax_b), __high2float(amax_b));
            bad = (__low2float(amax_b) != __low2float(amax_b)) | (__high2float(amax_b) != __high2float(amax_b));
        } else if constexpr (DT == DT_F16) {
            amax = fmaxf(__low2float(amax_h), __high2float(amax_h));
            bad = (__low2float(amax_h) != __low2float(amax_h)) | (__high2float(amax_h) != __high2float(amax_h));
        } else {
            amax = amax_f;
        }
        bad |= !(amax <= 3.402823466e38f) && amax == amax; /* ±Inf */
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            if (HALVES && o == 16) continue;
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            bad |= __shfl_xor_sync(0xffffffffu, bad, o);
        }
        if (!HALVES && roww > 1) {
            const int first = warp - warp % roww;
            if (lane == 0) team_amax[parity][warp] = amax, team_bad[parity][warp] = bad;
            asm volatile("bar.sync %0, %1;" ::"r"(1 + warp / roww), "r"(roww * 32) : "memory");
            for (int w2 = first; w2 < first + roww; w2++) amax = fmaxf(amax, team_amax[parity][w2]), bad |= team_bad[parity][w2];
            parity ^= 1; /* a team's next row writes the other slots: no second barrier */
        }
        float s = __fdiv_rn(amax, 127.0f);
        s = s > 1e-30f ? s : 1e-30f;
        float st = round_to(DT, s);
        if (st == 0.0f) st = rg_tiny(DT);
        const float rcp = __frcp_rn(st);
        const int64_t row = HALVES ? 2 * u + half : u;
        if (row >= m) return;
        int8_t *qrow = q + row * (int64_t)k;
#pragma unroll
        for (int p = 0; p < MAXPW; p++) {
            if (p >= pw) break;
            const int g = HALVES ? 0 : 2 * (p0 + p) + half;
            if (g < G) *(uint4 *)(qrow + g * 256 + i * 16) = bad ? make_uint4(0, 0, 0, 0) : rg_quantize16<DT>(vals[p], st, rcp);
        }
        if ((HALVES ? i : lane + p0) == 0) sx[row] = bad ? __int_as_float(0x7fc00000) : s;
    };

    /* two register buffers: one unit's loads in flight while the other's runs */
    uint4 ra[MAXPW][RAW], rb[MAXPW][RAW];
    int64_t u = ((int64_t)blockIdx.x * RG_WARPS + warp) / roww;
    load(u, ra);
    while (u < units) {
        load(u + nw, rb);
        run(u, ra);
        u += nw;
        if (u >= units) break;
        load(u + nw, ra);
        run(u, rb);
        u += nw;
    }
}

template <int DT, int MAXPW, bool HALVES> const void *rg_kernel()
{
    return (const void *)quantize_rows_g256_regs_kernel<DT, MAXPW, HALVES>;
}

template <int DT> constexpr int rg_maxpw() { return DT == DT_F32 ? 2 : 4; }

} // namespace

/* Team size for a row of k: the fewest warps whose share of the row's items
 * fits a warp's registers, more while the rows alone would not fill the
 * resident warps (small M), never more than a block's warps; 0: this kernel
 * cannot take the row (force: exactly that size, if it fits). */
int g256_regs_roww(int xdt, int64_t m, int64_t k, int64_t resident_warps, int force)
{
    if (k <= 0 || k % 256 || k > 8192) return 0;
    if (k == 256) return 1;
    const int items = (int)(k / 256 + 1) / 2, maxpw = xdt == DT_F32 ? 2 : 4;
    int roww = 1;
    while (roww <= RG_WARPS && (items % roww || items / roww > maxpw)) roww *= 2;
    if (roww > RG_WARPS) return 0;
    if (force) {
        if (force < roww || force > RG_WARPS || items % force) return 0;
        return force;
    }
    while (2 * roww <= RG_WARPS && items % (2 * roww) == 0 && m * 2 * roww <= resident_warps) roww *= 2;
    return roww;
}

static const void *rg_kernel_for(int xdt, bool halves)
{
    return xdt == DT_BF16 ? (halves ? rg_kernel<DT_BF16, 1, true>() : rg_kernel<DT_BF16, rg_maxpw<DT_BF16>(), false>())
           : xdt == DT_F16 ? (halves ? rg_kernel<DT_F16, 1, true>() : rg_kernel<DT_F16, rg_maxpw<DT_F16>(), false>())
                           : (halves ? rg_kernel<DT_F32, 1, true>() : rg_kernel<DT_F32, rg_maxpw<DT_F32>(), false>());
}

cudaError_t g256_regs_resident_blocks(int xdt, int64_t k, int sms, int *blocks)
{
    int per_sm = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rg_kernel_for(xdt, k == 256), RG_WARPS * 32, 0);
    *blocks = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
    return e;
}

cudaError_t launch_quantize_rows_g256_regs(const void *x, int xdt, int64_t ldx_bytes, int64_t m, int k, int roww,
                                           int8_t *q, float *sx, int resident_blocks, bool pdl, cudaStream_t stream)
{
    const bool halves = k == 256;
    const void *kern = rg_kernel_for(xdt, halves);
    const int64_t units = halves ? (m + 1) / 2 : m;
    int64_t blocks = (units * roww + RG_WARPS - 1) / RG_WARPS;
    if (blocks > resident_blocks) blocks = resident_blocks;
    if (blocks < 1) blocks = 1;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = launch_config(dim3((unsigned)blocks), dim3(RG_WARPS * 32), 0, stream, pdl, attr);
    auto fn = (void (*)(const char *, int64_t, int64_t, int, int, int8_t *, float *))kern;
    return cudaLaunchKernelEx(&cfg, fn, (const char *)x, ldx_bytes, m, k, roww, q, sx);
}

} // namespace qlc
