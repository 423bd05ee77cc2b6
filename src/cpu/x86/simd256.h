/* AVX2 (+F16C) helpers: dtype loads/stores of 8 lanes and exact round-to-dtype.
 * Include only from files built with AVX2 flags. */
#ifndef QL_SIMD256_H
#define QL_SIMD256_H

#include <immintrin.h>

#include "core/core.h"
#include "quant/gelu.h"

static inline __m256 ql256_load(ql_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case QL_F32: return _mm256_loadu_ps((const float *)p + i);
    case QL_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    default:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
    }
}

static inline __m256i ql256_bf16_bits(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, qn, nan);
}

static inline __m256 ql256_round_to(ql_dtype dt, __m256 v)
{
    switch (dt) {
    case QL_F32: return v;
    case QL_F16: return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    default: return _mm256_castsi256_ps(_mm256_slli_epi32(ql256_bf16_bits(v), 16));
    }
}

static inline void ql256_store(ql_dtype dt, void *p, int64_t i, __m256 v)
{
    switch (dt) {
    case QL_F32: _mm256_storeu_ps((float *)p + i, v); break;
    case QL_F16:
        _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    default: {
        __m256i b = ql256_bf16_bits(v); /* 8 × 32-bit lanes -> 8 × 16-bit */
        __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
        _mm_storeu_si128((__m128i *)((uint16_t *)p + i), _mm_packus_epi32(lo, hi));
        break;
    }
    }
}

/* ql_gelu_f32 (gelu.h) on 8 lanes, the same operations in the same order. */
static inline __m256 ql256_gelu(__m256 x)
{
#define QL256_FMA(p, v, c) _mm256_fmadd_ps(p, v, _mm256_set1_ps(c))
    const __m256 a = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(QL_GELU_XMAX));
    const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), QL256_FMA(a, _mm256_set1_ps(QL_GELU_C), 1.0f));
    const __m256 u = _mm256_sub_ps(t, _mm256_set1_ps(QL_GELU_T0));
    __m256 q = _mm256_set1_ps(QL_GELU_Q10);
    q = QL256_FMA(q, u, QL_GELU_Q9);
    q = QL256_FMA(q, u, QL_GELU_Q8);
    q = QL256_FMA(q, u, QL_GELU_Q7);
    q = QL256_FMA(q, u, QL_GELU_Q6);
    q = QL256_FMA(q, u, QL_GELU_Q5);
    q = QL256_FMA(q, u, QL_GELU_Q4);
    q = QL256_FMA(q, u, QL_GELU_Q3);
    q = QL256_FMA(q, u, QL_GELU_Q2);
    q = QL256_FMA(q, u, QL_GELU_Q1);
    q = QL256_FMA(q, u, QL_GELU_Q0);
    const __m256 hh = _mm256_mul_ps(a, a), half = _mm256_set1_ps(0.5f);
    const __m256 h = _mm256_mul_ps(half, hh), l = _mm256_mul_ps(half, _mm256_fmsub_ps(a, a, hh));
    const __m256 nh = _mm256_sub_ps(_mm256_setzero_ps(), h);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(nh, _mm256_set1_ps(QL_GELU_LOG2E)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-QL_GELU_LN2HI), nh);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-QL_GELU_LN2LO), r);
    r = _mm256_sub_ps(r, l);
    __m256 e = _mm256_set1_ps(QL_GELU_E4);
    e = QL256_FMA(e, r, QL_GELU_E3);
    e = QL256_FMA(e, r, QL_GELU_E2);
    e = QL256_FMA(e, r, QL_GELU_E1);
    e = QL256_FMA(e, r, QL_GELU_E0);
    e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(r, r), e, r), _mm256_set1_ps(1.0f));
    const __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(126)), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    const __m256 s1 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(t, q), e), p1);
    const __m256 gneg = _mm256_mul_ps(_mm256_mul_ps(x, s1), s2);
    const __m256 gpos = _mm256_fnmadd_ps(x, _mm256_mul_ps(s1, s2), x);
    __m256 g = _mm256_blendv_ps(gpos, gneg, x); /* by the sign bit of x */
    g = _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, _mm256_set1_ps(QL_GELU_XMAX), _CMP_GT_OQ));
    g = _mm256_blendv_ps(g, _mm256_set1_ps(-0.0f), _mm256_cmp_ps(x, _mm256_set1_ps(-QL_GELU_XMAX), _CMP_LT_OQ));
    g = _mm256_blendv_ps(g, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                         _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
    return _mm256_blendv_ps(g, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
#undef QL256_FMA
}

#endif
