/* W6A8 packed panels on AVX-512 with VBMI (wxa8_avx512.h): a code's top
 * two bits (block byte 256 + 16Q + i, bits 2s..2s+1) join its nibble, and
 * each lane looks its 16 codes up in its column's 64-byte table row with a
 * masked vpermb (the row as the memory operand). */
#include "cpu/x86/wxa8_avx512.h"
#include "cpu/x86/x86.h"

QL_INLINE void chunk6(const ql_wxa8_panels *p, const uint8_t *blk, const uint32_t *off, int h, __m512i v[2])
{
    const __m512i m4 = _mm512_set1_epi8(15), raw = _mm512_load_si512((const void *)(blk + 64 * h));
    /* the top bytes of quads 2h, 2h + 1 in lanes [2h, 2h, 2h + 1, 2h + 1] */
    const __m512i q2 = _mm512_castsi256_si512(_mm256_load_si256((const __m256i *)(blk + 256 + 32 * h)));
    const __m512i tops = _mm512_shuffle_i64x2(q2, q2, _MM_SHUFFLE(1, 1, 0, 0));
    /* lo lanes hold columns s = 0, 2, 0, 2 of their quads (bits 0 and 4), hi lanes s = 1, 3, 1, 3 */
    const __m512i sh_lo = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
                                           0x0004000400040004, 0, 0);
    const __m512i sh_hi = _mm512_add_epi16(sh_lo, _mm512_set1_epi16(2));
    const __m512i c30 = _mm512_set1_epi8(0x30);
    /* code = nibble | (top << 4) (ternary 0xF8: a | (b & c)); the word shifts keep each byte's own bits low */
    const __m512i tlo = _mm512_slli_epi16(_mm512_srlv_epi16(tops, sh_lo), 4);
    const __m512i thi = _mm512_slli_epi16(_mm512_srlv_epi16(tops, sh_hi), 4);
    const __m512i clo = _mm512_ternarylogic_epi32(_mm512_and_si512(raw, m4), tlo, c30, 0xF8);
    const __m512i chi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m4), thi, c30, 0xF8);
    const __mmask64 l1 = 0x00000000FFFF0000ull, l2 = 0x0000FFFF00000000ull, l3 = 0xFFFF000000000000ull;
    const uint8_t *lut = p->lut;
    for (int e = 0; e < 2; e++) {
        const __m512i code = e ? chi : clo;
        const int c0 = 8 * h + e;
        __m512i r = _mm512_permutexvar_epi8(code, _mm512_load_si512((const void *)(lut + off[c0])));
        r = _mm512_mask_permutexvar_epi8(r, l1, code, _mm512_load_si512((const void *)(lut + off[c0 + 2])));
        r = _mm512_mask_permutexvar_epi8(r, l2, code, _mm512_load_si512((const void *)(lut + off[c0 + 4])));
        v[e] = _mm512_mask_permutexvar_epi8(r, l3, code, _mm512_load_si512((const void *)(lut + off[c0 + 6])));
    }
}

QL_WXA8_AVX512_BODIES(w6, chunk6, 6, )

void ql_wxa8_decode6_avx512vbmi(const ql_wxa8_panels *p, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst)
{
    w6_decode(p, jp0, jp1, pc, kc, dst);
}

void ql_wxa8_rows6_avx512vbmi(const ql_wxa8_panels *p, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c)
{
    w6_rows(p, a, mr, m, jp, c);
}
