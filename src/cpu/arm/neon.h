/* Advanced SIMD helpers shared by the AArch64 prologue, epilogues and float
 * kernels: dtype loads, stores and roundings, four fp32 lanes at a time,
 * each bit-identical to the scalar conversions of src/core/dtype.c for every
 * input (NaN included). They rely on the AArch64 defaults: FPCR round to
 * nearest even, no flush-to-zero (AArch64 SIMD honours FPCR, unlike ARMv7's
 * NEON, which always flushed subnormals), no default-NaN mode. */
#ifndef QL_ARM_NEON_H
#define QL_ARM_NEON_H

#include <arm_neon.h>

#include "core/core.h"
#include "quant/gelu.h"

/* fp32 -> bf16 bits in the high half (low half 0): RNE by an integer add,
 * which carries into the exponent exactly as rounding does (up to Inf); NaN
 * is quietened instead, as ql_fp32_to_bf16 does (the add could carry a NaN
 * with a full mantissa into the sign bit). */
static inline uint32x4_t ql_neon_bf16_hi(float32x4_t v)
{
    const uint32x4_t u = vreinterpretq_u32_f32(v);
    const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    const uint32x4_t rne = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), lsb);
    const uint32x4_t nan = vmvnq_u32(vceqq_f32(v, v));
    return vandq_u32(vbslq_u32(nan, vorrq_u32(u, vdupq_n_u32(0x400000)), rne), vdupq_n_u32(0xffff0000u));
}

/* The value v would have as a tensor of dtype dt (ql_round_to). FCVTN/FCVTL
 * round fp16 to nearest even with subnormals and quieten NaNs keeping the top
 * payload bits, which is what ql_fp32_to_fp16 / ql_fp16_to_fp32 do. */
static inline float32x4_t ql_neon_round_to(ql_dtype dt, float32x4_t v)
{
    if (dt == QL_F32) return v;
    if (dt == QL_F16) return vcvt_f32_f16(vcvt_f16_f32(v));
    return vreinterpretq_f32_u32(ql_neon_bf16_hi(v));
}

/* Four elements i .. i+3 of a dtype array, as fp32. */
static inline float32x4_t ql_neon_load(ql_dtype dt, const void *p, int64_t i)
{
    if (dt == QL_F32) return vld1q_f32((const float *)p + i);
    if (dt == QL_F16) return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p + i)));
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + i), 16));
}

/* Store four fp32 values rounded to dt (ql_store_f). */
static inline void ql_neon_store(ql_dtype dt, void *p, int64_t i, float32x4_t v)
{
    if (dt == QL_F32) vst1q_f32((float *)p + i, v);
    else if (dt == QL_F16) vst1_u16((uint16_t *)p + i, vreinterpret_u16_f16(vcvt_f16_f32(v)));
    else vst1_u16((uint16_t *)p + i, vshrn_n_u32(ql_neon_bf16_hi(v), 16));
}

/* ql_gelu_f32 (../linear/gelu.h) on 4 lanes, the same operations in the same order. */
static inline float32x4_t ql_neon_gelu(float32x4_t x)
{
#define QLN_FMA(p, v, c) vfmaq_f32(vdupq_n_f32(c), p, v)
    const float32x4_t a = vminnmq_f32(vabsq_f32(x), vdupq_n_f32(QL_GELU_XMAX));
    const float32x4_t t = vdivq_f32(vdupq_n_f32(1.0f), QLN_FMA(a, vdupq_n_f32(QL_GELU_C), 1.0f));
    const float32x4_t u = vsubq_f32(t, vdupq_n_f32(QL_GELU_T0));
    float32x4_t q = vdupq_n_f32(QL_GELU_Q10);
    q = QLN_FMA(q, u, QL_GELU_Q9);
    q = QLN_FMA(q, u, QL_GELU_Q8);
    q = QLN_FMA(q, u, QL_GELU_Q7);
    q = QLN_FMA(q, u, QL_GELU_Q6);
    q = QLN_FMA(q, u, QL_GELU_Q5);
    q = QLN_FMA(q, u, QL_GELU_Q4);
    q = QLN_FMA(q, u, QL_GELU_Q3);
    q = QLN_FMA(q, u, QL_GELU_Q2);
    q = QLN_FMA(q, u, QL_GELU_Q1);
    q = QLN_FMA(q, u, QL_GELU_Q0);
    const float32x4_t hh = vmulq_f32(a, a), half = vdupq_n_f32(0.5f);
    const float32x4_t h = vmulq_f32(half, hh), l = vmulq_f32(half, vfmaq_f32(vnegq_f32(hh), a, a));
    const float32x4_t nh = vnegq_f32(h);
    const float32x4_t n = vrndnq_f32(vmulq_f32(nh, vdupq_n_f32(QL_GELU_LOG2E)));
    float32x4_t r = vfmaq_f32(nh, n, vdupq_n_f32(-QL_GELU_LN2HI));
    r = vfmaq_f32(r, n, vdupq_n_f32(-QL_GELU_LN2LO));
    r = vsubq_f32(r, l);
    float32x4_t e = vdupq_n_f32(QL_GELU_E4);
    e = QLN_FMA(e, r, QL_GELU_E3);
    e = QLN_FMA(e, r, QL_GELU_E2);
    e = QLN_FMA(e, r, QL_GELU_E1);
    e = QLN_FMA(e, r, QL_GELU_E0);
    e = vaddq_f32(vfmaq_f32(r, vmulq_f32(r, r), e), vdupq_n_f32(1.0f));
    const int32x4_t ni = vcvtq_s32_f32(n), n1 = vshrq_n_s32(ni, 1), n2 = vsubq_s32(ni, n1);
    const float32x4_t p1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(126)), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
    const float32x4_t s1 = vmulq_f32(vmulq_f32(vmulq_f32(t, q), e), p1);
    const float32x4_t gneg = vmulq_f32(vmulq_f32(x, s1), s2);
    const float32x4_t gpos = vfmsq_f32(x, x, vmulq_f32(s1, s2));
    const uint32x4_t neg = vcltzq_s32(vreinterpretq_s32_f32(x));
    float32x4_t g = vbslq_f32(neg, gneg, gpos);
    g = vbslq_f32(vcgtq_f32(x, vdupq_n_f32(QL_GELU_XMAX)), x, g);
    g = vbslq_f32(vcltq_f32(x, vdupq_n_f32(-QL_GELU_XMAX)), vdupq_n_f32(-0.0f), g);
    g = vbslq_f32(vceqq_f32(x, vdupq_n_f32(-INFINITY)), vreinterpretq_f32_u32(vdupq_n_u32(0x7fc00000u)), g);
    return vbslq_f32(vceqq_f32(x, x), g, x);
#undef QLN_FMA
}

#endif
