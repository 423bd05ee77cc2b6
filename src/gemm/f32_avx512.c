/* AVX-512 fp32 micro-kernel, 12×32: 24 zmm accumulators, two weight loads and
 * twelve broadcast FMAs per k; and the bf16 / int8 -> fp32 slice decoder. */
#include <immintrin.h>

#include "f32.h"

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

const ql_f32_kernel ql_f32_gemm_12x32__avx512 = {"f32_gemm_12x32__avx512", 12, 32, tile_12x32_avx512, decode_avx512};
