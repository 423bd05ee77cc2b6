/* W4A8/W6A8 weights kept packed (4 or 6 bits per weight) and decoded to
 * the int8 grid inside the GEMM: one K slice at a time into the kernel's
 * B layout (ql_packed_b.decode), or, for a few rows, in registers straight
 * into the dot products (ql_packed_b.rows).
 *
 * Layout, per panel of NR columns, per block of 16 consecutive k (natural
 * order, whatever the kernel's packed positions; a block never straddles a
 * scale group when group % 16 == 0): block_bytes = 8·NR bytes of nibbles,
 * then for 6 bits 4·NR bytes of the codes' top two bits. Column j = 4Q + s
 * (Q its quad, s in 0..3), k = 16b + i: nibble in byte 32Q + 16·(s >> 1) + i,
 * high half when s is odd; top bits in byte 8·NR + 16Q + i, bits 2s..2s+1.
 * So 64 bytes (two quads) split by a mask and a shift into two vectors of
 * four columns × 16 k, one column per 128-bit lane: each lane then decodes
 * with its column's 16-entry table (vpshufb; 6 bits: a 64-entry vpermb).
 * Scales: per panel [groups][NR] e4m3 bytes (0 for padding columns).
 * lut[s][code] = grid(value(code), e4m3(s)) (+ 128 for the VNNI kernels'
 * unsigned weights): the decode is a table lookup, bit-identical to the
 * product-and-round of docs/FORMATS.md by construction. */
#ifndef QL_WXA8_PANELS_H
#define QL_WXA8_PANELS_H

#include "cpu/gemm.h"

typedef struct ql_wxa8_panels {
    int bits, nr, kb, kg; /* the kernel's B layout: NR columns, A blocks of kb, k in groups of kg (4, or 2: int16 kernels) */
    bool offset128;
    int64_t n, k, k4, panels, group, ngroups;
    int64_t blocks;      /* 16-k blocks per panel: k4 · 4 / 16, rounded up */
    int64_t block_bytes; /* 8·NR (4 bits) or 12·NR (6 bits) */
    uint8_t *codes;      /* panels · blocks · block_bytes */
    uint8_t *sidx;       /* panels · ngroups · NR */
    uint8_t *lut;        /* [256][16 or 64]: decoded (offset) value of (scale byte, code); NaN bytes 0 + offset */
    int32_t *colsum;     /* signed weights (no offset): each column's sum of decoded values, panels · NR (0 for
                          * padding columns), for register decodes that feed the weights as vpdpbusd's signed
                          * operand against activations + 128 (ql_packed_b.rows); else NULL */
    float values[64];    /* value(code) */
    float e4m3[256];     /* e4m3 -> fp32 */
} ql_wxa8_panels;

/* Pack a (checked, e4m3-scaled) W4A8/W6A8 weight for kernel `kern`; fills
 * *b so that ql_gemm_s8_run decodes from *p (which must stay put). */
/* Byte and shift of the nibble (low 4 bits) of column j, k = 16b + i, inside block b. */
static inline void ql_wxa8_nibble_at(int j, int i, int *byte, int *shift)
{
    *byte = 32 * (j / 4) + 16 * ((j % 4) >> 1) + i;
    *shift = 4 * (j & 1);
}

ql_status ql_wxa8_panels_pack(const ql_s8_kernel *kern, const ql_wxa8_weight *w, ql_wxa8_panels *p, ql_packed_b *b);
void ql_wxa8_panels_free(ql_wxa8_panels *p);
size_t ql_wxa8_panels_bytes(const ql_wxa8_panels *p);

#endif
