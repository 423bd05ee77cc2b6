/* Int8 matrix-multiply micro-kernel (ARMv8.6 FEAT_I8MM: Apple M2+, Neoverse
 * V1/N2/V2, Graviton3), 8×12 tile. SMMLA multiplies a 2×8 block of A by an
 * 8×2 block of B into a 2×2 int32 block (32 MACs), so both operands are
 * packed in 8-k blocks (kb = 8, gemm.h): A as [K/8][8 rows][8] (rows r, r+1
 * adjacent: one 16-byte load is a 2×8 block), B as [K/8][12 columns][8]
 * (columns j, j+1 adjacent). 24 accumulators of 2×2 outputs; per 8-k step
 * four A loads, six B loads and 24 SMMLAs (768 MACs). */
#include <arm_neon.h>

#include "cpu/arm/arm.h"

/* 2×2 blocks (r, r+1) × (j, j+1) of two row vectors and back. */
static inline int32x4_t zip_lo(int32x4_t x, int32x4_t y)
{
    return vreinterpretq_s32_s64(vzip1q_s64(vreinterpretq_s64_s32(x), vreinterpretq_s64_s32(y)));
}
static inline int32x4_t zip_hi(int32x4_t x, int32x4_t y)
{
    return vreinterpretq_s32_s64(vzip2q_s64(vreinterpretq_s64_s32(x), vreinterpretq_s64_s32(y)));
}

static void tile_8x12c8_i8mm(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
    int32x4_t acc[4][6]; /* row pair p, column pair j: (c[2p][2j], c[2p][2j+1], c[2p+1][2j], c[2p+1][2j+1]) */
    for (int p = 0; p < 4; p++)
        for (int j = 0; j < 6; j += 2) {
            if (accumulate) {
                const int32x4_t r0 = vld1q_s32(c + 12 * (2 * p) + 2 * j), r1 = vld1q_s32(c + 12 * (2 * p + 1) + 2 * j);
                acc[p][j] = zip_lo(r0, r1);
                acc[p][j + 1] = zip_hi(r0, r1);
            } else acc[p][j] = acc[p][j + 1] = vdupq_n_s32(0);
        }
    /* 24 accumulators + 4 A blocks leave 4 registers: B is streamed one
     * column pair at a time (all six at once would spill accumulators) */
    for (int64_t q = 0; q < k4; q += 2, a += 64, b += 96) {
        const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16), a2 = vld1q_s8(a + 32), a3 = vld1q_s8(a + 48);
#pragma GCC unroll 6
        for (int j = 0; j < 6; j++) {
            const int8x16_t bj = vld1q_s8((const int8_t *)b + 16 * j);
            acc[0][j] = vmmlaq_s32(acc[0][j], a0, bj);
            acc[1][j] = vmmlaq_s32(acc[1][j], a1, bj);
            acc[2][j] = vmmlaq_s32(acc[2][j], a2, bj);
            acc[3][j] = vmmlaq_s32(acc[3][j], a3, bj);
        }
    }
    for (int p = 0; p < 4; p++)
        for (int j = 0; j < 6; j += 2) {
            vst1q_s32(c + 12 * (2 * p) + 2 * j, zip_lo(acc[p][j], acc[p][j + 1]));
            vst1q_s32(c + 12 * (2 * p + 1) + 2 * j, zip_hi(acc[p][j], acc[p][j + 1]));
        }
}

const ql_s8_kernel ql_s8_gemm_8x12c8__i8mm = {QL_ISA_I8MM, "s8_gemm_8x12c8__i8mm", 8, 12, 8, false, true, tile_8x12c8_i8mm,
                                               8, 1, NULL, NULL, NULL};
