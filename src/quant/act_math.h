/* exp and tanh for the input activations (swiglu's silu, gelu_tanh), in
 * fp32 from operations every ISA has, so the vector kernels (AVX-512 here,
 * CUDA's prologue) repeat them in the same order and match these scalar
 * twins bit for bit. libm's expf and tanhf cannot be vectorized that way:
 * each ISA's vector math library rounds differently.
 *
 * Both rest on e^r - 1 for |r| <= ln2/2 (plus rounding slack):
 *   em(r) = r + r²·P(r),  P the Taylor polynomial 1/2! + r/3! + ... + r^6/8!
 * (truncation below 2^-30 relative). Range reduction (Cody–Waite, ln2 in
 * two parts, exact products by fma): x = n·ln2 + r, n = rint(x·log2e).
 *   exp(x)  = (1 + em(r))·2^n, 2^n applied in two steps so results in the
 *             subnormals are rounded once; x clamped to [-104, 89] first
 *             (0 and +Inf beyond), NaN returned as it is.
 *   tanh(x) = x + x³·Q(x²) for |x| < 0.55 (Q a degree-5 polynomial fitted
 *             to (tanh(x) - x)/x³ in float64), else E/(E + 2) with
 *             E = e^(2|x|) - 1 = 2^n·em(r) + (2^n - 1) (one fma) and the sign
 *             of x put back; |x| is clamped to 10 (tanh = 1 in fp32 from
 *             9.01 on), NaN returned as it is. No cancellation anywhere.
 * Accuracy against float64 is checked in tests/test_input_act.c. */
#ifndef QL_ACT_MATH_H
#define QL_ACT_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define QL_ACT_BETA 0.7978845608028654f /* gelu_tanh's √(2/π) and κ, as PyTorch's fp32 constants */
#define QL_ACT_KAPPA 0.044715f
#define QL_ACT_LOG2E 0x1.715476p+0f
#define QL_ACT_LN2HI 0x1.62e430p-1f /* ln2 = LN2HI + LN2LO; n·LN2HI is exact for |n| < 2^12 */
#define QL_ACT_LN2LO -0x1.05c610p-29f
#define QL_ACT_P0 0x1p-1f /* 1/2! */
#define QL_ACT_P1 0x1.555556p-3f
#define QL_ACT_P2 0x1.555556p-5f
#define QL_ACT_P3 0x1.111112p-7f
#define QL_ACT_P4 0x1.6c16c2p-10f
#define QL_ACT_P5 0x1.a01a02p-13f
#define QL_ACT_P6 0x1.a01a02p-16f /* 1/8! */
#define QL_ACT_EXP_LO -104.0f     /* e^-104 < half the smallest subnormal: 0 */
#define QL_ACT_EXP_HI 89.0f       /* e^89 > FLT_MAX: +Inf */
#define QL_ACT_TANH_MAX 10.0f
#define QL_ACT_TANH_SMALL 0.55f /* below: x + x³·Q(x²), Q fitted (degree 5, 1e-10 relative) */
#define QL_ACT_Q0 -0x1.555556p-2f
#define QL_ACT_Q1 0x1.111106p-3f
#define QL_ACT_Q2 -0x1.ba1446p-5f
#define QL_ACT_Q3 0x1.657ae8p-6f
#define QL_ACT_Q4 -0x1.1770eep-7f
#define QL_ACT_Q5 0x1.4b67b4p-9f

#ifdef __CUDACC__
#define QL_ACT_HD __host__ __device__
#else
#define QL_ACT_HD
#endif
#ifdef __CUDA_ARCH__ /* nvcc's device pass contracts a product into a following add unless told not to */
#define QL_ACT_MUL(a, b) __fmul_rn(a, b)
#define QL_ACT_ADD(a, b) __fadd_rn(a, b)
#define QL_ACT_DIV(a, b) __fdiv_rn(a, b)
#else
#define QL_ACT_MUL(a, b) ((a) * (b))
#define QL_ACT_ADD(a, b) ((a) + (b))
#define QL_ACT_DIV(a, b) ((a) / (b))
#endif

static inline QL_ACT_HD float ql_act_pow2i(int32_t n) /* 2^n, -126 <= n <= 127 */
{
    const uint32_t u = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* e^r - 1 for |r| <= ~0.35 */
static inline QL_ACT_HD float ql_act_em(float r)
{
    float p = QL_ACT_P6;
    p = fmaf(p, r, QL_ACT_P5);
    p = fmaf(p, r, QL_ACT_P4);
    p = fmaf(p, r, QL_ACT_P3);
    p = fmaf(p, r, QL_ACT_P2);
    p = fmaf(p, r, QL_ACT_P1);
    p = fmaf(p, r, QL_ACT_P0);
    return fmaf(QL_ACT_MUL(r, r), p, r);
}

/* x = n·ln2 + r: returns r, n in *n (as a float: an integer) */
static inline QL_ACT_HD float ql_act_reduce(float x, float *n)
{
    const float k = rintf(QL_ACT_MUL(x, QL_ACT_LOG2E));
    *n = k;
    return fmaf(k, -QL_ACT_LN2LO, fmaf(k, -QL_ACT_LN2HI, x));
}

static inline QL_ACT_HD float ql_act_exp(float x)
{
    const float xc = fminf(fmaxf(x, QL_ACT_EXP_LO), QL_ACT_EXP_HI); /* NaN -> a bound (fmaxf), replaced below */
    float n;
    const float r = ql_act_reduce(xc, &n);
    const float p = QL_ACT_ADD(ql_act_em(r), 1.0f);
    const int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1; /* n in [-150, 129]: both halves in range */
    const float e = QL_ACT_MUL(QL_ACT_MUL(p, ql_act_pow2i(n1)), ql_act_pow2i(n2));
    return isnan(x) ? x : e;
}

static inline QL_ACT_HD float ql_act_tanh(float x)
{
    const float a = fminf(fabsf(x), QL_ACT_TANH_MAX); /* NaN -> 10 (fminf), replaced below */
    float n;
    const float r = ql_act_reduce(QL_ACT_ADD(a, a), &n); /* n in [0, 29] */
    const float s = ql_act_pow2i((int32_t)n);
    const float e = fmaf(s, ql_act_em(r), QL_ACT_ADD(s, -1.0f)); /* e^(2a) - 1 */
    const float t = QL_ACT_DIV(e, QL_ACT_ADD(e, 2.0f));
    const float x2 = QL_ACT_MUL(x, x);
    float q = QL_ACT_Q5;
    q = fmaf(q, x2, QL_ACT_Q4);
    q = fmaf(q, x2, QL_ACT_Q3);
    q = fmaf(q, x2, QL_ACT_Q2);
    q = fmaf(q, x2, QL_ACT_Q1);
    q = fmaf(q, x2, QL_ACT_Q0);
    const float small = fmaf(QL_ACT_MUL(x, x2), q, x);
    return isnan(x) ? x : copysignf(a < QL_ACT_TANH_SMALL ? small : t, x);
}

/* F.gelu(x, approximate="tanh") in fp32, PyTorch's order: c = (x·x)·x,
 * inner = β·(x + κ·c), then (0.5·x)·(1 + tanh(inner)). */
static inline QL_ACT_HD float ql_act_gelu_tanh(float x)
{
    const float cube = QL_ACT_MUL(QL_ACT_MUL(x, x), x);
    const float inner = QL_ACT_MUL(QL_ACT_BETA, QL_ACT_ADD(x, QL_ACT_MUL(QL_ACT_KAPPA, cube)));
    return QL_ACT_MUL(QL_ACT_MUL(0.5f, x), QL_ACT_ADD(1.0f, ql_act_tanh(inner)));
}

/* silu(g) = g / (1 + e^-g) in fp32 (swiglu rounds it to x's dtype, then multiplies by up) */
static inline QL_ACT_HD float ql_act_silu(float g) { return QL_ACT_DIV(g, QL_ACT_ADD(1.0f, ql_act_exp(-g))); }

#endif
