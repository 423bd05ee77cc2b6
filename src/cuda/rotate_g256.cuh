/* The G = 256 rotation and quantization of a half-warp, shared by the
 * prologue kernel and the GEMV that quantizes its own rows: the reference's
 * butterflies in the reference's order (ql_fwht_f32) and its roundings, so
 * every kernel that uses these pieces writes the same codes and scales. */
#pragma once
#include "common.cuh"

namespace qlc {

/* One radix-4 butterfly, exactly ql_fwht_f32's. */
__device__ __forceinline__ void bfly(float &a, float &b, float &c, float &d)
{
    float t0 = __fadd_rn(a, b), t1 = __fadd_rn(c, d), t2 = __fsub_rn(a, b), t3 = __fsub_rn(c, d);
    a = __fadd_rn(t0, t3);
    b = __fsub_rn(t0, t3);
    c = __fadd_rn(t1, t2);
    d = __fsub_rn(t1, t2);
}

/* The smallest positive normal of the dtype: a scale that rounds to zero there. */
__device__ __forceinline__ float tiny_of(int dt) { return dt == DT_F16 ? 6.103515625e-05f : 1.17549435e-38f; }

/* How a rotated value is kept between the row's absmax and its code: the
 * dtype's bits (16-bit dtypes) or the fp32 value. */
template <int DT> struct Stored { using T = uint16_t; };
template <> struct Stored<DT_F32> { using T = float; };
template <int DT> __host__ __device__ constexpr int raw_words() { return DT == DT_F32 ? 4 : 2; } /* uint4 per 16 values */

/* The transpose buffer of a half-warp: lane i's 16 values at 20·i (a pitch
 * that spreads a quarter-warp's 16-byte stores over all 32 banks), the
 * second half of a warp 336 floats on (16 banks over, for the column reads). */
constexpr int TB_PITCH = 20, TB_HALF = 336;

/* 16 input values (raw words, 16-byte loads) -> fp32. */
template <int DT> __device__ __forceinline__ void unpack16(const uint4 *words, float (&e)[16])
{
    if constexpr (DT == DT_F32) {
        const float *f = (const float *)words;
#pragma unroll
        for (int t = 0; t < 16; t++) e[t] = f[t];
    } else {
        const uint32_t *w = (const uint32_t *)words;
#pragma unroll
        for (int t = 0; t < 8; t++) {
            if constexpr (DT == DT_BF16) {
                e[2 * t] = __uint_as_float(w[t] << 16);
                e[2 * t + 1] = __uint_as_float(w[t] & 0xffff0000u);
            } else {
                e[2 * t] = __half2float(__ushort_as_half((uint16_t)(w[t] & 0xffff)));
                e[2 * t + 1] = __half2float(__ushort_as_half((uint16_t)(w[t] >> 16)));
            }
        }
    }
}

/* A group of 256 rotated by a half-warp: lane i enters with values
 * 16i..16i+15 and leaves with values i + 16·t (t = 0..15), rotated. The
 * stages of stride 1 and 4 run in registers, a transpose through the
 * half's buffer tb (16 x TB_PITCH floats, 16-byte aligned) gives the
 * strides 16 and 64. Every lane of the warp calls it (__syncwarp). */
__device__ __forceinline__ void rotate16_g256(float (&e)[16], float *tb, int i)
{
#pragma unroll
    for (int t = 0; t < 16; t++) e[t] = __fmul_rn(e[t], 0.0625f); /* 1/sqrt(256), before the sums as the reference */
#pragma unroll
    for (int t = 0; t < 16; t += 4) bfly(e[t], e[t + 1], e[t + 2], e[t + 3]);
#pragma unroll
    for (int t = 0; t < 4; t++) bfly(e[t], e[t + 4], e[t + 8], e[t + 12]);
#pragma unroll
    for (int t = 0; t < 4; t++)
        ((float4 *)(tb + i * TB_PITCH))[t] = make_float4(e[4 * t], e[4 * t + 1], e[4 * t + 2], e[4 * t + 3]);
    __syncwarp();
#pragma unroll
    for (int t = 0; t < 16; t++) e[t] = tb[t * TB_PITCH + i]; /* value i + 16·t: lane t's value i */
    __syncwarp(); /* the transpose buffer is free for the next group */
#pragma unroll
    for (int t = 0; t < 16; t += 4) bfly(e[t], e[t + 1], e[t + 2], e[t + 3]);
#pragma unroll
    for (int t = 0; t < 4; t++) bfly(e[t], e[t + 4], e[t + 8], e[t + 12]);
}

/* A row's scale from its absmax (the rounded values'), and the divisor's
 * dtype value st and its reciprocal: the reference's arithmetic. */
template <int DT> __device__ __forceinline__ void row_scale(float amax, float &s, float &st, float &rcp)
{
    s = __fdiv_rn(amax, 127.0f);
    s = s > 1e-30f ? s : 1e-30f;
    st = round_to(DT, s);
    if (st == 0.0f) st = tiny_of(DT);
    rcp = __frcp_rn(st);
}

/* 16 stored values (their raw words: bf16/fp16 bits in pairs, or fp32) ->
 * 16 codes, the reference's roundings. bf16: a quotient of two bf16 values
 * is never within 2^-17 of a bf16 rounding boundary, so x·RN(1/st) rounds to
 * the same bf16 as x/st (the argument and its adversarial test are the CPU
 * prologue's). */
template <int DT> __device__ __forceinline__ uint4 quantize16_words(const uint4 (&raw)[raw_words<DT>()], float st, float rcp)
{
    const uint32_t *w = (const uint32_t *)raw;
    uint32_t out[4], pair = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t b[4];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const int i = 4 * j + t; /* value i: word i/2, half i%2 (16-bit dtypes) */
            float quo;
            if constexpr (DT == DT_BF16) {
                /* a pair at a time: one packed RNE conversion for two quotients */
                if (i % 2 == 0) {
                    const float e0 = __uint_as_float(w[i / 2] << 16), e1 = __uint_as_float(w[i / 2] & 0xffff0000u);
                    const __nv_bfloat162 h = __floats2bfloat162_rn(__fmul_rn(e0, rcp), __fmul_rn(e1, rcp));
                    pair = *(const uint32_t *)&h;
                }
                quo = __uint_as_float(i % 2 ? pair & 0xffff0000u : pair << 16);
            } else if constexpr (DT == DT_F16) {
                const float e = __half2float(__ushort_as_half((uint16_t)(i % 2 ? w[i / 2] >> 16 : w[i / 2] & 0xffff)));
                quo = __half2float(__float2half_rn(__fdiv_rn(e, st)));
            } else {
                quo = __fdiv_rn(__uint_as_float(w[i]), st);
            }
            /* |quo| <= 127.5 by construction: only the top needs the clamp;
             * 1.5·2^23 rounds to an integer whose low byte is the code */
            b[t] = __float_as_uint(__fadd_rn(fminf(quo, 127.0f), 12582912.0f));
        }
        out[j] = __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

/* The same from shared memory (16-byte aligned): read as 16-byte words,
 * element loads would be 16 instructions with 4-way bank conflicts. */
template <int DT> __device__ __forceinline__ uint4 quantize16(const typename Stored<DT>::T *v, float st, float rcp)
{
    uint4 raw[raw_words<DT>()];
#pragma unroll
    for (int j = 0; j < raw_words<DT>(); j++) raw[j] = ((const uint4 *)v)[j];
    return quantize16_words<DT>(raw, st, rcp);
}

/* A block's scratch for quantize_row_g256 (in shared memory). */
template <int ROT> struct RowScratch {
    float tb[ROT * 2 * TB_HALF]; /* each rotating half-warp's transpose buffer */
    float amax[ROT];
    unsigned bad[ROT];
    float sx; /* the row's scale, NaN for a row with NaN or Inf */
};

/* Groups a rotating half-warp keeps in registers between the row's absmax
 * and its codes (K <= row_hold·2·ROT·256); longer rows are rotated twice. */
template <int DT> __host__ __device__ constexpr int row_hold() { return DT == DT_F32 ? 1 : 2; }

/* One row of x (K = 256·G values of dtype DT, 16-byte aligned) rotated and
 * quantized by the block's first ROT warps, a half-warp per group, with the
 * prologue kernel's arithmetic (the same codes and scale). store(g, i, c)
 * receives lane i's 16 codes of group g (value i + 16·t in byte t) for every
 * group; sc.sx the scale. Every thread of the block calls it; the codes and
 * sc.sx are visible to the whole block when it returns. */
template <int DT, int ROT, class Store>
__device__ __forceinline__ void quantize_row_g256(const char *x, int k, RowScratch<ROT> &sc, Store &&store)
{
    constexpr int RAW = raw_words<DT>(), ESZ = DT == DT_F32 ? 4 : 2, HOLD = row_hold<DT>();
    constexpr int STEP = 2 * ROT; /* groups rotated at once */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, i = lane % 16;
    const bool rot = warp < ROT; /* the others wait for the codes */
    float *tb = sc.tb + (2 * (warp % ROT) + half) * TB_HALF;
    const int G = k / 256;
    const bool held = G <= HOLD * STEP; /* one pass: every group stays in its half-warp's registers */
    /* group g (lane i: values 16i..16i+15), zeros past the last group */
    auto load_group = [&](int g, uint4 (&raw)[RAW]) {
        if (g < G) {
            const uint4 *src = (const uint4 *)(x + (size_t)(g * 256 + 16 * i) * ESZ);
#pragma unroll
            for (int j = 0; j < RAW; j++) raw[j] = __ldg(src + j);
        } else {
#pragma unroll
            for (int j = 0; j < RAW; j++) raw[j] = make_uint4(0, 0, 0, 0);
        }
    };
    /* rotated (lane i: values i + 16·t; both halves of a warp call it: it synchronizes the warp) and rounded to
     * the dtype, as the raw words the quantizer reads; max|v| into amax, NaN/Inf into bad */
    auto rotate_round = [&](uint4 (&raw)[RAW], float &amax, unsigned &bad) {
        float e[16];
        unpack16<DT>(raw, e);
        rotate16_g256(e, tb, i);
        uint32_t *wd = (uint32_t *)raw;
#pragma unroll
        for (int t = 0; t < 16; t += 2) {
            float v0 = e[t], v1 = e[t + 1];
            if constexpr (DT == DT_BF16) {
                const __nv_bfloat162 v = __floats2bfloat162_rn(v0, v1);
                wd[t / 2] = *(const uint32_t *)&v;
                v0 = __low2float(v), v1 = __high2float(v);
            } else if constexpr (DT == DT_F16) {
                const __half2 v = __floats2half2_rn(v0, v1);
                wd[t / 2] = *(const uint32_t *)&v;
                v0 = __low2float(v), v1 = __high2float(v);
            } else {
                wd[t] = __float_as_uint(v0), wd[t + 1] = __float_as_uint(v1);
            }
            const float a0 = fabsf(v0), a1 = fabsf(v1);
            bad |= !(a0 <= 3.402823466e38f) | !(a1 <= 3.402823466e38f);
            amax = fmaxf(amax, fmaxf(a0, a1)); /* zeros of padding groups change nothing */
        }
    };
    /* pass 1: the row's absmax of its rounded values; NaN or Inf anywhere: the row is bad */
    float amax = 0.0f;
    unsigned bad = 0;
    uint4 hold[HOLD][RAW];
    if (rot && held) {
#pragma unroll
        for (int h = 0; h < HOLD; h++) load_group(2 * warp + half + h * STEP, hold[h]); /* every load in flight at once */
#pragma unroll
        for (int h = 0; h < HOLD; h++)
            if (2 * warp + h * STEP < G) rotate_round(hold[h], amax, bad);
    } else if (rot) {
        for (int base = 2 * warp; base < G; base += STEP) {
            uint4 raw[RAW];
            load_group(base + half, raw);
            rotate_round(raw, amax, bad);
        }
    }
    for (int o = 16; o; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if (rot && lane == 0) sc.amax[warp] = amax, sc.bad[warp] = bad;
    __syncthreads();
    amax = 0.0f, bad = 0;
#pragma unroll
    for (int v = 0; v < ROT; v++) amax = fmaxf(amax, sc.amax[v]), bad |= sc.bad[v];
    float s, st, rcp;
    row_scale<DT>(amax, s, st, rcp);
    if (threadIdx.x == 0) sc.sx = bad ? __int_as_float(0x7fc00000) : s;
    /* pass 2: the codes (zeros for a bad row) */
    auto codes = [&](const uint4 (&raw)[RAW]) { return bad ? make_uint4(0, 0, 0, 0) : quantize16_words<DT>(raw, st, rcp); };
    if (rot && held) {
#pragma unroll
        for (int h = 0; h < HOLD; h++)
            if (2 * warp + half + h * STEP < G) store(2 * warp + half + h * STEP, i, codes(hold[h]));
    } else if (rot) {
        for (int base = 2 * warp; base < G; base += STEP) {
            uint4 raw[RAW];
            float a2 = 0.0f; /* (the row's absmax is known already) */
            unsigned b2 = 0;
            load_group(base + half, raw);
            rotate_round(raw, a2, b2);
            if (base + half < G) store(base + half, i, codes(raw));
        }
    }
    __syncthreads();
}

} // namespace qlc

namespace qlc {

/* ---- The G = 256 rotation on the tensor cores (bf16 rows)
 *
 * A group viewed as X[16][16] (value 16a + b) is rotated as Y = H16·X·H16/16
 * (H256 = H16 ⊗ H16 over the base-4 digits, FORMATS.md §3): two bf16 MMAs
 * (m16n8k16, fp32 sums) per 16 × 8 half. Step 1, M = (H16/16)·Xᵀ: A is the
 * constant, B this lane's input words as they load (X[a][4q..4q+3], a = g and
 * g + 8; the constant's columns are permuted to match, so no shuffle). Its
 * fp32 accumulator is, register for register, the B operand of step 2,
 * Y = H16·Mᵀ, once split into bf16 hi + lo (two MMAs into one fp32
 * accumulator: the intermediate keeps ~16 bits, where one bf16 would move
 * about a quarter of the codes near the row's absmax). Step 2's rows are
 * permuted so that a lane's two rows are a' = 2g, 2g + 1: each packs into one
 * 32-bit word at the position the exact kernel stores value 16a' + b' (16·b'
 * + a', the weight's permuted order). Sums run in another order than the
 * reference's, so a rotated value may round to the neighbouring bf16 (about
 * 0.05 % of them), and a code then moves (issue #25's rule: at most 0.1 % of
 * the codes; NUMERICS.md §10). Requires sm_80. */

struct RotMma {
    uint32_t a1[4], a2[4]; /* step 1's and step 2's constant, as this lane's A fragments */
};

/* H16[i][j]: −1 where an odd number of the two base-4 digit pairs sum to 3 (H4[r][c] = −1 iff r + c = 3). */
__device__ __forceinline__ bool h16_negative(int i, int j) { return (((i & 3) + (j & 3)) == 3) ^ (((i >> 2) + (j >> 2)) == 3); }

__device__ __forceinline__ RotMma rot_mma_constants(int lane)
{
    const int g = lane >> 2, q = lane & 3;
    /* step 1's column s holds b = β(s): the B words carry X[a][4q..4q+1] in k = 2q, 2q+1 and X[a][4q+2..4q+3] in
     * k = 2q+8, 2q+9 */
    auto beta = [](int s) { return 4 * ((s & 7) >> 1) + (s & 1) + 2 * (s >> 3); };
    auto pi2 = [](int r) { return r < 8 ? 2 * r : 2 * (r - 8) + 1; }; /* step 2's row r is a' = π2(r) */
    auto elem = [](bool neg, float mag) { return __bfloat16_as_ushort(__float2bfloat16_rn(neg ? -mag : mag)); };
    RotMma c;
#pragma unroll
    for (int f = 0; f < 4; f++) { /* fragment f: rows g (+8 for f odd), columns 2q.. (+8 for f >= 2) */
        const int row = g + 8 * (f & 1), col = 2 * q + 8 * (f >> 1);
        c.a1[f] = elem(h16_negative(row, beta(col)), 0.0625f) | (uint32_t)elem(h16_negative(row, beta(col + 1)), 0.0625f) << 16;
        c.a2[f] = elem(h16_negative(pi2(row), col), 1.0f) | (uint32_t)elem(h16_negative(pi2(row), col + 1), 1.0f) << 16;
    }
    return c;
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* Four bf16 values (two words, low half first) as fp32. */
__device__ __forceinline__ void unpack4_bf16(uint2 w, float (&e)[4])
{
    e[0] = __uint_as_float(w.x << 16), e[1] = __uint_as_float(w.x & 0xffff0000u);
    e[2] = __uint_as_float(w.y << 16), e[3] = __uint_as_float(w.y & 0xffff0000u);
}

/* One group: x[t] = this lane's X[g + 8t][4q..4q+3] (bf16, two words);
 * y[2u + e] = the rotated values a' = 2g (low half), 2g + 1 (high half) of
 * b' = 2q + e + 8u, rounded to bf16. Every lane of the warp calls it. */
__device__ __forceinline__ void rotate_g256_mma(const RotMma &c, const uint2 (&x)[2], uint32_t (&y)[4])
{
    float m[2][4];
#pragma unroll
    for (int t = 0; t < 2; t++) {
        m[t][0] = m[t][1] = m[t][2] = m[t][3] = 0.0f;
        mma_bf16_16816(m[t], c.a1, x[t].x, x[t].y);
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
        /* B of step 2 for rows i = g + 8u of M: k = a = 2q, 2q+1 from half t = 0, a + 8 from t = 1 */
        const float v[4] = {m[0][2 * u], m[0][2 * u + 1], m[1][2 * u], m[1][2 * u + 1]};
        uint32_t hi[2], lo[2];
#pragma unroll
        for (int w = 0; w < 2; w++) {
            hi[w] = pack_bf16x2(v[2 * w], v[2 * w + 1]);
            lo[w] = pack_bf16x2(__fsub_rn(v[2 * w], __uint_as_float(hi[w] << 16)),
                                __fsub_rn(v[2 * w + 1], __uint_as_float(hi[w] & 0xffff0000u)));
        }
        float r[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_bf16_16816(r, c.a2, hi[0], hi[1]);
        mma_bf16_16816(r, c.a2, lo[0], lo[1]);
        y[2 * u] = pack_bf16x2(r[0], r[2]);     /* column 2q (+8u): rows a' = 2g, 2g + 1 */
        y[2 * u + 1] = pack_bf16x2(r[1], r[3]); /* column 2q + 1 (+8u) */
    }
}

} // namespace qlc
