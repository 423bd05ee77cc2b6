/* W4A8 packed panels on AVX-512 (wxa8_avx512.h): one vpshufb per lane
 * looks 16 codes up in their column's 16-byte table row; the four rows of
 * a vector come in as one load and three masked broadcasts. Also the
 * entry points of both widths (6 bits: wxa8_decode6_avx512vbmi.c where the
 * CPU has VBMI, else the portable decoder). */
#include "cpu/x86/wxa8_avx512.h"
#include "cpu/generic/generic.h"
#include "cpu/x86/x86.h"

#include <stdio.h>
#include <stdlib.h>

int ql_wxa8_decode_pf = 8192;
__attribute__((constructor)) static void wxa8_pf_read(void)
{
    const char *v = getenv("QLINEAR_WXA8_PF");
    int d;
    if (v && *v && sscanf(v, "%d", &d) == 1 && d >= 0 && d <= 65536) ql_wxa8_decode_pf = d;
}

/* The table rows of columns c0 + 2i (i = 0..3), one per lane (off: the
 * block's row offsets, ql_wxa8_row_offsets). */
QL_INLINE __m512i lut4x16(const uint8_t *lut, const uint32_t *off, int c0)
{
    __m512i t = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(lut + off[c0])));
    t = _mm512_mask_broadcast_i32x4(t, 0x00F0, _mm_load_si128((const __m128i *)(lut + off[c0 + 2])));
    t = _mm512_mask_broadcast_i32x4(t, 0x0F00, _mm_load_si128((const __m128i *)(lut + off[c0 + 4])));
    return _mm512_mask_broadcast_i32x4(t, 0xF000, _mm_load_si128((const __m128i *)(lut + off[c0 + 6])));
}

QL_INLINE void chunk4(const ql_wxa8_panels *p, const uint8_t *blk, const uint32_t *off, int h, __m512i v[2])
{
    const __m512i m4 = _mm512_set1_epi8(15), raw = _mm512_load_si512((const void *)(blk + 64 * h));
    v[0] = _mm512_shuffle_epi8(lut4x16(p->lut, off, 8 * h), _mm512_and_si512(raw, m4));
    v[1] = _mm512_shuffle_epi8(lut4x16(p->lut, off, 8 * h + 1), _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
}

QL_WXA8_AVX512_BODIES(w4, chunk4, 4, )

static bool vbmi6(const ql_wxa8_panels *p) { return p->bits == 6 && ql_cpu()->avx512vbmi; }

void ql_wxa8_decode_avx512(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst)
{
    const ql_wxa8_panels *p = src;
    if (!ql_wxa8_avx512_shape_ok(p) || pc % 16 || kc % 16 || (p->bits == 6 && !vbmi6(p)))
        ql_wxa8_decode_generic(src, jp0, jp1, pc, kc, dst);
    else if (p->bits == 6)
        ql_wxa8_decode6_avx512vbmi(p, jp0, jp1, pc, kc, dst);
    else
        w4_decode(p, jp0, jp1, pc, kc, dst);
}

bool ql_wxa8_rows_ok_avx512(const void *src, const ql_s8_kernel *kern)
{
    /* weights + 128 (the VNNI kernels), or signed with their column sums (AMX) */
    const ql_wxa8_panels *p = src;
    return (kern->b_offset128 || p->colsum) && kern->kb == 64 && ql_wxa8_avx512_shape_ok(p) && (p->bits == 4 || vbmi6(p));
}

void ql_wxa8_rows_avx512(const void *src, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c)
{
    const ql_wxa8_panels *p = src;
    if (p->bits == 6) ql_wxa8_rows6_avx512vbmi(p, a, mr, m, jp, c);
    else w4_rows(p, a, mr, m, jp, c);
}
