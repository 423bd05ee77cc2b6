/* AVX-512 W8A8 tile epilogue: int32 tile -> (acc - 128·Σq) -> fp32 ->
 * ·(s_x·s_w) -> round to the output dtype -> + bias (rounded) -> residual
 * (rounded) -> store. The same roundings as ql_epilogue_scalar. */
#include "kernels.h"
#include "simd512.h"

void ql_w8a8_epilogue_avx512(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_w8a8_epi *e = arg;
    const ql_dtype dt = e->plan.y_dtype;
    const bool fbf = ql_cpu()->avx512bf16;
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        const __m512i corr = _mm512_set1_epi32(e->offset128 ? 128 * e->rowsum[row] : 0);
        const __m512 sxv = _mm512_set1_ps(e->c_out ? 0.0f : e->sx[row]);
        for (int j = 0; j < nr_eff; j += 16) {
            const __mmask16 mk = ql512_mask(nr_eff - j);
            const int64_t col = n0 + j;
            __m512i acc = _mm512_sub_epi32(_mm512_loadu_si512((const void *)(c + r * nr + j)), corr);
            if (e->c_out) {
                _mm512_mask_storeu_epi32(e->c_out + row * e->ldc + col, mk, acc);
                continue;
            }
            __m512 sw = e->sw_scalar ? _mm512_set1_ps(e->sw[0]) : _mm512_maskz_loadu_ps(mk, e->sw + col);
            __m512 y = ql512_round_to_fast(dt, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sxv, sw)), fbf);
            if (e->plan.bias) y = ql512_round_to_fast(dt, _mm512_add_ps(y, _mm512_maskz_loadu_ps(mk, e->plan.bias + col)), fbf);
            if (e->plan.residual) {
                __m512 res = ql512_load(dt, e->plan.residual, row * e->plan.ld_residual + col, mk);
                __m512 rs = ql512_load(dt, e->plan.residual_scale, col, mk);
                y = ql512_round_to_fast(dt, _mm512_add_ps(res, _mm512_mul_ps(rs, y)), fbf);
            }
            ql512_store_exact(dt, e->y, row * e->ldy + col, y, mk);
        }
    }
}

/* Dense fp32 tile epilogue (float GEMM result, no scales). */
void ql_f32_epilogue_avx512(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_f32_epi *e = arg;
    const ql_dtype dt = e->plan.y_dtype;
    const bool fbf = ql_cpu()->avx512bf16;
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        for (int j = 0; j < nr_eff; j += 16) {
            const __mmask16 mk = ql512_mask(nr_eff - j);
            const int64_t col = n0 + j;
            __m512 v = _mm512_loadu_ps(c + r * nr + j);
            if (e->col_scale)
                v = _mm512_mul_ps(v, e->col_scale_scalar ? _mm512_set1_ps(e->col_scale[0]) : _mm512_maskz_loadu_ps(mk, e->col_scale + col));
            __m512 y = ql512_round_to_fast(dt, v, fbf);
            if (e->plan.bias) y = ql512_round_to_fast(dt, _mm512_add_ps(y, _mm512_maskz_loadu_ps(mk, e->plan.bias + col)), fbf);
            if (e->plan.residual) {
                __m512 res = ql512_load(dt, e->plan.residual, row * e->plan.ld_residual + col, mk);
                __m512 rs = ql512_load(dt, e->plan.residual_scale, col, mk);
                y = ql512_round_to_fast(dt, _mm512_add_ps(res, _mm512_mul_ps(rs, y)), fbf);
            }
            ql512_store_exact(dt, e->y, row * e->ldy + col, y, mk);
        }
    }
}
