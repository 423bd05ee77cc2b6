/* int8 codes -> bf16 pairs in AVX-512 registers (VBMI), for the kernels that
 * multiply int8 weights as bf16 (exact: every int8 is a bf16):
 * bf16_avx512bf16.c (VDPBF16PS) and bf16_amx.c (TDPBF16PS). Include only
 * from files compiled with AVX512-F/BW and VBMI. */
#ifndef QL_CPU_X86_BF16_I8_AVX512_H
#define QL_CPU_X86_BF16_I8_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Rows k, k+1 of a [K][32] int8 panel are 64 contiguous bytes. VPERMB
 * interleaves them into column pairs (in the order the word unpacks below
 * undo), table lookups give each code's bf16 low byte (of |q|: L(128) = L(0))
 * and high byte (of q: two 128-entry halves by sign), and the byte unpacks
 * make the words: w[0] columns 0-15, w[1] columns 16-31, pairs (k, k+1). */
typedef struct {
    __m512i perm, lo0, lo1, hip0, hip1, hin0, hin1;
} ql_i8_tables;
/* Codes without -128 (symmetric, the library's quantizers: the layer checks
 * once): the high byte is that of |q| (one lookup) with q's sign bit ORed
 * in (VPTERNLOGD), 7 operations instead of 9. hip: the high bytes of 0..127. */

static inline __attribute__((always_inline)) ql_i8_tables ql_i8_tables_make(void)
{
    _Alignas(64) uint8_t perm[64], lo[128], hip[128], hin[128];
    for (int i = 0; i < 4; i++)     /* 128-bit lane i */
        for (int h = 0; h < 2; h++) /* unpack low half (columns 4i..4i+3), high half (16 + 4i..) */
            for (int j = 0; j < 4; j++)
                for (int r = 0; r < 2; r++) perm[16 * i + 8 * h + 2 * j + r] = (uint8_t)(32 * r + 16 * h + 4 * i + j);
    for (int u = 0; u < 128; u++) {
        float f = (float)u, g = (float)(u - 128);
        uint32_t fu, gu;
        memcpy(&fu, &f, 4);
        memcpy(&gu, &g, 4);
        lo[u] = (uint8_t)(fu >> 16);
        hip[u] = (uint8_t)(fu >> 24);
        hin[u] = (uint8_t)(gu >> 24);
    }
    ql_i8_tables t;
    t.perm = _mm512_load_si512(perm);
    t.lo0 = _mm512_load_si512(lo);
    t.lo1 = _mm512_load_si512(lo + 64);
    t.hip0 = _mm512_load_si512(hip);
    t.hip1 = _mm512_load_si512(hip + 64);
    t.hin0 = _mm512_load_si512(hin);
    t.hin1 = _mm512_load_si512(hin + 64);
    return t;
}

static inline __attribute__((always_inline)) void ql_i8_pairs(const int sym, const ql_i8_tables *t, __m512i rows,
                                                              __m512i *w0, __m512i *w1)
{
    const __m512i z = _mm512_permutexvar_epi8(t->perm, rows);
    if (sym) {
        const __m512i u = _mm512_abs_epi8(z);
        const __m512i lo = _mm512_permutex2var_epi8(t->lo0, u, t->lo1);
        const __m512i hm = _mm512_permutex2var_epi8(t->hip0, u, t->hip1);
        const __m512i hi = _mm512_ternarylogic_epi32(hm, z, _mm512_set1_epi8((char)0x80), 0xf8); /* hm | (z & 0x80) */
        *w0 = _mm512_unpacklo_epi8(lo, hi);
        *w1 = _mm512_unpackhi_epi8(lo, hi);
        return;
    }
    const __m512i lo = _mm512_permutex2var_epi8(t->lo0, _mm512_abs_epi8(z), t->lo1);
    const __mmask64 neg = _mm512_movepi8_mask(z);
    const __m512i hip = _mm512_permutex2var_epi8(t->hip0, z, t->hip1), hin = _mm512_permutex2var_epi8(t->hin0, z, t->hin1);
    const __m512i hi = _mm512_mask_blend_epi8(neg, hip, hin);
    *w0 = _mm512_unpacklo_epi8(lo, hi);
    *w1 = _mm512_unpackhi_epi8(lo, hi);
}

#endif
