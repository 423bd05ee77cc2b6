/* AVX2 prologue: the AVX-512 prologue's algorithm on 8-lane vectors. */
#include "cpu/generic/generic.h"
#include "cpu/x86/x86.h"
#include "cpu/x86/simd256.h"

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

static inline void butterfly4(__m256 *a, __m256 *b, __m256 *c, __m256 *d)
{
    const __m256 t0 = _mm256_add_ps(*a, *b), t1 = _mm256_add_ps(*c, *d);
    const __m256 t2 = _mm256_sub_ps(*a, *b), t3 = _mm256_sub_ps(*c, *d);
    *a = _mm256_add_ps(t0, t3);
    *b = _mm256_sub_ps(t0, t3);
    *c = _mm256_add_ps(t1, t2);
    *d = _mm256_sub_ps(t1, t2);
}

/* G = 256 in two passes over the row buffer instead of five: the stages at
 * distances 1, 4 and 16 on 64 values in 8 registers, then the stage at
 * distance 64 fused with the rounding to dt and the row maximum (of |v|'s
 * bits, unsigned: NaN and Inf above every finite value). The butterflies
 * and their operands are fwht_group's, so the bits are too. */
static uint32_t rotate_row256(ql_dtype dt, const void *src, int64_t k, float *scr)
{
    const __m256 norm = _mm256_set1_ps(1.0f / 16.0f);
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    for (int64_t c0 = 0; c0 < k; c0 += 64) {
        __m256 v[8];
        for (int i = 0; i < 8; i++) v[i] = stage_s1(_mm256_mul_ps(ql256_load(dt, src, c0 + 8 * i), norm));
        for (int i = 0; i < 8; i += 2) stage_s4(&v[i], &v[i + 1]);
        for (int j = 0; j < 2; j++) butterfly4(&v[j], &v[j + 2], &v[j + 4], &v[j + 6]);
        for (int i = 0; i < 8; i++) _mm256_store_ps(scr + c0 + 8 * i, v[i]);
    }
    __m256i amax = _mm256_setzero_si256();
    for (int64_t g0 = 0; g0 < k; g0 += 256)
        for (int64_t j = g0; j < g0 + 64; j += 8) {
            __m256 a = _mm256_load_ps(scr + j), b = _mm256_load_ps(scr + j + 64);
            __m256 c = _mm256_load_ps(scr + j + 128), d = _mm256_load_ps(scr + j + 192);
            butterfly4(&a, &b, &c, &d);
            __m256 *r[4] = {&a, &b, &c, &d};
            for (int t = 0; t < 4; t++) {
                const __m256 x = ql256_round_to(dt, *r[t]);
                _mm256_store_ps(scr + j + 64 * t, x);
                amax = _mm256_max_epu32(amax, _mm256_and_si256(_mm256_castps_si256(x), absmask));
            }
        }
    uint32_t lanes[8], bits = 0;
    _mm256_storeu_si256((__m256i *)lanes, amax);
    for (int t = 0; t < 8; t++) bits = lanes[t] > bits ? lanes[t] : bits;
    return bits;
}

/* Codes of four vectors of 8 (32 values) when some lane's quotient is near a
 * rounding step: the reference quotient, rounded exactly to dt and then to an
 * integer (cvtps2dq in the default rounding mode: nearest even, as rintf). */
static inline void codes32_exact(ql_dtype dt, const __m256 v[4], __m256 st, __m256i qi[4])
{
    for (int j = 0; j < 4; j++) qi[j] = _mm256_cvtps_epi32(ql256_round_to(dt, _mm256_div_ps(v[j], st)));
}

/* One row of rotated, rounded values (fp32, canonical order, zero-padded to
 * kp) -> 32-byte code blocks of row r (order ql_k32_element); returns Σq.
 * The quotient is v·RN(1/st), exact but where its dropped bits lie within 2
 * ulps of a rounding step (see quotient16 in prologue_avx512.c); vpackssdw
 * and vpacksswb saturate, which is the reference's clamp to [-128, 127]. */
static int32_t quantize_row_blocks(ql_dtype dt, const float *scr, int64_t kp, float stf, int mr, int r, int8_t *panel)
{
    const __m256 st = _mm256_set1_ps(stf), rcp = _mm256_set1_ps(1.0f / stf);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    const bool half = dt != QL_F32;
    /* bf16: no quotient of two bf16 values lies near a bf16 midpoint (see
     * the AVX-512 prologue), so none is risky; fp16: the 2-ulp window */
    const __m256i bias = _mm256_set1_epi32(dt == QL_BF16 ? 0x8000 : 0x1002), low = _mm256_set1_epi32(dt == QL_BF16 ? 0xFFFF : 0x1FFF);
    const __m256i five = _mm256_set1_epi32(5);
    __m256i sum = _mm256_setzero_si256();
    for (int64_t h = 0; h < kp / 32; h++) {
        __m256 v[4];
        __m256i qi[4], risky = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_load_ps(scr + 32 * h + 8 * j);
            const __m256 q = _mm256_mul_ps(v[j], rcp);
            if (half) { /* RN to dt = (bits + half-ulp [+ 2]) with the dropped bits cleared, no tie possible */
                const __m256i w = _mm256_add_epi32(_mm256_castps_si256(q), bias);
                if (dt == QL_F16) risky = _mm256_or_si256(risky, _mm256_cmpgt_epi32(five, _mm256_and_si256(w, low)));
                qi[j] = _mm256_cvtps_epi32(_mm256_castsi256_ps(_mm256_andnot_si256(low, w)));
            } else {
                const __m256 d = _mm256_sub_ps(q, _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
                const __m256 ad = _mm256_and_ps(d, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
                risky = _mm256_or_si256(risky, _mm256_castps_si256(_mm256_cmp_ps(ad, _mm256_set1_ps(0.5f - 0x1p-14f), _CMP_GE_OQ)));
                qi[j] = _mm256_cvtps_epi32(q);
            }
        }
        if (QL_UNLIKELY(!_mm256_testz_si256(risky, risky))) codes32_exact(dt, v, st, qi);
        const __m256i codes = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        _mm256_store_si256((__m256i *)(panel + (h * mr + r) * 32), codes);
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, codes), ones16));
    }
    int32_t lanes[8], tot = 0;
    _mm256_storeu_si256((__m256i *)lanes, sum);
    for (int t = 0; t < 8; t++) tot += lanes[t];
    return tot;
}

static void zero_row32(int64_t kp, int mr, int r, int8_t *panel)
{
    for (int64_t h = 0; h < kp / 32; h++) _mm256_store_si256((__m256i *)(panel + (h * mr + r) * 32), _mm256_setzero_si256());
}

/* Rows of x -> packed A in 32-byte blocks (the AVX2 and AVX-VNNI kernels). */
void ql_prologue_avx2(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                      int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch)
{
    const int64_t kp = (k + 31) & ~(int64_t)31, k8 = k & ~(int64_t)7;
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    for (int64_t row = r0; row < r1; row++) {
        int8_t *panel = packed + (size_t)(row / mr * kp * mr);
        const int r = (int)(row % mr);
        if (row >= m) { zero_row32(kp, mr, r, panel); continue; }
        const void *src = ql_row_cptr(dt, x, row, ldx);
        uint32_t bits;
        if (group == 256) bits = rotate_row256(dt, src, k, scratch); /* k % 256 == 0: kp == k */
        else {
            for (int64_t i = 0; i < k8; i += 8) _mm256_store_ps(scratch + i, ql256_load(dt, src, i));
            for (int64_t i = k8; i < kp; i++) scratch[i] = i < k ? ql_load_f(dt, src, i) : 0.0f;
            if (group >= 16) {
                for (int64_t g0 = 0; g0 < k; g0 += group) fwht_group(scratch + g0, group);
            } else if (group == 4) {
                for (int64_t i = 0; i < kp; i += 8)
                    _mm256_store_ps(scratch + i, stage_s1(_mm256_mul_ps(_mm256_load_ps(scratch + i), _mm256_set1_ps(0.5f))));
            }
            /* rounded to dt; max |v| as the unsigned maximum of the bits of
             * |v|, where NaN and Inf exceed every finite value */
            __m256i amax = _mm256_setzero_si256();
            for (int64_t i = 0; i < kp; i += 8) {
                __m256 v = _mm256_load_ps(scratch + i);
                if (group > 0 && dt != QL_F32) {
                    v = ql256_round_to(dt, v);
                    _mm256_store_ps(scratch + i, v);
                }
                amax = _mm256_max_epu32(amax, _mm256_and_si256(_mm256_castps_si256(v), absmask));
            }
            uint32_t lanes[8];
            _mm256_storeu_si256((__m256i *)lanes, amax);
            bits = 0;
            for (int t = 0; t < 8; t++) bits = lanes[t] > bits ? lanes[t] : bits;
        }
        if (bits >= 0x7F800000u) { /* non-finite row: codes 0, scale NaN -> NaN output row */
            sx[row] = NAN;
            rowsum[row] = 0;
            zero_row32(kp, mr, r, panel);
            continue;
        }
        float a;
        memcpy(&a, &bits, 4);
        const float s = ql_scale_from_absmax(a);
        sx[row] = s;
        rowsum[row] = quantize_row_blocks(dt, scratch, kp, ql_scale_divisor(dt, s), mr, r, panel);
    }
}
