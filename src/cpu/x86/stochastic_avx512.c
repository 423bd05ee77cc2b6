/* AVX-512 twin of the stochastic-rounding row (ql_sr_code per element):
 * the same lane-wise IEEE operations, so the same codes. */
#include <immintrin.h>

#include "cpu/x86/x86.h"

void ql_sr_row_avx512(const float *v, int64_t k, float s, int64_t idx0, uint64_t seed, int8_t *q)
{
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 sv = _mm512_set1_ps(s), lo_c = _mm512_set1_ps(-128.0f), hi_c = _mm512_set1_ps(127.0f);
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
        const uint64_t key = (uint64_t)(idx0 + j) + seed;
        const uint32_t lo = (uint32_t)key, hi = (uint32_t)(key >> 32);
        if (lo > 0xFFFFFFF0u) { /* the low word wraps inside these 16: element by element */
            for (int t = 0; t < 16; t++) q[j + t] = ql_sr_code(v[j + t], s, idx0 + j + t, seed);
            continue;
        }
        const __m512i x = _mm512_xor_si512(_mm512_add_epi32(_mm512_set1_epi32((int)lo), lane), _mm512_set1_epi32((int)hi));
        const __m512i state = _mm512_add_epi32(_mm512_mullo_epi32(x, _mm512_set1_epi32(747796405)),
                                               _mm512_set1_epi32((int)2891336453u));
        const __m512i sh = _mm512_add_epi32(_mm512_srli_epi32(state, 28), _mm512_set1_epi32(4));
        const __m512i word = _mm512_mullo_epi32(_mm512_xor_si512(_mm512_srlv_epi32(state, sh), state),
                                                _mm512_set1_epi32(277803737));
        const __m512i h = _mm512_srli_epi32(_mm512_xor_si512(_mm512_srli_epi32(word, 22), word), 8);
        const __m512 noise = _mm512_mul_ps(_mm512_cvtepi32_ps(h), _mm512_set1_ps(0x1p-24f));
        __m512 y = _mm512_add_ps(_mm512_div_ps(_mm512_loadu_ps(v + j), sv), noise);
        y = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        y = _mm512_min_ps(_mm512_max_ps(y, lo_c), hi_c);
        _mm_storeu_si128((__m128i *)(q + j), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(y)));
    }
    for (; j < k; j++) q[j] = ql_sr_code(v[j], s, idx0 + j, seed);
}
