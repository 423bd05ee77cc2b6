/* AVX-VNNI (VEX, ymm) int8 micro-kernel, 6×16 tile: 12 ymm accumulators,
 * two weight loads and six broadcasts per 4-k step. A holds each row's codes
 * in 32-byte blocks ([k/32][6][32], see gemm.h), so k4 is a multiple of 8. */
#include <immintrin.h>

#include "cpu/x86/x86.h"

static inline __m256i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static void tile_6x16c4_avxvnni(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
#define QL_ROW_DECL(r)                                                                     \
    __m256i c##r##0 = accumulate ? _mm256_load_si256((const __m256i *)(c + 16 * (r) + 8 * 0)) : _mm256_setzero_si256(); \
    __m256i c##r##1 = accumulate ? _mm256_load_si256((const __m256i *)(c + 16 * (r) + 8 * 1)) : _mm256_setzero_si256();
    QL_ROW_DECL(0) QL_ROW_DECL(1) QL_ROW_DECL(2) QL_ROW_DECL(3) QL_ROW_DECL(4) QL_ROW_DECL(5)
#undef QL_ROW_DECL
    for (int64_t q0 = 0; q0 < k4; q0 += 8, a += 6 * 32) {
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++, b += 64) {
            __m256i b0 = _mm256_load_si256((const __m256i *)b), b1 = _mm256_load_si256((const __m256i *)(b + 32));
#define QL_ROW(r)                                           \
    {                                                       \
        __m256i ar = bcast4(a + 32 * (r) + 4 * u);          \
        c##r##0 = _mm256_dpbusd_avx_epi32(c##r##0, b0, ar); \
        c##r##1 = _mm256_dpbusd_avx_epi32(c##r##1, b1, ar); \
    }
            QL_ROW(0) QL_ROW(1) QL_ROW(2) QL_ROW(3) QL_ROW(4) QL_ROW(5)
#undef QL_ROW
        }
    }
#define QL_STORE(r)                                               \
    _mm256_store_si256((__m256i *)(c + 16 * (r)), c##r##0);      \
    _mm256_store_si256((__m256i *)(c + 16 * (r) + 8), c##r##1);
    QL_STORE(0) QL_STORE(1) QL_STORE(2) QL_STORE(3) QL_STORE(4) QL_STORE(5)
#undef QL_STORE
}

const ql_s8_kernel ql_s8_gemm_6x16c4__avxvnni = {QL_ISA_AVXVNNI, "s8_gemm_6x16c4__avxvnni", 6, 16, 32, true, true,
                                                 tile_6x16c4_avxvnni, 4, 1, NULL, NULL, NULL};

/* Small-M tiles, R×16 for R = 1..5 (ql_s8_kernel_rows); up to 2 rows keep
 * two accumulator sets (even and odd k steps) for enough independent chains. */
static inline __attribute__((always_inline)) void tile_rx16(const int R, int64_t k4, const int8_t *a, const uint8_t *b,
                                                            int32_t *c, int accumulate)
{
    __m256i acc[6][2], alt[2][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        acc[r][0] = accumulate ? _mm256_load_si256((const __m256i *)(c + 16 * r)) : _mm256_setzero_si256();
        acc[r][1] = accumulate ? _mm256_load_si256((const __m256i *)(c + 16 * r + 8)) : _mm256_setzero_si256();
        if (r < 2) alt[r][0] = alt[r][1] = _mm256_setzero_si256();
    }
    for (int64_t q0 = 0; q0 < k4; q0 += 8, a += R * 32) {
#pragma GCC unroll 8
        for (int u = 0; u < 8; u++, b += 64) {
            const __m256i b0 = _mm256_load_si256((const __m256i *)b), b1 = _mm256_load_si256((const __m256i *)(b + 32));
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                const __m256i ar = bcast4(a + 32 * r + 4 * u);
                if (R <= 2 && (u & 1)) {
                    alt[r][0] = _mm256_dpbusd_avx_epi32(alt[r][0], b0, ar);
                    alt[r][1] = _mm256_dpbusd_avx_epi32(alt[r][1], b1, ar);
                } else {
                    acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], b0, ar);
                    acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], b1, ar);
                }
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        if (R <= 2) {
            acc[r][0] = _mm256_add_epi32(acc[r][0], alt[r][0]);
            acc[r][1] = _mm256_add_epi32(acc[r][1], alt[r][1]);
        }
        _mm256_store_si256((__m256i *)(c + 16 * r), acc[r][0]);
        _mm256_store_si256((__m256i *)(c + 16 * r + 8), acc[r][1]);
    }
}

/* (accumulate: K slices of the blocked driver, which fits the tile height to M too) */
#define QL_SMALL(R)                                                                                   \
    static void tile_##R##x16c4_avxvnni(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int acc) \
    {                                                                                                  \
        tile_rx16(R, k4, a, b, c, acc);                                                                \
    }
QL_SMALL(1) QL_SMALL(2) QL_SMALL(3) QL_SMALL(4) QL_SMALL(5)
#undef QL_SMALL
#define QL_K(R) {QL_ISA_AVXVNNI, "s8_gemm_" #R "x16c4__avxvnni", R, 16, 32, true, true, tile_##R##x16c4_avxvnni, 4, 1, NULL, NULL, NULL}
const ql_s8_kernel ql_s8_small_avxvnni[5] = {QL_K(1), QL_K(2), QL_K(3), QL_K(4), QL_K(5)};
#undef QL_K
