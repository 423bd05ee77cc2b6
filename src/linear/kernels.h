/* Per-ISA prologue (rotate + quantize + pack activations) and epilogue
 * (scale restore, cast, bias, residual) of the W8A8 linear. Every variant
 * reproduces the generic (reference) one bit for bit. */
#ifndef QL_LINEAR_KERNELS_H
#define QL_LINEAR_KERNELS_H

#include "../gemm/gemm.h"
#include "linear.h"

/* Quantize rows [r0, r1) of x into packed A (panels of mr rows; threads
 * may split a panel's rows), with per-row scale sx and Σq in rowsum. Rows
 * >= m are written as zeros. scratch holds k floats (64-byte aligned). */
typedef void (*ql_prologue_fn)(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                               int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);

void ql_prologue_generic(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                         int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
void ql_prologue_avx2(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                      int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
void ql_prologue_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                        int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
/* src/arm: c4 panels (kb = 4) and the SMMLA kernel's 8-k blocks (kb = 8) */
void ql_prologue_neon(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                      int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
void ql_prologue_neon_k8(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                         int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);

/* The unmerged-LoRA term of one output tile (see lora.h): int32 sums c of
 * t_q·u_qᵀ (row stride nr; u stored + 128 like the weights when offset128,
 * hence rowsum = Σ t_q), row factors st and column scales su. */
typedef struct ql_lora_tile {
    const int32_t *c;
    const int32_t *rowsum;
    const float *st;
    const float *su;
} ql_lora_tile;

/* State of the W8A8 tile epilogue. With c_out set, the raw exact int32
 * result is stored instead (the bare GEMM). */
typedef struct ql_w8a8_epi {
    const float *sx;
    const int32_t *rowsum;
    bool offset128;
    const float *sw;
    bool sw_scalar;
    ql_epi_plan plan;
    void *y;
    int64_t ldy;
    int32_t *c_out;
    int64_t ldc;
    /* every weight scale finite with |s_w| <= 64 (so s_x·s_w is finite for
     * any finite s_x) and every bias finite: only a NaN row can make NaN */
    bool finite_weights;
    /* NULL, or the LoRA term added to acc·(s_x·s_w) before the first rounding */
    const ql_lora_tile *lora;
    /* > 0: tiles come in the small-M order over this many rows (down a
     * column panel, then the next panel), and each tile's epilogue prefetches
     * the next tile's output lines (AVX-512), whose write misses otherwise
     * stall the stores */
    int64_t pf_m;
} ql_w8a8_epi;

/* The LoRA term of tile element (r, j) at (row, col), as every epilogue
 * computes it: fp32(acc2)·(st[row]·su[col]). */
static inline float ql_lora_term(const ql_w8a8_epi *e, int nr, int r, int j, int64_t row, int64_t col)
{
    const ql_lora_tile *t = e->lora;
    const int32_t a = t->c[r * nr + j] - (e->offset128 ? 128 * t->rowsum[row] : 0);
    return (float)a * (t->st[row] * t->su[col]);
}

void ql_w8a8_epilogue_generic(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_w8a8_epilogue_avx2(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_w8a8_epilogue_avx512(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_w8a8_epilogue_neon(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
/* The W8A8 tile epilogue that goes with an ISA's kernel. */
ql_tile_epilogue_fn ql_w8a8_epilogue_for(ql_isa isa);

/* State of the float-GEMM tile epilogue; col_scale (weight-only: the
 * weight's row scales, 1 or N of them) multiplies the fp32 sums first. */
typedef struct ql_f32_epi {
    ql_epi_plan plan;
    void *y;
    int64_t ldy;
    const float *col_scale;
    bool col_scale_scalar;
} ql_f32_epi;
void ql_f32_epilogue_generic(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_f32_epilogue_avx2(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_f32_epilogue_avx512(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_f32_epilogue_neon(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_rows_to_f32_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k, int64_t group,
                           int round_bf16, float *out, int64_t ldo);

int64_t ql_quantize_rows_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k,
                                int64_t group, int8_t *q, int64_t ldq, float *scale, float *scratch);

/* Write one quantized row (k codes) into its place in the packed A panels. */
static inline void ql_scatter_row(const int8_t *q, int64_t k, int mr, int r, int8_t *panel)
{
    int64_t q4 = k / 4;
    for (int64_t j = 0; j < q4; j++) memcpy(panel + (j * mr + r) * 4, q + 4 * j, 4);
    if (k % 4) {
        int8_t tail[4] = {0, 0, 0, 0};
        memcpy(tail, q + 4 * q4, (size_t)(k % 4));
        memcpy(panel + (q4 * mr + r) * 4, tail, 4);
    }
}
static inline void ql_zero_row(int64_t k, int mr, int r, int8_t *panel)
{
    for (int64_t j = 0; j < ql_k4(k); j++) memset(panel + (j * mr + r) * 4, 0, 4);
}

#endif
