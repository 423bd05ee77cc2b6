/* AVX-512 fp32 micro-kernel, 12×32: 24 zmm accumulators, two weight loads and
 * twelve broadcast FMAs per k; and the bf16 / int8 -> fp32 slice decoder. */
#include <immintrin.h>

#include "cpu/x86/x86.h"

static void tile_12x32_avx512(int64_t k, const float *a, int64_t lda, const float *b, float *c, int accumulate)
{
#define QL_ROW_DECL(r)                                                           \
    __m512 c##r##0 = accumulate ? _mm512_load_ps(c + 32 * (r)) : _mm512_setzero_ps(); \
    __m512 c##r##1 = accumulate ? _mm512_load_ps(c + 32 * (r) + 16) : _mm512_setzero_ps();
    QL_ROW_DECL(0) QL_ROW_DECL(1) QL_ROW_DECL(2) QL_ROW_DECL(3) QL_ROW_DECL(4) QL_ROW_DECL(5)
    QL_ROW_DECL(6) QL_ROW_DECL(7) QL_ROW_DECL(8) QL_ROW_DECL(9) QL_ROW_DECL(10) QL_ROW_DECL(11)
#undef QL_ROW_DECL
    const float *a0 = a, *a6 = a + 6 * lda;
    for (int64_t p = 0; p < k; p++, b += 32) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#define QL_ROW(r, base, off)                               \
    {                                                      \
        __m512 ar = _mm512_set1_ps(base[(off) * lda + p]); \
        c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0);        \
        c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1);        \
    }
        QL_ROW(0, a0, 0) QL_ROW(1, a0, 1) QL_ROW(2, a0, 2) QL_ROW(3, a0, 3) QL_ROW(4, a0, 4) QL_ROW(5, a0, 5)
        QL_ROW(6, a6, 0) QL_ROW(7, a6, 1) QL_ROW(8, a6, 2) QL_ROW(9, a6, 3) QL_ROW(10, a6, 4) QL_ROW(11, a6, 5)
#undef QL_ROW
    }
#define QL_STORE(r) _mm512_store_ps(c + 32 * (r), c##r##0); _mm512_store_ps(c + 32 * (r) + 16, c##r##1);
    QL_STORE(0) QL_STORE(1) QL_STORE(2) QL_STORE(3) QL_STORE(4) QL_STORE(5)
    QL_STORE(6) QL_STORE(7) QL_STORE(8) QL_STORE(9) QL_STORE(10) QL_STORE(11)
#undef QL_STORE
}

/* n is a multiple of 32 (whole slices of a 32-column panel). */
static void decode_avx512(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    if (dt == QL_I8) {
        const int8_t *s = src;
        for (int64_t i = 0; i < n; i += 16)
            _mm512_store_ps(dst + i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + i)))));
    } else {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i += 16)
            _mm512_store_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(
                                         _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + i))), 16)));
    }
}

/* Small-M tiles: R rows × P panels of 32 columns (R <= 6, P <= 2: up to 24
 * accumulators; one row also over 3 or 4 panels, so that eight FMA chains
 * hide the instruction's latency), the weight decoded in registers as it
 * streams past. */
static inline __attribute__((always_inline)) __m512 load_w(const ql_dtype dt, const void *b, int64_t at)
{
    if (dt == QL_F32) return _mm512_loadu_ps((const float *)b + at);
    if (dt == QL_I8)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)b + at))));
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)b + at))), 16));
}

#define QL_F32_SMALL_PF 1024 /* prefetch distance, bytes of each panel's stream */
static inline __attribute__((always_inline)) void small_tile(const int R, const int P, const ql_dtype dt, int64_t k,
                                                             const float *a, int64_t lda, const void *b, int64_t pe,
                                                             float *c)
{
    __m512 acc[6][8];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * P; v++) acc[r][v] = _mm512_setzero_ps();
    const int es = dt == QL_F32 ? 4 : dt == QL_I8 ? 1 : 2, line = 64 / (32 * es); /* k steps per cache line */
    for (int64_t p = 0; p < k; p++) {
        /* each panel is a stream of its own: prefetched, like the int8 small-M tiles */
        if (line <= 1 || p % line == 0)
#pragma GCC unroll 4
            for (int q = 0; q < P; q++)
#pragma GCC unroll 2
                for (int o = 0; o < 32 * es; o += 64)
                    _mm_prefetch((const char *)b + (q * pe + p * 32) * es + o + QL_F32_SMALL_PF, _MM_HINT_T0);
        /* rows broadcast first, then one weight vector at a time: R·2P
         * accumulators + R + 1 registers (at most 24 + 6 + 1 of the 32 zmm: no spill) */
        __m512 ar[6];
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) ar[r] = _mm512_set1_ps(a[r * lda + p]);
#pragma GCC unroll 8
        for (int v = 0; v < 2 * P; v++) {
            const __m512 w = load_w(dt, b, (v / 2) * pe + p * 32 + (v % 2) * 16);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) acc[r][v] = _mm512_fmadd_ps(ar[r], w, acc[r][v]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int v = 0; v < 2 * P; v++) _mm512_store_ps(c + r * 32 * P + 16 * v, acc[r][v]);
}

#define QL_RP(R, P)                                                                                              \
    static void small_##R##_##P(ql_dtype dt, int64_t k, const float *a, int64_t lda, const void *b, int64_t pe,  \
                                float *c)                                                                         \
    {                                                                                                             \
        if (dt == QL_F32) small_tile(R, P, QL_F32, k, a, lda, b, pe, c);                                          \
        else if (dt == QL_I8) small_tile(R, P, QL_I8, k, a, lda, b, pe, c);                                       \
        else small_tile(R, P, QL_BF16, k, a, lda, b, pe, c);                                                      \
    }
#define QL_R(R) QL_RP(R, 1) QL_RP(R, 2)
QL_R(1) QL_R(2) QL_R(3) QL_R(4) QL_R(5) QL_R(6)
QL_RP(1, 3) QL_RP(1, 4)
#undef QL_R
#undef QL_RP

typedef void (*small_fn)(ql_dtype, int64_t, const float *, int64_t, const void *, int64_t, float *);
static void small_avx512(int rows, int panels, int64_t k, const float *a, int64_t lda, const void *b, int64_t pe,
                         ql_dtype dt, float *c)
{
    static const small_fn fns[6][4] = {{small_1_1, small_1_2, small_1_3, small_1_4}, {small_2_1, small_2_2},
                                       {small_3_1, small_3_2}, {small_4_1, small_4_2}, {small_5_1, small_5_2},
                                       {small_6_1, small_6_2}};
    fns[rows - 1][panels - 1](dt, k, a, lda, b, pe, c);
}

const ql_f32_kernel ql_f32_gemm_12x32__avx512 = {QL_ISA_AVX512VNNI, "f32_gemm_12x32__avx512", 12, 32, tile_12x32_avx512, decode_avx512,
                                                 "f32_gemv_6x64__avx512", 6, small_avx512, 80, 0, 0, NULL, 1, 0, NULL};
