/* AVX2 (+F16C) helpers: dtype loads/stores of 8 lanes and exact round-to-dtype.
 * Include only from files built with AVX2 flags. */
#ifndef QL_SIMD256_H
#define QL_SIMD256_H

#include <immintrin.h>

#include "../core/core.h"

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

#endif
