/* Packing of W4A8/W6A8 weights for decoding inside the GEMM, and the
 * portable decoder (the reference twin of the vectorized one). */
#include "cpu/wxa8_panels.h"
#include "cpu/generic/generic.h"
#include "cpu/registry.h"

#include <math.h>
#include <stdlib.h>

#include "quant/wxa8.h"

ql_status ql_wxa8_panels_pack(const ql_s8_kernel *kern, const ql_wxa8_weight *w, ql_wxa8_panels *p, ql_packed_b *b)
{
    memset(p, 0, sizeof *p);
    const int nr = kern->nr, ncodes = w->bits == 6 ? 64 : 16;
    p->bits = w->bits;
    p->nr = nr;
    p->kb = kern->kb;
    p->kg = kern->kg;
    p->offset128 = kern->b_offset128;
    p->n = w->n;
    p->k = w->k;
    p->k4 = ql_kpad(kern, w->k) / 4;
    p->panels = ql_panels(w->n, nr);
    p->group = w->group;
    p->ngroups = w->k / w->group;
    p->blocks = (p->k4 * 4 + 15) / 16;
    p->block_bytes = (w->bits == 6 ? 12 : 8) * (int64_t)nr;
    ql_wxa8_values(w, p->values);
    for (int i = 0; i < 256; i++) p->e4m3[i] = ql_e4m3_to_fp32((uint8_t)i);
    const size_t cbytes = (size_t)(p->panels * p->blocks * p->block_bytes), sbytes = (size_t)(p->panels * p->ngroups * nr);
    p->codes = ql_aligned_alloc(cbytes);
    p->sidx = ql_aligned_alloc(sbytes);
    p->lut = ql_aligned_alloc((size_t)(256 * ncodes));
    const ql_cpu_kernels *kt = ql_cpu_kernels_for(kern->isa);
    /* a register decode that feeds signed weights to vpdpbusd (k in quads: AMX's layout) needs their column sums */
    const bool colsums = !p->offset128 && kt->wxa8_rows && p->kg == 4;
    if (colsums) p->colsum = ql_aligned_alloc((size_t)(p->panels * nr) * sizeof(int32_t));
    uint8_t *row = malloc((size_t)(w->k > 0 ? w->k : 1));
    if (!p->codes || !p->sidx || !p->lut || (colsums && !p->colsum) || !row) {
        free(row);
        ql_wxa8_panels_free(p);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "pack weight: cannot allocate %zu bytes", cbytes + sbytes);
    }
    memset(p->codes, 0, cbytes);
    memset(p->sidx, 0, sbytes);
    if (p->colsum) memset(p->colsum, 0, (size_t)(p->panels * nr) * sizeof(int32_t));
    const uint8_t off = p->offset128 ? 128 : 0;
    for (int sb = 0; sb < 256; sb++) /* NaN scale bytes never reach a layer (ql_check_wxa8_weight) */
        for (int c = 0; c < ncodes; c++)
            p->lut[sb * ncodes + c] =
                (uint8_t)((isnan(p->e4m3[sb]) ? 0 : (uint8_t)ql_wxa8_grid(p->values[c], p->e4m3[sb])) + off);
    for (int64_t col = 0; col < w->n; col++) {
        const int64_t pn = col / nr;
        const int j = (int)(col % nr);
        ql_wxa8_unpack_row(w->bits, w->q + col * w->ldq, w->k, row);
        uint8_t *pc = p->codes + pn * p->blocks * p->block_bytes;
        for (int64_t kk = 0; kk < w->k; kk++) {
            uint8_t *blk = pc + (kk / 16) * p->block_bytes;
            const int i = (int)(kk % 16);
            int byte, shift;
            ql_wxa8_nibble_at(j, i, &byte, &shift);
            blk[byte] |= (uint8_t)((row[kk] & 15) << shift);
            if (w->bits == 6) blk[8 * nr + 16 * (j / 4) + i] |= (uint8_t)((row[kk] >> 4) << (2 * (j % 4)));
        }
        for (int64_t g = 0; g < p->ngroups; g++)
            p->sidx[(pn * p->ngroups + g) * nr + j] = ((const uint8_t *)w->s_rel)[col * p->ngroups + g];
        if (p->colsum) {
            const uint8_t *sb = (const uint8_t *)w->s_rel + col * p->ngroups;
            int32_t sum = 0;
            for (int64_t kk = 0; kk < w->k; kk++) sum += (int8_t)p->lut[sb[kk / p->group] * ncodes + row[kk]];
            p->colsum[col] = sum;
        }
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
    b->decode = kt->wxa8_decode; /* writes the kernel's own B layout */
    if (kt->wxa8_rows && kt->wxa8_rows_ok && kt->wxa8_rows_ok(p, kern)) {
        b->rows = kt->wxa8_rows;
        b->rows_max = kt->wxa8_rows_max;
    }
    return QL_OK;
}

void ql_wxa8_panels_free(ql_wxa8_panels *p)
{
    if (!p) return;
    ql_aligned_free(p->codes);
    ql_aligned_free(p->sidx);
    ql_aligned_free(p->lut);
    ql_aligned_free(p->colsum);
    p->codes = p->sidx = p->lut = NULL;
    p->colsum = NULL;
}

size_t ql_wxa8_panels_bytes(const ql_wxa8_panels *p)
{
    return (size_t)(p->panels * p->blocks * p->block_bytes) + (size_t)(p->panels * p->ngroups * p->nr) +
           (size_t)(256 * (p->bits == 6 ? 64 : 16)) + (p->colsum ? (size_t)(p->panels * p->nr) * sizeof(int32_t) : 0);
}

void ql_wxa8_decode_generic(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst)
{
    const ql_wxa8_panels *p = src;
    const int nr = p->nr;
    const uint8_t off = p->offset128 ? 128 : 0;
    for (int64_t jp = jp0; jp < jp1; jp++) {
        const uint8_t *codes = p->codes + jp * p->blocks * p->block_bytes;
        const uint8_t *sidx = p->sidx + jp * p->ngroups * nr;
        /* k4 rows [pc, pc + kc) are rows of kg codes [pc·4/kg, (pc + kc)·4/kg): [rows][nr][kg] */
        const int kg = p->kg;
        for (int64_t r = pc * 4 / kg; r < (pc + kc) * 4 / kg; r++)
            for (int j = 0; j < nr; j++)
                for (int t = 0; t < kg; t++) {
                    const int64_t kk = ql_a_element(p->kb, kg * r + t); /* packed position -> k */
                    if (kk >= p->k) { /* K padding: the grid value 0 */
                        *dst++ = off;
                        continue;
                    }
                    const uint8_t *blk = codes + (kk / 16) * p->block_bytes;
                    const int i = (int)(kk % 16);
                    int byte, shift;
                    ql_wxa8_nibble_at(j, i, &byte, &shift);
                    int code = (blk[byte] >> shift) & 15;
                    if (p->bits == 6) code |= ((blk[8 * nr + 16 * (j / 4) + i] >> (2 * (j % 4))) & 3) << 4;
                    const float s = p->e4m3[sidx[(kk / p->group) * nr + j]];
                    *dst++ = (uint8_t)((uint8_t)ql_wxa8_grid(p->values[code], s) + off);
                }
    }
}
