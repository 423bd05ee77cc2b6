/* Advanced SIMD fp32 micro-kernel (any ARMv8-A CPU), 8×8: 16 accumulators;
 * per 4 k, eight 4-k loads of A (one per row), eight 8-column loads of B and
 * 64 FMLAs by element. The float driver packs B as [K][8]; bf16 and int8
 * weight slices are decoded to fp32 per K slice (decode below). */
#include "cpu/arm/arm.h"
#include "cpu/arm/neon.h"

static void tile_8x8_neon(int64_t k, const float *a, int64_t lda, const float *b, float *c, int accumulate)
{
#define QL_DECL(r)                                                                \
    float32x4_t c##r##0 = accumulate ? vld1q_f32(c + 8 * (r)) : vdupq_n_f32(0.0f), \
                c##r##1 = accumulate ? vld1q_f32(c + 8 * (r) + 4) : vdupq_n_f32(0.0f);
    QL_DECL(0) QL_DECL(1) QL_DECL(2) QL_DECL(3) QL_DECL(4) QL_DECL(5) QL_DECL(6) QL_DECL(7)
#undef QL_DECL
    int64_t p = 0;
    for (; p + 4 <= k; p += 4, b += 32) {
        const float32x4_t a0 = vld1q_f32(a + p), a1 = vld1q_f32(a + lda + p), a2 = vld1q_f32(a + 2 * lda + p),
                          a3 = vld1q_f32(a + 3 * lda + p), a4 = vld1q_f32(a + 4 * lda + p), a5 = vld1q_f32(a + 5 * lda + p),
                          a6 = vld1q_f32(a + 6 * lda + p), a7 = vld1q_f32(a + 7 * lda + p);
#define QL_ROW(r, t)                                          \
    c##r##0 = vfmaq_laneq_f32(c##r##0, b0, a##r, t);          \
    c##r##1 = vfmaq_laneq_f32(c##r##1, b1, a##r, t);
#define QL_STEP(t)                                                                          \
    {                                                                                       \
        const float32x4_t b0 = vld1q_f32(b + 8 * (t)), b1 = vld1q_f32(b + 8 * (t) + 4);     \
        QL_ROW(0, t) QL_ROW(1, t) QL_ROW(2, t) QL_ROW(3, t) QL_ROW(4, t) QL_ROW(5, t) QL_ROW(6, t) QL_ROW(7, t) \
    }
        QL_STEP(0) QL_STEP(1) QL_STEP(2) QL_STEP(3)
#undef QL_STEP
#undef QL_ROW
    }
    for (; p < k; p++, b += 8) {
        const float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4);
#define QL_ROW(r)                                                \
    c##r##0 = vfmaq_n_f32(c##r##0, b0, a[(r) * lda + p]);        \
    c##r##1 = vfmaq_n_f32(c##r##1, b1, a[(r) * lda + p]);
        QL_ROW(0) QL_ROW(1) QL_ROW(2) QL_ROW(3) QL_ROW(4) QL_ROW(5) QL_ROW(6) QL_ROW(7)
#undef QL_ROW
    }
#define QL_STORE(r) vst1q_f32(c + 8 * (r), c##r##0); vst1q_f32(c + 8 * (r) + 4, c##r##1);
    QL_STORE(0) QL_STORE(1) QL_STORE(2) QL_STORE(3) QL_STORE(4) QL_STORE(5) QL_STORE(6) QL_STORE(7)
#undef QL_STORE
}

/* bf16 / int8 -> fp32; n is a multiple of 8 (whole slices of 8-column panels). */
static void decode_neon(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    if (dt == QL_I8) {
        const int8_t *s = src;
        for (int64_t i = 0; i < n; i += 8) {
            const int16x8_t h = vmovl_s8(vld1_s8(s + i));
            vst1q_f32(dst + i, vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))));
            vst1q_f32(dst + i + 4, vcvtq_f32_s32(vmovl_high_s16(h)));
        }
    } else {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i += 4) vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(s + i), 16)));
    }
}

/* no small-M (GEMV) variant yet: small M runs the tile driver */
const ql_f32_kernel ql_f32_gemm_8x8__neon = {QL_ISA_NEON, "f32_gemm_8x8__neon", 8, 8, tile_8x8_neon, decode_neon, NULL, 0, NULL, 0, 0, 0, NULL, 0, 0, NULL};
