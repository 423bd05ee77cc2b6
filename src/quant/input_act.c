/* Input activations, scalar, in the operation order of PyTorch 2.15's CPU
 * kernels (measured agreement in docs/NUMERICS.md §11), with exp and tanh
 * from act_math.h: the reference twins of the vector rows (the tables'
 * input_act_row). */
#include "quant/input_act.h"

#include <math.h>

#include "quant/act_math.h"

ql_input_act_plan ql_input_act_plan_of(const ql_epilogue *epi, ql_dtype dt)
{
    ql_input_act_plan p = {QL_INPUT_ACT_NONE, dt, NULL, QL_F32, 0.0f};
    if (!epi) return p;
    p.code = epi->input_act;
    p.w = epi->input_act_weight;
    p.w_dtype = epi->input_act_weight_dtype;
    p.eps = epi->input_act_eps;
    return p;
}

static inline float square_at(ql_dtype dt, const void *x, int64_t j)
{
    const float v = ql_load_f(dt, x, j);
    return v * v;
}

/* PyTorch's cascade sum: `w` running sums (slot s takes elements
 * u·w + s of blocks u = 0 .. units-1), folded into a second level of sums
 * after every 16 blocks, that into a third after every 256 and a fourth
 * after every 4096, so only sums of similar size meet; then the levels are
 * added up per slot, lowest first. */
static void cascade(ql_dtype dt, const void *x, int64_t units, int w, float tot[32])
{
    float lv[4][32] = {{0.0f}};
    int64_t u = 0;
    while (units - u >= 16) {
        for (int64_t end = u + 16; u < end; u++)
            for (int s = 0; s < w; s++) lv[0][s] += square_at(dt, x, u * w + s);
        for (int l = 1; l < 4; l++) {
            for (int s = 0; s < w; s++) {
                lv[l][s] += lv[l - 1][s];
                lv[l - 1][s] = 0.0f;
            }
            if (u % ((int64_t)1 << (4 * (l + 1))) != 0) break; /* 256, 4096 blocks: fold further up */
        }
    }
    for (; u < units; u++)
        for (int s = 0; s < w; s++) lv[0][s] += square_at(dt, x, u * w + s);
    for (int s = 0; s < w; s++) tot[s] = ((lv[0][s] + lv[1][s]) + lv[2][s]) + lv[3][s];
}

/* A row of K >= 8 is read as K/8 vectors of 8 lanes, four vectors per
 * block (32 slots); the 0-3 vectors left over go to the first vector's
 * lanes, the four vectors are added lane-wise, and a scalar sum takes the
 * K % 8 tail elements, then the 8 lanes in order. Shorter rows: blocks of
 * four scalars, the leftovers into slot 0, the four slots added. */
float ql_rms_sum_squares(ql_dtype dt, const void *x, int64_t k)
{
    float tot[32];
    if (k < 8) {
        const int64_t blocks = k / 4;
        cascade(dt, x, blocks, 4, tot);
        for (int64_t j = 4 * blocks; j < k; j++) tot[0] += square_at(dt, x, j);
        return ((tot[0] + tot[1]) + tot[2]) + tot[3];
    }
    cascade(dt, x, k / 32, 32, tot);
    return ql_rms_sum_squares_finish(dt, x, k, tot);
}

float ql_rms_sum_squares_finish(ql_dtype dt, const void *x, int64_t k, float tot[32])
{
    const int64_t vecs = k / 8, blocks = vecs / 4;
    for (int64_t v = 4 * blocks; v < vecs; v++)
        for (int l = 0; l < 8; l++) tot[l] += square_at(dt, x, 8 * v + l);
    float s = 0.0f;
    for (int64_t j = 8 * vecs; j < k; j++) s += square_at(dt, x, j);
    for (int l = 0; l < 8; l++) s += ((tot[l] + tot[8 + l]) + tot[16 + l]) + tot[24 + l];
    return s;
}

/* F.gelu(x, approximate="tanh"): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))),
 * fp32 throughout in PyTorch's order, rounded once. */
static void gelu_tanh_row(ql_dtype dt, const void *src, int64_t k, void *dst)
{
    for (int64_t j = 0; j < k; j++) ql_store_f(dt, dst, j, ql_act_gelu_tanh(ql_load_f(dt, src, j)));
}

/* silu(gate) = gate / (1 + e^-gate) rounded to dt, then · up rounded. */
static void swiglu_row(ql_dtype dt, const void *src, int64_t k, void *dst)
{
    const void *up = ql_row_cptr(dt, src, 1, k);
    for (int64_t j = 0; j < k; j++) {
        const float s = ql_round_to(dt, ql_act_silu(ql_load_f(dt, src, j)));
        ql_store_f(dt, dst, j, s * ql_load_f(dt, up, j));
    }
}

/* rms_norm as PyTorch's CPU composite: r = 1/sqrt(Σx²/K + eps) in fp32,
 * y = (x·r)·w in fp32 with w rounded to dt, one rounding at the end.
 * A zero row with eps 0 gives 0·Inf = NaN, an Inf gives Inf·0 = NaN. */
static void rms_norm_row(const ql_input_act_plan *p, const void *src, int64_t k, void *dst)
{
    const ql_dtype dt = p->dt;
    const float ms = ql_rms_sum_squares(dt, src, k) / (float)k;
    const float r = 1.0f / sqrtf(ms + p->eps);
    for (int64_t j = 0; j < k; j++) {
        const float w = ql_round_to(dt, ql_load_f(p->w_dtype, p->w, j));
        ql_store_f(dt, dst, j, ql_load_f(dt, src, j) * r * w);
    }
}

void ql_input_act_row(const ql_input_act_plan *p, const void *src, int64_t k, void *dst)
{
    switch (p->code) {
    case QL_INPUT_ACT_GELU_TANH: gelu_tanh_row(p->dt, src, k, dst); break;
    case QL_INPUT_ACT_SWIGLU: swiglu_row(p->dt, src, k, dst); break;
    case QL_INPUT_ACT_RMS_NORM: rms_norm_row(p, src, k, dst); break;
    default: memcpy(dst, src, (size_t)k * ql_dtype_size(p->dt)); break;
    }
}
