/* Row-wise generic twins: activation rows to fp32, weight-row quantization,
 * stochastic rounding, the LoRA merge's low-rank add. */
#include "cpu/generic/generic.h"
#include "cpu/lowrank_add.h"

void ql_rows_to_f32_generic(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k, int64_t group,
                            int round_bf16, float *out, int64_t ldo)
{
    for (int64_t r = r0; r < r1; r++) {
        float *o = out + r * ldo;
        ql_load_row_rotated(dt, ql_row_cptr(dt, x, r, ldx), k, group, o);
        if (round_bf16)
            for (int64_t j = 0; j < k; j++) o[j] = ql_round_to(QL_BF16, o[j]);
    }
}

/* The reference quantizer itself (ql_quantize_rowwise / _convrot_weight). */
int64_t ql_quantize_rows_generic(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k,
                                 int64_t group, int8_t *q, int64_t ldq, float *scale, float *scratch)
{
    int64_t bad = -1;
    for (int64_t row = r0; row < r1; row++) {
        ql_load_row_rotated(dt, ql_row_cptr(dt, x, row, ldx), k, group, scratch);
        if (!ql_quantize_row_f32(dt, scratch, k, q + row * ldq, &scale[row]) && bad < 0) bad = row;
    }
    return bad;
}

void ql_sr_row_generic(const float *v, int64_t k, float s, int64_t idx0, uint64_t seed, int8_t *q)
{
    for (int64_t j = 0; j < k; j++) q[j] = ql_sr_code(v[j], s, idx0 + j, seed);
}

QL_DEFINE_LOWRANK_ADD(ql_lowrank_add_generic)
