/* W4A8/W6A8 weights kept packed (4 or 6 bits per weight) in the int8
 * GEMM's panel order and decoded to the int8 grid one K slice at a time,
 * inside the GEMM (ql_packed_b.decode).
 *
 * Layout, per panel of NR columns, per k4 row (4 packed positions, the
 * same k order as ql_packed_b): 2·NR bytes of nibbles, then for 6 bits NR
 * bytes of the codes' top two bits (column j: bits 2t..2t+1 hold position
 * t). Nibble bytes come in chunks of 8 columns: byte 4L + p (L, p in 0..3)
 * holds column L + 4·(p >= 2), positions 2·(p & 1) (low nibble) and
 * 2·(p & 1) + 1 (high nibble), so that a zero-extend, a shift and one
 * dword unpack put each column's four codes side by side in the order the
 * GEMM wants. Scales: per panel [groups][NR] e4m3 bytes (0 for padding
 * columns), decoded by a 256-entry table. */
#ifndef QL_WXA8_PANELS_H
#define QL_WXA8_PANELS_H

#include "cpu/gemm.h"

typedef struct ql_wxa8_panels {
    int bits, nr, kb;
    bool offset128;
    int64_t n, k, k4, panels, group, ngroups;
    int64_t row_bytes;   /* per k4 row of a panel: 2·NR or 3·NR */
    uint8_t *codes;      /* panels · k4 · row_bytes */
    uint8_t *sidx;       /* panels · ngroups · NR */
    int32_t *krow_group; /* [k4]: the group of each k4 row, -1 for K padding */
    float values[64];    /* value(code) */
    float e4m3[256];     /* e4m3 -> fp32 */
} ql_wxa8_panels;

/* Pack a (checked, e4m3-scaled) W4A8/W6A8 weight for kernel `kern`; fills
 * *b so that ql_gemm_s8_run decodes from *p (which must stay put). */
ql_status ql_wxa8_panels_pack(const ql_s8_kernel *kern, const ql_wxa8_weight *w, ql_wxa8_panels *p, ql_packed_b *b);
void ql_wxa8_panels_free(ql_wxa8_panels *p);
size_t ql_wxa8_panels_bytes(const ql_wxa8_panels *p);

#endif
