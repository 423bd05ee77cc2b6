/* AVX-512 requantization of one row of the LoRA's t (lora.h): the twin of
 * ql_lora_t_row_generic for the 64-block kernels (kb = 64, nr = 32, int8 A). */
#include <immintrin.h>

#include "cpu/x86/x86.h"

/* Lanes of a 64-block in the order the packed A holds them (ql_k64_element):
 * the prologue's two vpackssdw and one vpacksswb put lane 4L + t of q_j at
 * position 16L + 4j + t, so q_j must hold k = t + 4·(L >> 1) + 8·(j & 1) +
 * 16·(L & 1) + 32·(j >> 1): from t[0..31], q0 = 0-3 16-19 4-7 20-23 and
 * q1 = q0 + 8 (q2, q3 the same from t[32..63]). */
static inline __m512i block_codes(__m512i v0, __m512i v1, __m512i v2, __m512i v3)
{
    const __m512i i0 = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(8));
    const __m512i q0 = _mm512_permutex2var_epi32(v0, i0, v1), q1 = _mm512_permutex2var_epi32(v0, i1, v1);
    const __m512i q2 = _mm512_permutex2var_epi32(v2, i0, v3), q3 = _mm512_permutex2var_epi32(v2, i1, v3);
    return _mm512_packs_epi16(_mm512_packs_epi32(q0, q1), _mm512_packs_epi32(q2, q3));
}

/* 16 values of t (columns c .. c+15 of the row, those >= rt as 0). */
static inline __m512i t16(const int32_t *cb, int mr, int i, int64_t c, int64_t rt, __m512i corr)
{
    const int64_t left = rt - c;
    const __mmask16 mk = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1u);
    const int32_t *src = cb + ((c >> 5) * mr + i) * 32 + (c & 31);
    return _mm512_maskz_sub_epi32(mk, _mm512_maskz_loadu_epi32(mk, src), corr);
}

/* t_q = rne(t·inv) in double, as the generic twin rounds (exact: |t·inv| <= 127) */
static inline __m512i quant16(__m512i v, __m512d inv)
{
    const __m512d lo = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(v)), inv);
    const __m512d hi = _mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(v, 1)), inv);
    const __m256i a = _mm512_cvt_roundpd_epi32(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i b = _mm512_cvt_roundpd_epi32(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* For the 64-block kernels (nr = 32, kb = 64, int8 A, natural order in a
 * block): nr, kb, aes, perm and scratch are those facts of the kernel. */
int32_t ql_lora_t_row_s8_64__avx512(const int32_t *cb, int mr, int nr, int kb, int aes, const uint8_t *perm, int i,
                                    int64_t rt, int64_t rpad, int32_t corr, int8_t *tp, int32_t *scratch, int32_t *sum)
{
    (void)nr, (void)kb, (void)aes, (void)perm, (void)scratch;
    const __m512i cv = _mm512_set1_epi32(corr);
    __m512i mx = _mm512_setzero_si512();
    for (int64_t c = 0; c < rt; c += 16) mx = _mm512_max_epu32(mx, _mm512_abs_epi32(t16(cb, mr, i, c, rt, cv)));
    const int32_t amax = (int32_t)_mm512_reduce_max_epu32(mx);
    const __m512d inv = _mm512_set1_pd(amax ? 127.0 / (double)amax : 0.0);
    __m512i s = _mm512_setzero_si512();
    for (int64_t b = 0; b < rpad / 64; b++) {
        __m512i q[4];
        for (int u = 0; u < 4; u++) {
            q[u] = quant16(t16(cb, mr, i, b * 64 + 16 * u, rt, cv), inv);
            s = _mm512_add_epi32(s, q[u]);
        }
        _mm512_storeu_si512((void *)(tp + (b * mr + i) * 64), block_codes(q[0], q[1], q[2], q[3]));
    }
    *sum = _mm512_reduce_add_epi32(s);
    return amax;
}
