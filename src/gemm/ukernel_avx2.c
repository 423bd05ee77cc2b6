/* AVX2 without VNNI, exact: int8 sign-extended to int16, vpmaddwd gives exact
 * int32 pair sums (no vpmaddubsw, whose int16 sums saturate). 4×8 tile; each
 * accumulator holds two partial sums per column, folded at the end. */
#include <immintrin.h>

#include "gemm.h"

static void tile_4x8c4_avx2(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
    __m256i lo0 = _mm256_setzero_si256(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0, hi2 = lo0, lo3 = lo0, hi3 = lo0;
    for (int64_t q = 0; q < k4; q++, b += 32) {
        const int8_t *ak = a + (q / 8) * 4 * 32 + (q % 8) * 4; /* A in 32-byte blocks per row (gemm.h) */
        __m256i blo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b));        /* cols 0-3 × 4 k */
        __m256i bhi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 16))); /* cols 4-7 */
        int32_t w0, w1, w2, w3;
        memcpy(&w0, ak, 4); memcpy(&w1, ak + 32, 4); memcpy(&w2, ak + 64, 4); memcpy(&w3, ak + 96, 4);
        __m256i a0 = _mm256_cvtepi8_epi16(_mm_set1_epi32(w0)), a1 = _mm256_cvtepi8_epi16(_mm_set1_epi32(w1));
        __m256i a2 = _mm256_cvtepi8_epi16(_mm_set1_epi32(w2)), a3 = _mm256_cvtepi8_epi16(_mm_set1_epi32(w3));
        lo0 = _mm256_add_epi32(lo0, _mm256_madd_epi16(a0, blo)); hi0 = _mm256_add_epi32(hi0, _mm256_madd_epi16(a0, bhi));
        lo1 = _mm256_add_epi32(lo1, _mm256_madd_epi16(a1, blo)); hi1 = _mm256_add_epi32(hi1, _mm256_madd_epi16(a1, bhi));
        lo2 = _mm256_add_epi32(lo2, _mm256_madd_epi16(a2, blo)); hi2 = _mm256_add_epi32(hi2, _mm256_madd_epi16(a2, bhi));
        lo3 = _mm256_add_epi32(lo3, _mm256_madd_epi16(a3, blo)); hi3 = _mm256_add_epi32(hi3, _mm256_madd_epi16(a3, bhi));
    }
    /* hadd gives (c0 c1 c4 c5 | c2 c3 c6 c7); reorder 64-bit lanes to c0..c7. */
#define QL_FOLD(lo, hi, row)                                                                             \
    {                                                                                                    \
        __m256i t = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo, hi), 0xD8);                           \
        if (accumulate) t = _mm256_add_epi32(t, _mm256_loadu_si256((const __m256i *)(c + 8 * (row))));  \
        _mm256_storeu_si256((__m256i *)(c + 8 * (row)), t);                                              \
    }
    QL_FOLD(lo0, hi0, 0); QL_FOLD(lo1, hi1, 1); QL_FOLD(lo2, hi2, 2); QL_FOLD(lo3, hi3, 3);
#undef QL_FOLD
}

const ql_s8_kernel ql_s8_gemm_4x8c4__avx2 = {QL_ISA_AVX2, "s8_gemm_4x8c4__avx2", 4, 8, 32, false, false, tile_4x8c4_avx2};
