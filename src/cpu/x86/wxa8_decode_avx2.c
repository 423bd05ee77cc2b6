/* W4A8/W6A8 packed panels (wxa8_panels.h) decoded on AVX2 into the int16
 * kernel's B layout (ukernel_avx2.c: NR = 16, [k/2][16][2] int8, the pairs
 * of a 32-block in the prologue's order, ql_k32_element), bit-identical to
 * ql_wxa8_decode_generic: every code is looked up in its column's table row
 * lut[scale byte], which holds the reference's product-and-round, so
 * nothing here rounds.
 *
 * A 16-k block of 16 columns is four 32-byte quads. A mask and a shift
 * split a quad into two vectors of 16 k, one column per 128-bit lane (lo:
 * columns 4Q, 4Q + 2; hi: 4Q + 1, 4Q + 3), and each lane looks its codes up
 * with vpshufb in its column's 16-byte table row (6 bits: four rows of 16,
 * picked by the code's top two bits with two blends). Lanes are regrouped to
 * columns c | c + 8, and a transpose in each lane gives the kernel's rows:
 * of 16-bit words for the int16 kernel (16 columns × one k pair), of dwords
 * for AVX-VNNI's (kg = 4, weights + 128: 16 columns × four k).
 *
 * One row (M = 1, ql_packed_b.rows): no transpose and no buffer; each
 * decoded vector meets the row's 16 activations of its block, broadcast to
 * both lanes, in vpmaddubsw(|a|, w·sign(a)) — exact, since the grid clamps
 * weights to ±127 (the pack checks the table), so |a|·|w| <= 128·127 and a
 * pair sums to at most 32 512 — then vpmaddwd by ones into int32. Against
 * int16 operands this saves the widening of every weight (three shuffles
 * a vector) on a CPU with two shuffle pipes. */
#include <immintrin.h>

#include "cpu/generic/generic.h"
#include "cpu/wxa8_panels.h"
#include "cpu/x86/x86.h"

/* The 16-column, 32-block kernels: the int16 one (k in pairs) and AVX-VNNI's (k in quads, weights + 128). */
static bool shape_ok(const ql_wxa8_panels *p, int64_t pc, int64_t kc)
{
    return p->nr == 16 && p->kb == 32 && (p->kg == 2 ? !p->offset128 : p->kg == 4) && p->group % 16 == 0 &&
           p->k % 16 == 0 && p->block_bytes == (p->bits == 6 ? 12 : 8) * 16 && pc % 8 == 0 && kc % 8 == 0;
}

/* 6 bits: the table rows of one scale group for the four vectors of each
 * quad, t[Q][h][r] with h = 0 (lo: columns 4Q, 4Q + 2) or 1 (hi: 4Q + 1,
 * 4Q + 3) and r the 16-entry sub-row of the 64-entry row. */
typedef struct tables {
    __m256i t[4][2][4];
} tables;

static void load_tables(const ql_wxa8_panels *p, const uint8_t *s, tables *tb)
{
    /* each 64-byte row as two full loads, the sub-rows of the lanes' two columns paired by permutes (half the
     * loads of pairing 16-byte halves) */
    for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
            const uint8_t *lo = p->lut + s[4 * q + h] * 64, *hi = p->lut + s[4 * q + h + 2] * 64;
            for (int e = 0; e < 2; e++) {
                const __m256i a = _mm256_loadu_si256((const __m256i *)(lo + 32 * e));
                const __m256i b = _mm256_loadu_si256((const __m256i *)(hi + 32 * e));
                tb->t[q][h][2 * e] = _mm256_permute2x128_si256(a, b, 0x20);
                tb->t[q][h][2 * e + 1] = _mm256_permute2x128_si256(a, b, 0x31);
            }
        }
}

/* 4 bits: the byte offsets of a group's 16 table rows (16·scale byte), two vector operations where a byte load,
 * a shift and an add per row cost more than the row's own load */
static inline __attribute__((always_inline)) void row_offsets4(const uint8_t *s, uint32_t off[16])
{
    const __m128i b = _mm_loadu_si128((const __m128i *)s);
    _mm256_store_si256((__m256i *)off, _mm256_slli_epi32(_mm256_cvtepu8_epi32(b), 4));
    _mm256_store_si256((__m256i *)(off + 8), _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), 4));
}

/* 4 bits: the table row pair of quad q, h (off: row_offsets4 of the block's group). */
static inline __attribute__((always_inline)) __m256i row_pair4(const ql_wxa8_panels *p, const uint32_t *off, int q, int h)
{
    return _mm256_loadu2_m128i((const __m128i *)(p->lut + off[4 * q + h + 2]), (const __m128i *)(p->lut + off[4 * q + h]));
}

/* v[h] for quad q of block blk: lane 0 column 4q + h, lane 1 column 4q + 2 + h, 16 k each, decoded. 4 bits:
 * the table rows are loaded here through the group's row offsets off (with 16-k groups, the common case, every
 * block has its own, and staging them through tb cost a store and a load each); 6 bits: from tb. */
static inline __attribute__((always_inline)) void quad(const ql_wxa8_panels *p, const int bits, const uint8_t *blk,
                                                       const tables *tb, const uint32_t *off, int q, __m256i v[2])
{
    const __m256i m4 = _mm256_set1_epi8(15), raw = _mm256_loadu_si256((const __m256i *)(blk + 32 * q));
    const __m256i nib[2] = {_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4)};
    if (bits == 4) {
        for (int h = 0; h < 2; h++) v[h] = _mm256_shuffle_epi8(row_pair4(p, off, q, h), nib[h]);
        return;
    }
    /* the top two bits of column 4q + s: bits 2s, 2s + 1 of byte 128 + 16q + k */
    const __m256i top = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 128 + 16 * q)));
    for (int h = 0; h < 2; h++) {
        const __m256i sh = _mm256_setr_epi32(2 * h, 2 * h, 2 * h, 2 * h, 4 + 2 * h, 4 + 2 * h, 4 + 2 * h, 4 + 2 * h);
        const __m256i hi2 = _mm256_srlv_epi32(top, sh); /* this lane's column's two bits at bits 0, 1 of each byte */
        const __m256i b0 = _mm256_slli_epi16(hi2, 7), b1 = _mm256_slli_epi16(hi2, 6); /* bit 0, bit 1 -> bit 7 */
        const __m256i s0 = _mm256_shuffle_epi8(tb->t[q][h][0], nib[h]), s1 = _mm256_shuffle_epi8(tb->t[q][h][1], nib[h]);
        const __m256i s2 = _mm256_shuffle_epi8(tb->t[q][h][2], nib[h]), s3 = _mm256_shuffle_epi8(tb->t[q][h][3], nib[h]);
        v[h] = _mm256_blendv_epi8(_mm256_blendv_epi8(s0, s1, b0), _mm256_blendv_epi8(s2, s3, b0), b1);
    }
}

/* One 16-k block -> w[c], c = 0..7: lane 0 column c, lane 1 column c + 8, 16 k each. */
static inline __attribute__((always_inline)) void block_columns(const ql_wxa8_panels *p, const uint8_t *blk,
                                                                const tables *tb, const uint32_t *off, __m256i w[8])
{
    __m256i v[4][2];
    for (int q = 0; q < 4; q++) quad(p, p->bits, blk, tb, off, q, v[q]);
    for (int q = 0; q < 2; q++) /* c = 4Q + s, Q = 0, 1: column c from quad Q, column c + 8 from quad Q + 2 */
        for (int h = 0; h < 2; h++) {
            w[4 * q + h] = _mm256_permute2x128_si256(v[q][h], v[q + 2][h], 0x20);
            w[4 * q + 2 + h] = _mm256_permute2x128_si256(v[q][h], v[q + 2][h], 0x31);
        }
}

/* kg = 2: r[i], i = 0..7, the pair k = 2i, 2i + 1 of columns 0..15 ([16][2] bytes): an 8 × 8 transpose of
 * 16-bit words in each lane. */
static inline __attribute__((always_inline)) void pair_rows(const __m256i w[8], __m256i r[8])
{
    __m256i t[8], u[8];
    for (int c = 0; c < 8; c += 2) {
        t[c] = _mm256_unpacklo_epi16(w[c], w[c + 1]);
        t[c + 1] = _mm256_unpackhi_epi16(w[c], w[c + 1]);
    }
    for (int c = 0; c < 8; c += 4)
        for (int e = 0; e < 2; e++) {
            u[c + 2 * e] = _mm256_unpacklo_epi32(t[c + e], t[c + 2 + e]);
            u[c + 2 * e + 1] = _mm256_unpackhi_epi32(t[c + e], t[c + 2 + e]);
        }
    for (int e = 0; e < 4; e++) {
        r[2 * e] = _mm256_unpacklo_epi64(u[e], u[4 + e]);
        r[2 * e + 1] = _mm256_unpackhi_epi64(u[e], u[4 + e]);
    }
}

/* kg = 4: r[2d], r[2d + 1], d = 0..3, the quad k = 4d .. 4d + 3 of columns 0..7 and 8..15 ([8][4] bytes each): a
 * 4 × 4 transpose of dwords in each lane of columns 0..3 (8..11) and of 4..7 (12..15), then the lanes joined. */
static inline __attribute__((always_inline)) void quad_rows(const __m256i w[8], __m256i r[8])
{
    __m256i x[2][4];
    for (int g = 0; g < 2; g++) {
        const __m256i *c = w + 4 * g;
        const __m256i a0 = _mm256_unpacklo_epi32(c[0], c[1]), a1 = _mm256_unpackhi_epi32(c[0], c[1]);
        const __m256i a2 = _mm256_unpacklo_epi32(c[2], c[3]), a3 = _mm256_unpackhi_epi32(c[2], c[3]);
        x[g][0] = _mm256_unpacklo_epi64(a0, a2), x[g][1] = _mm256_unpackhi_epi64(a0, a2);
        x[g][2] = _mm256_unpacklo_epi64(a1, a3), x[g][3] = _mm256_unpackhi_epi64(a1, a3);
    }
    for (int d = 0; d < 4; d++) {
        r[2 * d] = _mm256_permute2x128_si256(x[0][d], x[1][d], 0x20);
        r[2 * d + 1] = _mm256_permute2x128_si256(x[0][d], x[1][d], 0x31);
    }
}

void ql_wxa8_decode_avx2(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst)
{
    const ql_wxa8_panels *p = src;
    if (!shape_ok(p, pc, kc)) {
        ql_wxa8_decode_generic(src, jp0, jp1, pc, kc, dst);
        return;
    }
    /* Where a 32-block's pieces sit (ql_k32_element: k = 8j + 4L + t at position 16L + 4j + t), in 32-byte
     * units from the block's start: kg = 2, pair i (k = 2i, 2i + 1) is row 8L + 2j + e of 32 bytes (i = 4j + 2L
     * + e); kg = 4, quad i (k = 4i .. 4i + 3) is row 4L + j of 64 bytes (i = 2j + L), columns 0..7 then 8..15. */
    int at[16];
    for (int i = 0; i < 16; i++)
        at[i] = p->kg == 2 ? 8 * ((i >> 1) & 1) + 2 * (i >> 2) + (i & 1) : 2 * (4 * (i & 1) + (i >> 1));
    const __m256i pad = _mm256_set1_epi8((char)(p->offset128 ? 0x80 : 0));
    const int64_t bpg = p->group / 16; /* 16-k blocks per scale group */
    tables tb;
    _Alignas(32) uint32_t off[16];
    for (int64_t jp = jp0; jp < jp1; jp++) {
        const uint8_t *codes = p->codes + jp * p->blocks * p->block_bytes;
        const uint8_t *sidx = p->sidx + jp * p->ngroups * 16;
        uint8_t *out = dst + (jp - jp0) * kc * 64; /* kc k4 rows of 16 columns × 4 bytes */
        /* the first block's scale group and its place there (no division per block) */
        int64_t g = (pc / 4) / bpg, in_g = (pc / 4) % bpg;
        bool fresh = true;
        for (int64_t b = pc / 4; b < (pc + kc) / 4; b++) { /* 16-k blocks of the slice */
            uint8_t *blk32 = out + ((b / 2) * 8 - pc) * 64; /* its 32-block's first byte */
            const int half = (int)(b % 2);
            __m256i r[8];
            if (16 * b >= p->k) { /* K padding: the grid value 0 */
                for (int i = 0; i < 8; i++) r[i] = pad;
            } else {
                if (fresh || in_g == 0) {
                    if (p->bits == 6) load_tables(p, sidx + g * 16, &tb);
                    else row_offsets4(sidx + g * 16, off);
                }
                fresh = false;
                if (++in_g == bpg) in_g = 0, g++;
                __m256i w[8];
                block_columns(p, codes + b * p->block_bytes, &tb, off, w);
                if (p->kg == 2) pair_rows(w, r); /* (the tables hold the + 128 of the VNNI kernels' weights) */
                else quad_rows(w, r);
            }
            if (p->kg == 2)
                for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)(blk32 + at[8 * half + i] * 32), r[i]);
            else
                for (int d = 0; d < 4; d++)
                    for (int e = 0; e < 2; e++)
                        _mm256_storeu_si256((__m256i *)(blk32 + (at[4 * half + d] + e) * 32), r[2 * d + e]);
        }
    }
}

/* The register decode for one row: the int16 kernel's layout (signed weights, k in pairs, A of 32-blocks) and
 * weights within ±127, which the sign transfer below needs (a table entry of -128 declines the layer). */
bool ql_wxa8_rows_ok_avx2(const void *src, const ql_s8_kernel *kern)
{
    const ql_wxa8_panels *p = src;
    if (!(kern->kb == 32 && kern->kg == 2 && kern->aes == 2 && !kern->b_offset128 && p->kg == 2 && !p->offset128 &&
          p->nr == 16 && p->kb == 32 && p->group % 16 == 0 && p->k % 16 == 0 && (p->bits == 4 || p->bits == 6)))
        return false;
    for (int i = 0; i < 256 * (p->bits == 6 ? 64 : 16); i++)
        if (p->lut[i] == 0x80) return false;
    return true;
}

/* c[0..15] = row r of the packed A panels a (int16 codes, [kp/32][mr][32], ql_k32_element order) against panel
 * jp. acc[q][h] lane 0 sums column 4q + h, lane 1 column 4q + 2 + h, in four partial sums each. */
static inline __attribute__((always_inline)) void row1(const ql_wxa8_panels *p, const int bits, const int16_t *a,
                                                      int mr, int r, int64_t jp, int32_t *c)
{
    const uint8_t *codes = p->codes + jp * p->blocks * p->block_bytes;
    const uint8_t *sidx = p->sidx + jp * p->ngroups * 16;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[4][2];
    for (int q = 0; q < 4; q++) acc[q][0] = acc[q][1] = _mm256_setzero_si256();
    tables tb;
    _Alignas(32) uint32_t off[16];
    const int64_t blocks = p->k / 16, bpg = p->group / 16, bb = p->block_bytes, pf = ql_wxa8_decode_pf;
    __m256i xn = _mm256_setzero_si256(); /* the current 32-block's activations in natural k order */
    for (int64_t b = 0, in_g = 0; b < blocks; b++) {
        if (b % 2 == 0) {
            /* position 16L + 4j + t holds k = 8j + 4L + t: the 64-bit quarters of the halves L = 0, 1 interleave,
             * and the pack puts lane l's two quarters in order (the codes fit int8, nothing saturates) */
            const __m256i l0 = _mm256_load_si256((const __m256i *)(a + ((b / 2) * mr + r) * 32));
            const __m256i l1 = _mm256_load_si256((const __m256i *)(a + ((b / 2) * mr + r) * 32 + 16));
            xn = _mm256_packs_epi16(_mm256_unpacklo_epi64(l0, l1), _mm256_unpackhi_epi64(l0, l1));
        }
        const __m256i x = b % 2 ? _mm256_permute2x128_si256(xn, xn, 0x11) : _mm256_permute2x128_si256(xn, xn, 0x00);
        const __m256i ax = _mm256_abs_epi8(x);
        if (in_g == 0) {
            if (bits == 6) load_tables(p, sidx, &tb);
            else row_offsets4(sidx, off);
            sidx += 16;
        }
        if (++in_g == bpg) in_g = 0;
        const uint8_t *blk = codes + b * bb;
        if (pf) /* the codes stream from DRAM at M = 1 */
            for (int o = 0; o < bb; o += 64) _mm_prefetch((const char *)(blk + pf + o), _MM_HINT_T1);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            __m256i v[2];
            quad(p, bits, blk, &tb, off, q, v);
            for (int h = 0; h < 2; h++)
                acc[q][h] = _mm256_add_epi32(
                    acc[q][h], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(v[h], x)), ones));
        }
    }
    /* hadd(acc[q][0], acc[q][1]): lane 0 columns 4q, 4q + 1, lane 1 4q + 2, 4q + 3, two sums each; a second hadd of
     * two quads leaves columns (0, 1, 4, 5 | 2, 3, 6, 7) of those eight */
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    for (int q = 0; q < 4; q += 2) {
        const __m256i t0 = _mm256_hadd_epi32(acc[q][0], acc[q][1]), t1 = _mm256_hadd_epi32(acc[q + 1][0], acc[q + 1][1]);
        _mm256_storeu_si256((__m256i *)(c + 4 * q), _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(t0, t1), order));
    }
}

static void rows4(const ql_wxa8_panels *p, const int16_t *a, int mr, int r, int64_t jp, int32_t *c)
{
    row1(p, 4, a, mr, r, jp, c);
}

static void rows6(const ql_wxa8_panels *p, const int16_t *a, int mr, int r, int64_t jp, int32_t *c)
{
    row1(p, 6, a, mr, r, jp, c);
}

void ql_wxa8_rows_avx2(const void *src, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c)
{
    const ql_wxa8_panels *p = src;
    for (int64_t i = 0; i < m; i++) { /* row i: panel i / mr, row i % mr of it */
        const int16_t *ap = (const int16_t *)a + (i / mr) * (p->k4 * 4) * mr;
        if (p->bits == 6) rows6(p, ap, mr, (int)(i % mr), jp, c + 16 * i);
        else rows4(p, ap, mr, (int)(i % mr), jp, c + 16 * i);
    }
}
