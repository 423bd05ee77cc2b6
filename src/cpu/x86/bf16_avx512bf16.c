/* AVX512_BF16 micro-kernels, 12×32 with VDPBF16PS: each instruction adds a
 * pair of bf16 products (k, k+1) into 16 fp32 lanes, 32 multiply-adds against
 * FMA's 16. 24 zmm accumulators; per 2 k: two 64-byte loads of B (packed
 * [K/2][32][2]: 16 column pairs each) and 24 VDPBF16PS, each with one A pair
 * broadcast from memory (A packed in panels [K/2][12][2]: one stream). Two
 * kernels share the tile:
 *   bf16_gemm_12x32c2__avx512bf16     dense bf16-compute layers (B bf16 pairs)
 *   bf16_gemm_12x32c2i8__avx512bf16   weight-only layers with bf16 activations:
 *       the f32 kernel's int8 packing ([K][32]) decoded to bf16 pairs (exact:
 *       every int8 is a bf16), per K slice (blocked) or in registers (small M).
 * Numerics (Intel SDM, VDPBF16PS; verified on Zen 5): per pair,
 *     acc = FMA(w[k+1], x[k+1], acc); acc = FMA(w[k], x[k], acc)
 * each rounded to nearest even, bf16 denormal inputs and a denormal acc read
 * as zero, denormal results (tiny after rounding) flushed to signed zero,
 * MXCSR ignored; NaN: the weight's, else the activation's, else the
 * accumulator's, quieted; an invalid operation the default NaN (0xffc00000).
 * The twins in generic/bf16_generic.c model this bit for bit; every path here
 * (blocked with any K slicing, small-M, any thread count) runs the same
 * chain per output, so all give the same bits. */
#include <immintrin.h>

#include "cpu/x86/bf16_i8_avx512.h"
#include "cpu/x86/x86.h"

#define QL_BF16_PF 1024 /* prefetch distance in the B streams, bytes */
/* small M: B streamed once (from DRAM when large): 8 KiB ahead into L2, as the int8 kernels' QL_SMALL_PF */
#define QL_BF16_SMALL_PF 8192

static inline __attribute__((always_inline)) __m512 dp(__m512 acc, __m512i w, const uint16_t *x)
{
    uint32_t pair;
    memcpy(&pair, x, 4);
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_set1_epi32((int)pair));
}

/* The last pair of an odd K: x[k] alone (its partner 0, as B's padding). */
static inline __attribute__((always_inline)) __m512 dp1(__m512 acc, __m512i w, const uint16_t *x)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)_mm512_set1_epi32((int)(uint32_t)*x));
}

/* a: the packed A panel's slice ([ceil(k/2)][12][2], K padded with 0). */
static void tile_12x32c2(int64_t k, const float *av, int64_t lda, const float *bv, float *c, int accumulate)
{
    (void)lda;
    const uint16_t *a = (const uint16_t *)av;
    const uint16_t *b = (const uint16_t *)bv;
#define QL_ROW_DECL(r)                                                                \
    __m512 c##r##0 = accumulate ? _mm512_load_ps(c + 32 * (r)) : _mm512_setzero_ps(); \
    __m512 c##r##1 = accumulate ? _mm512_load_ps(c + 32 * (r) + 16) : _mm512_setzero_ps();
    QL_ROW_DECL(0) QL_ROW_DECL(1) QL_ROW_DECL(2) QL_ROW_DECL(3) QL_ROW_DECL(4) QL_ROW_DECL(5)
    QL_ROW_DECL(6) QL_ROW_DECL(7) QL_ROW_DECL(8) QL_ROW_DECL(9) QL_ROW_DECL(10) QL_ROW_DECL(11)
#undef QL_ROW_DECL
    const int64_t k2 = (k + 1) / 2;
#define QL_ROW(r)                              \
    c##r##0 = dp(c##r##0, b0, a + 2 * (r)); \
    c##r##1 = dp(c##r##1, b1, a + 2 * (r));
    for (int64_t p = 0; p < k2; p++, b += 64, a += 24) {
        _mm_prefetch((const char *)b + QL_BF16_PF, _MM_HINT_T0);
        _mm_prefetch((const char *)b + QL_BF16_PF + 64, _MM_HINT_T0);
        const __m512i b0 = _mm512_load_si512(b), b1 = _mm512_load_si512(b + 32);
        QL_ROW(0) QL_ROW(1) QL_ROW(2) QL_ROW(3) QL_ROW(4) QL_ROW(5)
        QL_ROW(6) QL_ROW(7) QL_ROW(8) QL_ROW(9) QL_ROW(10) QL_ROW(11)
    }
#undef QL_ROW
#define QL_STORE(r) _mm512_store_ps(c + 32 * (r), c##r##0); _mm512_store_ps(c + 32 * (r) + 16, c##r##1);
    QL_STORE(0) QL_STORE(1) QL_STORE(2) QL_STORE(3) QL_STORE(4) QL_STORE(5)
    QL_STORE(6) QL_STORE(7) QL_STORE(8) QL_STORE(9) QL_STORE(10) QL_STORE(11)
#undef QL_STORE
}

/* The blocked path's slice decode: n codes ([n/32][32]) -> bf16 pairs. */
static inline __attribute__((always_inline)) void decode_pairs(const int sym, const void *src, int64_t n, float *dst)
{
    const int8_t *s = src;
    uint16_t *d = (uint16_t *)dst;
    const ql_i8_tables t = ql_i8_tables_make();
    const int64_t rows = n / 32;
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2, s += 64, d += 64) {
        __m512i w0, w1;
        ql_i8_pairs(sym, &t, _mm512_loadu_si512(s), &w0, &w1);
        _mm512_store_si512(d, w0);
        _mm512_store_si512(d + 32, w1);
    }
    if (r < rows) { /* an odd slice: row k+1 is 0 */
        __m512i w0, w1;
        ql_i8_pairs(sym, &t, _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)s)), &w0, &w1);
        _mm512_store_si512(d, w0);
        _mm512_store_si512(d + 32, w1);
    }
}
static void decode_i8_pairs(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    (void)dt;
    decode_pairs(0, src, n, dst);
}
static void decode_i8_pairs_sym(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    (void)dt;
    decode_pairs(1, src, n, dst);
}

/* ---- small M: R rows × P panels of 32 columns over the whole K (R <= 6,
 * P <= 2, or one row over up to 4 panels: up to 24 accumulators), B streamed: bf16 pairs loaded as they
 * are (dense) or int8 codes decoded in registers (weight-only). */
static inline __attribute__((always_inline)) void small_step(const int R, const int P, const int i8, const int whole,
                                                             const ql_i8_tables *t, int64_t p, const uint16_t *a,
                                                             int64_t lda, const void *b, int64_t pe, __m512 acc[6][8])
{
    __m512i w[8];
#pragma GCC unroll 4
    for (int q = 0; q < P; q++) {
        if (i8) {
            const int8_t *bq = (const int8_t *)b + q * pe + 64 * p;
            _mm_prefetch((const char *)bq + QL_BF16_SMALL_PF, _MM_HINT_T1);
            const __m512i rows =
                whole ? _mm512_loadu_si512(bq) : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)bq));
            ql_i8_pairs(i8 == 2, t, rows, &w[2 * q], &w[2 * q + 1]);
        } else {
            const uint16_t *bq = (const uint16_t *)b + q * pe + 64 * p;
            _mm_prefetch((const char *)bq + QL_BF16_SMALL_PF, _MM_HINT_T1);
            _mm_prefetch((const char *)bq + QL_BF16_SMALL_PF + 64, _MM_HINT_T1);
            w[2 * q] = _mm512_loadu_si512(bq);
            w[2 * q + 1] = _mm512_loadu_si512(bq + 32);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * P; v++)
            acc[r][v] = whole ? dp(acc[r][v], w[v], a + r * lda + 2 * p) : dp1(acc[r][v], w[v], a + r * lda + 2 * p);
}

static inline __attribute__((always_inline)) void small_tile(const int R, const int P, const int i8, int64_t k,
                                                             const uint16_t *a, int64_t lda, const void *b, int64_t pe,
                                                             float *c)
{
    __m512 acc[6][8];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * P; v++) acc[r][v] = _mm512_setzero_ps();
    ql_i8_tables t;
    if (i8) t = ql_i8_tables_make();
    const int64_t k2 = k / 2;
    for (int64_t p = 0; p < k2; p++) small_step(R, P, i8, 1, &t, p, a, lda, b, pe, acc);
    if (k & 1) small_step(R, P, i8, 0, &t, k2, a, lda, b, pe, acc);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * P; v++) _mm512_store_ps(c + r * 32 * P + 16 * v, acc[r][v]);
}

#define QL_RP(R, P)                                                                                                \
    static void small_##R##_##P(int i8, int64_t k, const uint16_t *a, int64_t lda, const void *b, int64_t pe,      \
                                float *c)                                                                           \
    {                                                                                                               \
        if (i8 == 2) small_tile(R, P, 2, k, a, lda, b, pe, c);                                                      \
        else if (i8) small_tile(R, P, 1, k, a, lda, b, pe, c);                                                      \
        else small_tile(R, P, 0, k, a, lda, b, pe, c);                                                              \
    }
#define QL_R(R) QL_RP(R, 1) QL_RP(R, 2)
QL_R(1) QL_R(2) QL_R(3) QL_R(4) QL_R(5) QL_R(6) QL_RP(1, 3) QL_RP(1, 4)
#undef QL_R
#undef QL_RP

typedef void (*small_fn)(int, int64_t, const uint16_t *, int64_t, const void *, int64_t, float *);
static void small_bf16(int rows, int panels, int64_t k, const float *a, int64_t lda, const void *b, int64_t pe,
                       ql_dtype dt, float *c)
{
    static const small_fn fns[6][4] = {{small_1_1, small_1_2, small_1_3, small_1_4}, {small_2_1, small_2_2},
                                       {small_3_1, small_3_2}, {small_4_1, small_4_2}, {small_5_1, small_5_2},
                                       {small_6_1, small_6_2}};
    fns[rows - 1][panels - 1](dt == QL_I8, k, (const uint16_t *)a, lda, b, pe, c);
}
static void small_sym(int rows, int panels, int64_t k, const float *a, int64_t lda, const void *b, int64_t pe,
                      ql_dtype dt, float *c)
{
    static const small_fn fns[6][4] = {{small_1_1, small_1_2, small_1_3, small_1_4}, {small_2_1, small_2_2},
                                       {small_3_1, small_3_2}, {small_4_1, small_4_2}, {small_5_1, small_5_2},
                                       {small_6_1, small_6_2}};
    fns[rows - 1][panels - 1](dt == QL_I8 ? 2 : 0, k, (const uint16_t *)a, lda, b, pe, c);
}

const ql_f32_kernel ql_bf16_gemm_12x32c2__avx512bf16 = {QL_ISA_AVX512BF16, "bf16_gemm_12x32c2__avx512bf16", 12, 32, tile_12x32c2,
                                                        NULL, "bf16_gemv_6x64c2__avx512bf16", 6, small_bf16, 80, 2, 1, NULL, 1, 0, NULL};
static const ql_f32_kernel i7 = {QL_ISA_AVX512BF16, "bf16_gemm_12x32c2i7__avx512bf16", 12, 32, tile_12x32c2, decode_i8_pairs_sym,
                                 "bf16_gemv_6x64c2i7__avx512bf16", 6, small_sym, 80, 0, 1, NULL, 1, 0, NULL};
const ql_f32_kernel ql_bf16_gemm_12x32c2i8__avx512bf16 = {QL_ISA_AVX512BF16, "bf16_gemm_12x32c2i8__avx512bf16", 12, 32,
                                                          tile_12x32c2, decode_i8_pairs, "bf16_gemv_6x64c2i8__avx512bf16", 6,
                                                          small_bf16, 80, 0, 1, &i7, 1, 0, NULL};
