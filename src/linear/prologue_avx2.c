/* AVX2 prologue: the AVX-512 prologue's algorithm on 8-lane vectors. */
#include "kernels.h"
#include "simd256.h"

#include <math.h>

static inline __m256 stage_s1(__m256 x)
{
    __m256 p = _mm256_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1));
    __m256 s = _mm256_add_ps(x, p), d = _mm256_sub_ps(x, p);
    return _mm256_add_ps(s, _mm256_permute_ps(d, _MM_SHUFFLE(1, 0, 3, 2)));
}

/* Stage at distance 4 over 16 lanes held in x0 (lanes 0-7) and x1 (8-15). */
static inline void stage_s4(__m256 *x0, __m256 *x1)
{
    __m256 p0 = _mm256_permute2f128_ps(*x0, *x0, 1), p1 = _mm256_permute2f128_ps(*x1, *x1, 1);
    __m256 s0 = _mm256_add_ps(*x0, p0), d0 = _mm256_sub_ps(*x0, p0);
    __m256 s1 = _mm256_add_ps(*x1, p1), d1 = _mm256_sub_ps(*x1, p1);
    *x0 = _mm256_add_ps(s0, d1);
    *x1 = _mm256_add_ps(s1, d0);
}

static void fwht_group(float *v, int64_t g)
{
    int p = 0;
    for (int64_t t = g; t > 1; t /= 4) p++;
    const __m256 norm = _mm256_set1_ps(ldexpf(1.0f, -p));
    for (int64_t i = 0; i < g; i += 16) {
        __m256 x0 = stage_s1(_mm256_mul_ps(_mm256_load_ps(v + i), norm));
        __m256 x1 = stage_s1(_mm256_mul_ps(_mm256_load_ps(v + i + 8), norm));
        stage_s4(&x0, &x1);
        _mm256_store_ps(v + i, x0);
        _mm256_store_ps(v + i + 8, x1);
    }
    for (int64_t s = 16; s < g; s *= 4)
        for (int64_t base = 0; base < g; base += 4 * s)
            for (int64_t j = base; j < base + s; j += 8) {
                __m256 a = _mm256_load_ps(v + j), b = _mm256_load_ps(v + j + s);
                __m256 c = _mm256_load_ps(v + j + 2 * s), d = _mm256_load_ps(v + j + 3 * s);
                __m256 t0 = _mm256_add_ps(a, b), t1 = _mm256_add_ps(c, d);
                __m256 t2 = _mm256_sub_ps(a, b), t3 = _mm256_sub_ps(c, d);
                _mm256_store_ps(v + j, _mm256_add_ps(t0, t3));
                _mm256_store_ps(v + j + s, _mm256_sub_ps(t0, t3));
                _mm256_store_ps(v + j + 2 * s, _mm256_add_ps(t1, t2));
                _mm256_store_ps(v + j + 3 * s, _mm256_sub_ps(t1, t2));
            }
}

void ql_prologue_avx2(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                      int64_t p0, int64_t p1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch)
{
    const int64_t k4 = ql_k4(k), kp = (k + 15) & ~(int64_t)15, k8 = k & ~(int64_t)7;
    int8_t *q = (int8_t *)(scratch + kp);
    const __m256 fmax = _mm256_set1_ps(3.402823466e38f), lo = _mm256_set1_ps(-128.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t p = p0; p < p1; p++) {
        int8_t *panel = packed + (size_t)(p * k4 * mr * 4);
        for (int r = 0; r < mr; r++) {
            int64_t row = p * mr + r;
            if (row >= m) { ql_zero_row(k, mr, r, panel); continue; }
            const void *src = ql_row_cptr(dt, x, row, ldx);
            for (int64_t i = 0; i < k8; i += 8) _mm256_store_ps(scratch + i, ql256_load(dt, src, i));
            for (int64_t i = k8; i < kp; i++) scratch[i] = i < k ? ql_load_f(dt, src, i) : 0.0f;
            if (group >= 16) {
                for (int64_t g0 = 0; g0 < k; g0 += group) fwht_group(scratch + g0, group);
            } else if (group == 4) {
                for (int64_t i = 0; i < kp; i += 8)
                    _mm256_store_ps(scratch + i, stage_s1(_mm256_mul_ps(_mm256_load_ps(scratch + i), _mm256_set1_ps(0.5f))));
            }
            __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
            for (int64_t i = 0; i < kp; i += 8) {
                __m256 v = _mm256_load_ps(scratch + i);
                if (group > 0 && dt != QL_F32) {
                    v = ql256_round_to(dt, v);
                    _mm256_store_ps(scratch + i, v);
                }
                __m256 av = _mm256_and_ps(v, absmask);
                bad = _mm256_or_ps(bad, _mm256_cmp_ps(av, fmax, _CMP_NLE_UQ));
                amax = _mm256_max_ps(amax, av);
            }
            if (_mm256_movemask_ps(bad)) {
                sx[row] = NAN;
                rowsum[row] = 0;
                ql_zero_row(k, mr, r, panel);
                continue;
            }
            float lanes[8], a = 0.0f;
            _mm256_storeu_ps(lanes, amax);
            for (int t = 0; t < 8; t++) a = lanes[t] > a ? lanes[t] : a;
            float s = ql_scale_from_absmax(a);
            const __m256 st = _mm256_set1_ps(ql_scale_divisor(dt, s));
            __m256i sum = _mm256_setzero_si256();
            for (int64_t i = 0; i < kp; i += 8) {
                __m256 y = ql256_round_to(dt, _mm256_div_ps(_mm256_load_ps(scratch + i), st));
                y = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
                __m256i qi = _mm256_cvtps_epi32(y);
                sum = _mm256_add_epi32(sum, qi);
                __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
                _mm_storel_epi64((__m128i *)(q + i), _mm_packs_epi16(w, w));
            }
            int32_t sums[8], tot = 0;
            _mm256_storeu_si256((__m256i *)sums, sum);
            for (int t = 0; t < 8; t++) tot += sums[t];
            sx[row] = s;
            rowsum[row] = tot; /* lanes past k hold code 0 */
            ql_scatter_row(q, k, mr, r, panel);
        }
    }
}
