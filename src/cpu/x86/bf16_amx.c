/* AMX-BF16 micro-kernels (Sapphire Rapids and later): the float paths of the
 * amx table on TDPBF16PS. One instruction multiplies a 16-row A tile (32
 * bf16 of k a row) by a B tile of 16 k-pairs × 16 columns (the "VNNI-2"
 * layout: each column's k and k+1 side by side) into 16 × 16 fp32 sums:
 * 8192 multiply-adds, against VDPBF16PS's 32 per instruction.
 *   bf16_gemm_32x32c2__amx     dense bf16-compute layers: B packed once as
 *       bf16 pairs [kp/2][32][2], K padded with zeros to 32 (tile_k);
 *   bf16_gemm_32x32c2i8__amx   weight-only layers with bf16 activations: the
 *       f32 kernel's int8 packing ([K][32]) decoded to bf16 pairs (exact:
 *       every int8 is a bf16) per K slice (blocked) or per 32-k block into
 *       an L1 buffer (small M); …i7… the cheaper decode for codes without -128.
 * The 32×32 tile is 2×2 accumulator tiles tmm0..tmm3 (16 × 16 fp32), A
 * tiles tmm4 (rows 0-15), tmm5 (rows 16-31), B tiles tmm6 (columns 0-15),
 * tmm7 (columns 16-31): per 32-k block four tile loads and four TDPBF16PS,
 * the tile configuration of ukernel_amx.c (amx.h: the same bytes).
 *
 * Layouts (f32.h, tile_k = 32):
 *   A blocked: packed panels [kp/32][32][32] bf16, so a block's rows 0-15 are
 *     an A tile of row stride 64 bytes (rows 16-31 at +1024 bytes);
 *   A small M: the bf16 rows themselves (row stride lda·2 bytes); a K tail
 *     (K not a multiple of 32) is copied into a zero-padded block first;
 *   B: a block is 16 pair rows of 128 bytes (columns 0-15 at +0, 16-31 at
 *     +64), two B tiles of row stride 128;
 *   C: the driver's tile, row stride 32 fp32 (small M: 32·panels).
 * Padding is zeros on both sides (an exact +0 product per padded k).
 *
 * Small M (up to small_max = 64 rows): tiles of R = 1..32 rows (the R-row
 * configuration: no padded row is loaded or multiplied) over the whole K,
 * panel by panel, threads splitting N; the same blocks through the same
 * instruction as the blocked path, so a row gives the same bits on both
 * paths and with any K slicing or thread count.
 *
 * Numerics (docs/NUMERICS.md §4.2): products of bf16 pairs are exact in fp32
 * and summed in fp32 in the instruction's own order (Intel's SDM writes it
 * as two FMA chains, even and odd k, over the 16 pairs, then their sum added
 * to C), round to nearest even, bf16-denormal inputs read as 0 and denormal
 * results flushed, MXCSR ignored. The contract is a float64 bound, not the
 * bits of another kernel. */
#include <immintrin.h>

#include "cpu/x86/amx.h"
#include "cpu/x86/bf16_i8_avx512.h"
#include "cpu/x86/x86.h"

/* small M: the weight streamed once (from DRAM when large): prefetched 8 KiB
 * ahead into L2, as the VDPBF16PS and int8 small-M kernels do */
#define QL_AMX_SMALL_PF 8192

#if defined(__x86_64__)

/* ---- blocked: one 32×32 tile over k (a multiple of 32 but for the last
 * slice, whose padded block is zeros in A and B) */
static void tile_32x32c2(int64_t k, const float *av, int64_t lda, const float *bv, float *c, int accumulate)
{
    (void)lda;
    const uint16_t *a = (const uint16_t *)av, *b = (const uint16_t *)bv;
    ql_amx_use(&ql_amx_cfgs[32]);
    if (accumulate) {
        QL_TLOAD(0, c, 128);
        QL_TLOAD(1, c + 16, 128);
        QL_TLOAD(2, c + 16 * 32, 128);
        QL_TLOAD(3, c + 16 * 32 + 16, 128);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t p = 0; p < k; p += 32, a += 32 * 32, b += 16 * 64) {
        QL_TLOAD(4, a, 64);
        QL_TLOAD(6, b, 128);
        QL_TLOAD(7, b + 32, 128);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        QL_TLOAD(5, a + 16 * 32, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    QL_TSTORE(0, c, 128);
    QL_TSTORE(1, c + 16, 128);
    QL_TSTORE(2, c + 16 * 32, 128);
    QL_TSTORE(3, c + 16 * 32 + 16, 128);
}

/* rows (<= 32) int8 rows of a [K][32] panel -> bf16 pairs [16][32][2], the
 * pairs past `rows` zero (an odd last row's partner too). */
static inline __attribute__((always_inline)) void decode_block(const int sym, const ql_i8_tables *t, const int8_t *s,
                                                               int rows, uint16_t *d)
{
    int r = 0;
    for (; r + 2 <= rows; r += 2, s += 64, d += 64) {
        __m512i w0, w1;
        ql_i8_pairs(sym, t, _mm512_loadu_si512(s), &w0, &w1);
        _mm512_store_si512(d, w0);
        _mm512_store_si512(d + 32, w1);
    }
    if (r < rows) {
        __m512i w0, w1;
        ql_i8_pairs(sym, t, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)s)), &w0, &w1);
        _mm512_store_si512(d, w0);
        _mm512_store_si512(d + 32, w1);
        r += 2, d += 64;
    }
    for (; r < 32; r += 2, d += 64) {
        _mm512_store_si512(d, _mm512_setzero_si512());
        _mm512_store_si512(d + 32, _mm512_setzero_si512());
    }
}

/* The blocked path's slice decode: n codes ([n/32][32], n/32 = the slice's
 * kc) -> bf16 pairs, padded with zero pairs to a whole 32-k block. */
static inline __attribute__((always_inline)) void decode_slice(const int sym, const void *src, int64_t n, float *dst)
{
    const int8_t *s = src;
    uint16_t *d = (uint16_t *)dst;
    const ql_i8_tables t = ql_i8_tables_make();
    const int64_t rows = n / 32;
    for (int64_t r = 0; r < rows; r += 32, s += 32 * 32, d += 16 * 64)
        decode_block(sym, &t, s, rows - r < 32 ? (int)(rows - r) : 32, d);
}
static void decode_i8(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    (void)dt;
    decode_slice(0, src, n, dst);
}
static void decode_i7(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    (void)dt;
    decode_slice(1, src, n, dst);
}

static inline __attribute__((always_inline)) void prefetch_lines(const void *p, int lines)
{
    for (int i = 0; i < lines; i++) _mm_prefetch((const char *)p + 64 * i, _MM_HINT_T1);
}

/* ---- small M: R rows (1..32) × P panels (1, 2) over the whole K. i8: 0
 * dense (B bf16 pairs, K padded to 32), 1 int8 codes, 2 codes without -128.
 * A weight-only panel's blocks are decoded one ahead into two L1 buffers,
 * so a block's stores have long retired when its tiles load it. */
static inline __attribute__((always_inline)) void small_tile(const int i8, const int R, const int P, int64_t k,
                                                             const uint16_t *a, int64_t lda, const void *b, int64_t pe,
                                                             float *c)
{
    ql_amx_use(&ql_amx_cfgs[R]);
    const int hi = R > 16;
    const int64_t kf = k & ~(int64_t)31, rem = k - kf, lda_b = lda * 2;
    _Alignas(64) uint16_t at[32 * 32]; /* the K tail's block of A, zero-padded */
    _Alignas(64) uint16_t bt[2][16 * 64];
    if (rem)
        for (int r = 0; r < R; r++) {
            memcpy(at + r * 32, a + r * lda + kf, (size_t)rem * 2);
            memset(at + r * 32 + rem, 0, (size_t)(32 - rem) * 2);
        }
    ql_i8_tables t;
    if (i8) t = ql_i8_tables_make();
    for (int q = 0; q < P; q++) {
        _tile_zero(0);
        _tile_zero(1);
        if (hi) {
            _tile_zero(2);
            _tile_zero(3);
        }
        const int8_t *b8 = (const int8_t *)b + q * pe;      /* i8: [k][32] codes */
        const uint16_t *b16 = (const uint16_t *)b + q * pe; /* dense: [kp/2][32][2] */
        if (i8) decode_block(i8 == 2, &t, b8, k < 32 ? (int)k : 32, bt[0]);
        for (int64_t p = 0, blk = 0; p < k; p += 32, blk++) {
            const int tail = p == kf;
            const uint16_t *ab = tail ? at : a + p;
            const int64_t as = tail ? 64 : lda_b;
            const uint16_t *bb;
            if (i8) {
                prefetch_lines(b8 + p * 32 + QL_AMX_SMALL_PF, 16);
                bb = bt[blk & 1];
            } else {
                prefetch_lines(b16 + p * 32 + QL_AMX_SMALL_PF / 2, 32);
                bb = b16 + p * 32;
            }
            QL_TLOAD(4, ab, as);
            QL_TLOAD(6, bb, 128);
            QL_TLOAD(7, bb + 32, 128);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            if (hi) {
                QL_TLOAD(5, ab + 16 * (tail ? 32 : lda), as);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            if (i8 && p + 32 < k) /* the next block, while the tiles multiply */
                decode_block(i8 == 2, &t, b8 + (p + 32) * 32, k - p - 32 < 32 ? (int)(k - p - 32) : 32, bt[(blk + 1) & 1]);
        }
        const int64_t ldc = (int64_t)P * 32 * 4;
        QL_TSTORE(0, c + q * 32, ldc);
        QL_TSTORE(1, c + q * 32 + 16, ldc);
        if (hi) {
            QL_TSTORE(2, c + 16 * P * 32 + q * 32, ldc);
            QL_TSTORE(3, c + 16 * P * 32 + q * 32 + 16, ldc);
        }
    }
}

#define QL_SMALL(name, I8)                                                                                            \
    static void name(int rows, int panels, int64_t k, const float *a, int64_t lda, const void *b, int64_t pe,       \
                     ql_dtype dt, float *c)                                                                         \
    {                                                                                                               \
        (void)dt;                                                                                                   \
        if (panels == 2) small_tile(I8, rows, 2, k, (const uint16_t *)a, lda, b, pe, c);                            \
        else small_tile(I8, rows, 1, k, (const uint16_t *)a, lda, b, pe, c);                                        \
    }
QL_SMALL(small_dense, 0)
QL_SMALL(small_i8, 1)
QL_SMALL(small_i7, 2)
#undef QL_SMALL

#else /* 32-bit x86: no tile instructions, and the amx table is never supported (features_x86.c) */

static void tile_32x32c2(int64_t k, const float *a, int64_t lda, const float *b, float *c, int accumulate)
{
    (void)k, (void)a, (void)lda, (void)b, (void)c, (void)accumulate;
}
static void decode_i8(ql_dtype dt, const void *src, int64_t n, float *dst) { (void)dt, (void)src, (void)n, (void)dst; }
#define decode_i7 decode_i8
static void small_dense(int rows, int panels, int64_t k, const float *a, int64_t lda, const void *b, int64_t pe,
                        ql_dtype dt, float *c)
{
    (void)rows, (void)panels, (void)k, (void)a, (void)lda, (void)b, (void)pe, (void)dt, (void)c;
}
#define small_i8 small_dense
#define small_i7 small_dense

#endif

/* small M up to 64 rows (two 32-row tiles per streamed panel): an estimate,
 * as the int8 kernel's small_m (QLINEAR_SMALL_M moves it) */
const ql_f32_kernel ql_bf16_gemm_32x32c2__amx = {QL_ISA_AMX, "bf16_gemm_32x32c2__amx", 32, 32, tile_32x32c2, NULL,
                                                 "bf16_small_32x64c2__amx", 32, small_dense, 64, 2, 1, NULL, 0, 32,
                                                 ql_amx_begin};
static const ql_f32_kernel i7 = {QL_ISA_AMX, "bf16_gemm_32x32c2i7__amx", 32, 32, tile_32x32c2, decode_i7,
                                 "bf16_small_32x64c2i7__amx", 32, small_i7, 64, 0, 1, NULL, 0, 32, ql_amx_begin};
const ql_f32_kernel ql_bf16_gemm_32x32c2i8__amx = {QL_ISA_AMX, "bf16_gemm_32x32c2i8__amx", 32, 32, tile_32x32c2, decode_i8,
                                                   "bf16_small_32x64c2i8__amx", 32, small_i8, 64, 0, 1, &i7, 0, 32,
                                                   ql_amx_begin};
