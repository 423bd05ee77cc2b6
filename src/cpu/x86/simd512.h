/* AVX-512 helpers shared by the AVX-512 prologue and epilogue: the FWHT's
 * in-register stages, dtype loads, stores and the exact round-to-dtype
 * (RNE, subnormals kept: no vcvtneps2bf16, which flushes subnormals).
 * Include only from files built with AVX-512 flags. */
#ifndef QL_SIMD512_H
#define QL_SIMD512_H

#include <immintrin.h>

#include "core/core.h"
#include "quant/gelu.h"

/* Radix-4 stages of the FWHT inside a register, on lanes at distance 1
 * (s1) and 4 (s4): on lanes (a, b, c, d), s = (a+b, b+a, c+d, d+c) and
 * d = (a-b, b-a, c-d, d-c); the outputs are s ± the pair's first
 * difference, (a+b)+(c-d), (a+b)-(c-d), (c+d)+(a-b), (c+d)-(a-b), exactly
 * the generic butterfly's operations: adding the second difference instead
 * (b+a)+(d-c) gives the same value but +0 where the butterfly gives -0
 * (a = b = -0, c = d). */
static inline __m512 ql512_fwht_s1(__m512 x)
{
    __m512 p = _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1));
    __m512 s = _mm512_add_ps(x, p), d = _mm512_sub_ps(x, p);
    __m512 q = _mm512_permute_ps(d, _MM_SHUFFLE(0, 0, 2, 2));
    return _mm512_mask_sub_ps(_mm512_add_ps(s, q), 0xAAAA, s, q);
}
static inline __m512 ql512_fwht_s4(__m512 x)
{
    __m512 p = _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1));
    __m512 s = _mm512_add_ps(x, p), d = _mm512_sub_ps(x, p);
    __m512 q = _mm512_shuffle_f32x4(d, d, _MM_SHUFFLE(0, 0, 2, 2));
    return _mm512_mask_sub_ps(_mm512_add_ps(s, q), 0xF0F0, s, q);
}

static inline __mmask16 ql512_mask(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

static inline __m512 ql512_load(ql_dtype dt, const void *p, int64_t i, __mmask16 m)
{
    switch (dt) {
    case QL_F32: return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    case QL_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    default:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    }
}

/* bf16 bit pattern (in the low 16 bits of each lane) of v, RNE, NaN quietened. */
static inline __m512i ql512_bf16_bits(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i qn = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_mov_epi32(r, nan, qn);
}

static inline __m512 ql512_round_to(ql_dtype dt, __m512 v)
{
    switch (dt) {
    case QL_F32: return v;
    case QL_F16: return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    default: return _mm512_castsi512_ps(_mm512_slli_epi32(ql512_bf16_bits(v), 16));
    }
}

/* bf16 rounding in one instruction where that is exact. vcvtneps2bf16
 * (AVX512-BF16, which not every AVX512-VNNI CPU has: callers pass
 * ql_cpu()->avx512bf16) treats denormal inputs as zero, and only denormal
 * inputs can round to a denormal bf16, so those lanes take the integer path.
 * Returns the rounded value as fp32 and, in *bits, the bf16 patterns. */
static inline __m512 ql512_bf16_round(__m512 v, bool has_bf16, __m256i *bits)
{
    __m256i b;
    if (has_bf16) {
        b = (__m256i)_mm512_cvtneps_pbh(v);
        __mmask16 den = _mm512_fpclass_ps_mask(v, 0x20); /* denormal */
        if (QL_UNLIKELY(den)) b = _mm256_mask_mov_epi16(b, den, _mm512_cvtepi32_epi16(ql512_bf16_bits(v)));
    } else b = _mm512_cvtepi32_epi16(ql512_bf16_bits(v));
    *bits = b;
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

static inline __m512 ql512_round_to_fast(ql_dtype dt, __m512 v, bool has_bf16)
{
    if (dt != QL_BF16) return ql512_round_to(dt, v);
    __m256i bits;
    return ql512_bf16_round(v, has_bf16, &bits);
}

static inline void ql512_store(ql_dtype dt, void *p, int64_t i, __m512 v, __mmask16 m)
{
    switch (dt) {
    case QL_F32: _mm512_mask_storeu_ps((float *)p + i, m, v); break;
    case QL_F16:
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    default: _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtepi32_epi16(ql512_bf16_bits(v))); break;
    }
}

/* Store values already representable in dt (no rounding needed). */
static inline void ql512_store_exact(ql_dtype dt, void *p, int64_t i, __m512 v, __mmask16 m)
{
    if (dt == QL_BF16)
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
    else ql512_store(dt, p, i, v, m);
}

/* ql_gelu_f32 (gelu.h) on 16 lanes, the same operations in the same order. */
static inline __m512 ql512_gelu(__m512 x)
{
#define QL512_FMA(p, v, c) _mm512_fmadd_ps(p, v, _mm512_set1_ps(c))
    const __m512 a = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(QL_GELU_XMAX));
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), QL512_FMA(a, _mm512_set1_ps(QL_GELU_C), 1.0f));
    const __m512 u = _mm512_sub_ps(t, _mm512_set1_ps(QL_GELU_T0));
    __m512 q = _mm512_set1_ps(QL_GELU_Q10);
    q = QL512_FMA(q, u, QL_GELU_Q9);
    q = QL512_FMA(q, u, QL_GELU_Q8);
    q = QL512_FMA(q, u, QL_GELU_Q7);
    q = QL512_FMA(q, u, QL_GELU_Q6);
    q = QL512_FMA(q, u, QL_GELU_Q5);
    q = QL512_FMA(q, u, QL_GELU_Q4);
    q = QL512_FMA(q, u, QL_GELU_Q3);
    q = QL512_FMA(q, u, QL_GELU_Q2);
    q = QL512_FMA(q, u, QL_GELU_Q1);
    q = QL512_FMA(q, u, QL_GELU_Q0);
    const __m512 hh = _mm512_mul_ps(a, a), half = _mm512_set1_ps(0.5f);
    const __m512 h = _mm512_mul_ps(half, hh), l = _mm512_mul_ps(half, _mm512_fmsub_ps(a, a, hh));
    const __m512 nh = _mm512_sub_ps(_mm512_setzero_ps(), h);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(nh, _mm512_set1_ps(QL_GELU_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-QL_GELU_LN2HI), nh);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-QL_GELU_LN2LO), r);
    r = _mm512_sub_ps(r, l);
    __m512 e = _mm512_set1_ps(QL_GELU_E4);
    e = QL512_FMA(e, r, QL_GELU_E3);
    e = QL512_FMA(e, r, QL_GELU_E2);
    e = QL512_FMA(e, r, QL_GELU_E1);
    e = QL512_FMA(e, r, QL_GELU_E0);
    e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(r, r), e, r), _mm512_set1_ps(1.0f));
    const __m512i ni = _mm512_cvtps_epi32(n), n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
    const __m512 p1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(126)), 23));
    const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
    const __m512 s1 = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(t, q), e), p1);
    const __m512 gneg = _mm512_mul_ps(_mm512_mul_ps(x, s1), s2);
    const __m512 gpos = _mm512_fnmadd_ps(x, _mm512_mul_ps(s1, s2), x);
    __m512 g = _mm512_mask_blend_ps(_mm512_movepi32_mask(_mm512_castps_si512(x)), gpos, gneg);
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, _mm512_set1_ps(QL_GELU_XMAX), _CMP_GT_OQ), x);
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-QL_GELU_XMAX), _CMP_LT_OQ), _mm512_set1_ps(-0.0f));
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ),
                           _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
    return _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
#undef QL512_FMA
}

#endif
