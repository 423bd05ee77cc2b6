/* Portable reference twin of the int8 micro-kernels: 4×8 tile, plain C. */
#include "cpu/gemm.h"

static void tile_4x8c4_generic(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
    int32_t acc[4][8] = {{0}};
    if (accumulate) memcpy(acc, c, sizeof acc);
    for (int64_t q = 0; q < k4; q++, a += 16, b += 32)
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < 8; j++)
                for (int t = 0; t < 4; t++) acc[r][j] += (int32_t)a[r * 4 + t] * (int32_t)(int8_t)b[j * 4 + t];
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 8; j++) c[r * 8 + j] = acc[r][j];
}

const ql_s8_kernel ql_s8_gemm_4x8c4__generic = {QL_ISA_GENERIC, "s8_gemm_4x8c4__generic", 4, 8, 4, false, true,
                                                 tile_4x8c4_generic, 4, 1, NULL, NULL, NULL};
