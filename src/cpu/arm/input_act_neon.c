/* The input activations on 4 fp32 lanes (input_act_body.h). vminnmq/vmaxnmq
 * return the number when one operand is NaN, as fminf/fmaxf do. */
#include "cpu/arm/arm.h"
#include "cpu/arm/neon.h"

#define QW 4
#define QV float32x4_t
#define QVI int32x4_t
#define QV_SET1 vdupq_n_f32
#define QV_ADD vaddq_f32
#define QV_MUL vmulq_f32
#define QV_DIV vdivq_f32
#define QV_FMA(a, b, c) vfmaq_f32(c, a, b)
#define QV_MIN vminnmq_f32
#define QV_MAX vmaxnmq_f32
#define QV_ABS vabsq_f32
#define QV_NEG vnegq_f32
#define QV_RINT vrndnq_f32
#define QV_CVT_I32 vcvtnq_s32_f32
#define QV_FROM_BITS vreinterpretq_f32_s32
#define QVI_SET1 vdupq_n_s32
#define QVI_ADD vaddq_s32
#define QVI_SUB vsubq_s32
#define QVI_SRAI vshrq_n_s32
#define QVI_SLLI vshlq_n_s32
#define QV_IF_NAN(x, v) vbslq_f32(vmvnq_u32(vceqq_f32(x, x)), x, v)
#define QV_SELECT_LT(a, b, lt, ge) vbslq_f32(vcltq_f32(a, b), lt, ge)
#define QV_COPYSIGN(v, x) vbslq_f32(vdupq_n_u32(0x80000000u), x, v)
#define QV_LOAD ql_neon_load
#define QV_STORE ql_neon_store
#define QV_ROUND_TO ql_neon_round_to
#define QV_STOREU_F32 vst1q_f32

#include "cpu/input_act_body.h"

void ql_input_act_row_neon(const ql_input_act_plan *p, const void *src, int64_t k, void *dst)
{
    qv_input_act_row(p, src, k, dst);
}
