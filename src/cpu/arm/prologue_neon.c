/* W8A8 prologue on Advanced SIMD (any ARMv8-A CPU): load a row (fp32, fp16 or
 * bf16), rotate it group-wise with the fast Walsh–Hadamard transform, round
 * it to its dtype, take the absmax, quantize, and write the codes straight
 * into the packed A panels of the kernel's layout (kb = 4: c4 panels of the
 * NEON and SDOT kernels; kb = 8: 8-k blocks of the SMMLA kernel).
 * Bit-identical to ql_prologue_generic: every value goes through the same
 * IEEE operations in the same order (the butterflies of ql_fwht_f32 lane by
 * lane; the quotient by an exact FDIV, which AArch64 has, so no reciprocal
 * argument is needed), and the roundings of neon.h. */
#include <math.h>

#include "cpu/arm/arm.h"
#include "cpu/generic/generic.h"
#include "quant/quant.h"
#include "cpu/arm/neon.h"

/* x -> fp32 row */
static void load_row(ql_dtype dt, const void *x, int64_t k, float *v)
{
    int64_t j = 0;
    for (; j + 4 <= k; j += 4) vst1q_f32(v + j, ql_neon_load(dt, x, j));
    for (; j < k; j++) v[j] = ql_load_f(dt, x, j);
}

/* ql_fwht_f32 on every group of the row, then the rounding to dt. */
static void rotate_row(ql_dtype dt, float *v, int64_t k, int64_t group)
{
    int p = 0;
    for (int64_t g = group; g > 1; g /= 4) p++;
    const float32x4_t norm = vdupq_n_f32(1.0f / (float)(1 << p)); /* 2^-p, exact */
    /* stride 1: the butterflies of 4 aligned quadruples at once, transposed
     * by LD4/ST4 (lane l of val[t] is element t of quadruple l) */
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        float32x4x4_t x = vld4q_f32(v + i);
        const float32x4_t a = vmulq_f32(x.val[0], norm), b = vmulq_f32(x.val[1], norm);
        const float32x4_t c = vmulq_f32(x.val[2], norm), d = vmulq_f32(x.val[3], norm);
        const float32x4_t t0 = vaddq_f32(a, b), t1 = vaddq_f32(c, d), t2 = vsubq_f32(a, b), t3 = vsubq_f32(c, d);
        x.val[0] = vaddq_f32(t0, t3);
        x.val[1] = vsubq_f32(t0, t3);
        x.val[2] = vaddq_f32(t1, t2);
        x.val[3] = vsubq_f32(t1, t2);
        vst4q_f32(v + i, x);
    }
    const float n1 = 1.0f / (float)(1 << p);
    for (; i < k; i += 4) { /* k is a multiple of 4 (of the group) */
        const float a = v[i] * n1, b = v[i + 1] * n1, c = v[i + 2] * n1, d = v[i + 3] * n1;
        const float t0 = a + b, t1 = c + d, t2 = a - b, t3 = c - d;
        v[i] = t0 + t3;
        v[i + 1] = t0 - t3;
        v[i + 2] = t1 + t2;
        v[i + 3] = t1 - t2;
    }
    /* strides 4, 16, ...: four butterflies j .. j+3 side by side */
    for (int64_t g0 = 0; g0 < k; g0 += group)
        for (int64_t s = 4; s < group; s *= 4)
            for (int64_t base = g0; base < g0 + group; base += 4 * s)
                for (int64_t j = base; j < base + s; j += 4) {
                    const float32x4_t a = vld1q_f32(v + j), b = vld1q_f32(v + j + s);
                    const float32x4_t c = vld1q_f32(v + j + 2 * s), d = vld1q_f32(v + j + 3 * s);
                    const float32x4_t t0 = vaddq_f32(a, b), t1 = vaddq_f32(c, d), t2 = vsubq_f32(a, b), t3 = vsubq_f32(c, d);
                    vst1q_f32(v + j, vaddq_f32(t0, t3));
                    vst1q_f32(v + j + s, vsubq_f32(t0, t3));
                    vst1q_f32(v + j + 2 * s, vaddq_f32(t1, t2));
                    vst1q_f32(v + j + 3 * s, vsubq_f32(t1, t2));
                }
    if (dt == QL_F32) return;
    for (i = 0; i + 4 <= k; i += 4) vst1q_f32(v + i, ql_neon_round_to(dt, vld1q_f32(v + i)));
    for (; i < k; i++) v[i] = ql_round_to(dt, v[i]);
}

/* max |v| with NaN propagated (FMAX/FMAXV return NaN if any input is NaN) */
static float absmax(const float *v, int64_t k)
{
    float32x4_t m0 = vdupq_n_f32(0.0f), m1 = m0;
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        m0 = vmaxq_f32(m0, vabsq_f32(vld1q_f32(v + j)));
        m1 = vmaxq_f32(m1, vabsq_f32(vld1q_f32(v + j + 4)));
    }
    float a = vmaxvq_f32(vmaxq_f32(m0, m1));
    for (; j < k; j++) {
        const float m = fabsf(v[j]);
        a = (m > a || m != m) ? m : a;
    }
    return a;
}

/* 16 codes: rne(round_to(dt, v / st)) with the clamp to [-128, 127] done by
 * the saturating narrows (the values are integral by then). */
static inline int8x16_t quant16(ql_dtype dt, const float *v, float32x4_t st)
{
    int16x8_t h[2];
    for (int u = 0; u < 2; u++) {
        int32x4_t w[2];
        for (int t = 0; t < 2; t++) {
            const float32x4_t y = ql_neon_round_to(dt, vdivq_f32(vld1q_f32(v + 8 * u + 4 * t), st));
            w[t] = vcvtq_s32_f32(vrndnq_f32(y));
        }
        h[u] = vcombine_s16(vqmovn_s32(w[0]), vqmovn_s32(w[1]));
    }
    return vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1]));
}

static void prologue(int kb, ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                     int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *v)
{
    const int64_t kp = (k + kb - 1) / kb * kb, k16 = k & ~(int64_t)15;
    for (int64_t row = r0; row < r1; row++) {
        int8_t *panel = packed + (size_t)(row / mr * kp * mr);
        const int r = (int)(row % mr);
        int64_t pos = 0;
        if (row < m) {
            load_row(dt, ql_row_cptr(dt, x, row, ldx), k, v);
            if (group > 0) rotate_row(dt, v, k, group);
            const float a = absmax(v, k);
            if (!(a <= 3.402823466e38f)) { /* NaN or Inf: codes 0, scale NaN (ql_quantize_row_f32) */
                sx[row] = NAN;
                rowsum[row] = 0;
            } else {
                const float s = ql_scale_from_absmax(a), st = ql_scale_divisor(dt, s);
                const float32x4_t stv = vdupq_n_f32(st);
                int32x4_t sum = vdupq_n_s32(0);
                for (; pos < k16; pos += 16) {
                    const int8x16_t q = quant16(dt, v + pos, stv);
                    sum = vpadalq_s16(sum, vpaddlq_s8(q));
                    if (kb == 4) {
                        int8_t *d = panel + (size_t)(((pos / 4) * mr + r) * 4);
                        const int32x4_t q32 = vreinterpretq_s32_s8(q);
                        vst1q_lane_s32((int32_t *)d, q32, 0);
                        vst1q_lane_s32((int32_t *)(d + 4 * mr), q32, 1);
                        vst1q_lane_s32((int32_t *)(d + 8 * mr), q32, 2);
                        vst1q_lane_s32((int32_t *)(d + 12 * mr), q32, 3);
                    } else {
                        int8_t *d = panel + (size_t)(((pos / 8) * mr + r) * 8);
                        vst1_s8(d, vget_low_s8(q));
                        vst1_s8(d + 8 * mr, vget_high_s8(q));
                    }
                }
                int32_t s32 = vaddvq_s32(sum);
                for (; pos < k; pos++) {
                    const int8_t q = ql_quantize_value(dt, v[pos], st);
                    panel[ql_a_offset(kb, mr, r, pos)] = q;
                    s32 += q;
                }
                sx[row] = s;
                rowsum[row] = s32;
            }
        }
        for (; pos < kp; pos++) panel[ql_a_offset(kb, mr, r, pos)] = 0; /* padding, rows >= m, non-finite rows */
    }
}

void ql_prologue_neon(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr, int64_t r0,
                      int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch)
{
    prologue(4, dt, x, ldx, m, k, group, mr, r0, r1, packed, sx, rowsum, scratch);
}

void ql_prologue_neon_k8(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                         int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch)
{
    prologue(8, dt, x, ldx, m, k, group, mr, r0, r1, packed, sx, rowsum, scratch);
}
