/* AVX-512 W8A8 tile epilogue: int32 tile -> (acc - 128·Σq) -> fp32 ->
 * ·(s_x·s_w) -> round to the output dtype -> + bias (rounded) -> residual
 * (rounded) -> store. The same roundings as ql_epilogue_scalar. */
#include "kernels.h"
#include "simd512.h"

/* bf16 output, the common case: each rounding also yields the 16-bit
 * patterns, so the last one is stored as it is. */
static inline void finish_bf16(const ql_epi_plan *p, __m512 v, int64_t row, int64_t col, __mmask16 mk, bool fbf,
                               void *y, int64_t ldy)
{
    __m256i bits;
    __m512 r = ql512_bf16_round(v, fbf, &bits);
    if (p->bias) r = ql512_bf16_round(_mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, p->bias + col)), fbf, &bits);
    if (p->residual) {
        __m512 res = ql512_load(QL_BF16, p->residual, row * p->ld_residual + col, mk);
        __m512 rs = ql512_load(QL_BF16, p->residual_scale, col, mk);
        r = ql512_bf16_round(_mm512_add_ps(res, _mm512_mul_ps(rs, r)), fbf, &bits);
    }
    (void)r;
    _mm256_mask_storeu_epi16((uint16_t *)y + row * ldy + col, mk, bits);
}

/* Any output dtype: round, + bias (rounded), residual (rounded), store. */
static inline void finish(const ql_epi_plan *p, __m512 v, int64_t row, int64_t col, __mmask16 mk, bool fbf, void *y,
                          int64_t ldy)
{
    const ql_dtype dt = p->y_dtype;
    if (dt == QL_BF16) {
        finish_bf16(p, v, row, col, mk, fbf, y, ldy);
        return;
    }
    __m512 r = ql512_round_to(dt, v);
    if (p->bias) r = ql512_round_to(dt, _mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, p->bias + col)));
    if (p->residual) {
        __m512 res = ql512_load(dt, p->residual, row * p->ld_residual + col, mk);
        __m512 rs = ql512_load(dt, p->residual_scale, col, mk);
        r = ql512_round_to(dt, _mm512_add_ps(res, _mm512_mul_ps(rs, r)));
    }
    ql512_store_exact(dt, y, row * ldy + col, r, mk);
}

void ql_w8a8_epilogue_avx512(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_w8a8_epi *e = arg;
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
            finish(&e->plan, _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sxv, sw)), row, col, mk, fbf, e->y, e->ldy);
        }
    }
}

/* Dense fp32 tile epilogue (float GEMM result, no scales). */
void ql_f32_epilogue_avx512(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_f32_epi *e = arg;
    const bool fbf = ql_cpu()->avx512bf16;
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        for (int j = 0; j < nr_eff; j += 16) {
            const __mmask16 mk = ql512_mask(nr_eff - j);
            const int64_t col = n0 + j;
            __m512 v = _mm512_loadu_ps(c + r * nr + j);
            if (e->col_scale)
                v = _mm512_mul_ps(v, e->col_scale_scalar ? _mm512_set1_ps(e->col_scale[0]) : _mm512_maskz_loadu_ps(mk, e->col_scale + col));
            finish(&e->plan, v, row, col, mk, fbf, e->y, e->ldy);
        }
    }
}
