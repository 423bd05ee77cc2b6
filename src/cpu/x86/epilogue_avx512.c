/* AVX-512 W8A8 tile epilogue: int32 tile -> (acc - 128·Σq) -> fp32 ->
 * ·(s_x·s_w) -> round to the output dtype -> + bias (rounded) -> residual
 * (rounded) -> GELU (rounded) -> residual (rounded) -> store. The same
 * roundings as ql_epilogue_scalar. */
#include "cpu/generic/generic.h"
#include "cpu/x86/x86.h"
#include "cpu/x86/simd512.h"

/* bf16 output, the common case: each rounding also yields the 16-bit
 * patterns, so the last one is stored as it is. */
static inline void finish_bf16(const ql_epi_plan *p, __m512 v, int64_t row, int64_t col, __mmask16 mk, bool fbf,
                               void *y, int64_t ldy)
{
    __m256i bits;
    __m512 r = ql512_bf16_round(v, fbf, &bits);
    if (p->bias) r = ql512_bf16_round(_mm512_add_ps(r, _mm512_maskz_loadu_ps(mk, p->bias + col)), fbf, &bits);
    if (p->act) r = ql512_bf16_round(ql512_gelu(r), fbf, &bits);
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
    if (p->act) r = ql512_round_to(dt, ql512_gelu(r));
    if (p->residual) {
        __m512 res = ql512_load(dt, p->residual, row * p->ld_residual + col, mk);
        __m512 rs = ql512_load(dt, p->residual_scale, col, mk);
        r = ql512_round_to(dt, _mm512_add_ps(res, _mm512_mul_ps(rs, r)));
    }
    ql512_store_exact(dt, y, row * ldy + col, r, mk);
}

/* The LoRA term of 16 outputs (ql_lora_term). */
static inline __m512 lora_term(const ql_w8a8_epi *e, int nr, int r, int j, int64_t row, int64_t col, __mmask16 mk)
{
    const ql_lora_tile *t = e->lora;
    const __m512i a = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(mk, t->c + r * nr + j),
                                       _mm512_set1_epi32(e->offset128 ? 128 * t->rowsum[row] : 0));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_mul_ps(_mm512_set1_ps(t->st[row]), _mm512_maskz_loadu_ps(mk, t->su + col)));
}

/* One row of a tile, any output: the exact path. */
static void row_exact(const ql_w8a8_epi *e, const int32_t *c, int nr, int r, int64_t m0, int64_t n0, int nr_eff, bool fbf)
{
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
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sxv, sw));
        if (e->lora) v = _mm512_add_ps(v, lora_term(e, nr, r, j, row, col, mk));
        finish(&e->plan, v, row, col, mk, fbf, e->y, e->ldy);
    }
}

/* 32 values to bf16 (lo: columns 0-15, hi: 16-31), rounded to nearest
 * even: vcvtne2ps2bf16 where the CPU has it, else the integer rounding of
 * ql512_bf16_bits (NaNs quieted, denormals kept) and one word permute that
 * packs the two halves in the same order. */
static inline __m512i cvt2_bf16(__m512 hi, __m512 lo, bool fbf)
{
    if (fbf) return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    const __m512i even = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24,
                                          22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    return _mm512_permutex2var_epi16(ql512_bf16_bits(lo), even, ql512_bf16_bits(hi));
}

/* Full 32-column tiles with bf16 output, optional bias, no residual: the
 * common case, two vectors at a time. cvt2_bf16 rounds 32 values (one
 * instruction with AVX512-BF16) and vpunpck{l,h}wd widen them back to fp32 (columns 0-3, 8-11,
 * 16-19, 24-27 and 4-7, ...; the bias is permuted to match, once per tile);
 * one vpermw restores the column order of the final 32 bf16. That
 * instruction flushes denormal inputs, so the caller only comes here when
 * none can occur: |s_x·s_w| >= 2^-126 (then a nonzero |acc·s_x·s_w| is
 * normal) and every bias is 0 or >= 2^-118 in magnitude (then a nonzero
 * rounded value plus it is a multiple of an ulp >= 2^-126, or >= 2^-119).
 * With a LoRA term the sums themselves are checked: if any lane of the tile
 * is denormal, the tile is redone by the exact path (rare: the two terms
 * must cancel to below 2^-126). The LoRA term is ql_lora_term's, with the
 * tile's column scales and row pointers loaded once. */
static void tile32_bf16(const ql_w8a8_epi *e, const int32_t *c, int64_t m0, int64_t n0, int mr_eff, __m512 sw0,
                        __m512 sw1, bool has_bias, __m512 blo, __m512 bhi, bool fbf)
{
    const __m512i order = _mm512_set_epi16(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8, 23, 22, 21, 20,
                                           7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
    const __m512i zero = _mm512_setzero_si512();
    const ql_lora_tile *lt = e->lora;
    const int32_t *c2 = lt ? lt->c : NULL, *trs = lt ? lt->rowsum : NULL;
    const float *st = lt ? lt->st : NULL;
    const __m512 su0 = lt ? _mm512_loadu_ps(lt->su + n0) : _mm512_setzero_ps();
    const __m512 su1 = lt ? _mm512_loadu_ps(lt->su + n0 + 16) : _mm512_setzero_ps();
    const int32_t off = e->offset128 ? 128 : 0;
    __mmask16 denormal = 0;
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        const __m512i corr = _mm512_set1_epi32(off * e->rowsum[row]);
        const __m512 sx = _mm512_set1_ps(e->sx[row]);
        __m512 v0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512((const void *)(c + 32 * r)), corr)),
                                  _mm512_mul_ps(sx, sw0));
        __m512 v1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512((const void *)(c + 32 * r + 16)), corr)),
                                  _mm512_mul_ps(sx, sw1));
        if (lt) {
            const __m512i corr2 = _mm512_set1_epi32(off * trs[row]);
            const __m512 s = _mm512_set1_ps(st[row]);
            const __m512 a0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512((const void *)(c2 + 32 * r)), corr2));
            const __m512 a1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512((const void *)(c2 + 32 * r + 16)), corr2));
            v0 = _mm512_add_ps(v0, _mm512_mul_ps(a0, _mm512_mul_ps(s, su0)));
            v1 = _mm512_add_ps(v1, _mm512_mul_ps(a1, _mm512_mul_ps(s, su1)));
            denormal |= _mm512_fpclass_ps_mask(v0, 0x20) | _mm512_fpclass_ps_mask(v1, 0x20);
        }
        __m512i y = cvt2_bf16(v1, v0, fbf); /* columns 0..31 */
        if (has_bias) {
            const __m512 lo = _mm512_add_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, y)), blo);
            const __m512 hi = _mm512_add_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, y)), bhi);
            y = _mm512_permutexvar_epi16(order, cvt2_bf16(hi, lo, fbf));
        }
        _mm512_storeu_si512((void *)((uint16_t *)e->y + row * e->ldy + n0), y);
    }
    if (denormal)
        for (int r = 0; r < mr_eff; r++) row_exact(e, c, 32, r, m0, n0, 32, fbf);
}

/* The small-M order's next tile (e->pf_m): the rows below, or the top of the
 * next column panel. Its output lines are fetched for writing while this
 * thread's next tile computes (a prefetch past the output cannot fault). */
static void prefetch_next_tile(const ql_w8a8_epi *e, int nr, int64_t m0, int64_t n0, int mr_eff)
{
    int64_t r0 = m0 + mr_eff, c0 = n0;
    if (r0 >= e->pf_m) {
        r0 = 0;
        c0 = n0 + nr;
    }
    const int64_t r1 = r0 + mr_eff < e->pf_m ? r0 + mr_eff : e->pf_m;
    const size_t es = e->c_out ? 4 : ql_dtype_size(e->plan.y_dtype), bytes = (size_t)nr * es;
    /* integer addresses: the next panel may lie past the output's end */
    const uintptr_t base = e->c_out ? (uintptr_t)e->c_out : (uintptr_t)e->y;
    const int64_t ld = e->c_out ? e->ldc : e->ldy;
    for (int64_t r = r0; r < r1; r++) {
        const uintptr_t p = base + (uintptr_t)(r * ld + c0) * es;
        for (size_t o = 0; o < bytes; o += 64) __asm__("prefetchw (%0)" : : "r"(p + o));
        __asm__("prefetchw (%0)" : : "r"(p + bytes - 1));
    }
}

static void epilogue_avx512(const ql_w8a8_epi *e, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);

void ql_w8a8_epilogue_avx512(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_w8a8_epi *e = arg;
    epilogue_avx512(e, c, nr, m0, n0, mr_eff, nr_eff);
    if (e->pf_m > 0) prefetch_next_tile(e, nr, m0, n0, mr_eff);
}

static void epilogue_avx512(const ql_w8a8_epi *e, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const bool fbf = ql_cpu()->avx512bf16;
    /* without AVX512-BF16 the same tiles round by integer arithmetic (cvt2_bf16), still faster than row by row */
    if (!e->c_out && e->plan.y_dtype == QL_BF16 && !e->plan.residual && !e->plan.act && nr == 32 && nr_eff == 32) {
        const __m512 sw0 = e->sw_scalar ? _mm512_set1_ps(e->sw[0]) : _mm512_loadu_ps(e->sw + n0);
        const __m512 sw1 = e->sw_scalar ? sw0 : _mm512_loadu_ps(e->sw + n0 + 16);
        /* every row's |s_x|·min|s_w| >= 2^-126 (a NaN scale fails), 16 rows
         * at a time (the AMX tiles have 32) */
        const __m512 swmin = _mm512_set1_ps(_mm512_reduce_min_ps(_mm512_min_ps(_mm512_abs_ps(sw0), _mm512_abs_ps(sw1))));
        bool ok = true;
        for (int r0 = 0; ok && r0 < mr_eff; r0 += 16) {
            const __mmask16 rows = ql512_mask(mr_eff - r0);
            const __m512 sxw = _mm512_mul_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(rows, e->sx + m0 + r0)), swmin);
            ok = _mm512_mask_cmp_ps_mask(rows, sxw, _mm512_set1_ps(0x1p-126f), _CMP_GE_OQ) == rows;
            if (ok && e->lora) { /* no Inf - Inf: |acc·s_x·s_w| < 2^127, |term| < 2^114 */
                const __m512 lim = _mm512_set1_ps(0x1p90f);
                ok = _mm512_mask_cmp_ps_mask(rows, _mm512_abs_ps(_mm512_maskz_loadu_ps(rows, e->sx + m0 + r0)), lim, _CMP_LE_OQ) == rows &&
                     _mm512_mask_cmp_ps_mask(rows, _mm512_abs_ps(_mm512_maskz_loadu_ps(rows, e->lora->st + m0 + r0)), lim, _CMP_LE_OQ) == rows;
            }
        }
        __m512 blo = _mm512_setzero_ps(), bhi = blo;
        if (ok && e->plan.bias) {
            const __m512 b0 = _mm512_loadu_ps(e->plan.bias + n0), b1 = _mm512_loadu_ps(e->plan.bias + n0 + 16);
            const __m512 tiny = _mm512_set1_ps(0x1p-118f);
            ok = !(_mm512_cmp_ps_mask(_mm512_abs_ps(b0), tiny, _CMP_LT_OQ) & _mm512_cmp_ps_mask(b0, blo, _CMP_NEQ_OQ)) &&
                 !(_mm512_cmp_ps_mask(_mm512_abs_ps(b1), tiny, _CMP_LT_OQ) & _mm512_cmp_ps_mask(b1, blo, _CMP_NEQ_OQ));
            const __m512i ilo = _mm512_set_epi32(27, 26, 25, 24, 19, 18, 17, 16, 11, 10, 9, 8, 3, 2, 1, 0);
            blo = _mm512_permutex2var_ps(b0, ilo, b1);
            bhi = _mm512_permutex2var_ps(b0, _mm512_add_epi32(ilo, _mm512_set1_epi32(4)), b1);
        }
        if (ok) {
            tile32_bf16(e, c, m0, n0, mr_eff, sw0, sw1, e->plan.bias != NULL, blo, bhi, fbf);
            return;
        }
    }
    for (int r = 0; r < mr_eff; r++) row_exact(e, c, nr, r, m0, n0, nr_eff, fbf);
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
