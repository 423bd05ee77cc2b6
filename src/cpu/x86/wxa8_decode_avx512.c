/* AVX-512 decoder of packed W4A8/W6A8 panels (NR = 32), bit-identical to
 * ql_wxa8_decode_generic: the same fp32 product value(code) · s_rel, the
 * same rounding (vcvtps2dq, nearest-even), the same clamp to [-127, 127]. */
#include <immintrin.h>

#include "cpu/wxa8_panels.h"
#include "cpu/x86/x86.h"

void ql_wxa8_decode_avx512(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst)
{
    const ql_wxa8_panels *p = src;
    const __m512 table = _mm512_loadu_ps(p->values); /* 4 bits: value(code) by vpermps */
    const __m512i lo4 = _mm512_set1_epi32(15), c3 = _mm512_set1_epi32(3);
    const __m512i minv = _mm512_set1_epi32(-127), maxv = _mm512_set1_epi32(127);
    const __m512i off = _mm512_set1_epi32(p->offset128 ? 128 : 0), c32 = _mm512_set1_epi32(32);
    const __m512i rep_a = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i rep_b = _mm512_add_epi32(rep_a, _mm512_set1_epi32(4));
    const __m512i hshift = _mm512_set_epi32(6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0);
    const int six = p->bits == 6;
    for (int64_t jp = jp0; jp < jp1; jp++) {
        const uint8_t *codes = p->codes + jp * p->k4 * p->row_bytes;
        const uint8_t *sidx = p->sidx + jp * p->ngroups * 32;
        int32_t gprev = -2;
        __m512 sc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t r = pc; r < pc + kc; r++, dst += 128) {
            const uint8_t *row = codes + r * p->row_bytes;
            const int32_t g = p->krow_group[r];
            if (g != gprev) { /* the 32 columns' scales, 8 per chunk (dwords 0..7) */
                gprev = g;
                for (int c = 0; c < 4; c++)
                    sc[c] = g < 0 ? _mm512_setzero_ps()
                                  : _mm512_castps256_ps512(_mm256_i32gather_ps(
                                        p->e4m3, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sidx + g * 32 + 8 * c))), 4));
            }
            for (int c = 0; c < 4; c++) {
                const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + 16 * c)));
                const __m512i lo = _mm512_and_si512(v, lo4), hi = _mm512_srli_epi32(v, 4);
                __m512i q[2] = {_mm512_unpacklo_epi32(lo, hi), _mm512_unpackhi_epi32(lo, hi)};
                __m512i hb = six ? _mm512_castsi256_si512(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + 64 + 8 * c))))
                                 : _mm512_setzero_si512();
                for (int h = 0; h < 2; h++) {
                    const __m512i rep = h ? rep_b : rep_a;
                    __m512 val;
                    if (six) {
                        __m512i top = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(rep, hb), hshift), c3);
                        __m512i code = _mm512_or_si512(q[h], _mm512_slli_epi32(top, 4));
                        val = _mm512_cvtepi32_ps(_mm512_sub_epi32(code, c32));
                    } else val = _mm512_permutexvar_ps(q[h], table);
                    const __m512 s = _mm512_permutexvar_ps(rep, sc[c]);
                    __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(val, s));
                    x = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(x, minv), maxv), off);
                    _mm_storeu_si128((__m128i *)(dst + 32 * c + 16 * h), _mm512_cvtepi32_epi8(x));
                }
            }
        }
    }
}
