/* W4A8 / W6A8 weights kept packed on the GPU (layout: ql_cuda_packed_desc
 * in cuda_backend.h) and decoded to the int8 grid: for many rows into a
 * workspace that the int8 GEMM then reads, for a few rows in registers
 * inside a GEMV. Plus the asymmetric correction (group sums of the
 * activation codes and the CPU's corrected epilogue).
 *
 * Both decoders give the reference's grid = clamp(rne(value·s), ±127)
 * exactly, 16 natural codes at a time:
 *   4 bits: a table lookup, lut[scale byte][code] made on the host by the
 *     reference's own function; the 16-byte row of one scale byte sits in
 *     four registers and three byte permutes pick four codes' entries (the
 *     low three bits of each code index an 8-byte half, the fourth picks
 *     the half);
 *   6 bits: fp16 arithmetic on pairs, exact: (code − 32) has at most 6
 *     significant bits and an e4m3 scale 4, so their product (|x| <= 14336,
 *     lowest bit >= 2^-9) is an fp16 normal number with no rounding; it is
 *     clamped to ±127 and 1536 added, which rounds it to nearest even (ulp 1
 *     in [1024, 2048)) and leaves the integer in the low byte. The same
 *     value as the fp32 product rounded by rintf. */
#include <cuda_fp16.h>

#include "cuda_internal.h"
#include "rotate_g256.cuh"
#include "wxa8_cuda.h"

namespace qlc {
namespace {

/* Four int8 entries of the 16-entry table T (row of one scale byte) for the
 * four codes in the low 16 bits of q (code u in bits 4u..4u+3). Selectors
 * keep bit 3 of every nibble clear (prmt's sign mode stays off). */
__device__ __forceinline__ uint32_t lut16(const uint4 &t, uint32_t q)
{
    const uint32_t sel = q & 0x7777u;
    const uint32_t lo = __byte_perm(t.x, t.y, sel), hi = __byte_perm(t.z, t.w, sel);
    return __byte_perm(lo, hi, ((q >> 1) & 0x4444u) | 0x3210u);
}

/* 16 codes of 4 bits (nib.x: codes 0-7, nib.y: 8-15) -> 16 int8 (o[u]: codes
 * 4u..4u+3). sbv: the scale bytes of the 16 codes, 16/GS of them (byte 0
 * first). lut: [256] rows of 16 bytes. */
template <int GS>
__device__ __forceinline__ void decode16_4(uint2 nib, uint32_t sbv, const uint4 *lut, uint32_t (&o)[4])
{
    if constexpr (GS == 16) {
        const uint4 t = lut[sbv & 0xff];
        o[0] = lut16(t, nib.x), o[1] = lut16(t, nib.x >> 16), o[2] = lut16(t, nib.y), o[3] = lut16(t, nib.y >> 16);
    } else if constexpr (GS == 8) {
        const uint4 t0 = lut[sbv & 0xff], t1 = lut[(sbv >> 8) & 0xff];
        o[0] = lut16(t0, nib.x), o[1] = lut16(t0, nib.x >> 16), o[2] = lut16(t1, nib.y), o[3] = lut16(t1, nib.y >> 16);
    } else {
        o[0] = lut16(lut[sbv & 0xff], nib.x), o[1] = lut16(lut[(sbv >> 8) & 0xff], nib.x >> 16);
        o[2] = lut16(lut[(sbv >> 16) & 0xff], nib.y), o[3] = lut16(lut[sbv >> 24], nib.y >> 16);
    }
}

__device__ __forceinline__ __half2 as_h2(uint32_t u)
{
    __half2 h;
    memcpy(&h, &u, 4);
    return h;
}
__device__ __forceinline__ uint32_t h2_bits(__half2 h)
{
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

/* 16 codes of 6 bits -> 16 int8. nib as for 4 bits; hw: the top two bits,
 * code j (0..3) at bits 2j, j + 4 at 16 + 2j, j + 8 at 8 + 2j, j + 12 at
 * 24 + 2j, so that codes (j, j + 4) of each half come out as an fp16 pair
 * with one shift and mask; s2: the group scale in both halves (fp16). */
__device__ __forceinline__ void decode16_6(uint2 nib, uint32_t hw, __half2 s2, uint32_t (&o)[4])
{
    const __half2 off = as_h2(0x64206420u);   /* 1056 = 1024 + 32 */
    const __half2 lo = as_h2(0xD7F0D7F0u);    /* -127 */
    const __half2 hi = as_h2(0x57F057F0u);    /* 127 */
    const __half2 magic = as_h2(0x66006600u); /* 1536 */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t nw = h ? nib.y : nib.x, hb = hw >> (8 * h);
        uint32_t y[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            /* fp16 bits 0x6400 | code: the value 1024 + code */
            const uint32_t c = ((nw >> (4 * j)) & 0x000F000Fu) | (((hb >> (2 * j)) & 0x00030003u) << 4) | 0x64006400u;
            __half2 x = __hmul2_rn(__hsub2_rn(as_h2(c), off), s2); /* (code - 32)·s, exact */
            x = __hmin2(__hmax2(x, lo), hi);
            y[j] = h2_bits(__hadd2_rn(x, magic)); /* low byte of each half: rne(x) */
        }
        /* y[j] holds codes (j, j + 4) of this half in bytes 0 and 2 */
        const uint32_t t01 = __byte_perm(y[0], y[1], 0x6240), t23 = __byte_perm(y[2], y[3], 0x6240);
        o[2 * h] = __byte_perm(t01, t23, 0x5410);
        o[2 * h + 1] = __byte_perm(t01, t23, 0x7632);
    }
}

/* The fp16 scale of a byte, in both halves. */
__device__ __forceinline__ __half2 scale_h2(const uint16_t *tab, uint32_t b)
{
    const uint32_t s = tab[b & 0xff];
    return as_h2(s | (s << 16));
}

/* The scale bytes of natural codes [kn, kn + 16) of a row (16/GS bytes, aligned). */
template <int GS> __device__ __forceinline__ uint32_t load_scales(const uint8_t *srow, int64_t kn)
{
    if constexpr (GS == 16) return __ldg(srow + kn / 16);
    else if constexpr (GS == 8) return __ldg((const uint16_t *)(srow + kn / 8));
    else return __ldg((const uint32_t *)(srow + kn / 4));
}

/* Natural codes [kn, kn + 16) of row `col` decoded into o. */
template <int BITS, int GS>
__device__ __forceinline__ void decode_chunk(const PackedW &w, int64_t col, int64_t kn, const uint4 *lut4,
                                             const uint16_t *tab6, uint32_t (&o)[4])
{
    const uint2 nib = __ldg((const uint2 *)(w.nib + col * w.ldn + kn / 2));
    const uint32_t sbv = load_scales<GS>(w.sb + col * w.lds, kn);
    if constexpr (BITS == 4) decode16_4<GS>(nib, sbv, lut4, o);
    else decode16_6(nib, __ldg((const uint32_t *)(w.hi + col * w.ldh + kn / 4)), scale_h2(tab6, sbv), o);
}

/* Natural codes [kn, kn + 32) of row `col` (kn % 32 == 0) decoded into lo
 * (the first 16) and hi: one 16-byte load of nibbles, so that a warp keeps
 * twice decode_chunk's bytes in flight. */
template <int BITS, int GS>
__device__ __forceinline__ void decode_chunk32(const PackedW &w, int64_t col, int64_t kn, const uint4 *lut4,
                                               const uint16_t *tab6, uint32_t (&lo)[4], uint32_t (&hi)[4])
{
    const uint4 nib = __ldg((const uint4 *)(w.nib + col * w.ldn + kn / 2));
    const uint8_t *srow = w.sb + col * w.lds;
    uint32_t s0, s1; /* the scale bytes of each half, as load_scales gives them */
    if constexpr (GS == 16) {
        const uint32_t v = __ldg((const uint16_t *)(srow + kn / 16));
        s0 = v & 0xff, s1 = v >> 8;
    } else if constexpr (GS == 8) {
        const uint32_t v = __ldg((const uint32_t *)(srow + kn / 8));
        s0 = v & 0xffff, s1 = v >> 16;
    } else {
        const uint2 v = __ldg((const uint2 *)(srow + kn / 4));
        s0 = v.x, s1 = v.y;
    }
    if constexpr (BITS == 4) {
        decode16_4<GS>(make_uint2(nib.x, nib.y), s0, lut4, lo);
        decode16_4<GS>(make_uint2(nib.z, nib.w), s1, lut4, hi);
    } else {
        const uint2 hw = __ldg((const uint2 *)(w.hi + col * w.ldh + kn / 4));
        decode16_6(make_uint2(nib.x, nib.y), hw.x, scale_h2(tab6, s0), lo);
        decode16_6(make_uint2(nib.z, nib.w), hw.y, scale_h2(tab6, s1), hi);
    }
}

/* Tables into shared memory (every thread of the block takes part). */
template <int BITS> __device__ __forceinline__ void load_tables(const PackedW &w, uint4 *lut4, uint16_t *tab6)
{
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        if constexpr (BITS == 4) lut4[i] = __ldg((const uint4 *)w.table + i);
        else tab6[i] = __ldg((const uint16_t *)w.table + i);
    }
}

/* ------------------------------------------------------------ decode */

constexpr int DEC_THREADS = 256;

template <int BITS, int GS>
__global__ void __launch_bounds__(DEC_THREADS) wxa8_decode_kernel(PackedW w, bool permuted, int8_t *out, int64_t ldo)
{
    __shared__ uint4 lut4[BITS == 4 ? 256 : 1];
    __shared__ uint16_t tab6[BITS == 6 ? 256 : 1];
    /* per warp two groups of 256 decoded codes (natural order), 16 bytes apart in banks */
    __shared__ __align__(16) uint8_t tr[DEC_THREADS / 32][2][272];
    load_tables<BITS>(w, lut4, tab6);
    __syncthreads();
    const int64_t chunks = w.k / 16, t = (int64_t)blockIdx.x * DEC_THREADS + threadIdx.x;
    const bool valid = t < w.n * chunks;
    const int64_t row = valid ? t / chunks : 0, c = valid ? t % chunks : 0;
    uint32_t o[4] = {0, 0, 0, 0};
    if (valid) decode_chunk<BITS, GS>(w, row, 16 * c, lut4, tab6, o);
    int8_t *dst = out + row * ldo + 16 * c;
    if (!permuted) {
        if (valid) *(uint4 *)dst = make_uint4(o[0], o[1], o[2], o[3]);
        return;
    }
    /* k % 256 == 0: the 16 threads of a half-warp hold the 16 chunks of one
     * group of 256 (natural chunk i = lane % 16), all valid or none. The
     * group is transposed as 16 x 16 bytes: stored row i = values i + 16·t. */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = lane / 16, i = lane % 16;
    uint8_t *g = tr[warp][h];
    *(uint4 *)(g + 16 * i) = make_uint4(o[0], o[1], o[2], o[3]);
    __syncwarp();
    uint32_t r[4];
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const uint8_t *p = g + i + 64 * u; /* values i + 16·(4u + j), j = 0..3 */
        r[u] = (uint32_t)p[0] | (uint32_t)p[16] << 8 | (uint32_t)p[32] << 16 | (uint32_t)p[48] << 24;
    }
    if (valid) *(uint4 *)dst = make_uint4(r[0], r[1], r[2], r[3]);
}

/* -------------------------------------------------------------- GEMV */

/* Hopper: a warp starts packed row `col` on its way from DRAM into L2 (a
 * programmatic dependent launch, before it waits for the kernel before). */
template <int BITS>
__device__ __forceinline__ void prefetch_packed_row(const PackedW &w, int64_t col, int lane, int part = 0, int split = 1)
{
    prefetch_row_l2(w.nib + col * w.ldn, w.k / 2, lane, part, split);
    if (BITS == 6) prefetch_row_l2(w.hi + col * w.ldh, w.k / 4, lane, part, split);
}

constexpr int PG_WARPS = 8;
/* Activation codes per row staged per pass (17 KB of shared memory for one
 * or two rows, 35 KB for more): long passes keep a warp's loop long between
 * the block's barriers. */
template <int MR> __host__ __device__ constexpr int pg_kc() { return MR <= 2 ? 16384 / MR : 4096; }
/* a row in shared memory: groups of 256 16 bytes apart in banks */
template <int MR> __host__ __device__ constexpr int pg_pitch() { return pg_kc<MR>() / 256 * 272; }

__device__ __forceinline__ int xs_off(int kk) { return kk / 256 * 272 + kk % 256; }

/* Rows [0, rows) of the activation codes, natural codes [c0, c0 + kc), into
 * xs (PITCH bytes a row) in natural order. Permuted codes come as 16 x 16 byte tiles (stored
 * row i = values i + 16·t): a thread takes four stored rows (64 bytes) and
 * transposes them 4 x 4 bytes at a time into words of four consecutive
 * values. */
template <int PITCH>
__device__ __forceinline__ void stage_rows(const int8_t *a, int64_t lda, int rows, int64_t c0, int kc, bool permuted,
                                           int8_t *xs)
{
    if (!permuted) {
        const int per_row = kc / 16;
        for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
            const int r = i / per_row, u = i % per_row;
            const int4 v = *(const int4 *)(a + r * lda + c0 + 16 * u);
            int8_t *dst = xs + r * PITCH + xs_off(16 * u);
            if constexpr (PITCH % 16 == 0) *(int4 *)dst = v;
            else *(int2 *)dst = make_int2(v.x, v.y), *(int2 *)(dst + 8) = make_int2(v.z, v.w);
        }
        return;
    }
    const int per_row = kc / 64; /* units of four stored rows */
    for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
        const int r = i / per_row, rem = i % per_row, b = rem / 4, q = rem % 4;
        const int4 *src = (const int4 *)(a + r * lda + c0 + 256 * b + 64 * q);
        const int4 x0 = src[0], x1 = src[1], x2 = src[2], x3 = src[3];
        const uint32_t xw[4][4] = {{(uint32_t)x0.x, (uint32_t)x0.y, (uint32_t)x0.z, (uint32_t)x0.w},
                                   {(uint32_t)x1.x, (uint32_t)x1.y, (uint32_t)x1.z, (uint32_t)x1.w},
                                   {(uint32_t)x2.x, (uint32_t)x2.y, (uint32_t)x2.z, (uint32_t)x2.w},
                                   {(uint32_t)x3.x, (uint32_t)x3.y, (uint32_t)x3.z, (uint32_t)x3.w}};
        int8_t *dst = xs + r * PITCH + 272 * b + 4 * q;
#pragma unroll
        for (int wd = 0; wd < 4; wd++) { /* bytes t = 4wd..4wd+3 of stored rows 4q..4q+3 */
            const uint32_t t0 = __byte_perm(xw[0][wd], xw[1][wd], 0x5140), t1 = __byte_perm(xw[0][wd], xw[1][wd], 0x7362);
            const uint32_t t2 = __byte_perm(xw[2][wd], xw[3][wd], 0x5140), t3 = __byte_perm(xw[2][wd], xw[3][wd], 0x7362);
            /* values 4q..4q+3 + 16·t */
            *(uint32_t *)(dst + 16 * (4 * wd + 0)) = __byte_perm(t0, t2, 0x5410);
            *(uint32_t *)(dst + 16 * (4 * wd + 1)) = __byte_perm(t0, t2, 0x7632);
            *(uint32_t *)(dst + 16 * (4 * wd + 2)) = __byte_perm(t1, t3, 0x5410);
            *(uint32_t *)(dst + 16 * (4 * wd + 3)) = __byte_perm(t1, t3, 0x7632);
        }
    }
}

template <int MR, int BITS, int GS>
__global__ void __launch_bounds__(PG_WARPS * 32) wxa8_gemv_kernel(const int8_t *a, int64_t lda, PackedW w, bool permuted,
                                                                   int split, EpiParams p)
{
    __shared__ __align__(16) int8_t xs[MR * pg_pitch<MR>()];
    __shared__ uint4 lut4[BITS == 4 ? 256 : 1];
    __shared__ uint16_t tab6[BITS == 6 ? 256 : 1];
    __shared__ int32_t red[2 * MR * PG_WARPS];
    pdl_trigger(); /* the next layer's prologue may launch (it waits for this grid) */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % split;
    const int64_t col = (int64_t)blockIdx.x * (PG_WARPS / split) + warp / split; /* `split` warps a column */
    const bool active = col < w.n;
    load_tables<BITS>(w, lut4, tab6); /* layer constants: before waiting */
    if (active) prefetch_packed_row<BITS>(w, col, lane, part, split); /* on its way into L2 while the prologue finishes */
    pdl_wait(); /* the activation codes are the prologue's */
    int32_t acc[MR] = {};
    constexpr int KC = pg_kc<MR>();
    for (int64_t c0 = 0; c0 < w.k; c0 += KC) {
        const int kc = (int)(w.k - c0 < KC ? w.k - c0 : KC);
        __syncthreads(); /* the tables are in; the last pass's rows are read */
        stage_rows<pg_pitch<MR>()>(a, lda, MR, c0, kc, permuted, xs);
        __syncthreads();
        if (!active) continue;
        rounds4((part * 32 + lane) * 32, kc, 32 * 32 * split, [&](int kk) {
            /* kc % 16 == 0: the second half may lie past kc (4 bits, k % 32 == 16); its loads stay inside the row's
             * padding (pitches padded to 16 bytes), its codes are dropped */
            uint32_t lo[4], hi[4];
            decode_chunk32<BITS, GS>(w, col, c0 + kk, lut4, tab6, lo, hi);
            const bool both = kk + 32 <= kc;
            const int8_t *xp = xs + xs_off(kk);
#pragma unroll
            for (int r = 0; r < MR; r++) {
                const int4 x0 = *(const int4 *)(xp + r * pg_pitch<MR>());
                acc[r] = __dp4a(x0.x, (int)lo[0], acc[r]);
                acc[r] = __dp4a(x0.y, (int)lo[1], acc[r]);
                acc[r] = __dp4a(x0.z, (int)lo[2], acc[r]);
                acc[r] = __dp4a(x0.w, (int)lo[3], acc[r]);
                if (both) {
                    const int4 x1 = *(const int4 *)(xp + 16 + r * pg_pitch<MR>());
                    acc[r] = __dp4a(x1.x, (int)hi[0], acc[r]);
                    acc[r] = __dp4a(x1.y, (int)hi[1], acc[r]);
                    acc[r] = __dp4a(x1.z, (int)hi[2], acc[r]);
                    acc[r] = __dp4a(x1.w, (int)hi[3], acc[r]);
                }
            }
        });
    }
    if (!gemv_split_reduce<PG_WARPS, MR>(acc, split, red, 0) || !active) return;
    gemv_finish<MR>(acc, p, lane, col);
}

/* Up to 16 rows (by default from QLC_PACKED_MMA_MIN_M) on the tensor cores: an mma.sync m16n8k32 whose B fragment
 * is decoded in registers from the packed codes. A block covers 8·T output
 * columns and its warps share K (warp w the 128-code blocks w, w + 8, ...);
 * the activation rows are staged in natural order (stage_rows) and read as
 * A fragments. Within a 128-code block lane (g, t) = (lane/4, lane%4)
 * decodes codes 32t .. 32t + 31 of column g of each tile (decode_chunk32:
 * one 16-byte load), and k step s multiplies their codes 8s .. 8s + 7: the
 * mma's k positions 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3 carry these
 * eight codes on both sides, which a dot product allows (the same order on
 * A and B). Rows past m are not staged and not stored; integer sums, so the
 * result equals the GEMV's and the CPU's. */
constexpr int PM_WARPS = 8;
constexpr int PM_KC = 2048; /* codes of a row staged per pass */
/* 8 bytes past a multiple of 128: the A fragments' 8-byte reads (rows g,
 * bytes 32t + 8s) of a warp fall in two wavefronts, not eight */
constexpr int PM_PITCH = PM_KC / 256 * 272 + 8;

template <int BITS, int GS, int T>
__global__ void __launch_bounds__(PM_WARPS * 32, 2) wxa8_mma16_kernel(const int8_t *a, int64_t lda, int m, PackedW w,
                                                                      bool permuted, EpiParams p)
{
    __shared__ __align__(16) int8_t xs[16 * PM_PITCH]; /* then the warps' partial sums */
    __shared__ uint4 lut4[BITS == 4 ? 256 : 1];
    __shared__ uint16_t tab6[BITS == 6 ? 256 : 1];
    static_assert(PM_WARPS * T * 4 * 32 * 4 <= (int)sizeof xs, "the partial sums fit the staging buffer");
    pdl_trigger();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int64_t c0 = (int64_t)blockIdx.x * (8 * T);
    load_tables<BITS>(w, lut4, tab6);
    for (int r = warp; r < 8 * T; r += PM_WARPS)
        if (c0 + r < w.n) prefetch_packed_row<BITS>(w, c0 + r, lane); /* into L2 while the prologue finishes */
    pdl_wait();
    int32_t acc[T][4] = {};
    for (int64_t k0 = 0; k0 < w.k; k0 += PM_KC) {
        const int kc = (int)(w.k - k0 < PM_KC ? w.k - k0 : PM_KC);
        __syncthreads(); /* the tables are in; the last pass's rows are read */
        stage_rows<PM_PITCH>(a, lda, m, k0, kc, permuted, xs);
        __syncthreads();
        rounds4(warp * 128, kc, PM_WARPS * 128, [&](int kb) {
            const int kk = kb + 32 * t4;
            uint32_t b[T][8];
#pragma unroll
            for (int t = 0; t < T; t++) {
                const int64_t col = c0 + 8 * t + g;
                uint32_t lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                if (col < w.n && kk < kc) {
                    /* kc % 16 == 0: a second half past kc (4 bits) reads the row's padding; its codes are dropped */
                    decode_chunk32<BITS, GS>(w, col, k0 + kk, lut4, tab6, lo, hi);
                    if (kk + 32 > kc) hi[0] = hi[1] = hi[2] = hi[3] = 0;
                }
#pragma unroll
                for (int j = 0; j < 4; j++) b[t][j] = lo[j], b[t][4 + j] = hi[j];
            }
            /* codes past kc meet zeros in B; the staged bytes they read lie inside the buffer */
            const int8_t *xp = xs + xs_off(kk);
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const uint2 r0 = *(const uint2 *)(xp + g * PM_PITCH + 8 * s);
                const uint2 r1 = *(const uint2 *)(xp + (g + 8) * PM_PITCH + 8 * s);
                const uint32_t af[4] = {r0.x, r1.x, r0.y, r1.y};
#pragma unroll
                for (int t = 0; t < T; t++) {
                    const uint32_t bf[2] = {b[t][2 * s], b[t][2 * s + 1]};
                    mma_s8(acc[t], af, bf);
                }
            }
        });
    }
    __syncthreads(); /* every warp is done with the staged rows */
    int32_t *red = (int32_t *)xs; /* [warp][tile][4][lane] */
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int j = 0; j < 4; j++) red[((warp * T + t) * 4 + j) * 32 + lane] = acc[t][j];
    __syncthreads();
    for (int i = threadIdx.x; i < T * 32; i += blockDim.x) {
        const int t = i / 32, ln = i % 32, row = ln / 4;
        int32_t v[4] = {0, 0, 0, 0};
        for (int wp = 0; wp < PM_WARPS; wp++)
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] += red[((wp * T + t) * 4 + j) * 32 + ln];
        const int64_t col = c0 + 8 * t + 2 * (ln % 4);
        if (col >= w.n) continue;
        if (row < m) epi_store2(p, row, col, w.n, v[0], v[1], p.sx[row]);
        if (row + 8 < m) epi_store2(p, row + 8, col, w.n, v[2], v[3], p.sx[row + 8]);
    }
}

/* The packed GEMV for one row at G = 256 that quantizes the row itself
 * (the int8 one's scheme, gemm_mma.cu): each block rotates and quantizes x
 * with quantize_row_g256, storing the codes straight into the natural-order
 * staging layout that wxa8_gemv_kernel's decode loop reads (value i + 16·t
 * of group g at byte 272·g + i + 16·t: a byte store per code, the two halves
 * of a warp 16 bytes apart in banks), then its warps share the columns
 * (gemv_split_columns: one to four warps a column). The
 * whole row stays staged (K <= QLC_GEMV_ROW_MAX_K). Block 0 also leaves the
 * codes in q in the prologue's order, and the scale in sx. */
template <int DT, int BITS, int GS>
__global__ void __launch_bounds__(GEMV_ROW_WARPS * 32, 2) wxa8_gemv_row_g256_kernel(const char *x, int k, PackedW w,
                                                                                     int split, EpiParams p, int8_t *q,
                                                                                     float *sx)
{
    __shared__ __align__(16) int8_t xs[QLC_GEMV_ROW_MAX_K / 256 * 272];
    __shared__ __align__(16) RowScratch<GEMV_ROW_ROT_WARPS> sc;
    __shared__ uint4 lut4[BITS == 4 ? 256 : 1];
    __shared__ uint16_t tab6[BITS == 6 ? 256 : 1];
    __shared__ int32_t red[2 * GEMV_ROW_WARPS];
    pdl_trigger(); /* the next layer's prologue may launch (it waits for this grid) */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t col0 = (int64_t)blockIdx.x * (GEMV_ROW_WARPS / split) + warp / split;
    load_tables<BITS>(w, lut4, tab6); /* layer constants: before waiting (quantize_row_g256 synchronizes the block) */
    if (col0 < w.n) prefetch_packed_row<BITS>(w, col0, lane, warp % split, split); /* while the kernel before finishes */
    pdl_wait(); /* x is the previous kernel's output; q and sx may still be read by it */
    quantize_row_g256<DT, GEMV_ROW_ROT_WARPS>(x, k, sc, [&](int g, int i, uint4 c) {
        int8_t *d = xs + g * 272 + i;
        const uint32_t cw[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
        for (int t = 0; t < 16; t++) d[16 * t] = (int8_t)(cw[t / 4] >> (8 * (t % 4)));
        if (blockIdx.x == 0) *(uint4 *)(q + g * 256 + 16 * i) = c;
    });
    if (blockIdx.x == 0 && threadIdx.x == 0) *sx = sc.sx;
    EpiParams pp = p;
    pp.sx = &sc.sx; /* the row's scale, NaN for a bad row */
    gemv_split_columns<GEMV_ROW_WARPS>(w.n, split, pp, red, [&](int64_t col, int part) {
        int32_t acc = 0;
        rounds4((part * 32 + lane) * 32, k, 32 * 32 * split, [&](int kk) { /* k % 256 == 0: no tail */
            uint32_t lo[4], hi[4];
            decode_chunk32<BITS, GS>(w, col, kk, lut4, tab6, lo, hi);
            const int4 x0 = *(const int4 *)(xs + xs_off(kk)), x1 = *(const int4 *)(xs + xs_off(kk + 16));
            acc = __dp4a(x0.x, (int)lo[0], acc);
            acc = __dp4a(x0.y, (int)lo[1], acc);
            acc = __dp4a(x0.z, (int)lo[2], acc);
            acc = __dp4a(x0.w, (int)lo[3], acc);
            acc = __dp4a(x1.x, (int)hi[0], acc);
            acc = __dp4a(x1.y, (int)hi[1], acc);
            acc = __dp4a(x1.z, (int)hi[2], acc);
            acc = __dp4a(x1.w, (int)hi[3], acc);
        });
        return acc;
    });
}

/* -------------------------------------------------- asymmetric layers */

__global__ void group_sums_kernel(const int8_t *a, int64_t lda, int64_t m, int64_t k, int64_t group, bool permuted,
                                  float *s)
{
    const int64_t ng = k / group, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * ng) return;
    const int64_t r = i / ng, g = i % ng;
    const int8_t *row = a + r * lda;
    int32_t sum = 0;
    for (int64_t kn = g * group; kn < (g + 1) * group; kn++) /* natural kn = 256b + i + 16t is stored at 256b + 16i + t */
        sum += row[permuted ? (kn & ~(int64_t)255) | ((kn & 15) << 4) | ((kn >> 4) & 15) : kn];
    s[i] = (float)sum; /* exact: |sum| <= 128·group */
}


/* A tile of BY·RT rows × BX·CT columns per block (BX·BY threads; thread
 * (ty, tx) owns rows ty·RT.., columns tx·CT..); s and corr pass through
 * shared memory GC groups at a time. Every t is summed in group order. */
template <int BY, int BX, int RT, int CT>
__global__ void __launch_bounds__(BX *BY) corr_epilogue_kernel(const int32_t *acc, int64_t ldacc, const float *s,
                                                               const float *corr, int64_t m, int64_t n, int64_t ng,
                                                               EpiParams p)
{
    constexpr int NT = BX * BY, TM = BY * RT, TN = BX * CT, GC = 16;
    __shared__ __align__(16) float ss[GC][TM];
    __shared__ __align__(16) float cs[GC][TN];
    const int tx = threadIdx.x % BX, ty = threadIdx.x / BX;
    const int64_t m0 = (int64_t)blockIdx.y * TM, n0 = (int64_t)blockIdx.x * TN;
    float t[RT][CT];
#pragma unroll
    for (int i = 0; i < RT; i++)
#pragma unroll
        for (int j = 0; j < CT; j++) t[i][j] = 0.0f;
    for (int64_t g0 = 0; g0 < ng; g0 += GC) {
        const int gc = (int)(ng - g0 < GC ? ng - g0 : GC);
        __syncthreads();
        for (int i = threadIdx.x; i < GC * TM; i += NT) {
            const int gg = i % GC, rr = i / GC; /* a row's groups are contiguous in s */
            ss[gg][rr] = gg < gc && m0 + rr < m ? s[(m0 + rr) * ng + g0 + gg] : 0.0f;
        }
        for (int i = threadIdx.x; i < GC * TN; i += NT) {
            const int gg = i / TN, cc = i % TN;
            cs[gg][cc] = gg < gc && n0 + cc < n ? corr[(g0 + gg) * n + n0 + cc] : 0.0f;
        }
        __syncthreads();
        for (int gg = 0; gg < gc; gg++) {
            float sv[RT], cv[CT];
#pragma unroll
            for (int i = 0; i < RT; i++) sv[i] = ss[gg][ty * RT + i];
#pragma unroll
            for (int j = 0; j < CT; j++) cv[j] = cs[gg][tx * CT + j];
#pragma unroll
            for (int i = 0; i < RT; i++)
#pragma unroll
                for (int j = 0; j < CT; j++) t[i][j] = __fadd_rn(t[i][j], __fmul_rn(sv[i], cv[j]));
        }
    }
#pragma unroll
    for (int i = 0; i < RT; i++) {
        const int64_t row = m0 + ty * RT + i;
        if (row >= m) continue;
        const float sx = p.sx[row];
#pragma unroll
        for (int j = 0; j < CT; j++) {
            const int64_t col = n0 + tx * CT + j;
            if (col >= n) continue;
            const float sxw = __fmul_rn(sx, p.sw[p.sw_per_row ? col : 0]);
            const float v = __fadd_rn(__fmul_rn(__int2float_rn(acc[row * ldacc + col]), sxw), __fmul_rn(sx, t[i][j]));
            store_one(p, row, col, epi_after(p, v, row, col), 0);
        }
    }
}

/* The kernel for a packed layer's bits and codes per scale byte. */
template <template <int, int> class F, typename... Args> cudaError_t with_format(const PackedW &w, Args &&...args)
{
    if (w.bits == 6) return F<6, 16>::run(w, args...);
    if (w.gs == 16) return F<4, 16>::run(w, args...);
    if (w.gs == 8) return F<4, 8>::run(w, args...);
    return F<4, 4>::run(w, args...);
}

template <int BITS, int GS> struct DecodeLaunch {
    static cudaError_t run(const PackedW &w, bool permuted, int8_t *out, int64_t ldo, cudaStream_t stream)
    {
        const int64_t threads = w.n * (w.k / 16);
        wxa8_decode_kernel<BITS, GS>
            <<<(unsigned)((threads + DEC_THREADS - 1) / DEC_THREADS), DEC_THREADS, 0, stream>>>(w, permuted, out, ldo);
        return cudaGetLastError();
    }
};

template <int BITS, int GS> struct GemvLaunch {
    static cudaError_t run(const PackedW &w, const int8_t *a, int64_t lda, bool permuted, int64_t m, int split,
                           const EpiParams &p, cudaStream_t stream, bool pdl)
    {
        cudaLaunchAttribute attr[1];
        const int64_t cpb = PG_WARPS / split;
        cudaLaunchConfig_t cfg =
            launch_config(dim3((unsigned)((w.n + cpb - 1) / cpb)), dim3(PG_WARPS * 32), 0, stream, pdl, attr);
        switch (m) {
#define QLC_PG_CASE(R)                                                                                                \
    case R: return cudaLaunchKernelEx(&cfg, wxa8_gemv_kernel<R, BITS, GS>, a, lda, w, permuted, split, p);
            QLC_PG_CASE(1) QLC_PG_CASE(2) QLC_PG_CASE(3) QLC_PG_CASE(4)
            QLC_PG_CASE(5) QLC_PG_CASE(6) QLC_PG_CASE(7) QLC_PG_CASE(8)
#undef QLC_PG_CASE
        default: return cudaErrorInvalidValue;
        }
    }
};

template <int BITS, int GS> struct Mma16Launch {
    static cudaError_t run(const PackedW &w, const int8_t *a, int64_t lda, bool permuted, int64_t m, const EpiParams &p,
                           int tiles, cudaStream_t stream, bool pdl)
    {
        cudaLaunchAttribute attr[1];
        cudaLaunchConfig_t cfg = launch_config(dim3((unsigned)((w.n + 8 * tiles - 1) / (8 * tiles))), dim3(PM_WARPS * 32), 0,
                                               stream, pdl, attr);
        if (tiles == 4) return cudaLaunchKernelEx(&cfg, wxa8_mma16_kernel<BITS, GS, 4>, a, lda, (int)m, w, permuted, p);
        return cudaLaunchKernelEx(&cfg, wxa8_mma16_kernel<BITS, GS, 2>, a, lda, (int)m, w, permuted, p);
    }
};

template <int BITS, int GS> struct GemvRowLaunch {
    static cudaError_t run(const PackedW &w, const void *x, int xdt, int split, const EpiParams &p, int8_t *q, float *sx,
                           int sms, cudaStream_t stream, bool pdl)
    {
        cudaLaunchAttribute attr[1];
        cudaLaunchConfig_t cfg = launch_config(dim3((unsigned)gemv_row_blocks(w.n, split, sms)), dim3(GEMV_ROW_WARPS * 32),
                                               0, stream, pdl, attr);
        const char *xc = (const char *)x;
        const int k = (int)w.k;
        if (xdt == DT_BF16)
            return cudaLaunchKernelEx(&cfg, wxa8_gemv_row_g256_kernel<DT_BF16, BITS, GS>, xc, k, w, split, p, q, sx);
        if (xdt == DT_F16)
            return cudaLaunchKernelEx(&cfg, wxa8_gemv_row_g256_kernel<DT_F16, BITS, GS>, xc, k, w, split, p, q, sx);
        return cudaLaunchKernelEx(&cfg, wxa8_gemv_row_g256_kernel<DT_F32, BITS, GS>, xc, k, w, split, p, q, sx);
    }
};

} // namespace

cudaError_t launch_wxa8_decode(const PackedW &w, bool permuted, int8_t *out, int64_t ldo, cudaStream_t stream)
{
    if (w.n == 0 || w.k == 0) return cudaSuccess;
    if (permuted && w.k % 256 != 0) return cudaErrorInvalidValue;
    return with_format<DecodeLaunch>(w, permuted, out, ldo, stream);
}

cudaError_t launch_wxa8_gemv(const int8_t *a, int64_t lda, const PackedW &w, bool permuted, int64_t m, int split,
                             const EpiParams &p, cudaStream_t stream, bool pdl)
{
    if ((uintptr_t)a % 16 != 0 || lda % 16 != 0 || w.k % 16 != 0 || (permuted && w.k % 256 != 0) ||
        (split != 1 && split != 2 && split != 4))
        return cudaErrorInvalidValue;
    return with_format<GemvLaunch>(w, a, lda, permuted, m, split, p, stream, pdl);
}

int wxa8_mma16_tiles(int64_t n, int sms) { return (n + 31) / 32 >= (sms > 0 ? sms : 1) ? 4 : 2; }

cudaError_t launch_wxa8_mma16(const int8_t *a, int64_t lda, const PackedW &w, bool permuted, int64_t m, int tiles,
                              const EpiParams &p, cudaStream_t stream, bool pdl)
{
    if ((uintptr_t)a % 16 != 0 || lda % 16 != 0 || w.k % 16 != 0 || (permuted && w.k % 256 != 0) || m < 1 ||
        m > QLC_PACKED_MMA_MAX_M || (tiles != 2 && tiles != 4))
        return cudaErrorInvalidValue;
    if (w.n == 0) return cudaSuccess;
    return with_format<Mma16Launch>(w, a, lda, permuted, m, p, tiles, stream, pdl);
}

cudaError_t launch_group_sums(const int8_t *a, int64_t lda, int64_t m, int64_t k, int64_t group, bool permuted, float *s,
                              cudaStream_t stream)
{
    const int64_t count = m * (k / group);
    if (count == 0) return cudaSuccess;
    group_sums_kernel<<<(unsigned)((count + 255) / 256), 256, 0, stream>>>(a, lda, m, k, group, permuted, s);
    return cudaGetLastError();
}

cudaError_t launch_corr_epilogue(const int32_t *acc, int64_t ldacc, const float *s, const float *corr, int64_t m,
                                 int64_t n, int64_t ng, const EpiParams &p, cudaStream_t stream)
{
    if (m <= 8) { /* few rows: 8 × 64 tiles, a column per thread */
        corr_epilogue_kernel<1, 64, 8, 1>
            <<<dim3((unsigned)((n + 63) / 64), (unsigned)((m + 7) / 8)), 64, 0, stream>>>(acc, ldacc, s, corr, m, n, ng, p);
    } else { /* 64 × 64 tiles, 4 × 4 per thread */
        corr_epilogue_kernel<16, 16, 4, 4>
            <<<dim3((unsigned)((n + 63) / 64), (unsigned)((m + 63) / 64)), 256, 0, stream>>>(acc, ldacc, s, corr, m, n, ng, p);
    }
    return cudaGetLastError();
}

cudaError_t launch_wxa8_gemv_row(const void *x, int xdt, const PackedW &w, int split, const EpiParams &p, int8_t *q,
                                 float *sx, int sms, cudaStream_t stream, bool pdl)
{
    if (w.k % 256 != 0 || w.k > QLC_GEMV_ROW_MAX_K || (uintptr_t)x % 16 != 0 || (split != 1 && split != 2 && split != 4))
        return cudaErrorInvalidValue;
    return with_format<GemvRowLaunch>(w, x, xdt, split, p, q, sx, sms, stream, pdl);
}

} // namespace qlc
