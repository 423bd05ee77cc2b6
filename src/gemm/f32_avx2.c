/* AVX2 + FMA fp32 micro-kernel, 6×16: 12 ymm accumulators, two weight loads
 * and six broadcast FMAs per k; and the bf16 / int8 -> fp32 slice decoder. */
#include <immintrin.h>

#include "f32.h"

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

const ql_f32_kernel ql_f32_gemm_6x16__avx2 = {"f32_gemm_6x16__avx2", 6, 16, tile_6x16_avx2, decode_avx2};
