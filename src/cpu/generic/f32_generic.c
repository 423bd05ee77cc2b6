/* The portable reference twin of the float micro-kernels: 4×16 tile and the
 * small-M tile, plain C, one multiply then one add per k in k order. */
#include "cpu/generic/generic.h"

static void tile_4x16_generic(int64_t k, const float *a, int64_t lda, const float *b, float *c, int accumulate)
{
    float acc[4][16] = {{0}};
    if (accumulate) memcpy(acc, c, sizeof acc);
    for (int64_t p = 0; p < k; p++, b += 16)
        for (int r = 0; r < 4; r++) {
            float av = a[r * lda + p];
            for (int j = 0; j < 16; j++) acc[r][j] += av * b[j];
        }
    memcpy(c, acc, sizeof acc);
}

static void decode_generic(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    if (dt == QL_I8)
        for (int64_t i = 0; i < n; i++) dst[i] = (float)((const int8_t *)src)[i];
    else
        for (int64_t i = 0; i < n; i++) dst[i] = ql_load_f(dt, src, i);
}

/* The small-M twin: the same multiply, then add, in k order. */
static void small_generic(int rows, int panels, int64_t k, const float *a, int64_t lda, const void *b, int64_t panel_elems,
                          ql_dtype bdt, float *c)
{
    const int cols = panels * 16;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            const int64_t base = (j / 16) * panel_elems + j % 16;
            float acc = 0.0f;
            for (int64_t p = 0; p < k; p++) {
                const int64_t at = base + p * 16;
                const float w = bdt == QL_I8 ? (float)((const int8_t *)b)[at] : ql_load_f(bdt, b, at);
                acc += a[r * lda + p] * w;
            }
            c[r * cols + j] = acc;
        }
}

const ql_f32_kernel ql_f32_gemm_4x16__generic = {QL_ISA_GENERIC, "f32_gemm_4x16__generic", 4, 16, tile_4x16_generic, decode_generic,
                                                 "f32_gemv_4x32__generic", 4, small_generic, 16, 0, 0, NULL, 0, 0, NULL};

