/* W8A8 tile epilogue on Advanced SIMD: int32 tile -> fp32 · (s_x·s_w) (+ the
 * unmerged-LoRA term), cast, bias, residual, store; four outputs at a time with the scalar epilogue's
 * operations in its order (ql_epilogue_scalar), so bit-identical to
 * ql_w8a8_epilogue_generic. SCVTF rounds int32 -> fp32 to nearest even, as
 * C's conversion does. Column tails use the scalar code itself. */
#include "cpu/arm/arm.h"
#include "cpu/generic/generic.h"
#include "cpu/arm/neon.h"

/* Four outputs from their fp32 values: ql_epilogue_scalar's roundings. */
static inline void finish4(const ql_epi_plan *pl, float32x4_t v, const void *res, void *y, int64_t col)
{
    const ql_dtype dt = pl->y_dtype;
    v = ql_neon_round_to(dt, v);
    if (pl->bias) v = ql_neon_round_to(dt, vaddq_f32(v, vld1q_f32(pl->bias + col)));
    if (pl->act) v = ql_neon_round_to(dt, ql_neon_gelu(v));
    if (res) {
        const float32x4_t t = vmulq_f32(ql_neon_load(dt, pl->residual_scale, col), v);
        v = ql_neon_round_to(dt, vaddq_f32(ql_neon_load(dt, res, col), t));
    }
    ql_neon_store(dt, y, col, v);
}

void ql_w8a8_epilogue_neon(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_w8a8_epi *e = arg;
    const ql_epi_plan *pl = &e->plan;
    const ql_dtype dt = pl->y_dtype;
    const int n4 = nr_eff & ~3;
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        const int32_t corr = e->offset128 ? 128 * e->rowsum[row] : 0;
        const int32_t *cr = c + r * nr;
        if (e->c_out) {
            int32_t *o = e->c_out + row * e->ldc + n0;
            int j = 0;
            for (; j < n4; j += 4) vst1q_s32(o + j, vsubq_s32(vld1q_s32(cr + j), vdupq_n_s32(corr)));
            for (; j < nr_eff; j++) o[j] = cr[j] - corr;
            continue;
        }
        const float sx = e->sx[row];
        const float32x4_t sxv = vdupq_n_f32(sx);
        const void *res = pl->residual ? ql_row_cptr(dt, pl->residual, row, pl->ld_residual) : NULL;
        void *y = ql_row_ptr(dt, e->y, row, e->ldy);
        int j = 0;
        for (; j < n4; j += 4) {
            const int64_t col = n0 + j;
            const float32x4_t sw = e->sw_scalar ? vdupq_n_f32(e->sw[0]) : vld1q_f32(e->sw + col);
            const int32x4_t acc = vsubq_s32(vld1q_s32(cr + j), vdupq_n_s32(corr));
            float32x4_t v = vmulq_f32(vcvtq_f32_s32(acc), vmulq_f32(sxv, sw));
            if (e->lora) { /* + fp32(acc2)·(st[row]·su[col]) (ql_lora_term) */
                const ql_lora_tile *t = e->lora;
                const int32x4_t a2 = vsubq_s32(vld1q_s32(t->c + r * nr + j),
                                               vdupq_n_s32(e->offset128 ? 128 * t->rowsum[row] : 0));
                v = vaddq_f32(v, vmulq_f32(vcvtq_f32_s32(a2), vmulq_f32(vdupq_n_f32(t->st[row]), vld1q_f32(t->su + col))));
            }
            finish4(pl, v, res, y, col);
        }
        for (; j < nr_eff; j++) {
            const int64_t col = n0 + j;
            const float sxw = sx * e->sw[e->sw_scalar ? 0 : col];
            float v = (float)(cr[j] - corr) * sxw;
            if (e->lora) v += ql_lora_term(e, nr, r, j, row, col);
            ql_store_f(dt, e->y, row * e->ldy + col, ql_epilogue_scalar(pl, v, row, col));
        }
    }
}

/* The float GEMM's tile epilogue (dense, weight-only, dequant): the column
 * scale (weight-only) first, then the same roundings as ql_f32_epilogue_generic. */
void ql_f32_epilogue_neon(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_f32_epi *e = arg;
    const ql_epi_plan *pl = &e->plan;
    const ql_dtype dt = pl->y_dtype;
    const int n4 = nr_eff & ~3;
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        const void *res = pl->residual ? ql_row_cptr(dt, pl->residual, row, pl->ld_residual) : NULL;
        void *y = ql_row_ptr(dt, e->y, row, e->ldy);
        for (int j = 0; j < n4; j += 4) {
            const int64_t col = n0 + j;
            float32x4_t v = vld1q_f32(c + r * nr + j);
            if (e->col_scale)
                v = vmulq_f32(v, e->col_scale_scalar ? vdupq_n_f32(e->col_scale[0]) : vld1q_f32(e->col_scale + col));
            finish4(pl, v, res, y, col);
        }
        if (n4 < nr_eff) ql_f32_epilogue_generic(arg, c + r * nr + n4, nr, row, n0 + n4, 1, nr_eff - n4);
    }
}
