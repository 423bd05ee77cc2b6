/* AVX512-VNNI int8 micro-kernel, 12×32 tile: 24 zmm accumulators; per 4-k
 * step two 64-byte weight loads and 12 activation broadcasts folded into
 * vpdpbusd as embedded-broadcast memory operands. A holds each row's codes
 * in 64-byte blocks ([k/64][12][64], see gemm.h), so k4 is a multiple of 16. */
#include <immintrin.h>

#include "gemm.h"

static inline __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

static void tile_12x32c4_avx512vnni(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
#define QL_ROW_DECL(r)                                                                     \
    __m512i c##r##0 = accumulate ? _mm512_load_si512((const void *)(c + 32 * (r) + 16 * 0)) : _mm512_setzero_si512(); \
    __m512i c##r##1 = accumulate ? _mm512_load_si512((const void *)(c + 32 * (r) + 16 * 1)) : _mm512_setzero_si512();
    QL_ROW_DECL(0) QL_ROW_DECL(1) QL_ROW_DECL(2) QL_ROW_DECL(3) QL_ROW_DECL(4) QL_ROW_DECL(5)
    QL_ROW_DECL(6) QL_ROW_DECL(7) QL_ROW_DECL(8) QL_ROW_DECL(9) QL_ROW_DECL(10) QL_ROW_DECL(11)
#undef QL_ROW_DECL
    for (int64_t q0 = 0; q0 < k4; q0 += 16, a += 12 * 64) {
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++, b += 128) {
            __m512i b0 = _mm512_load_si512((const void *)b), b1 = _mm512_load_si512((const void *)(b + 64));
            _mm_prefetch((const char *)(b + 1024), _MM_HINT_T0);
#define QL_ROW(r)                                        \
    {                                                    \
        __m512i ar = bcast4(a + 64 * (r) + 4 * u);       \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, b0, ar);  \
        c##r##1 = _mm512_dpbusd_epi32(c##r##1, b1, ar);  \
    }
            QL_ROW(0) QL_ROW(1) QL_ROW(2) QL_ROW(3) QL_ROW(4) QL_ROW(5)
            QL_ROW(6) QL_ROW(7) QL_ROW(8) QL_ROW(9) QL_ROW(10) QL_ROW(11)
#undef QL_ROW
        }
    }
#define QL_STORE(r)                                            \
    _mm512_store_si512((void *)(c + 32 * (r)), c##r##0);      \
    _mm512_store_si512((void *)(c + 32 * (r) + 16), c##r##1);
    QL_STORE(0) QL_STORE(1) QL_STORE(2) QL_STORE(3) QL_STORE(4) QL_STORE(5)
    QL_STORE(6) QL_STORE(7) QL_STORE(8) QL_STORE(9) QL_STORE(10) QL_STORE(11)
#undef QL_STORE
}

const ql_s8_kernel ql_s8_gemm_12x32c4__avx512vnni = {QL_ISA_AVX512VNNI, "s8_gemm_12x32c4__avx512vnni", 12, 32, 64, true, true,
                                                     tile_12x32c4_avx512vnni};
