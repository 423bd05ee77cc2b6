/* Plain Advanced SIMD int8 micro-kernel (any ARMv8-A CPU), 4×8 tile, exact.
 * Without SDOT, the exact way is a widening multiply into int16 (SMULL:
 * |a·b| <= 2^14 fits) and a pairwise widening add into int32 (SADALP).
 * SMLAL into int16 would be one instruction less, but two products of
 * -128·-128 overflow int16, so it is not exact for every input.
 * Layout: the generic c4 panels (gemm.h, kb = 4). Per 4-k step, row r's four
 * codes are broadcast (LD1R) and multiplied with 16-byte B vectors holding
 * 4 columns × 4 k; each accumulator lane holds a column's sum over two k,
 * folded by one ADDP at the end. 32 arithmetic instructions per 128 MACs. */
#include <arm_neon.h>

#include "cpu/arm/arm.h"

static void tile_4x8c4_neon(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
    /* acc[r][v]: row r, columns 2v, 2v+1 as (k01, k23) pairs */
    int32x4_t acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int v = 0; v < 4; v++) acc[r][v] = vdupq_n_s32(0);
    for (int64_t q = 0; q < k4; q++, a += 16, b += 32) {
        const int8x16_t b0 = vld1q_s8((const int8_t *)b), b1 = vld1q_s8((const int8_t *)b + 16);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            int32_t w;
            memcpy(&w, a + 4 * r, 4);
            const int8x16_t ar = vreinterpretq_s8_s32(vdupq_n_s32(w));
            acc[r][0] = vpadalq_s16(acc[r][0], vmull_s8(vget_low_s8(ar), vget_low_s8(b0)));
            acc[r][1] = vpadalq_s16(acc[r][1], vmull_high_s8(ar, b0));
            acc[r][2] = vpadalq_s16(acc[r][2], vmull_s8(vget_low_s8(ar), vget_low_s8(b1)));
            acc[r][3] = vpadalq_s16(acc[r][3], vmull_high_s8(ar, b1));
        }
    }
    for (int r = 0; r < 4; r++) {
        int32x4_t lo = vpaddq_s32(acc[r][0], acc[r][1]), hi = vpaddq_s32(acc[r][2], acc[r][3]);
        if (accumulate) {
            lo = vaddq_s32(lo, vld1q_s32(c + 8 * r));
            hi = vaddq_s32(hi, vld1q_s32(c + 8 * r + 4));
        }
        vst1q_s32(c + 8 * r, lo);
        vst1q_s32(c + 8 * r + 4, hi);
    }
}

const ql_s8_kernel ql_s8_gemm_4x8c4__neon = {QL_ISA_NEON, "s8_gemm_4x8c4__neon", 4, 8, 4, false, true, tile_4x8c4_neon, 4, 1, NULL, NULL, NULL};
