/* Packing of W4A8/W6A8 weights for decoding inside the GEMM, and the
 * portable decoder (the reference twin of the vectorized one). */
#include "cpu/wxa8_panels.h"
#include "cpu/generic/generic.h"
#include "cpu/registry.h"

#include <stdlib.h>

#include "quant/wxa8.h"

/* Byte and nibble of (column j of a panel, position t of a k4 row). */
static inline void nibble_at(int j, int t, int *byte, int *shift)
{
    const int chunk = j / 8, c = j % 8, L = c % 4, p = 2 * (c / 4) + t / 2;
    *byte = chunk * 16 + 4 * L + p;
    *shift = 4 * (t & 1);
}

ql_status ql_wxa8_panels_pack(const ql_s8_kernel *kern, const ql_wxa8_weight *w, ql_wxa8_panels *p, ql_packed_b *b)
{
    memset(p, 0, sizeof *p);
    const int nr = kern->nr;
    p->bits = w->bits;
    p->nr = nr;
    p->kb = kern->kb;
    p->offset128 = kern->b_offset128;
    p->n = w->n;
    p->k = w->k;
    p->k4 = ql_kpad(kern, w->k) / 4;
    p->panels = ql_panels(w->n, nr);
    p->group = w->group;
    p->ngroups = w->k / w->group;
    p->row_bytes = (w->bits == 6 ? 3 : 2) * (int64_t)nr;
    ql_wxa8_values(w, p->values);
    for (int i = 0; i < 256; i++) p->e4m3[i] = ql_e4m3_to_fp32((uint8_t)i);
    const size_t cbytes = (size_t)(p->panels * p->k4 * p->row_bytes), sbytes = (size_t)(p->panels * p->ngroups * nr);
    p->codes = ql_aligned_alloc(cbytes);
    p->sidx = ql_aligned_alloc(sbytes);
    p->krow_group = ql_aligned_alloc((size_t)p->k4 * sizeof(int32_t));
    uint8_t *row = malloc((size_t)(w->k > 0 ? w->k : 1));
    if (!p->codes || !p->sidx || !p->krow_group || !row) {
        free(row);
        ql_wxa8_panels_free(p);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "pack weight: cannot allocate %zu bytes", cbytes + sbytes);
    }
    memset(p->codes, 0, cbytes);
    memset(p->sidx, 0, sbytes);
    for (int64_t r = 0; r < p->k4; r++) {
        const int64_t kk = ql_a_element(p->kb, 4 * r); /* the row's four k share a group (group >= 4) */
        p->krow_group[r] = kk < w->k ? (int32_t)(kk / w->group) : -1;
    }
    for (int64_t col = 0; col < w->n; col++) {
        const int64_t pn = col / nr;
        const int j = (int)(col % nr);
        ql_wxa8_unpack_row(w->bits, w->q + col * w->ldq, w->k, row);
        uint8_t *pc = p->codes + pn * p->k4 * p->row_bytes;
        for (int64_t pos = 0; pos < p->k4 * 4; pos++) {
            const int64_t kk = ql_a_element(p->kb, pos);
            if (kk >= w->k) continue;
            const int64_t r = pos / 4;
            const int t = (int)(pos % 4);
            int byte, shift;
            nibble_at(j, t, &byte, &shift);
            pc[r * p->row_bytes + byte] |= (uint8_t)((row[kk] & 15) << shift);
            if (w->bits == 6) pc[r * p->row_bytes + 2 * nr + j] |= (uint8_t)((row[kk] >> 4) << (2 * t));
        }
        for (int64_t g = 0; g < p->ngroups; g++)
            p->sidx[(pn * p->ngroups + g) * nr + j] = ((const uint8_t *)w->s_rel)[col * p->ngroups + g];
    }
    free(row);
    memset(b, 0, sizeof *b);
    b->n = w->n;
    b->k = w->k;
    b->k4 = p->k4;
    b->panels = p->panels;
    b->nr = nr;
    b->offset128 = kern->b_offset128;
    b->src = p;
    b->decode = ql_cpu_kernels_for(kern->isa)->wxa8_decode; /* writes the kernel's own B layout */
    return QL_OK;
}

void ql_wxa8_panels_free(ql_wxa8_panels *p)
{
    if (!p) return;
    ql_aligned_free(p->codes);
    ql_aligned_free(p->sidx);
    ql_aligned_free(p->krow_group);
    p->codes = p->sidx = NULL;
    p->krow_group = NULL;
}

size_t ql_wxa8_panels_bytes(const ql_wxa8_panels *p)
{
    return (size_t)(p->panels * p->k4 * p->row_bytes) + (size_t)(p->panels * p->ngroups * p->nr) +
           (size_t)p->k4 * sizeof(int32_t);
}

void ql_wxa8_decode_generic(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst)
{
    const ql_wxa8_panels *p = src;
    const int nr = p->nr;
    const uint8_t off = p->offset128 ? 128 : 0;
    for (int64_t jp = jp0; jp < jp1; jp++) {
        const uint8_t *codes = p->codes + jp * p->k4 * p->row_bytes;
        const uint8_t *sidx = p->sidx + jp * p->ngroups * nr;
        for (int64_t r = pc; r < pc + kc; r++) {
            const uint8_t *row = codes + r * p->row_bytes;
            const int32_t g = p->krow_group[r];
            for (int j = 0; j < nr; j++) {
                const float s = g < 0 ? 0.0f : p->e4m3[sidx[g * nr + j]];
                for (int t = 0; t < 4; t++) {
                    int byte, shift;
                    nibble_at(j, t, &byte, &shift);
                    int code = (row[byte] >> shift) & 15;
                    if (p->bits == 6) code |= ((row[2 * nr + j] >> (2 * t)) & 3) << 4;
                    *dst++ = (uint8_t)((uint8_t)ql_wxa8_grid(p->values[code], s) + off);
                }
            }
        }
    }
}
