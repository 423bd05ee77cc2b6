/* The W8A8 prologue on the GPU: each activation row is read once, rotated
 * group-wise (fast Walsh–Hadamard transform, the reference's butterflies in
 * the reference's order), rounded to its dtype, reduced to its absmax and
 * quantized with the reference's roundings. Output: int8 codes [M, ldq]
 * (zero-padded to ldq, the GEMM's 16-byte row pitch) and fp32 scales [M];
 * with G = 256 each group's codes are stored 16x16-transposed (see
 * codes_permuted). Codes and scales bit-identical to ql_load_row_rotated +
 * ql_quantize_row_f32, except for bf16 rows in the G = 256 kernel with
 * QLINEAR_CUDA_PROLOGUE=mma, rotated on the tensor cores (rotate_g256_mma:
 * issue #25's rule, a code may move). */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"
#include "cuda_internal.h"
#include "input_act.cuh"
#include "rotate_g256.cuh"

namespace qlc {
namespace {

constexpr int PRO_THREADS = 128;

/* log4 of the group (0: no rotation). act: the input activation, applied
 * to each value as it is loaded (the row's rms_norm factor comes from the
 * pre-pass, act.rms). */
__global__ void __launch_bounds__(PRO_THREADS) quantize_rows_kernel(const char *x, int xdt, int64_t ldx_bytes,
                                                                     int64_t k, int log4g, bool vec, int8_t *q,
                                                                     int64_t ldq, float *sx, bool perm, InputAct act)
{
    extern __shared__ float v[]; /* the row, fp32, rotated in place */
    __shared__ float red_max[PRO_THREADS / 32];
    __shared__ int red_bad[PRO_THREADS / 32];
    const int64_t r = blockIdx.x;
    const char *row = x + r * ldx_bytes;
    const int tid = threadIdx.x;
    const float rfac = act.code == QL_INPUT_ACT_RMS_NORM ? act.rms[r] : 0.0f;
    const int64_t g = log4g ? (int64_t)1 << (2 * log4g) : 0;
    const float norm = log4g ? ldexpf(1.0f, -log4g) : 1.0f; /* 1/sqrt(G), exact */

    if (g == 256) {
        /* Stages of stride 1 and 4 in registers on 16 consecutive values... */
        for (int64_t c = tid; c < k / 16; c += PRO_THREADS) {
            float e[16];
            load16_act(act, xdt, row, rfac, k, c * 16, vec, e);
#pragma unroll
            for (int i = 0; i < 16; i++) e[i] = __fmul_rn(e[i], norm);
#pragma unroll
            for (int i = 0; i < 16; i += 4) bfly(e[i], e[i + 1], e[i + 2], e[i + 3]);
#pragma unroll
            for (int i = 0; i < 4; i++) bfly(e[i], e[i + 4], e[i + 8], e[i + 12]);
            float4 *dst = (float4 *)(v + c * 16);
#pragma unroll
            for (int i = 0; i < 4; i++) dst[i] = make_float4(e[4 * i], e[4 * i + 1], e[4 * i + 2], e[4 * i + 3]);
        }
        __syncthreads();
        /* ...then stride 16 and 64 on the 16 values j = base + i + 16·t. */
        for (int64_t c = tid; c < k / 16; c += PRO_THREADS) {
            float *p = v + (c / 16) * 256 + (c % 16);
            float e[16];
#pragma unroll
            for (int t = 0; t < 16; t++) e[t] = p[16 * t];
#pragma unroll
            for (int i = 0; i < 16; i += 4) bfly(e[i], e[i + 1], e[i + 2], e[i + 3]);
#pragma unroll
            for (int i = 0; i < 4; i++) bfly(e[i], e[i + 4], e[i + 8], e[i + 12]);
#pragma unroll
            for (int t = 0; t < 16; t++) p[16 * t] = e[t];
        }
    } else {
        for (int64_t j = tid; j < k; j += PRO_THREADS) v[j] = __fmul_rn(act_value(act, xdt, row, rfac, k, j), norm);
        /* Any other group: one butterfly per thread and stage, through shared memory. */
        for (int t = 0; t < log4g; t++) {
            const int64_t s = (int64_t)1 << (2 * t);
            __syncthreads();
            for (int64_t b = tid; b < k / 4; b += PRO_THREADS) {
                int64_t grp = b >> (2 * log4g - 2), idx = b & ((g >> 2) - 1);
                int64_t j = grp * g + (idx >> (2 * t)) * 4 * s + (idx & (s - 1));
                bfly(v[j], v[j + s], v[j + 2 * s], v[j + 3 * s]);
            }
        }
    }
    __syncthreads();

    /* Round to the dtype (the reference rotates in the operand's dtype), absmax. */
    float amax = 0.0f;
    int bad = 0;
    for (int64_t j = tid; j < k; j += PRO_THREADS) {
        float e = round_to(xdt, v[j]);
        v[j] = e;
        float m = fabsf(e);
        if (!(m <= 3.402823466e38f)) bad = 1;
        else amax = fmaxf(amax, m);
    }
    for (int o = 16; o; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if ((tid & 31) == 0) red_max[tid / 32] = amax, red_bad[tid / 32] = bad;
    __syncthreads();
    amax = 0.0f, bad = 0;
#pragma unroll
    for (int w = 0; w < PRO_THREADS / 32; w++) amax = fmaxf(amax, red_max[w]), bad |= red_bad[w];

    int8_t *qrow = q + r * ldq;
    if (bad) {
        for (int64_t j = tid; j < ldq; j += PRO_THREADS) qrow[j] = 0; /* zeros in any order */
        if (tid == 0) sx[r] = __int_as_float(0x7fc00000);
        return;
    }
    float s = __fdiv_rn(amax, 127.0f);
    s = s > 1e-30f ? s : 1e-30f;
    float st = round_to(xdt, s);
    if (st == 0.0f) st = tiny_of(xdt);
    /* bf16: a quotient of two bf16 values is never within 2^-17 of a bf16
     * rounding boundary, so x·RN(1/st) rounds to the same bf16 as x/st (the
     * argument and its adversarial test are the CPU prologue's). */
    const float rcp = __frcp_rn(st);
    for (int64_t j0 = (int64_t)tid * 4; j0 < ldq; j0 += PRO_THREADS * 4) {
        char4 out;
        signed char *o = (signed char *)&out;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int64_t j = j0 + i;
            float c = 0.0f;
            if (j < k) {
                float quo = xdt == DT_BF16 ? __fmul_rn(v[j], rcp) : __fdiv_rn(v[j], st);
                c = fminf(fmaxf(rintf(round_to(xdt, quo)), -128.0f), 127.0f);
            }
            o[i] = (signed char)(int)c;
            /* the fast kernel's order (K a multiple of 256 there) */
            if (perm) qrow[(j & ~(int64_t)255) + (j & 15) * 16 + ((j & 255) >> 4)] = o[i];
        }
        if (!perm) *(char4 *)(qrow + j0) = out;
    }
    if (tid == 0) sx[r] = s;
}


/* The fast path for G = 256 (K a multiple of 256, K <= 8192, 16-byte
 * aligned rows). Its codes come out permuted within each group of 256: the
 * code of value i + 16·t is stored at 16·i + t (the order this kernel holds
 * them in; the layer's weight is permuted alike, and a dot product does not
 * depend on the order of its terms). Warp-synchronous, no block barrier. A half-warp
 * rotates one group: lane i first holds values 16i..16i+15 (the stages of
 * stride 1 and 4 in registers), a transpose through the warp's shared
 * buffer gives it i + 16·t (strides 16 and 64). The rotated values, rounded
 * to the dtype with packed conversions, go to the warp's row buffer while
 * the absmax runs on packed pairs; once the row is complete the warp reads
 * it back in memory order, 16 values per lane, and writes 16 codes with one
 * store. A team of ROWW warps (1, 2 or 4, chosen by the launch so that
 * small M still fills the GPU) owns a row, each warp a contiguous share of
 * its groups, the absmax joined through shared memory at a named barrier
 * of the team (two rows per warp, one per half, when K = 256: ROWW = 1);
 * the next item's input is loaded while the current one is computed. */
constexpr int WP_WARPS = 4;
/* Row buffer: lane i of a group keeps its 16 rounded values (i + 16·t,
 * t = 0..15) contiguously, 16 bytes of padding after them so that a
 * quarter-warp's 16-byte accesses hit distinct banks. */
template <int ESZ> __host__ __device__ constexpr int lane_stride() { return 16 * ESZ + 16; }
/* items (pairs of groups) of a row, and a warp's share of them in a team of roww */
__host__ __device__ inline int wp_items(int k) { return k == 256 ? 1 : (k / 256 + 1) / 2; }
__host__ __device__ inline int wp_slots(int k, int roww) { return 2 * (wp_items(k) / roww); }
/* a warp's shared memory: the transpose buffers (none for the tensor-core rotation), then its row buffer */
template <int DT> __host__ __device__ inline size_t wp_warp_bytes(int k, int roww, bool mma)
{
    return (mma ? 0 : 2 * TB_HALF * sizeof(float)) + (size_t)wp_slots(k, roww) * 16 * lane_stride<DT == DT_F32 ? 4 : 2>();
}

/* ACT: the input activation (ql_input_act), a template parameter so that
 * the kernels without one are unchanged; swiglu's items carry the up half
 * too (twice the registers per item: half the items in flight).
 * MMA (bf16 only): the warp rotates both groups of an item on the tensor
 * cores (rotate_g256_mma) instead of a half-warp each by butterflies; its
 * lanes load 8-byte pieces (the MMA's operand order) and write the rounded
 * values to the same row buffer in the same order, so everything after the
 * rotation is shared. */
template <int DT, int ROWW, int ACT, bool MMA, bool AHEAD>
__global__ void __launch_bounds__(WP_WARPS * 32, 5) quantize_rows_g256_kernel(const char *x, int64_t ldx_bytes, int64_t m,
                                                                          int k, int8_t *q, float *sx, InputAct act)
{
    constexpr int roww = ROWW;
    /* Programmatic dependent launch: the GEMM may start its preamble now (it
     * waits for this grid's completion before reading the codes); it is
     * launched only once every block of this grid has started, so nothing
     * of this grid waits behind the GEMM's blocks. This grid itself may have
     * been launched while the kernel before it (the previous layer's GEMM,
     * which wrote x and read the codes' buffer) still runs: wait for it. */
    pdl_trigger();
    pdl_wait();
    using T = typename Stored<DT>::T;
    constexpr int RAW = raw_words<DT>();
    constexpr int ESZ = DT == DT_F32 ? 4 : 2;
    constexpr bool SWI = ACT == QL_INPUT_ACT_SWIGLU;
    constexpr int NRAW = SWI ? 2 * RAW : RAW; /* uint4 of an item: its 16 values (swiglu: gate, then up) */
    constexpr int DEPTH = (SWI ? 4 : 8) / ESZ; /* items loading while one is computed: 4 KiB per warp in flight */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, i = lane % 16;
    static_assert(!MMA || DT == DT_BF16, "the tensor-core rotation takes bf16 rows");
    unsigned char *mine = smem_raw + (size_t)warp * wp_warp_bytes<DT>(k, roww, MMA);
    __shared__ float team_amax[2][WP_WARPS]; /* by row parity: a row's reads end before row + 2 writes */
    __shared__ unsigned team_bad[2][WP_WARPS];
    float *tb = (float *)mine + half * TB_HALF; /* this half's transpose buffer */
    unsigned char *rbuf = mine + (MMA ? 0 : 2 * TB_HALF * sizeof(float));
    RotMma rc;
    if constexpr (MMA) rc = rot_mma_constants(lane);
    constexpr int LS = lane_stride<ESZ>(), SLOT = 16 * LS; /* bytes: a lane's values, a group's */
    const int G = k / 256;
    const bool halves = G == 1; /* K = 256: a row per half-warp */
    const int PW = wp_items(k) / roww, p0 = warp % roww * PW; /* this warp's items of a row */
    const int64_t units = halves ? (m + 1) / 2 : m, gw = ((int64_t)blockIdx.x * WP_WARPS + warp) / roww,
                  nw = (int64_t)gridDim.x * WP_WARPS / roww;
    int parity = 0;

    /* item (u, p): the row and group this lane's half rotates; zeros where there is none */
    auto load = [&](int64_t u, int p, uint4 (&r)[NRAW]) {
        if constexpr (MMA) {
            /* both groups (h = 0, 1): r[h] = X_h[g + 8t][4q..4q+3] for t = 0, 1 (swiglu: the up half's in r[2 + h]) */
            const int gq = lane >> 2, q = lane & 3;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t row = halves ? 2 * u + h : u;
                const int g = halves ? 0 : 2 * p + h;
#pragma unroll
                for (int j = 0; j < NRAW / 2; j++) r[2 * j + h] = make_uint4(0, 0, 0, 0);
                if (row < m && g < G) {
                    const char *src = x + row * ldx_bytes + (size_t)(g * 256 + 16 * gq + 4 * q) * ESZ;
#pragma unroll
                    for (int j = 0; j < NRAW / 2; j++) { /* j = 1: swiglu's up half, k values on */
                        const uint2 *s = (const uint2 *)(src + (size_t)j * k * ESZ);
                        const uint2 t0 = __ldcs(s), t1 = __ldcs((const uint2 *)((const char *)s + 128 * ESZ)); /* rows a, a + 8 */
                        r[2 * j + h] = make_uint4(t0.x, t0.y, t1.x, t1.y);
                    }
                }
            }
            return;
        }
        const int64_t row = halves ? 2 * u + half : u;
        const int g = halves ? 0 : 2 * p + half;
        if (row < m && g < G) {
            const uint4 *src = (const uint4 *)(x + row * ldx_bytes + (size_t)(g * 256 + i * 16) * ESZ);
#pragma unroll
            for (int j = 0; j < RAW; j++) r[j] = __ldcs(src + j);
            if constexpr (SWI) { /* the up half, k values on (k·ESZ is a multiple of 16 bytes) */
                const uint4 *up = (const uint4 *)((const char *)src + (size_t)k * ESZ);
#pragma unroll
                for (int j = 0; j < RAW; j++) r[RAW + j] = __ldcs(up + j);
            }
        } else {
#pragma unroll
            for (int j = 0; j < NRAW; j++) r[j] = make_uint4(0, 0, 0, 0);
        }
    };

    /* gelu_tanh / swiglu's silu by table one item ahead (AHEAD): the raw
     * words of a 16-bit row are the table's indices. look issues an item's
     * 16 lookups, settle puts the activated values in its raw words (zero
     * padding stays zero: both functions map +0 to +0). */
    constexpr bool ahead = AHEAD; /* launched only with act.tab */
    static_assert(!AHEAD || (!MMA && DT != DT_F32 && (ACT == QL_INPUT_ACT_GELU_TANH || SWI) && DEPTH >= 2),
                  "lookups ahead: gelu_tanh or swiglu by table on 16-bit rows");
    auto look = [&](const uint4 (&r)[NRAW], uint32_t (&pd)[16]) {
        const uint32_t *w = (const uint32_t *)r;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            pd[2 * t] = __ldg(act.tab + (w[t] & 0xffffu));
            pd[2 * t + 1] = __ldg(act.tab + (w[t] >> 16));
        }
    };
    auto settle = [&](uint4 (&r)[NRAW], const uint32_t (&pd)[16]) {
        uint32_t *w = (uint32_t *)r;
        if constexpr (SWI) {
            float sv[16], up[16];
#pragma unroll
            for (int t = 0; t < 8; t++) {
                sv[2 * t] = DT == DT_BF16 ? __uint_as_float(pd[2 * t] << 16) : __half2float(__ushort_as_half((uint16_t)pd[2 * t]));
                sv[2 * t + 1] =
                    DT == DT_BF16 ? __uint_as_float(pd[2 * t + 1] << 16) : __half2float(__ushort_as_half((uint16_t)pd[2 * t + 1]));
            }
            unpack16<DT>(r + RAW, up);
#pragma unroll
            for (int t = 0; t < 8; t++) {
                const float a0 = round_to(DT, __fmul_rn(sv[2 * t], up[2 * t]));
                const float a1 = round_to(DT, __fmul_rn(sv[2 * t + 1], up[2 * t + 1]));
                w[t] = DT == DT_BF16 ? (__float_as_uint(a0) >> 16) | (__float_as_uint(a1) & 0xffff0000u)
                                     : (uint32_t)__half_as_ushort(__float2half_rn(a0)) |
                                           (uint32_t)__half_as_ushort(__float2half_rn(a1)) << 16;
            }
        } else {
#pragma unroll
            for (int t = 0; t < 8; t++) w[t] = pd[2 * t] | pd[2 * t + 1] << 16;
        }
    };

    /* running absmax of the row: packed pairs for 16-bit dtypes, a float for fp32 */
    __nv_bfloat162 amax_b = __float2bfloat162_rn(0.0f), amax_b2 = amax_b; /* amax_b2: the second row, MMA with K = 256 */
    __half2 amax_h = __float2half2_rn(0.0f);
    float amax_f = 0.0f;
    unsigned bad_f = 0;

    auto process = [&](const uint4 (&raw)[NRAW], const int64_t u, const int p) {
        if constexpr (MMA) {
            const int gq = lane >> 2, q = lane & 3;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint2 xt[2] = {make_uint2(raw[h].x, raw[h].y), make_uint2(raw[h].z, raw[h].w)};
                if constexpr (ACT != QL_INPUT_ACT_NONE) {
                    const int64_t row = halves ? 2 * u + h : u;
                    const int g = halves ? 0 : 2 * p + h;
                    if (row < m && g < G) { /* padding stays zeros, as below */
                        const float r = ACT == QL_INPUT_ACT_RMS_NORM ? act.rms[row] : 0.0f;
#pragma unroll
                        for (int t = 0; t < 2; t++) {
                            float e4[4], up4[4];
                            unpack4_bf16(xt[t], e4);
                            if constexpr (SWI) unpack4_bf16(t ? make_uint2(raw[2 + h].z, raw[2 + h].w)
                                                              : make_uint2(raw[2 + h].x, raw[2 + h].y), up4);
                            activate<4>(ACT, act, DT, e4, SWI ? up4 : e4, r, (int64_t)g * 256 + 16 * (gq + 8 * t) + 4 * q);
                            xt[t] = make_uint2(pack_bf16x2(e4[0], e4[1]), pack_bf16x2(e4[2], e4[3])); /* exact: bf16 values */
                        }
                    }
                }
                uint32_t y[4];
                rotate_g256_mma(rc, xt, y);
                /* value 16a' + b' at b'·LS + 2a': this lane's words at b' = 2q + e + 8u, a' = 2gq */
                unsigned char *slot = rbuf + (halves ? h : 2 * (p - p0) + h) * SLOT + 4 * gq;
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    *(uint32_t *)(slot + (2 * q + (w & 1) + 8 * (w >> 1)) * LS) = y[w];
                    const __nv_bfloat162 v = *(const __nv_bfloat162 *)&y[w];
                    if (halves && h) amax_b2 = __hmax2_nan(amax_b2, __habs2(v));
                    else amax_b = __hmax2_nan(amax_b, __habs2(v));
                }
            }
        } else {
        float e[16];
        unpack16<DT>(raw, e);
        if constexpr (ACT != QL_INPUT_ACT_NONE) {
            /* the activation of a real item (padding stays zeros: rms_norm's 0·Inf would poison the row) */
            const int64_t row = halves ? 2 * u + half : u;
            const int g = halves ? 0 : 2 * p + half;
            if (row < m && g < G && !ahead) {
                float up[16];
                if constexpr (SWI) unpack16<DT>(raw + RAW, up);
                const float r = ACT == QL_INPUT_ACT_RMS_NORM ? act.rms[row] : 0.0f;
                activate<16>(ACT, act, DT, e, SWI ? up : e, r, (int64_t)g * 256 + i * 16);
            }
        }
        rotate16_g256(e, tb, i);

        /* round to the dtype, absmax, keep this lane's 16 values together:
         * the codes leave in this order (i·16 + t within the group), and the
         * weight was permuted the same way at upload */
        unsigned char *mine_vals = rbuf + (halves ? half : 2 * (p - p0) + half) * SLOT + i * LS;
        uint32_t packed[8];
#pragma unroll
        for (int t = 0; t < 16; t += 2) {
            if constexpr (DT == DT_BF16) {
                const __nv_bfloat162 v = __floats2bfloat162_rn(e[t], e[t + 1]); /* NaN stays NaN */
                amax_b = __hmax2_nan(amax_b, __habs2(v));
                packed[t / 2] = *(const uint32_t *)&v;
            } else if constexpr (DT == DT_F16) {
                const __half2 v = __floats2half2_rn(e[t], e[t + 1]);
                amax_h = __hmax2_nan(amax_h, __habs2(v));
                packed[t / 2] = *(const uint32_t *)&v;
            } else {
                const float a0 = fabsf(e[t]), a1 = fabsf(e[t + 1]);
                bad_f |= (a0 != a0) | (a1 != a1);
                amax_f = fmaxf(amax_f, fmaxf(a0, a1));
            }
        }
        if constexpr (DT == DT_F32) {
#pragma unroll
            for (int t = 0; t < 4; t++)
                ((float4 *)mine_vals)[t] = make_float4(e[4 * t], e[4 * t + 1], e[4 * t + 2], e[4 * t + 3]);
        } else {
            ((uint4 *)mine_vals)[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
            ((uint4 *)mine_vals)[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
        }
        }

        if (p == p0 + PW - 1) {
            /* the row (each half's row when K = 256) is complete */
            if (MMA && halves) {
                /* every lane holds values of both rows: each row's absmax over the warp, each half keeps its own */
#pragma unroll
                for (int o = 16; o; o >>= 1) {
                    const uint32_t a0 = __shfl_xor_sync(0xffffffffu, *(const uint32_t *)&amax_b, o),
                                   a1 = __shfl_xor_sync(0xffffffffu, *(const uint32_t *)&amax_b2, o);
                    amax_b = __hmax2_nan(amax_b, *(const __nv_bfloat162 *)&a0);
                    amax_b2 = __hmax2_nan(amax_b2, *(const __nv_bfloat162 *)&a1);
                }
                if (half) amax_b = amax_b2;
            }
            float amax;
            if constexpr (DT == DT_BF16) amax = fmaxf(__low2float(amax_b), __high2float(amax_b));
            else if constexpr (DT == DT_F16) amax = fmaxf(__low2float(amax_h), __high2float(amax_h));
            else amax = amax_f;
            unsigned bad = bad_f;
            if constexpr (DT != DT_F32) {
                const float lo = DT == DT_BF16 ? __low2float(amax_b) : __low2float(amax_h);
                const float hi = DT == DT_BF16 ? __high2float(amax_b) : __high2float(amax_h);
                bad = (lo != lo) | (hi != hi);
            }
            bad |= !(amax <= 3.402823466e38f) && amax == amax; /* ±Inf */
#pragma unroll
            for (int o = 16; o; o >>= 1) {
                if (halves && o == 16) continue;
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
                bad |= __shfl_xor_sync(0xffffffffu, bad, o);
            }
            if (roww > 1) {
                const int first = warp - warp % roww;
                if (lane == 0) team_amax[parity][warp] = amax, team_bad[parity][warp] = bad;
                asm volatile("bar.sync %0, %1;" ::"r"(1 + warp / roww), "r"(roww * 32) : "memory");
                for (int w = first; w < first + roww; w++)
                    amax = fmaxf(amax, team_amax[parity][w]), bad |= team_bad[parity][w];
                parity ^= 1;
            }
            float s, st, rcp;
            row_scale<DT>(amax, s, st, rcp);
            const int64_t row = halves ? 2 * u + half : u;
            __syncwarp(); /* the row buffer is complete */
            if (row < m) {
                int8_t *qrow = q + row * (int64_t)k;
                /* this warp's chunks of 16 codes: its groups 2·p0 ... */
                const int c0 = halves ? i : 32 * p0 + lane, cstep = halves ? 16 : 32,
                          cend = halves ? 16 : min(k / 16, 32 * (p0 + PW));
                for (int c = c0; c < cend; c += cstep) {
                    const T *v = (const T *)(rbuf + (halves ? half : c / 16 - 2 * p0) * SLOT + (c % 16) * LS);
                    *(uint4 *)(qrow + c * 16) = bad ? make_uint4(0, 0, 0, 0) : quantize16<DT>(v, st, rcp);
                }
                if ((halves ? i : lane + p0) == 0) sx[row] = bad ? __int_as_float(0x7fc00000) : s;
            }
            __syncwarp(); /* read back before the next row overwrites it */
            amax_b = amax_b2 = __float2bfloat162_rn(0.0f), amax_h = __float2half2_rn(0.0f), amax_f = 0.0f, bad_f = 0;
        }
    };

    /* Items in order (u, 0..P-1), u = gw, gw + nw, ...; DEPTH of them in
     * flight as register loads (the loop over d is unrolled so that each
     * buffer is a fixed set of registers). With `ahead` the next item's
     * table lookups are issued before the current item is processed and
     * used after it (its raw words become the activated values), so their
     * latency hides under the rotation. */
    auto advance = [&](int64_t &uu, int &pp) {
        if (++pp == p0 + PW) pp = p0, uu += nw;
    };
    uint4 raw[DEPTH][NRAW];
    uint32_t pend[16]; /* ahead: the next item's looked-up values (16-bit patterns) */
    int64_t lu = gw, u = gw; /* the next item to load, the item to process */
    int lp = p0, p = p0;
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
        if (lu < units) load(lu, lp, raw[d]);
        advance(lu, lp);
    }
    if (ahead) look(raw[0], pend), settle(raw[0], pend);
    while (u < units) {
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            if (u >= units) break;
            uint4 cur[NRAW];
#pragma unroll
            for (int j = 0; j < NRAW; j++) cur[j] = raw[d][j];
            if (lu < units) load(lu, lp, raw[d]);
            advance(lu, lp);
            if (ahead) look(raw[(d + 1) % DEPTH], pend);
            process(cur, u, p);
            if (ahead) settle(raw[(d + 1) % DEPTH], pend);
            advance(u, p);
        }
    }
}


/* Warps per row: as many as keep every team's row in one wave of resident
 * warps (small M: a row per warp would leave most of the GPU idle, each
 * warp waiting on its own loads); a divisor of the row's items. `force`
 * (1, 2, 4; 0 = choose) caps it instead, for tests and measurements. */
static int pick_roww(int64_t m, int k, int64_t resident_warps, int force)
{
    const int items = wp_items(k);
    if (k == 256) return 1;
    int roww = 1;
    while (roww < WP_WARPS && items % (2 * roww) == 0 && (force ? 2 * roww <= force : m * 2 * roww <= resident_warps))
        roww *= 2;
    return roww;
}

/* With an input activation, the team size that keeps the most warps
 * resident (ties: the smaller team): an activated item takes longer between
 * its loads, and a long row's buffers (one warp a row: 98 KB a block at
 * K = 8192, two blocks an SM) leave too few warps to hide it. resident:
 * blocks per team size 1, 2, 4. */
static int occupancy_roww(int k, const int (&resident)[3])
{
    const int items = wp_items(k);
    int roww = 1, best = 0;
    if (k == 256) return 1;
    for (int r = 1, rw = 2; rw <= WP_WARPS; r++, rw *= 2)
        if (items % (2 * rw) == 0 && resident[r] > resident[best]) best = r, roww = rw;
    return roww;
}

/* The kernels of a dtype and rotation: [input activation][team size 1, 2, 4]. */
template <int DT, int ACT, bool MMA, bool AHEAD = false> void *const *g256_kernels_act()
{
    static void *const k[3] = {(void *)quantize_rows_g256_kernel<DT, 1, ACT, MMA, AHEAD>,
                               (void *)quantize_rows_g256_kernel<DT, 2, ACT, MMA, AHEAD>,
                               (void *)quantize_rows_g256_kernel<DT, 4, ACT, MMA, AHEAD>};
    return k;
}
/* act: a ql_input_act code, or QLC_ACT_*_AHEAD (16-bit rows, butterflies only; for other dtypes and the tensor-core
 * rotation the plain kernels, never launched) */
template <int DT, bool MMA> const void *g256_kernel(int act, int r)
{
    constexpr bool CAN = DT != DT_F32 && !MMA;
    switch (act) {
    case QLC_ACT_GELU_AHEAD: return g256_kernels_act<DT, QL_INPUT_ACT_GELU_TANH, MMA, CAN>()[r];
    case QLC_ACT_SWIGLU_AHEAD: return g256_kernels_act<DT, QL_INPUT_ACT_SWIGLU, MMA, CAN>()[r];
    case QL_INPUT_ACT_GELU_TANH: return g256_kernels_act<DT, QL_INPUT_ACT_GELU_TANH, MMA>()[r];
    case QL_INPUT_ACT_SWIGLU: return g256_kernels_act<DT, QL_INPUT_ACT_SWIGLU, MMA>()[r];
    case QL_INPUT_ACT_RMS_NORM: return g256_kernels_act<DT, QL_INPUT_ACT_RMS_NORM, MMA>()[r];
    default: return g256_kernels_act<DT, QL_INPUT_ACT_NONE, MMA>()[r];
    }
}

/* The shared-memory limit of each kernel raised to what the largest fast
 * row (K = 8192) needs, and the resident blocks at this K (per input
 * activation: their register counts differ). */
template <int DT, bool MMA> cudaError_t fit_g256(int k, int sms, int (&resident)[QLC_KERNEL_ACTS][3])
{
    for (int a = 0; a < QLC_KERNEL_ACTS; a++)
        for (int r = 0; r < 3; r++) {
            const void *kern = g256_kernel<DT, MMA>(a, r);
            cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)(WP_WARPS * wp_warp_bytes<DT>(8192, 1 << r, MMA)));
            if (e != cudaSuccess) return e;
            int per_sm = 0;
            if (k % 256 == 0 && k > 0 && k <= 8192)
                e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, WP_WARPS * 32,
                                                                  WP_WARPS * wp_warp_bytes<DT>(k, 1 << r, MMA));
            if (e != cudaSuccess) return e;
            resident[a][r] = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
        }
    return cudaSuccess;
}

template <int DT, bool MMA> cudaError_t launch_g256(const void *x, int64_t ldx_bytes, int64_t m, int k, const InputAct &act,
                                          int8_t *q, float *sx, int force_roww, const int (&resident)[QLC_KERNEL_ACTS][3],
                                          bool pdl, cudaStream_t stream)
{
    int a = act.code; /* the kernel set: the activation, or its table lookups ahead */
    if (DT != DT_F32 && !MMA && act.ahead && act.tab) {
        if (a == QL_INPUT_ACT_GELU_TANH) a = QLC_ACT_GELU_AHEAD;
        else if (a == QL_INPUT_ACT_SWIGLU) a = QLC_ACT_SWIGLU_AHEAD;
    }
    int roww = pick_roww(m, k, (int64_t)resident[a][0] * WP_WARPS, force_roww);
    if (a != QL_INPUT_ACT_NONE && !force_roww) {
        const int occ = occupancy_roww(k, resident[a]);
        if (occ > roww) roww = occ;
    }
    const int r = roww == 1 ? 0 : roww == 2 ? 1 : 2;
    const int64_t units = k == 256 ? (m + 1) / 2 : m;
    int64_t blocks = (units * roww + WP_WARPS - 1) / WP_WARPS;
    if (blocks > resident[a][r]) blocks = resident[a][r];
    auto kern = (void (*)(const char *, int64_t, int64_t, int, int8_t *, float *, InputAct))g256_kernel<DT, MMA>(a, r);
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = launch_config(dim3((unsigned)blocks), dim3(WP_WARPS * 32),
                                           WP_WARPS * wp_warp_bytes<DT>(k, roww, MMA), stream, pdl, attr);
    return cudaLaunchKernelEx(&cfg, kern, (const char *)x, ldx_bytes, m, k, q, sx, act);
}

/* rms_norm's pre-pass: a block per row computes the row's factor
 * 1/sqrt(Σx²/k + eps) into out[row] (rms_sum_squares_block: its warps
 * share the row's 16-block partials). A pass of its own because every
 * value of a row needs it before the rotation, and the fast kernel streams
 * a row through once (it holds only rotated values); one extra read of X,
 * for rms_norm layers only, which the fast kernel's read then finds in L2
 * where X is small. */
constexpr int RMS_WARPS = 4;
__global__ void __launch_bounds__(RMS_WARPS * 32) rms_factors_kernel(const char *x, int xdt, int64_t ldx_bytes,
                                                                      int64_t k, float eps, float *out)
{
    __shared__ float part[RMS_PARTS * 32];
    /* as the fast prologue: the next kernel may launch now (it waits for this
     * grid); wait for the kernel that wrote x */
    pdl_trigger();
    pdl_wait();
    const int64_t row = blockIdx.x;
    const float s = rms_sum_squares_block(xdt, x + row * ldx_bytes, k, part);
    if (threadIdx.x == 0) out[row] = rms_factor(s, k, eps);
}

} // namespace

int log4_of(int64_t g)
{
    int p = 0;
    while (g > 1) g /= 4, p++;
    return p;
}

int prologue_form_from_env()
{
    const char *v = getenv("QLINEAR_CUDA_PROLOGUE");
    return v && !strcmp(v, "exact") ? PROLOGUE_EXACT : v && !strcmp(v, "mma") ? PROLOGUE_MMA : PROLOGUE_AUTO;
}

bool codes_permuted(int64_t k, int64_t group, int64_t ldq) { return group == 256 && k % 256 == 0 && k > 0 && ldq == k; }

static bool fast_ok(int64_t k, int64_t group, int64_t ldq) { return codes_permuted(k, group, ldq) && k <= 8192; }

size_t quantize_rows_smem(int64_t k)
{
    const size_t bytes = (size_t)k * sizeof(float);
    return bytes <= 200u * 1024u ? (bytes ? bytes : 4) : 0;
}

cudaError_t prepare_quantize_rows(int64_t k, PrologueFit *fit)
{
    /* the generic kernel's limit raised to the most any row may use */
    cudaError_t e = cudaFuncSetAttribute(quantize_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)quantize_rows_smem(51200));
    int dev = 0, sms = 0, major = 0;
    if (e == cudaSuccess) e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    fit->pdl = major >= 9;
    if (e == cudaSuccess) e = fit_g256<DT_F32, false>((int)k, sms, fit->resident[0]);
    if (e == cudaSuccess) e = fit_g256<DT_F16, false>((int)k, sms, fit->resident[1]);
    if (e == cudaSuccess) e = fit_g256<DT_BF16, false>((int)k, sms, fit->resident[2]);
    if (e == cudaSuccess) e = fit_g256<DT_BF16, true>((int)k, sms, fit->resident[3]);
    return e;
}

cudaError_t launch_rms_factors(const void *x, int xdt, int64_t ldx, int64_t m, int64_t k, float eps, float *out,
                               bool pdl, cudaStream_t stream)
{
    if (m == 0) return cudaSuccess;
    const int esize = xdt == DT_F32 ? 4 : 2;
    const int64_t groups = k / 512; /* the row's 16-block partials: a warp each, up to RMS_WARPS */
    const int warps = groups < 1 ? 1 : groups < RMS_WARPS ? (int)groups : RMS_WARPS;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = launch_config(dim3((unsigned)m), dim3(warps * 32), 0, stream, pdl, attr);
    return cudaLaunchKernelEx(&cfg, rms_factors_kernel, (const char *)x, xdt, ldx * esize, k, eps, out);
}

cudaError_t launch_quantize_rows(const void *x, int xdt, int64_t ldx, int64_t m, int64_t k, int64_t group,
                                 const InputAct &act, int8_t *q, int64_t ldq, float *sx, int force_roww, int form,
                                 const PrologueFit &fit, cudaStream_t stream)
{
    if (act.code < 0 || act.code >= QLC_INPUT_ACTS) return cudaErrorInvalidValue;
    const int esize = xdt == DT_F32 ? 4 : 2;
    if (act.code == QL_INPUT_ACT_RMS_NORM) {
        cudaError_t e = launch_rms_factors(x, xdt, ldx, m, k, act.eps, act.rms, fit.pdl, stream);
        if (e != cudaSuccess) return e;
    }
    /* swiglu's up half starts k values into the row: 16-byte aligned wherever k is a multiple of 256 (the fast
     * kernel's); the generic kernel checks it itself */
    const bool vec = ((uintptr_t)x % 16 == 0) && ((ldx * esize) % 16 == 0);
    if (vec && fast_ok(k, group, ldq)) {
        /* auto: gelu_tanh's and swiglu's lookups one item ahead on bf16 rows
         * (measured faster; fp16's variant spills registers and was not
         * measured); ahead: on fp16 rows too; table or computed: never */
        const int form = act_form();
        InputAct a = act;
        a.ahead = form == QLC_ACT_AHEAD || (form == QLC_ACT_AUTO && xdt == DT_BF16);
        if (xdt == DT_BF16 && form == PROLOGUE_MMA)
            return launch_g256<DT_BF16, true>(x, ldx * esize, m, (int)k, a, q, sx, force_roww, fit.resident[3],
                                              fit.pdl, stream);
        if (xdt == DT_BF16)
            return launch_g256<DT_BF16, false>(x, ldx * esize, m, (int)k, a, q, sx, force_roww, fit.resident[2],
                                               fit.pdl, stream);
        if (xdt == DT_F16)
            return launch_g256<DT_F16, false>(x, ldx * esize, m, (int)k, a, q, sx, force_roww, fit.resident[1],
                                              fit.pdl, stream);
        return launch_g256<DT_F32, false>(x, ldx * esize, m, (int)k, a, q, sx, force_roww, fit.resident[0], fit.pdl,
                                          stream);
    }
    quantize_rows_kernel<<<(unsigned)m, PRO_THREADS, quantize_rows_smem(k), stream>>>(
        (const char *)x, xdt, ldx * esize, k, log4_of(group), vec, q, ldq, sx, codes_permuted(k, group, ldq), act);
    return cudaGetLastError();
}

} // namespace qlc
