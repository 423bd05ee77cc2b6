/* Dot-product int8 micro-kernel (ARMv8.2 FEAT_DotProd: Apple M1+, Cortex-A76+,
 * Neoverse N1, Graviton2), 8×12 tile: 24 accumulators, per 4-k step two
 * 16-byte A loads (8 rows × 4 k), three B loads (12 columns × 4 k) and 24
 * by-element SDOTs (16 MACs each). Layout: the generic c4 panels (kb = 4),
 * so SDOT's 4-byte groups are exactly the packed k4 groups; s8·s8 needs no
 * offset correction. */
#include <arm_neon.h>

#include "cpu/arm/arm.h"

static void tile_8x12c4_neondot(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
#define QL_DECL(r)                                                                  \
    int32x4_t c##r##0 = accumulate ? vld1q_s32(c + 12 * (r)) : vdupq_n_s32(0),     \
              c##r##1 = accumulate ? vld1q_s32(c + 12 * (r) + 4) : vdupq_n_s32(0), \
              c##r##2 = accumulate ? vld1q_s32(c + 12 * (r) + 8) : vdupq_n_s32(0);
    QL_DECL(0) QL_DECL(1) QL_DECL(2) QL_DECL(3) QL_DECL(4) QL_DECL(5) QL_DECL(6) QL_DECL(7)
#undef QL_DECL
    for (int64_t q = 0; q < k4; q++, a += 32, b += 48) {
        const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16);
        const int8x16_t b0 = vld1q_s8((const int8_t *)b), b1 = vld1q_s8((const int8_t *)b + 16),
                        b2 = vld1q_s8((const int8_t *)b + 32);
#define QL_ROW(r, av, lane)                               \
    c##r##0 = vdotq_laneq_s32(c##r##0, b0, av, lane);      \
    c##r##1 = vdotq_laneq_s32(c##r##1, b1, av, lane);      \
    c##r##2 = vdotq_laneq_s32(c##r##2, b2, av, lane);
        QL_ROW(0, a0, 0) QL_ROW(1, a0, 1) QL_ROW(2, a0, 2) QL_ROW(3, a0, 3)
        QL_ROW(4, a1, 0) QL_ROW(5, a1, 1) QL_ROW(6, a1, 2) QL_ROW(7, a1, 3)
#undef QL_ROW
    }
#define QL_STORE(r)                      \
    vst1q_s32(c + 12 * (r), c##r##0);     \
    vst1q_s32(c + 12 * (r) + 4, c##r##1); \
    vst1q_s32(c + 12 * (r) + 8, c##r##2);
    QL_STORE(0) QL_STORE(1) QL_STORE(2) QL_STORE(3) QL_STORE(4) QL_STORE(5) QL_STORE(6) QL_STORE(7)
#undef QL_STORE
}

const ql_s8_kernel ql_s8_gemm_8x12c4__neondot = {QL_ISA_NEONDOT, "s8_gemm_8x12c4__neondot", 8, 12, 4, false, true,
                                                  tile_8x12c4_neondot, 4, 1, NULL, NULL, NULL};
