/* AVX2 + FMA fp32 micro-kernel, 6×16: 12 ymm accumulators, two weight loads
 * and six broadcast FMAs per k; and the bf16 / int8 -> fp32 slice decoder. */
#include <immintrin.h>

#include "cpu/x86/x86.h"

static void tile_6x16_avx2(int64_t k, const float *a, int64_t lda, const float *b, float *c, int accumulate)
{
#define QL_ROW_DECL(r)                                                              \
    __m256 c##r##0 = accumulate ? _mm256_load_ps(c + 16 * (r)) : _mm256_setzero_ps(); \
    __m256 c##r##1 = accumulate ? _mm256_load_ps(c + 16 * (r) + 8) : _mm256_setzero_ps();
    QL_ROW_DECL(0) QL_ROW_DECL(1) QL_ROW_DECL(2) QL_ROW_DECL(3) QL_ROW_DECL(4) QL_ROW_DECL(5)
#undef QL_ROW_DECL
    for (int64_t p = 0; p < k; p++, b += 16) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#define QL_ROW(r)                                             \
    {                                                         \
        __m256 ar = _mm256_broadcast_ss(a + (r) * lda + p);   \
        c##r##0 = _mm256_fmadd_ps(ar, b0, c##r##0);           \
        c##r##1 = _mm256_fmadd_ps(ar, b1, c##r##1);           \
    }
        QL_ROW(0) QL_ROW(1) QL_ROW(2) QL_ROW(3) QL_ROW(4) QL_ROW(5)
#undef QL_ROW
    }
#define QL_STORE(r) _mm256_store_ps(c + 16 * (r), c##r##0); _mm256_store_ps(c + 16 * (r) + 8, c##r##1);
    QL_STORE(0) QL_STORE(1) QL_STORE(2) QL_STORE(3) QL_STORE(4) QL_STORE(5)
#undef QL_STORE
}

/* n is a multiple of 16 (whole slices of a 16-column panel). */
static void decode_avx2(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    if (dt == QL_I8) {
        const int8_t *s = src;
        for (int64_t i = 0; i < n; i += 8)
            _mm256_store_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + i)))));
    } else {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i += 8)
            _mm256_store_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(
                                         _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i))), 16)));
    }
}

/* Small-M tiles: R rows × P panels of 16 columns (R <= 3, P <= 2: up to 12
 * accumulators), the weight decoded in registers as it streams past. */
static inline __attribute__((always_inline)) __m256 load_w(const ql_dtype dt, const void *b, int64_t at)
{
    if (dt == QL_F32) return _mm256_loadu_ps((const float *)b + at);
    if (dt == QL_I8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)b + at))));
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)b + at))), 16));
}

#define QL_F32_SMALL_PF 1024 /* prefetch distance, bytes of each panel's stream */
static inline __attribute__((always_inline)) void small_tile(const int R, const int P, const ql_dtype dt, int64_t k,
                                                             const float *a, int64_t lda, const void *b, int64_t pe,
                                                             float *c)
{
    __m256 acc[3][4];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 2 * P; v++) acc[r][v] = _mm256_setzero_ps();
    const int es = dt == QL_F32 ? 4 : dt == QL_I8 ? 1 : 2, line = 64 / (16 * es); /* k steps per cache line */
    for (int64_t p = 0; p < k; p++) {
        /* each panel is a stream of its own: prefetched, like the int8 small-M tiles */
        if (line <= 1 || p % line == 0)
#pragma GCC unroll 2
            for (int q = 0; q < P; q++)
#pragma GCC unroll 2
                for (int o = 0; o < 16 * es; o += 64)
                    _mm_prefetch((const char *)b + (q * pe + p * 16) * es + o + QL_F32_SMALL_PF, _MM_HINT_T0);
        /* rows broadcast first, then one weight vector at a time: R·2P
         * accumulators + R + 1 registers (3×32 on AVX2: 16, no spill) */
        __m256 ar[3];
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) ar[r] = _mm256_broadcast_ss(a + r * lda + p);
#pragma GCC unroll 4
        for (int v = 0; v < 2 * P; v++) {
            const __m256 w = load_w(dt, b, (v / 2) * pe + p * 16 + (v % 2) * 8);
#pragma GCC unroll 3
            for (int r = 0; r < R; r++) acc[r][v] = _mm256_fmadd_ps(ar[r], w, acc[r][v]);
        }
    }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int v = 0; v < 2 * P; v++) _mm256_store_ps(c + r * 16 * P + 8 * v, acc[r][v]);
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
QL_R(1) QL_R(2) QL_R(3)
#undef QL_R
#undef QL_RP

typedef void (*small_fn)(ql_dtype, int64_t, const float *, int64_t, const void *, int64_t, float *);
static void small_avx2(int rows, int panels, int64_t k, const float *a, int64_t lda, const void *b, int64_t pe,
                       ql_dtype dt, float *c)
{
    static const small_fn fns[3][2] = {{small_1_1, small_1_2}, {small_2_1, small_2_2}, {small_3_1, small_3_2}};
    fns[rows - 1][panels - 1](dt, k, a, lda, b, pe, c);
}

const ql_f32_kernel ql_f32_gemm_6x16__avx2 = {QL_ISA_AVX2, "f32_gemm_6x16__avx2", 6, 16, tile_6x16_avx2, decode_avx2,
                                              "f32_gemv_3x32__avx2", 3, small_avx2, 16, 0, 0, NULL, 0, 0, NULL};
