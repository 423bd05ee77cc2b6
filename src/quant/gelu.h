/* GELU (torch.nn.GELU(), the exact erf form): gelu(x) = x·Φ(x), Φ the
 * normal CDF. Computed in fp32 from the tail T = Φ(-|x|) = erfc(z)/2,
 * z = |x|/√2, which has no cancellation anywhere:
 *   T = t·exp(-x²/2)·Q(t)/2,  t = 1/(1 + z/2) = 1/(1 + |x|/(2√2)),
 * Q a degree-10 polynomial fitted to erfc(z)·exp(z²)/t on z in [0, 15/√2]
 * (fit error 4e-9 relative). x²/2 is split into hi + lo with an fma, so the
 * large exponent (up to 112.5) loses nothing, and exp is 2^n·e^r with
 * |r| <= ln2/2 (Cody–Waite reduction, degree-6 polynomial). 2^n is applied
 * in two exact-then-once-rounded steps so tiny results come out as correctly
 * placed subnormals. Then gelu = x·T for x < 0 (or -0) and x - x·T (one fma)
 * for x >= 0. |x| > 15: x for x > 0 (T < 2^-167), -0 for finite x < 0; -Inf
 * gives NaN and NaN stays the same NaN, as torch (x·0.5·(1 + erf)) does.
 * Every ISA (AVX-512, AVX2, NEON) repeats exactly these operations in this
 * order, so they match this scalar twin bit for bit; accuracy against
 * float64 is measured in tests/test_gelu.c. */
#ifndef QL_GELU_H
#define QL_GELU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "act_math.h"

#define QL_GELU_XMAX 15.0f
#define QL_GELU_C 0x1.6a09e6p-2f /* 1/(2√2) */
#define QL_GELU_LOG2E QL_ACT_LOG2E /* the input activations' exp reduction constants */
#define QL_GELU_LN2HI QL_ACT_LN2HI
#define QL_GELU_LN2LO QL_ACT_LN2LO
/* Q(t) = Σ q_i u^i, i = 0..10 (fp32 coefficients fitted one by one) */
#define QL_GELU_T0 0x1.28p-1f /* Q is evaluated in u = t - T0, |u| <= 0.43 */
#define QL_GELU_Q0 0x1.22ca5cp-1f
#define QL_GELU_Q1 0x1.8dbb3cp-1f
#define QL_GELU_Q2 0x1.2c38acp-1f
#define QL_GELU_Q3 0x1.62fa66p-4f
#define QL_GELU_Q4 -0x1.9f6998p-3f
#define QL_GELU_Q5 -0x1.b075b6p-5f
#define QL_GELU_Q6 0x1.d1f7b4p-4f
#define QL_GELU_Q7 0x1.1fe94p-8f
#define QL_GELU_Q8 -0x1.2e6536p-4f
#define QL_GELU_Q9 0x1.24c7b4p-6f
#define QL_GELU_Q10 0x1.1e3adep-5f
/* e^r = 1 + (r + r²·E(r)), E(r) = Σ e_i r^i, i = 0..4 */
#define QL_GELU_E0 0x1.fffffcp-2f
#define QL_GELU_E1 0x1.555492p-3f
#define QL_GELU_E2 0x1.5558f2p-5f
#define QL_GELU_E3 0x1.1239e4p-7f
#define QL_GELU_E4 0x1.6a2424p-10f

#ifdef __CUDACC__
#define QL_GELU_HD __host__ __device__
#else
#define QL_GELU_HD
#endif

/* (Also compiled for CUDA devices: no operation here may be contracted or
 * reordered, and nvcc's device defaults — IEEE division, no fast math —
 * keep each one as written.) */
static inline QL_GELU_HD float ql_gelu_f32(float x)
{
    const float a = fminf(fabsf(x), QL_GELU_XMAX); /* NaN -> 15 (fminf), replaced at the end */
    const float t = 1.0f / fmaf(a, QL_GELU_C, 1.0f), u = t - QL_GELU_T0;
    float q = QL_GELU_Q10;
    q = fmaf(q, u, QL_GELU_Q9);
    q = fmaf(q, u, QL_GELU_Q8);
    q = fmaf(q, u, QL_GELU_Q7);
    q = fmaf(q, u, QL_GELU_Q6);
    q = fmaf(q, u, QL_GELU_Q5);
    q = fmaf(q, u, QL_GELU_Q4);
    q = fmaf(q, u, QL_GELU_Q3);
    q = fmaf(q, u, QL_GELU_Q2);
    q = fmaf(q, u, QL_GELU_Q1);
    q = fmaf(q, u, QL_GELU_Q0);
    const float hh = a * a, h = 0.5f * hh, l = 0.5f * fmaf(a, a, -hh); /* a²/2 = h + l */
    const float n = rintf(-h * QL_GELU_LOG2E);
    float r = fmaf(n, -QL_GELU_LN2HI, -h);
    r = fmaf(n, -QL_GELU_LN2LO, r);
    r = r - l;
    float e = QL_GELU_E4;
    e = fmaf(e, r, QL_GELU_E3);
    e = fmaf(e, r, QL_GELU_E2);
    e = fmaf(e, r, QL_GELU_E1);
    e = fmaf(e, r, QL_GELU_E0);
    e = fmaf(r * r, e, r) + 1.0f;
    const int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1; /* n in [-163, 0] */
    const float s1 = (t * q) * e * ql_act_pow2i(n1 - 1), s2 = ql_act_pow2i(n2); /* T = s1·s2 */
    float g = signbit(x) ? (x * s1) * s2 : fmaf(-x, s1 * s2, x);
    if (x > QL_GELU_XMAX) g = x;
    if (x < -QL_GELU_XMAX) g = x == -INFINITY ? NAN : -0.0f;
    return isnan(x) ? x : g;
}


/* round_bf16(ql_gelu_f32(x)) for a bf16 x, by its bits h: the bf16
 * epilogues' GELU (their y is a bf16 value before the activation). Of the
 * 65 536 inputs only 2^-12 <= |x| < 16 need the function; those results are
 * looked up in lut (QL_GELU_LUT_SIZE entries, filled by
 * ql_gelu_bf16_lut_fill from ql_gelu_f32 itself: 8 KB). Below 2^-12 GELU's
 * x²/√(2π) term is under a quarter of bf16's half-ulp of x/2 and the result
 * is x/2 rounded to nearest even (exact but in the subnormals); from 16 on it
 * is x (x > 0) or -0 (-Inf: NaN), as ql_gelu_f32's cut-off. All 65 536
 * inputs are checked against the function in tests/test_gelu.c. */
#define QL_GELU_LUT_LO (115u << 7) /* |x|'s bits at 2^-12 */
#define QL_GELU_LUT_HI (131u << 7) /* at 16 */
#define QL_GELU_LUT_SIZE (2 * (QL_GELU_LUT_HI - QL_GELU_LUT_LO)) /* positive, then negative x */
/* The inputs outside the table: |x| >= 16 gives x (x > 0, +Inf), -0
 * (finite x < 0) or NaN (-Inf), NaN stays NaN (quieted as the rounding
 * does); |x| < 2^-12 gives x/2, one exponent step down, or in units of
 * 2^-133 (|x| itself below 2^-125) halved, ties to even. */
static inline QL_GELU_HD uint16_t ql_gelu_bf16_outside(uint16_t h)
{
    const uint32_t a = h & 0x7fffu, s = h & 0x8000u;
    if (a >= QL_GELU_LUT_HI) return (uint16_t)(a > 0x7f80u ? (h | 0x40u) : !s ? h : a == 0x7f80u ? 0x7fc0u : 0x8000u);
    return (uint16_t)(s | (a >= 0x100u ? a - 0x80u : (a >> 1) + (a & (a >> 1) & 1u)));
}
/* The table is read unconditionally, at a clamped index, and the rare
 * inputs outside it are fixed after: in a GPU epilogue the reads of many
 * outputs are then independent and in flight together. */
static inline QL_GELU_HD uint32_t ql_gelu_bf16_index(uint16_t h)
{
    const uint32_t span = QL_GELU_LUT_HI - QL_GELU_LUT_LO, off = (h & 0x7fffu) - QL_GELU_LUT_LO; /* wraps below LO */
    return (uint32_t)(h >> 15) * span + (off < span ? off : span - 1);
}
static inline QL_GELU_HD uint16_t ql_gelu_bf16_fix(uint16_t h, uint16_t t) /* t: lut[ql_gelu_bf16_index(h)] */
{
    return (uint32_t)(h & 0x7fffu) - QL_GELU_LUT_LO < QL_GELU_LUT_HI - QL_GELU_LUT_LO ? t : ql_gelu_bf16_outside(h);
}
static inline QL_GELU_HD uint16_t ql_gelu_bf16_bits(uint16_t h, const uint16_t *lut)
{
    return ql_gelu_bf16_fix(h, lut[ql_gelu_bf16_index(h)]);
}

#endif
