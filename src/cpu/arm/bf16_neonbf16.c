/* bf16 micro-kernel (FEAT_BF16, ARMv8.6), 8×8: BFMMLA multiplies a 2×4 bf16
 * block of A by a 4×2 block of B into a 2×2 fp32 tile, 16 multiply-adds per
 * instruction against FMLA's 4. 16 accumulators (row pair × column pair);
 * per 4 k: eight 4-k loads of A (fp32 rows holding bf16 values: UZP2 keeps
 * their top halves, two rows per 2×4 block, exactly), four 16-byte loads of
 * B (packed [K/4][8][4], a column pair per load) and 16 BFMMLAs.
 * Numerics: products exact, sums with BFMMLA's own rounding (round to odd,
 * denormals flushed, when FPCR.EBF = 0), so not the FMLA kernel's bits; the
 * twin bf16_gemm_8x8c4__generic models them bit for bit, and docs/NUMERICS.md's
 * numerics contract gives the float64 bound. */
#include "cpu/arm/arm.h"
#include "cpu/arm/neon.h"

static inline bfloat16x8_t a_block(const float *r0, const float *r1)
{
    return vreinterpretq_bf16_u16(vuzp2q_u16(vreinterpretq_u16_f32(vld1q_f32(r0)), vreinterpretq_u16_f32(vld1q_f32(r1))));
}

static void tile_8x8c4_neonbf16(int64_t k, const float *a, int64_t lda, const float *bv, float *c, int accumulate)
{
    const bfloat16_t *b = (const bfloat16_t *)bv;
    /* acc[i][j]: rows 2i, 2i+1 × columns 2j, 2j+1 as {c(2i,2j), c(2i,2j+1), c(2i+1,2j), c(2i+1,2j+1)} */
    float32x4_t acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            acc[i][j] = accumulate ? vcombine_f32(vld1_f32(c + 16 * i + 2 * j), vld1_f32(c + 16 * i + 8 + 2 * j))
                                   : vdupq_n_f32(0.0f);
    int64_t p = 0;
    for (; p + 4 <= k; p += 4, b += 32) {
        bfloat16x8_t ab[4];
        for (int i = 0; i < 4; i++) ab[i] = a_block(a + 2 * i * lda + p, a + (2 * i + 1) * lda + p);
        for (int j = 0; j < 4; j++) {
            const bfloat16x8_t bb = vld1q_bf16(b + 8 * j);
            for (int i = 0; i < 4; i++) acc[i][j] = vbfmmlaq_f32(acc[i][j], ab[i], bb);
        }
    }
    if (p < k) { /* the last 1-3 k: A zero-filled (B is zero-padded by the packing) */
        float t[8][4] = {{0}};
        for (int r = 0; r < 8; r++)
            for (int q = 0; p + q < k; q++) t[r][q] = a[r * lda + p + q];
        bfloat16x8_t ab[4];
        for (int i = 0; i < 4; i++) ab[i] = a_block(t[2 * i], t[2 * i + 1]);
        for (int j = 0; j < 4; j++) {
            const bfloat16x8_t bb = vld1q_bf16(b + 8 * j);
            for (int i = 0; i < 4; i++) acc[i][j] = vbfmmlaq_f32(acc[i][j], ab[i], bb);
        }
    }
    for (int i = 0; i < 4; i++) /* the 64-bit halves hold row 2i, then row 2i+1 */
        for (int j = 0; j < 4; j += 2) {
            const float64x2_t lo = vreinterpretq_f64_f32(acc[i][j]), hi = vreinterpretq_f64_f32(acc[i][j + 1]);
            vst1q_f32(c + 16 * i + 2 * j, vreinterpretq_f32_f64(vzip1q_f64(lo, hi)));
            vst1q_f32(c + 16 * i + 8 + 2 * j, vreinterpretq_f32_f64(vzip2q_f64(lo, hi)));
        }
}

/* no small-M variant: small M runs the tile driver */
const ql_f32_kernel ql_bf16_gemm_8x8c4__neonbf16 = {QL_ISA_NEONBF16, "bf16_gemm_8x8c4__neonbf16", 8, 8, tile_8x8c4_neonbf16, NULL, NULL, 0,
                                                    NULL, 0, 4, 0, NULL, 0, 0, NULL};
