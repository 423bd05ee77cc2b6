/* The CPU kernel table: everything the drivers and the ops take from an
 * ISA, one table per ISA, defined in its architecture's folder (generic/,
 * x86/, arm/) and ordered by the registry (registry.h). Every entry
 * reproduces the generic table's entry bit for bit (tests walk the
 * registry); an entry left NULL is the generic twin. */
#ifndef QL_CPU_KERNELS_H
#define QL_CPU_KERNELS_H

#include "cpu/f32.h"
#include "cpu/features.h"
#include "cpu/gemm.h"
#include "quant/epilogue.h"
#include "quant/input_act.h"

/* Quantize rows [r0, r1) of x into packed A (panels of mr rows; threads
 * may split a panel's rows), with per-row scale sx and Σq in rowsum. Rows
 * >= m are written as zeros. scratch holds k floats (64-byte aligned). */
typedef void (*ql_prologue_fn)(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
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


/* State of the float-GEMM tile epilogue; col_scale (weight-only: the
 * weight's row scales, 1 or N of them) multiplies the fp32 sums first. */
typedef struct ql_f32_epi {
    ql_epi_plan plan;
    void *y;
    int64_t ldy;
    const float *col_scale;
    bool col_scale_scalar;
} ql_f32_epi;

/* Float paths: rows [r0, r1) of x -> fp32 rows out + r·ldo (rotated and
 * rounded to dt when group > 0; rounded to bf16 when round_bf16). out rows
 * have stride ldo >= k rounded up to 16 and are 64-byte aligned. */
typedef void (*ql_rows_to_f32_fn)(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k,
                                  int64_t group, int round_bf16, float *out, int64_t ldo);

/* Row-major int8 codes of weight rows [r0, r1) with the reference quantizer's
 * codes and scales (ql_quantize_rowwise, or ql_quantize_convrot_weight when
 * group > 0). Returns the first row holding (or rotating to) NaN/Inf, or -1;
 * such rows get codes 0 and scale NaN. scratch holds k rounded up to 16 floats. */
typedef int64_t (*ql_quantize_rows_fn)(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k,
                                       int64_t group, int8_t *q, int64_t ldq, float *scale, float *scratch);

/* A row of ql_sr_code with seed != 0 (stochastic rounding, quant.h). */
typedef void (*ql_sr_row_fn)(const float *v, int64_t k, float s, int64_t idx0, uint64_t seed, int8_t *q);

/* Row i of the LoRA's t (the D × A tiles cb: panels of mr × nr int32, minus
 * corr) -> int8 codes rne(t·127/max|t|) in the T panel tp ([rpad/kb][mr][kb],
 * position q of a block holding element perm[q]; int16 codes when aes = 2),
 * columns >= rt as 0; *sum = Σ codes; returns max|t|. scratch: rpad·5 bytes. */
typedef int32_t (*ql_lora_t_row_fn)(const int32_t *cb, int mr, int nr, int kb, int aes, const uint8_t *perm, int i,
                                    int64_t rt, int64_t rpad, int32_t corr, int8_t *tp, int32_t *scratch, int32_t *sum);

/* W[rows, k] (row stride ld) += c·(up[rows, R]·down[R, k]): up·down summed in
 * fp32 in rank order, then scaled and added, lane by lane with no FMA, so
 * every vector width gives the same bits (the merge of a LoRA). */
typedef void (*ql_lowrank_add_fn)(float *w, int64_t rows, int64_t k, int64_t ld, const float *up, int64_t rank,
                                  const float *down, float c);

/* Cache blocking of a GEMM driver, in rows of A (mc), columns of B (nc) and
 * K (kc); the driver rounds mc and nc to whole panels. */
typedef struct ql_blocking {
    int mc, nc, kc;
} ql_blocking;

typedef struct ql_cpu_kernels {
    ql_isa isa;
    /* NULL, or the table this one extends: every entry left NULL (or 0)
     * here is the base's (then the generic one's), so a change to the base
     * reaches this table too */
    const struct ql_cpu_kernels *base;
    /* whether this CPU (features minus QLINEAR_DISABLE) runs the table, and
     * if not, why (a one-line reason; NULL, or a NULL or "" answer: the CPU
     * lacks the instructions) */
    bool (*supported)(const ql_cpu_features *f);
    const char *(*refusal)(const ql_cpu_features *f);

    /* int8 GEMM: the main kernel; s8_rows[r - 1] the r-row variant for
     * r = 1 .. s8_rows_max, sharing its B packing (NULL: every height runs
     * the main kernel); the blocked driver's blocking; rows up to which the
     * small-M (GEMV-like, weight-streaming) path runs */
    const ql_s8_kernel *s8;
    const ql_s8_kernel *const *s8_rows;
    int s8_rows_max;
    ql_blocking s8_blocking;
    /* K shorter than KC: the blocked driver widens a block to up to this
     * many times NC columns (0: 4), keeping its weight slice's size */
    int s8_short_k_widen;
    int64_t small_m;
    /* rows up to which weights decoded in the GEMM (W4A8/W6A8 packed) take
     * the small-M path (0: always blocked); tune: set at registry init to
     * adjust the table to this CPU (vendor, family: CPU tuning), or NULL */
    int64_t decoded_small_m;
    void (*tune)(struct ql_cpu_kernels *kt, const ql_cpu_features *f);
    /* the kernels W4A8/W6A8 layers run on where the main one cannot: packed
     * weights decoded into the GEMM (decoders write c4 panels of int8) and
     * asymmetric layers (their correction reads int8 A panels back); NULL: s8 */
    const ql_s8_kernel *s8_decoded;
    const ql_s8_kernel *s8_int8_a;
    /* the prologue and epilogue that go with this ISA's s8 kernels (the
     * pipeline picks them by its kernel's isa) */
    ql_prologue_fn prologue;
    ql_tile_epilogue_fn w8a8_epilogue;
    void (*wxa8_decode)(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst);
    /* the small-M path's register decode of packed panels (ql_packed_b.rows)
     * for up to wxa8_rows_max rows, or NULL; it may decline a layer at
     * packing (wxa8_rows_ok) */
    void (*wxa8_rows)(const void *src, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c);
    bool (*wxa8_rows_ok)(const void *src, const struct ql_s8_kernel *kern);
    int wxa8_rows_max;
    ql_lora_t_row_fn lora_t_row;

    /* float GEMM (fp32 activations; fp32, bf16 or int8 weights), the kernel
     * of bf16-compute layers, their epilogue and activation conversion */
    const ql_f32_kernel *f32;
    const ql_f32_kernel *bf16;
    /* weight-only layers with bf16 activations: a kernel reading f32's int8
     * packing (same nr, [K][NR]) with bf16 A rows (VDPBF16PS: int8 codes
     * decoded to bf16, exactly); NULL: the f32 kernel, fp32 products in k order */
    const ql_f32_kernel *wo_bf16;
    ql_f32_epilogue_fn f32_epilogue;
    ql_blocking f32_blocking;
    ql_rows_to_f32_fn rows_to_f32;

    /* the input activation of one row (ql_input_act_row's vector twin) */
    ql_input_act_row_fn input_act_row;

    /* weight quantization, stochastic rounding, LoRA merge */
    ql_quantize_rows_fn quantize_rows;
    ql_sr_row_fn sr_row;
    ql_lowrank_add_fn lowrank_add;
} ql_cpu_kernels;

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
