/* Advanced SIMD helpers shared by the AArch64 prologue, epilogues and float
 * kernels: dtype loads, stores and roundings, four fp32 lanes at a time,
 * each bit-identical to the scalar conversions of src/core/dtype.c for every
 * input (NaN included). They rely on the AArch64 defaults: FPCR round to
 * nearest even, no flush-to-zero (AArch64 SIMD honours FPCR, unlike ARMv7's
 * NEON, which always flushed subnormals), no default-NaN mode. */
#ifndef QL_ARM_NEON_H
#define QL_ARM_NEON_H

#include <arm_neon.h>

#include "../core/core.h"

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

#endif
