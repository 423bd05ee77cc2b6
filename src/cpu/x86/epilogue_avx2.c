/* AVX2 W8A8 tile epilogue: 8 columns at a time, the scalar epilogue for a
 * partial last chunk. Same roundings as ql_epilogue_scalar. */
#include "cpu/generic/generic.h"
#include "cpu/x86/x86.h"
#include "cpu/x86/simd256.h"

#include <math.h>

/* Round, + bias (rounded), GELU (rounded), residual (rounded), store: 8 outputs. */
static inline void finish(const ql_epi_plan *p, __m256 v, int64_t row, int64_t col, void *y, int64_t ldy)
{
    const ql_dtype dt = p->y_dtype;
    __m256 r = ql256_round_to(dt, v);
    if (p->bias) r = ql256_round_to(dt, _mm256_add_ps(r, _mm256_loadu_ps(p->bias + col)));
    if (p->act) r = ql256_round_to(dt, ql256_gelu(r));
    if (p->residual) {
        __m256 res = ql256_load(dt, p->residual, row * p->ld_residual + col);
        __m256 rs = ql256_load(dt, p->residual_scale, col);
        r = ql256_round_to(dt, _mm256_add_ps(res, _mm256_mul_ps(rs, r)));
    }
    ql256_store(dt, y, row * ldy + col, r);
}

/* RNE of fp32 to bf16 as fp32 bits, for inputs known not to be NaN
 * (subnormals and overflow to Inf are exact). */
static inline __m256i bf16_rne_nonan(__m256 v)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                            _mm256_set1_epi32((int)0xffff0000u));
}

/* The LoRA term of 8 outputs (ql_lora_term). */
static inline __m256 lora_term(const ql_w8a8_epi *e, int nr, int r, int j, int64_t row, int64_t col)
{
    const ql_lora_tile *t = e->lora;
    const __m256i a = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(t->c + r * nr + j)),
                                       _mm256_set1_epi32(e->offset128 ? 128 * t->rowsum[row] : 0));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(a), _mm256_mul_ps(_mm256_set1_ps(t->st[row]), _mm256_loadu_ps(t->su + col)));
}

/* bf16 output, optional bias, no residual, 8 columns at a time, for tiles
 * where no NaN can arise (finite weight scales and bias, see
 * ql_w8a8_epi.finite_weights, and no NaN row): the NaN-quietening half of
 * the exact rounding is not needed. */
static bool tile_nan_free(const ql_w8a8_epi *e, int64_t m0, int mr_eff)
{
    if (!e->finite_weights) return false;
    for (int r = 0; r < mr_eff; r++)
        if (isnan(e->sx[m0 + r])) return false;
    /* with a LoRA term: |acc·s_x·s_w| < 2^127 and |term| < 2^114, so no
     * Inf - Inf either */
    for (int r = 0; e->lora && r < mr_eff; r++)
        if (!(fabsf(e->sx[m0 + r]) <= 0x1p90f && fabsf(e->lora->st[m0 + r]) <= 0x1p90f)) return false;
    return true;
}

static void tile_bf16(const ql_w8a8_epi *e, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        const __m256i corr = _mm256_set1_epi32(e->offset128 ? 128 * e->rowsum[row] : 0);
        const __m256 sxv = _mm256_set1_ps(e->sx[row]);
        for (int j = 0; j < nr_eff; j += 8) {
            const int64_t col = n0 + j;
            const __m256i acc = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(c + r * nr + j)), corr);
            const __m256 sw = e->sw_scalar ? _mm256_set1_ps(e->sw[0]) : _mm256_loadu_ps(e->sw + col);
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(sxv, sw));
            if (e->lora) v = _mm256_add_ps(v, lora_term(e, nr, r, j, row, col));
            __m256i y = bf16_rne_nonan(v);
            if (e->plan.bias) y = bf16_rne_nonan(_mm256_add_ps(_mm256_castsi256_ps(y), _mm256_loadu_ps(e->plan.bias + col)));
            y = _mm256_srli_epi32(y, 16);
            _mm_storeu_si128((__m128i *)((uint16_t *)e->y + row * e->ldy + col),
                             _mm_packus_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1)));
        }
    }
}

void ql_w8a8_epilogue_avx2(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_w8a8_epi *e = arg;
    const ql_dtype dt = e->plan.y_dtype;
    if (!e->c_out && dt == QL_BF16 && !e->plan.residual && !e->plan.act && nr_eff % 8 == 0 && tile_nan_free(e, m0, mr_eff)) {
        tile_bf16(e, c, nr, m0, n0, mr_eff, nr_eff);
        return;
    }
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
            __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(sxv, sw));
            if (e->lora) v = _mm256_add_ps(v, lora_term(e, nr, r, j, row, col));
            finish(&e->plan, v, row, col, e->y, e->ldy);
        }
        for (int j = full; j < nr_eff; j++) {
            const int64_t col = n0 + j;
            int32_t acc = c[r * nr + j] - corr_s;
            if (e->c_out) { e->c_out[row * e->ldc + col] = acc; continue; }
            float sxw = e->sx[row] * e->sw[e->sw_scalar ? 0 : col];
            float v = (float)acc * sxw;
            if (e->lora) v += ql_lora_term(e, nr, r, j, row, col);
            ql_store_f(dt, e->y, row * e->ldy + col, ql_epilogue_scalar(&e->plan, v, row, col));
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
