/* AVX-512 decode of packed W4A8/W6A8 panels (wxa8_panels.h; NR = 32,
 * the kernels' 64-blocks), bit-identical to ql_wxa8_decode_generic: every
 * code is looked up in its column's table row lut[scale byte], which holds
 * the reference's product-and-round, so nothing here rounds.
 *
 * A 16-k block of 8 columns is 64 bytes; a mask and a shift split it into
 * two vectors with one column per 128-bit lane (lo: columns 0, 2, 4, 6 of
 * the eight; hi: 1, 3, 5, 7), 16 k each, and each lane looks its codes up
 * in its column's 16-byte row (vpshufb: the table is per lane; 6 bits:
 * 64-byte rows, one masked vpermb per lane, AVX512-VBMI). The scale bytes
 * of a group change every 16 k at group 16: four 16-byte table loads per
 * vector, against a product, a rounding and a pack per 16 codes before.
 *
 * decode (the blocked path): four such vectors are one 4 × 4 dword
 * transpose away from the kernel's [k4][32][4] rows, whose k4 rows inside a
 * 64-block come in the prologue's order (ql_k64_element).
 * rows (small M): no transpose; the vectors go straight into vpdpbusd
 * against each row's 16 activations broadcast to the four lanes, and each
 * lane's four partial sums are added once at the end. */
#include <immintrin.h>

#include "cpu/generic/generic.h"
#include "cpu/wxa8_panels.h"
#include "cpu/x86/x86.h"

/* The 16 k4 rows of a 64-block: natural k4 row u sits at packed row rho[u]. */
static void k4_order(int rho[16])
{
    for (int d = 0; d < 16; d++) rho[ql_k64_element(4 * d) >> 2] = d;
}

/* After the transpose, dword 4l + e of a 16-column vector holds column
 * 2l + (e & 1) + 8·(e >> 1): this puts column c at dword c. */
static inline __m512i column_order(void)
{
    return _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
}

/* The table rows of four columns (c0 + 2i, i = 0..3), one per lane. */
static inline __m512i lut4x16(const uint8_t *lut, const uint8_t *s, int c0)
{
    __m512i t = _mm512_castsi128_si512(_mm_load_si128((const __m128i *)(lut + 16 * s[c0])));
    t = _mm512_inserti32x4(t, _mm_load_si128((const __m128i *)(lut + 16 * s[c0 + 2])), 1);
    t = _mm512_inserti32x4(t, _mm_load_si128((const __m128i *)(lut + 16 * s[c0 + 4])), 2);
    return _mm512_inserti32x4(t, _mm_load_si128((const __m128i *)(lut + 16 * s[c0 + 6])), 3);
}

/* 4 bits: chunk h of a block (columns 8h .. 8h + 7) -> v[0] (lo), v[1] (hi). */
static inline void chunk4(const uint8_t *blk, const uint8_t *lut, const uint8_t *s, int h, __m512i v[2])
{
    const __m512i m4 = _mm512_set1_epi8(15), raw = _mm512_load_si512((const void *)(blk + 64 * h));
    v[0] = _mm512_shuffle_epi8(lut4x16(lut, s, 8 * h), _mm512_and_si512(raw, m4));
    v[1] = _mm512_shuffle_epi8(lut4x16(lut, s, 8 * h + 1), _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
}

/* 6 bits: the same, codes completed by their top bits (block byte 256 +
 * 16Q + i, bits 2s..2s+1), then each lane through its 64-byte table row. */
__attribute__((target("avx512vbmi"))) static inline void chunk6(const uint8_t *blk, const uint8_t *lut, const uint8_t *s,
                                                                 int h, __m512i v[2])
{
    const __m512i m4 = _mm512_set1_epi8(15), raw = _mm512_load_si512((const void *)(blk + 64 * h));
    /* the top bytes of quads 2h, 2h + 1 in lanes [2h, 2h, 2h+1, 2h+1] */
    const __m512i q2 = _mm512_castsi256_si512(_mm256_load_si256((const __m256i *)(blk + 256 + 32 * h)));
    const __m512i tops = _mm512_shuffle_i64x2(q2, q2, _MM_SHUFFLE(1, 1, 0, 0));
    const __m512i sh_lo = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0, 0, 0x0004000400040004,
                                           0x0004000400040004, 0, 0);
    const __m512i sh_hi = _mm512_add_epi16(sh_lo, _mm512_set1_epi16(2));
    const __m512i c30 = _mm512_set1_epi8(0x30);
    /* code = nibble | (top << 4): the word shifts keep each byte's own bits in its low two */
    const __m512i tlo = _mm512_slli_epi16(_mm512_srlv_epi16(tops, sh_lo), 4);
    const __m512i thi = _mm512_slli_epi16(_mm512_srlv_epi16(tops, sh_hi), 4);
    const __m512i clo = _mm512_ternarylogic_epi32(_mm512_and_si512(raw, m4), tlo, c30, 0xF8);
    const __m512i chi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m4), thi, c30, 0xF8);
    const __mmask64 l1 = 0x00000000FFFF0000ull, l2 = 0x0000FFFF00000000ull, l3 = 0xFFFF000000000000ull;
    for (int e = 0; e < 2; e++) {
        const __m512i code = e ? chi : clo;
        const int c0 = 8 * h + e;
        __m512i r = _mm512_permutexvar_epi8(code, _mm512_load_si512((const void *)(lut + 64 * s[c0])));
        r = _mm512_mask_permutexvar_epi8(r, l1, code, _mm512_load_si512((const void *)(lut + 64 * s[c0 + 2])));
        r = _mm512_mask_permutexvar_epi8(r, l2, code, _mm512_load_si512((const void *)(lut + 64 * s[c0 + 4])));
        v[e] = _mm512_mask_permutexvar_epi8(r, l3, code, _mm512_load_si512((const void *)(lut + 64 * s[c0 + 6])));
    }
}

/* Lanes of (a, b, c, d) -> r[0..3]: r[d'] lane l = dword d' of a, b, c, d's lane l. */
static inline void transpose4(__m512i a, __m512i b, __m512i c, __m512i d, __m512i r[4])
{
    const __m512i t0 = _mm512_unpacklo_epi32(a, b), t1 = _mm512_unpackhi_epi32(a, b);
    const __m512i t2 = _mm512_unpacklo_epi32(c, d), t3 = _mm512_unpackhi_epi32(c, d);
    r[0] = _mm512_unpacklo_epi64(t0, t2);
    r[1] = _mm512_unpackhi_epi64(t0, t2);
    r[2] = _mm512_unpacklo_epi64(t1, t3);
    r[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* Whether this layer decodes here: the kernels' NR and 64-blocks, whole
 * 16-k blocks inside a scale group, and VBMI for 6 bits. */
static bool vector_ok(const ql_wxa8_panels *p)
{
    return p->nr == 32 && p->kb == 64 && p->group % 16 == 0 && p->k % 16 == 0 && (p->bits == 4 || ql_cpu()->avx512vbmi);
}

static inline void decode_chunk(const ql_wxa8_panels *p, const uint8_t *blk, const uint8_t *s, int h, __m512i v[2])
{
    if (p->bits == 6) chunk6(blk, p->lut, s, h, v);
    else chunk4(blk, p->lut, s, h, v);
}

void ql_wxa8_decode_avx512(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst)
{
    const ql_wxa8_panels *p = src;
    if (!vector_ok(p) || pc % 16 || kc % 16) {
        ql_wxa8_decode_generic(src, jp0, jp1, pc, kc, dst);
        return;
    }
    int rho[16];
    k4_order(rho);
    const __m512i order = column_order(), pad = _mm512_set1_epi8((char)(p->offset128 ? 0x80 : 0));
    for (int64_t jp = jp0; jp < jp1; jp++) {
        const uint8_t *codes = p->codes + jp * p->blocks * p->block_bytes;
        const uint8_t *sidx = p->sidx + jp * p->ngroups * 32;
        uint8_t *out = dst + (jp - jp0) * kc * 128;
        for (int64_t b = pc / 4; b < (pc + kc) / 4; b++) { /* 16-k blocks of the slice */
            uint8_t *rows64 = out + ((b / 4) * 16 - pc) * 128; /* its 64-block's first k4 row */
            const int u0 = 4 * (int)(b % 4);
            if (16 * b >= p->k) { /* K padding */
                for (int d = 0; d < 4; d++) {
                    _mm512_storeu_si512((void *)(rows64 + rho[u0 + d] * 128), pad);
                    _mm512_storeu_si512((void *)(rows64 + rho[u0 + d] * 128 + 64), pad);
                }
                continue;
            }
            const uint8_t *blk = codes + b * p->block_bytes, *s = sidx + (16 * b / p->group) * 32;
            if (b + 2 < p->blocks) _mm_prefetch((const char *)(blk + 2 * p->block_bytes), _MM_HINT_T0);
            for (int half = 0; half < 2; half++) {
                __m512i v[4], r[4];
                decode_chunk(p, blk, s, 2 * half, v);
                decode_chunk(p, blk, s, 2 * half + 1, v + 2);
                transpose4(v[0], v[1], v[2], v[3], r);
                for (int d = 0; d < 4; d++)
                    _mm512_storeu_si512((void *)(rows64 + rho[u0 + d] * 128 + 64 * half), _mm512_permutexvar_epi32(order, r[d]));
            }
        }
    }
}

bool ql_wxa8_rows_ok_avx512(const void *src, const ql_s8_kernel *kern)
{
    return kern->b_offset128 && kern->kb == 64 && vector_ok(src); /* u8 weights: vpdpbusd's unsigned operand */
}

/* Up to two rows against panel jp: acc[r][2h + e] lane l accumulates
 * column 8h + 2l + e over k ≡ dword (mod 4) of each 16-k block. */
static inline void rows2(const ql_wxa8_panels *p, __m512i perm, const int8_t *a0, const int8_t *a1, int64_t a_step,
                         int nrow, int64_t jp, int32_t *c0, int32_t *c1)
{
    const uint8_t *codes = p->codes + jp * p->blocks * p->block_bytes;
    const uint8_t *sidx = p->sidx + jp * p->ngroups * 32;
    __m512i acc0[8], acc1[8];
    for (int i = 0; i < 8; i++) acc0[i] = acc1[i] = _mm512_setzero_si512();
    _Alignas(64) int8_t nat[2][64]; /* a 64-block of each row in natural k order */
    const int64_t blocks = p->k / 16;
    for (int64_t b = 0; b < blocks; b++) {
        if (b % 4 == 0) {
            const int64_t at = (b / 4) * a_step;
            _mm512_store_si512((void *)nat[0], _mm512_permutexvar_epi32(perm, _mm512_loadu_si512((const void *)(a0 + at))));
            if (nrow > 1)
                _mm512_store_si512((void *)nat[1], _mm512_permutexvar_epi32(perm, _mm512_loadu_si512((const void *)(a1 + at))));
        }
        const __m512i x0 = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(nat[0] + 16 * (b % 4))));
        const __m512i x1 = nrow > 1 ? _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(nat[1] + 16 * (b % 4))))
                                    : _mm512_setzero_si512();
        const uint8_t *blk = codes + b * p->block_bytes, *s = sidx + (16 * b / p->group) * 32;
        _mm_prefetch((const char *)(blk + 8 * p->block_bytes), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 8 * p->block_bytes + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 8 * p->block_bytes + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(blk + 8 * p->block_bytes + 192), _MM_HINT_T0);
        if (p->bits == 6) {
            _mm_prefetch((const char *)(blk + 8 * p->block_bytes + 256), _MM_HINT_T0);
            _mm_prefetch((const char *)(blk + 8 * p->block_bytes + 320), _MM_HINT_T0);
        }
        for (int h = 0; h < 4; h++) {
            __m512i v[2];
            decode_chunk(p, blk, s, h, v);
            acc0[2 * h] = _mm512_dpbusd_epi32(acc0[2 * h], v[0], x0);
            acc0[2 * h + 1] = _mm512_dpbusd_epi32(acc0[2 * h + 1], v[1], x0);
            if (nrow > 1) {
                acc1[2 * h] = _mm512_dpbusd_epi32(acc1[2 * h], v[0], x1);
                acc1[2 * h + 1] = _mm512_dpbusd_epi32(acc1[2 * h + 1], v[1], x1);
            }
        }
    }
    const __m512i order = column_order();
    for (int r = 0; r < nrow; r++) {
        const __m512i *acc = r ? acc1 : acc0;
        int32_t *c = r ? c1 : c0;
        for (int half = 0; half < 2; half++) {
            __m512i t[4];
            transpose4(acc[4 * half], acc[4 * half + 1], acc[4 * half + 2], acc[4 * half + 3], t);
            const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(t[0], t[1]), _mm512_add_epi32(t[2], t[3]));
            _mm512_storeu_si512((void *)(c + 16 * half), _mm512_permutexvar_epi32(order, sum));
        }
    }
}

void ql_wxa8_rows_avx512(const void *src, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c)
{
    const ql_wxa8_panels *p = src;
    const int64_t kp = p->k4 * 4, a_step = 64 * (int64_t)mr; /* a row's next 64-block */
    int rho[16]; /* natural dword u of a 64-block of A at packed dword rho[u] */
    k4_order(rho);
    const __m512i perm = _mm512_loadu_si512((const void *)rho);
    for (int64_t r0 = 0; r0 < m; r0 += 2) {
        const int nrow = m - r0 < 2 ? (int)(m - r0) : 2;
        const int64_t r1 = r0 + nrow - 1;
        const int8_t *a0 = a + (r0 / mr) * kp * mr + (r0 % mr) * 64, *a1 = a + (r1 / mr) * kp * mr + (r1 % mr) * 64;
        rows2(p, perm, a0, a1, a_step, nrow, jp, c + r0 * 32, c + r1 * 32);
    }
}
