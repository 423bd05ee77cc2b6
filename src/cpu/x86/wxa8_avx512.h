/* AVX-512 decode of packed W4A8/W6A8 panels (wxa8_panels.h; NR = 32,
 * the kernels' 64-blocks), bit-identical to ql_wxa8_decode_generic: every
 * code is looked up in its column's table row lut[scale byte], which holds
 * the reference's product-and-round, so nothing here rounds.
 *
 * A 16-k block of 8 columns is 64 bytes; a mask and a shift split it into
 * two vectors with one column per 128-bit lane (lo: columns 0, 2, 4, 6 of
 * the eight; hi: 1, 3, 5, 7), 16 k each, and each lane looks its codes up
 * in its column's table row (4 bits: vpshufb, whose table is per lane,
 * wxa8_decode_avx512.c; 6 bits: 64-byte rows, a masked vpermb per lane,
 * AVX512-VBMI, wxa8_decode6_avx512vbmi.c).
 *
 * decode (the blocked path): four such vectors are one 4 × 4 dword
 * transpose away from the kernel's [k4][32][4] rows, whose k4 rows inside a
 * 64-block come in the prologue's order (ql_k64_element).
 * rows (small M): no transpose; the vectors go straight into vpdpbusd
 * against each row's 16 activations broadcast to the four lanes, and each
 * lane's four partial sums are added once at the end. Weights stored + 128
 * (the VNNI kernels) are vpdpbusd's unsigned operand and the epilogue
 * removes 128·Σa; signed weights (AMX's layout) are its signed operand
 * against activations + 128 (a XOR 0x80), and 128·Σq of each column
 * (colsum) comes off at the end.
 *
 * Each file instantiates the bodies below with its chunk decoder
 * (QL_WXA8_AVX512_BODIES), so the loops are compiled with that decoder
 * inlined and the accumulators in registers. */
#ifndef QL_CPU_X86_WXA8_AVX512_H
#define QL_CPU_X86_WXA8_AVX512_H

#include <immintrin.h>

#include "cpu/wxa8_panels.h"

#define QL_INLINE static inline __attribute__((always_inline))

/* The prefetch distance of the codes: ql_wxa8_decode_pf (x86.h). */

/* The 16 k4 rows of a 64-block: natural k4 row u sits at packed row rho[u]. */
QL_INLINE void ql_wxa8_k4_order(int rho[16])
{
    for (int d = 0; d < 16; d++) rho[ql_k64_element(4 * d) >> 2] = d;
}

/* After the transpose, dword 4l + e of a 16-column vector holds column
 * 2l + (e & 1) + 8·(e >> 1): this puts column c at dword c. */
QL_INLINE __m512i ql_wxa8_column_order(void)
{
    return _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
}

/* Lanes of (a, b, c, d) -> r[0..3]: r[i] lane l = dword i of a, b, c, d's lane l. */
QL_INLINE void ql_wxa8_transpose4(__m512i a, __m512i b, __m512i c, __m512i d, __m512i r[4])
{
    const __m512i t0 = _mm512_unpacklo_epi32(a, b), t1 = _mm512_unpackhi_epi32(a, b);
    const __m512i t2 = _mm512_unpacklo_epi32(c, d), t3 = _mm512_unpackhi_epi32(c, d);
    r[0] = _mm512_unpacklo_epi64(t0, t2);
    r[1] = _mm512_unpackhi_epi64(t0, t2);
    r[2] = _mm512_unpacklo_epi64(t1, t3);
    r[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* The byte offsets of a 16-k block's 32 table rows (rows of 2^shift
 * bytes: 16 for 4-bit codes, 64 for 6-bit) from its scale bytes s[32],
 * once per scale group; the decoders then address each row with one load
 * instead of a byte load and a shift per column. */
QL_INLINE void ql_wxa8_row_offsets(const uint8_t *s, int shift, uint32_t off[32])
{
    _mm512_store_si512((void *)off, _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s)), shift));
    _mm512_store_si512((void *)(off + 16),
                       _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(s + 16))), shift));
}

/* The bodies, for a chunk decoder CHUNK(p, blk, off, h, v[2]) of BITS-bit
 * codes (chunk h of a block: columns 8h .. 8h + 7 -> v[0] lo, v[1] hi; off
 * from ql_wxa8_row_offsets):
 *   NAME##_decode(p, jp0, jp1, pc, kc, dst): the kernel's B rows (pc, kc
 *     multiples of 16 k4 rows);
 *   NAME##_rows(p, a, mr, m, jp, c): c[m][32] = the m rows of the packed A
 *     panels a against panel jp. */
#define QL_WXA8_AVX512_BODIES(NAME, CHUNK, BITS, ATTR)                                                                        \
    ATTR static void NAME##_decode(const ql_wxa8_panels *p, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc,        \
                                   uint8_t *dst)                                                                      \
    {                                                                                                                 \
        int rho[16];                                                                                                  \
        ql_wxa8_k4_order(rho);                                                                                        \
        const __m512i order = ql_wxa8_column_order(), pad = _mm512_set1_epi8((char)(p->offset128 ? 0x80 : 0));        \
        const int64_t bpg = p->group / 16; /* blocks per scale group */                                               \
        _Alignas(64) uint32_t off[32];                                                                                \
        const int64_t pf = ql_wxa8_decode_pf; /* bytes ahead into L2: the codes stream from DRAM at small M */       \
        for (int64_t jp = jp0; jp < jp1; jp++) {                                                                      \
            const uint8_t *codes = p->codes + jp * p->blocks * p->block_bytes;                                        \
            const uint8_t *sidx = p->sidx + jp * p->ngroups * 32;                                                     \
            uint8_t *out = dst + (jp - jp0) * kc * 128;                                                               \
            int64_t g = (pc / 4) / bpg, in_g = (pc / 4) % bpg; /* the first block's group, its place there */       \
            bool fresh = true;                                                                                        \
            for (int64_t b = pc / 4; b < (pc + kc) / 4; b++) { /* 16-k blocks of the slice */                        \
                uint8_t *rows64 = out + ((b / 4) * 16 - pc) * 128; /* its 64-block's first k4 row */                 \
                const int u0 = 4 * (int)(b % 4);                                                                      \
                if (16 * b >= p->k) { /* K padding */                                                                 \
                    for (int d = 0; d < 4; d++) {                                                                     \
                        _mm512_storeu_si512((void *)(rows64 + rho[u0 + d] * 128), pad);                               \
                        _mm512_storeu_si512((void *)(rows64 + rho[u0 + d] * 128 + 64), pad);                          \
                    }                                                                                                 \
                    continue;                                                                                         \
                }                                                                                                     \
                if (fresh || in_g == 0) ql_wxa8_row_offsets(sidx + g * 32, BITS == 4 ? 4 : 6, off);                   \
                fresh = false;                                                                                        \
                if (++in_g == bpg) in_g = 0, g++;                                                                     \
                const uint8_t *blk = codes + b * p->block_bytes;                                                      \
                if (pf)                                                                                               \
                    _Pragma("GCC unroll 6") for (int o = 0; o < 64 * BITS; o += 64)                                   \
                        _mm_prefetch((const char *)(blk + pf + o), _MM_HINT_T1);                                      \
                for (int half = 0; half < 2; half++) {                                                                \
                    __m512i v[4], r[4];                                                                               \
                    CHUNK(p, blk, off, 2 * half, v);                                                                  \
                    CHUNK(p, blk, off, 2 * half + 1, v + 2);                                                          \
                    ql_wxa8_transpose4(v[0], v[1], v[2], v[3], r);                                                    \
                    for (int d = 0; d < 4; d++)                                                                       \
                        _mm512_storeu_si512((void *)(rows64 + rho[u0 + d] * 128 + 64 * half),                         \
                                            _mm512_permutexvar_epi32(order, r[d]));                                   \
                }                                                                                                     \
            }                                                                                                         \
        }                                                                                                             \
    }                                                                                                                 \
                                                                                                                      \
    /* NROW (1 or 2) rows against panel jp: acc[r][2h + e] lane l sums column 8h + 2l + e, */                         \
    /* each of its dwords over one k mod 4 class of the 16-k blocks */                                                \
    QL_INLINE void NAME##_rows_n(const ql_wxa8_panels *p, __m512i perm, const int8_t *a0, const int8_t *a1,           \
                                 int64_t a_step, const int nrow, const bool sgn, int64_t jp, int32_t *c0, int32_t *c1) \
    {                                                                                                                 \
        const __m512i flip = _mm512_set1_epi8(sgn ? (char)0x80 : 0);                                                  \
        const uint8_t *codes = p->codes + jp * p->blocks * p->block_bytes;                                            \
        const uint8_t *sidx = p->sidx + jp * p->ngroups * 32;                                                         \
        __m512i acc0[8], acc1[8];                                                                                     \
        for (int i = 0; i < 8; i++) acc0[i] = acc1[i] = _mm512_setzero_si512();                                       \
        _Alignas(64) int8_t nat[2][64]; /* a 64-block of each row in natural k order */                               \
        _Alignas(64) uint32_t off[32];                                                                                \
        enum { BB = 64 * BITS, AHEAD = (8192 / BB + 1) * BB }; /* block bytes; prefetch into L2, as QL_SMALL_PF */     \
        const int64_t blocks = p->k / 16, bpg = p->group / 16;                                                        \
        for (int64_t b = 0, in_g = 0; b < blocks; b++) {                                                              \
            if (b % 4 == 0) {                                                                                         \
                const int64_t at = (b / 4) * a_step;                                                                  \
                _mm512_store_si512((void *)nat[0],                                                                    \
                                   _mm512_xor_si512(_mm512_permutexvar_epi32(perm, _mm512_loadu_si512(a0 + at)), flip)); \
                if (nrow > 1)                                                                                         \
                    _mm512_store_si512((void *)nat[1],                                                                \
                                       _mm512_xor_si512(_mm512_permutexvar_epi32(perm, _mm512_loadu_si512(a1 + at)), flip)); \
            }                                                                                                         \
            const __m512i x0 = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(nat[0] + 16 * (b % 4))));     \
            const __m512i x1 = nrow > 1 ? _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(nat[1] + 16 * (b % 4)))) \
                                        : _mm512_setzero_si512();                                                     \
            if (in_g == 0) ql_wxa8_row_offsets(sidx, BITS == 4 ? 4 : 6, off), sidx += 32;                            \
            if (++in_g == bpg) in_g = 0;                                                                              \
            const uint8_t *blk = codes + b * BB;                                                                      \
            _Pragma("GCC unroll 6") for (int o = 0; o < BB; o += 64)                                                  \
                _mm_prefetch((const char *)(blk + AHEAD + o), _MM_HINT_T1);                                           \
            _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++)                                                       \
            {                                                                                                         \
                __m512i v[2];                                                                                         \
                CHUNK(p, blk, off, h, v);                                                                             \
                /* vpdpbusd(acc, unsigned, signed): the weights are the unsigned operand unless sgn */               \
                acc0[2 * h] = _mm512_dpbusd_epi32(acc0[2 * h], sgn ? x0 : v[0], sgn ? v[0] : x0);                     \
                acc0[2 * h + 1] = _mm512_dpbusd_epi32(acc0[2 * h + 1], sgn ? x0 : v[1], sgn ? v[1] : x0);             \
                if (nrow > 1) {                                                                                       \
                    acc1[2 * h] = _mm512_dpbusd_epi32(acc1[2 * h], sgn ? x1 : v[0], sgn ? v[0] : x1);                 \
                    acc1[2 * h + 1] = _mm512_dpbusd_epi32(acc1[2 * h + 1], sgn ? x1 : v[1], sgn ? v[1] : x1);         \
                }                                                                                                     \
            }                                                                                                         \
        }                                                                                                             \
        const __m512i order = ql_wxa8_column_order();                                                                 \
        for (int r = 0; r < nrow; r++) {                                                                              \
            const __m512i *acc = r ? acc1 : acc0;                                                                     \
            int32_t *c = r ? c1 : c0;                                                                                 \
            for (int half = 0; half < 2; half++) {                                                                    \
                __m512i t[4];                                                                                         \
                ql_wxa8_transpose4(acc[4 * half], acc[4 * half + 1], acc[4 * half + 2], acc[4 * half + 3], t);        \
                const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(t[0], t[1]), _mm512_add_epi32(t[2], t[3]));     \
                __m512i out = _mm512_permutexvar_epi32(order, sum);                                                   \
                if (sgn) /* Σ (a + 128)·q - 128·Σq */                                                                 \
                    out = _mm512_sub_epi32(out, _mm512_slli_epi32(                                                    \
                                                    _mm512_loadu_si512((const void *)(p->colsum + jp * 32 + 16 * half)), 7)); \
                _mm512_storeu_si512((void *)(c + 16 * half), out);                                                    \
            }                                                                                                         \
        }                                                                                                             \
    }                                                                                                                 \
    /* sgn: signed weights (activations + 128), as rows_n says; one copy each */                                   \
    ATTR static void NAME##_rows1(const ql_wxa8_panels *p, __m512i perm, const int8_t *a0, int64_t a_step,           \
                                  int64_t jp, int32_t *c0)                                                            \
    {                                                                                                                 \
        if (p->offset128) NAME##_rows_n(p, perm, a0, a0, a_step, 1, false, jp, c0, c0);                               \
        else NAME##_rows_n(p, perm, a0, a0, a_step, 1, true, jp, c0, c0);                                             \
    }                                                                                                                 \
    ATTR static void NAME##_rows2(const ql_wxa8_panels *p, __m512i perm, const int8_t *a0, const int8_t *a1,          \
                                  int64_t a_step, int64_t jp, int32_t *c0, int32_t *c1)                               \
    {                                                                                                                 \
        if (p->offset128) NAME##_rows_n(p, perm, a0, a1, a_step, 2, false, jp, c0, c1);                               \
        else NAME##_rows_n(p, perm, a0, a1, a_step, 2, true, jp, c0, c1);                                             \
    }                                                                                                                 \
    ATTR static void NAME##_rows(const ql_wxa8_panels *p, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c) \
    {                                                                                                                 \
        const int64_t kp = p->k4 * 4, a_step = 64 * (int64_t)mr; /* a row's next 64-block */                          \
        int rho[16]; /* natural dword u of a 64-block of A at packed dword rho[u] */                                  \
        ql_wxa8_k4_order(rho);                                                                                        \
        const __m512i perm = _mm512_loadu_si512((const void *)rho);                                                   \
        for (int64_t r0 = 0; r0 < m; r0 += 2) {                                                                       \
            const int8_t *a0 = a + (r0 / mr) * kp * mr + (r0 % mr) * 64;                                              \
            if (r0 + 1 < m) {                                                                                         \
                const int8_t *a1 = a + ((r0 + 1) / mr) * kp * mr + ((r0 + 1) % mr) * 64;                              \
                NAME##_rows2(p, perm, a0, a1, a_step, jp, c + r0 * 32, c + (r0 + 1) * 32);                            \
            } else                                                                                                    \
                NAME##_rows1(p, perm, a0, a_step, jp, c + r0 * 32);                                                   \
        }                                                                                                             \
    }

/* Whether the vector paths take this layer: the kernels' NR and
 * 64-blocks, and whole 16-k blocks inside a scale group. */
static inline bool ql_wxa8_avx512_shape_ok(const ql_wxa8_panels *p)
{
    return p->nr == 32 && p->kb == 64 && p->group % 16 == 0 && p->k % 16 == 0 && p->block_bytes == 64 * p->bits;
}

#endif
