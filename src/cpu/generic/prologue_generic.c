/* The generic prologue and the generic W8A8 and float tile epilogues. */
#include "cpu/generic/generic.h"

/* The reference twin: the eager row quantizer, then a scatter into panels. */
void ql_prologue_generic(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                         int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch)
{
    int8_t *q = (int8_t *)(scratch + k); /* scratch holds k floats + k bytes */
    for (int64_t row = r0; row < r1; row++) {
        int8_t *panel = packed + (size_t)(row / mr * ql_k4(k) * mr * 4);
        const int r = (int)(row % mr);
        if (row >= m) { ql_zero_row(k, mr, r, panel); continue; }
        ql_load_row_rotated(dt, ql_row_cptr(dt, x, row, ldx), k, group, scratch);
        ql_quantize_row_f32(dt, scratch, k, q, &sx[row]);
        int32_t s = 0;
        for (int64_t j = 0; j < k; j++) s += q[j];
        rowsum[row] = s;
        ql_scatter_row(q, k, mr, r, panel);
    }
}

void ql_w8a8_epilogue_generic(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_w8a8_epi *e = arg;
    for (int r = 0; r < mr_eff; r++) {
        int64_t row = m0 + r;
        int32_t corr = e->offset128 ? 128 * e->rowsum[row] : 0;
        for (int j = 0; j < nr_eff; j++) {
            int64_t col = n0 + j;
            int32_t acc = c[r * nr + j] - corr;
            if (e->c_out) { e->c_out[row * e->ldc + col] = acc; continue; }
            float sxw = e->sx[row] * e->sw[e->sw_scalar ? 0 : col];
            float v = (float)acc * sxw;
            if (e->lora) v += ql_lora_term(e, nr, r, j, row, col);
            ql_store_f(e->plan.y_dtype, e->y, row * e->ldy + col, ql_epilogue_scalar(&e->plan, v, row, col));
        }
    }
}

void ql_f32_epilogue_generic(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_f32_epi *e = arg;
    for (int r = 0; r < mr_eff; r++)
        for (int j = 0; j < nr_eff; j++) {
            float v = c[r * nr + j];
            if (e->col_scale) v *= e->col_scale[e->col_scale_scalar ? 0 : n0 + j];
            ql_store_f(e->plan.y_dtype, e->y, (m0 + r) * e->ldy + n0 + j, ql_epilogue_scalar(&e->plan, v, m0 + r, n0 + j));
        }
}
