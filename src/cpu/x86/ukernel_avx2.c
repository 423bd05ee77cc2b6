/* AVX2 without VNNI, exact: vpmaddwd on int16 operands widened once —
 * activations in the prologue, weights per block by the driver (or in
 * registers by the small-M tiles) — gives exact int32 sums of two products
 * (vpmaddubsw, whose int16 sums saturate at ±128·±128·2, would need codes
 * restricted to ±127 and a sign transfer per product). R×16
 * tiles, R = 1..6: 2R accumulators, two weight vectors (8 columns × a k
 * pair each) and one broadcast k pair per row; no shuffle in the loop.
 * A: [kp/32][R][32] int16 (the prologue's 32-code blocks, widened).
 * B: [kp/2][16][2] (kg = 2), int8 in the packed weight, int16 widened. */
#include <immintrin.h>

#include "cpu/x86/x86.h"

static inline __attribute__((always_inline)) void tile_rx16c2(const int R, const bool b16, int64_t k4, const int8_t *a8,
                                                              const uint8_t *b, int32_t *c, int accumulate)
{
    const int16_t *a = (const int16_t *)a8;
    __m256i acc[6][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        acc[r][0] = accumulate ? _mm256_load_si256((const __m256i *)(c + 16 * r)) : _mm256_setzero_si256();
        acc[r][1] = accumulate ? _mm256_load_si256((const __m256i *)(c + 16 * r + 8)) : _mm256_setzero_si256();
    }
    for (int64_t q0 = 0; q0 < k4; q0 += 8, a += R * 32) { /* 32 k: one A block */
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++) {
            __m256i b0, b1;
            if (b16) {
                b0 = _mm256_load_si256((const __m256i *)b);
                b1 = _mm256_load_si256((const __m256i *)(b + 32));
                b += 64;
            } else {
                b0 = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)b));
                b1 = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(b + 16)));
                b += 32;
            }
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                int32_t pair;
                memcpy(&pair, a + 32 * r + 2 * u, 4);
                const __m256i ar = _mm256_set1_epi32(pair);
                acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(ar, b0));
                acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(ar, b1));
                /* integer adds reassociate: without this GCC sums the 16
                 * unrolled products as a tree and spills them to the stack */
                __asm__("" : "+x"(acc[r][0]), "+x"(acc[r][1]));
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_store_si256((__m256i *)(c + 16 * r), acc[r][0]);
        _mm256_store_si256((__m256i *)(c + 16 * r + 8), acc[r][1]);
    }
}

/* int8 -> int16, n a multiple of 32 */
static void widen_avx2(const int8_t *src, int16_t *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i += 32) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(src + i));
        _mm256_store_si256((__m256i *)(dst + i), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
        _mm256_store_si256((__m256i *)(dst + i + 16), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
    }
}

#define QL_TILES(R)                                                                                          \
    static void tile_##R##x16c2_avx2(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int acc)     \
    {                                                                                                        \
        tile_rx16c2(R, false, k4, a, b, c, acc);                                                             \
    }                                                                                                        \
    static void tile_##R##x16c2_b16_avx2(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int acc) \
    {                                                                                                        \
        tile_rx16c2(R, true, k4, a, b, c, acc);                                                              \
    }
QL_TILES(1) QL_TILES(2) QL_TILES(3) QL_TILES(4) QL_TILES(5) QL_TILES(6)
#undef QL_TILES

#define QL_K(R)                                                                                               \
    {QL_ISA_AVX2, "s8_gemm_" #R "x16c2__avx2", R, 16, 32, false, false, tile_##R##x16c2_avx2, 2, 2,          \
     tile_##R##x16c2_b16_avx2, widen_avx2, NULL}
const ql_s8_kernel ql_s8_small_avx2[6] = {QL_K(1), QL_K(2), QL_K(3), QL_K(4), QL_K(5), QL_K(6)};
#undef QL_K
