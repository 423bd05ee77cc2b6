/* Input activations (comfy-kitchen's apply_input_act), one row at a time:
 * the scalar implementation the reference calls; the ISA tables' vector
 * twins (input_act_row) repeat its operations, so every path is
 * bit-identical to it (docs/NUMERICS.md §11). */
#ifndef QL_INPUT_ACT_H
#define QL_INPUT_ACT_H

#include "core/core.h"

/* One forward's activation, resolved from its ql_epilogue. */
typedef struct ql_input_act_plan {
    int code;         /* ql_input_act; QL_INPUT_ACT_NONE: nothing to do */
    ql_dtype dt;      /* x's dtype: every result is rounded to it */
    const void *w;    /* RMS_NORM: [k] weight, rounded to dt when read (w.to(x.dtype)) */
    ql_dtype w_dtype;
    float eps;
} ql_input_act_plan;

/* The plan of epi (NULL: none) for x of dtype dt. */
ql_input_act_plan ql_input_act_plan_of(const ql_epilogue *epi, ql_dtype dt);

/* Columns of x a row of k activated values reads: 2k for SWIGLU, else k. */
static inline int64_t ql_input_act_cols(int code, int64_t k) { return code == QL_INPUT_ACT_SWIGLU ? 2 * k : k; }

/* src (ql_input_act_cols values of dtype p->dt) -> dst (k values of p->dt). */
void ql_input_act_row(const ql_input_act_plan *p, const void *src, int64_t k, void *dst);

/* Σ x[j]² of k values of dtype dt (each square an fp32 product), summed in
 * fp32 in the order of PyTorch's CPU sum of a contiguous row on x86-64 (its
 * AVX2 kernel, 8 lanes): what rms_norm's mean(x²) adds up. */
float ql_rms_sum_squares(ql_dtype dt, const void *x, int64_t k);
/* Its end for K >= 8, given the 32 slot totals of the row's k/32 whole
 * blocks (the part a vector kernel computes lane for lane). */
float ql_rms_sum_squares_finish(ql_dtype dt, const void *x, int64_t k, float tot[32]);

/* A vector twin of ql_input_act_row (bit for bit), an entry of the ISA tables. */
typedef void (*ql_input_act_row_fn)(const ql_input_act_plan *p, const void *src, int64_t k, void *dst);

#endif
