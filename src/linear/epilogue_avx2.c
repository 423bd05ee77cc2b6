/* AVX2 W8A8 tile epilogue: 8 columns at a time, the scalar epilogue for a
 * partial last chunk. Same roundings as ql_epilogue_scalar. */
#include "kernels.h"
#include "simd256.h"

/* Round, + bias (rounded), residual (rounded), store: 8 outputs. */
static inline void finish(const ql_epi_plan *p, __m256 v, int64_t row, int64_t col, void *y, int64_t ldy)
{
    const ql_dtype dt = p->y_dtype;
    __m256 r = ql256_round_to(dt, v);
    if (p->bias) r = ql256_round_to(dt, _mm256_add_ps(r, _mm256_loadu_ps(p->bias + col)));
    if (p->residual) {
        __m256 res = ql256_load(dt, p->residual, row * p->ld_residual + col);
        __m256 rs = ql256_load(dt, p->residual_scale, col);
        r = ql256_round_to(dt, _mm256_add_ps(res, _mm256_mul_ps(rs, r)));
    }
    ql256_store(dt, y, row * ldy + col, r);
}

void ql_w8a8_epilogue_avx2(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_w8a8_epi *e = arg;
    const ql_dtype dt = e->plan.y_dtype;
    const int full = nr_eff & ~7;
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        const int32_t corr_s = e->offset128 ? 128 * e->rowsum[row] : 0;
        const __m256i corr = _mm256_set1_epi32(corr_s);
        const __m256 sxv = _mm256_set1_ps(e->c_out ? 0.0f : e->sx[row]);
        for (int j = 0; j < full; j += 8) {
            const int64_t col = n0 + j;
            __m256i acc = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(c + r * nr + j)), corr);
            if (e->c_out) {
                _mm256_storeu_si256((__m256i *)(e->c_out + row * e->ldc + col), acc);
                continue;
            }
            __m256 sw = e->sw_scalar ? _mm256_set1_ps(e->sw[0]) : _mm256_loadu_ps(e->sw + col);
            finish(&e->plan, _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(sxv, sw)), row, col, e->y, e->ldy);
        }
        for (int j = full; j < nr_eff; j++) {
            const int64_t col = n0 + j;
            int32_t acc = c[r * nr + j] - corr_s;
            if (e->c_out) { e->c_out[row * e->ldc + col] = acc; continue; }
            float sxw = e->sx[row] * e->sw[e->sw_scalar ? 0 : col];
            ql_store_f(dt, e->y, row * e->ldy + col, ql_epilogue_scalar(&e->plan, (float)acc * sxw, row, col));
        }
    }
}

/* Float-GEMM tile epilogue, 8 columns at a time. */
void ql_f32_epilogue_avx2(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_f32_epi *e = arg;
    const int full = nr_eff & ~7;
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        for (int j = 0; j < full; j += 8) {
            const int64_t col = n0 + j;
            __m256 v = _mm256_loadu_ps(c + r * nr + j);
            if (e->col_scale)
                v = _mm256_mul_ps(v, e->col_scale_scalar ? _mm256_set1_ps(e->col_scale[0]) : _mm256_loadu_ps(e->col_scale + col));
            finish(&e->plan, v, row, col, e->y, e->ldy);
        }
        if (full < nr_eff) ql_f32_epilogue_generic(arg, c + r * nr + full, nr, row, n0 + full, 1, nr_eff - full);
    }
}
