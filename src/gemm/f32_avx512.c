/* AVX-512 fp32 micro-kernel, 12×32: 24 zmm accumulators, two weight loads and
 * twelve broadcast FMAs per k. */
#include <immintrin.h>

#include "f32.h"

static void tile_12x32_avx512(int64_t k, const float *a, int64_t lda, const float *b, float *c)
{
#define QL_ROW_DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
    QL_ROW_DECL(0) QL_ROW_DECL(1) QL_ROW_DECL(2) QL_ROW_DECL(3) QL_ROW_DECL(4) QL_ROW_DECL(5)
    QL_ROW_DECL(6) QL_ROW_DECL(7) QL_ROW_DECL(8) QL_ROW_DECL(9) QL_ROW_DECL(10) QL_ROW_DECL(11)
#undef QL_ROW_DECL
    const float *a0 = a, *a6 = a + 6 * lda;
    for (int64_t p = 0; p < k; p++, b += 32) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#define QL_ROW(r, base, off)                                  \
    {                                                         \
        __m512 ar = _mm512_set1_ps(base[(off) * lda + p]);    \
        c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0);           \
        c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1);           \
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

const ql_f32_kernel ql_f32_gemm_12x32__avx512 = {"f32_gemm_12x32__avx512", 12, 32, tile_12x32_avx512};
