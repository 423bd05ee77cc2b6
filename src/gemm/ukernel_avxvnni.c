/* AVX-VNNI (VEX, ymm) int8 micro-kernel, 6×16 tile: 12 ymm accumulators,
 * two weight loads and six broadcasts per 4-k step. A holds each row's codes
 * in 32-byte blocks ([k/32][6][32], see gemm.h), so k4 is a multiple of 8. */
#include <immintrin.h>

#include "gemm.h"

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
                                                 tile_6x16c4_avxvnni};
