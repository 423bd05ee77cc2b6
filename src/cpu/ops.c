/* Operations outside ql_linear that run CPU kernels: weight quantization,
 * stochastic rounding, the input activations alone, the LoRA merge's
 * rotation and low-rank add, and the bare packed GEMM the bench times. They take the default table (QLINEAR_ISA
 * or the best this CPU runs). */
#include "cpu/ops.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu/generic/generic.h"
#include "cpu/registry.h"

ql_status ql_quantize_weight_rows(ql_dtype dtype, const void *w, int64_t rows, int64_t k, int64_t ldw, int64_t group,
                                  int8_t *q, int64_t ldq, float *scale)
{
    const char *fn = group > 0 ? "ql_quantize_convrot_weight" : "ql_quantize_rowwise";
    if (!ql_is_float_dtype(dtype) || k <= 0 || rows <= 0) /* the reference's own messages */
        return group > 0 ? ql_quantize_convrot_weight(dtype, w, rows, k, ldw, group, q, ldq, scale)
                         : ql_quantize_rowwise(dtype, w, rows, k, ldw, q, ldq, scale);
    QL_TRY(ql_check_matrix(fn, "x", w, rows, k, ldw));
    QL_TRY(ql_check_matrix(fn, "q", q, rows, k, ldq));
    QL_CHECK_PTR(fn, scale);
    if (group > 0) QL_TRY(ql_check_group(fn, group, k));
    float *scratch = ql_aligned_alloc((size_t)((k + 15) & ~(int64_t)15) * sizeof(float));
    if (!scratch) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate a row of %lld floats", fn, (long long)k);
    const int64_t bad = ql_cpu_kernels_default()->quantize_rows(dtype, w, ldw, 0, rows, k, group, q, ldq, scale, scratch);
    ql_aligned_free(scratch);
    if (bad >= 0)
        return ql_fail(QL_ERR_NONFINITE, "%s: row %lld %s NaN or Inf; its codes are 0 and its scale NaN", fn,
                       (long long)bad, group > 0 ? "holds (or rotates to)" : "holds");
    return QL_OK;
}

ql_status ql_quantize_rowwise_sr(const float *x, int64_t rows, int64_t k, int64_t ldx, int64_t idx0, uint64_t seed,
                                 int8_t *q, int64_t ldq, float *scale)
{
    const char *fn = "ql_quantize_rowwise_sr";
    QL_TRY(ql_check_matrix(fn, "x", x, rows, k, ldx));
    QL_TRY(ql_check_matrix(fn, "q", q, rows, k, ldq));
    QL_CHECK_PTR(fn, scale);
    /* seed 0 rounds to nearest: the scalar twin handles both */
    const ql_sr_row_fn row = seed ? ql_cpu_kernels_default()->sr_row : ql_sr_row_generic;
    int64_t bad = -1;
    for (int64_t r = 0; r < rows; r++) {
        const float *v = x + r * ldx;
        float a = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float av = fabsf(v[j]);
            a = av > a || av != av ? av : a; /* NaN sticks */
        }
        if (!(a <= 3.40282347e38f)) {
            memset(q + r * ldq, 0, (size_t)k);
            scale[r] = NAN;
            if (bad < 0) bad = r;
            continue;
        }
        const float s = ql_sr_scale(a);
        scale[r] = s;
        row(v, k, s, idx0 + r * k, seed, q + r * ldq);
    }
    if (bad >= 0)
        return ql_fail(QL_ERR_NONFINITE, "%s: row %lld holds NaN or Inf; its codes are 0 and its scale NaN", fn,
                       (long long)bad);
    return QL_OK;
}

ql_status ql_input_act_apply(const ql_epilogue *epi, ql_dtype dtype, const void *x, int64_t rows, int64_t k,
                             int64_t ldx, void *out, int64_t ldo)
{
    const char *fn = "ql_input_act_apply";
    QL_TRY(ql_check_float_dtype(fn, "x", dtype));
    const ql_input_act_plan p = ql_input_act_plan_of(epi, dtype);
    if (p.code < QL_INPUT_ACT_NONE || p.code > QL_INPUT_ACT_RMS_NORM)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown input_act %d", fn, p.code);
    if (p.code == QL_INPUT_ACT_RMS_NORM && !p.w)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: rms_norm needs input_act_weight", fn);
    QL_TRY(ql_check_matrix(fn, "x", x, rows, ql_input_act_cols(p.code, k), ldx));
    QL_TRY(ql_check_matrix(fn, "out", out, rows, k, ldo));
    const ql_input_act_row_fn row = ql_cpu_kernels_default()->input_act_row; /* bit-identical on every table */
    const size_t es = ql_dtype_size(dtype);
    for (int64_t r = 0; r < rows; r++)
        row(&p, (const char *)x + (size_t)(r * ldx) * es, k, (char *)out + (size_t)(r * ldo) * es);
    return QL_OK;
}

void ql_rotate_rows_f32(const float *src, int64_t rows, int64_t k, int64_t lds, int64_t group, float *dst, int64_t ldd)
{
    ql_cpu_kernels_default()->rows_to_f32(QL_F32, src, lds, 0, rows, k, group, 0, dst, ldd);
}

void ql_lowrank_add(float *w, int64_t rows, int64_t k, int64_t ld, const float *up, int64_t rank, const float *down,
                    float c)
{
    ql_cpu_kernels_default()->lowrank_add(w, rows, k, ld, up, rank, down, c);
}

/* ---- the bare packed GEMM */

struct ql_s8_prepared {
    int threads;
    ql_s8_plan plan;
    void *pa;
    int32_t *rowsum;
    int64_t m;
    ql_packed_b pb;
    char name[96];
};

ql_status ql_s8_prepare(ql_context *ctx, const int8_t *a, int64_t m, const int8_t *b, int64_t n, int64_t k,
                        ql_s8_prepared **out)
{
    const char *fn = "ql_s8_prepare";
    *out = NULL;
    ql_s8_prepared *p = calloc(1, sizeof *p);
    if (!p) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    p->threads = ctx->threads;
    p->plan = ql_s8_plan_limit(ql_cpu_kernels_for(ctx->isa), m, n, k, ctx->small_m); /* the path the linear takes */
    const ql_s8_kernel *kern = p->plan.kern;
    snprintf(p->name, sizeof p->name, "%s%s", kern->name, p->plan.small ? " small-M" : "");
    p->m = m;
    p->pa = ql_aligned_alloc(ql_packed_a_bytes(kern, m, k) * (size_t)(kern->aes ? kern->aes : 1));
    p->rowsum = ql_aligned_alloc((size_t)(m > 0 ? m : 1) * sizeof(int32_t));
    ql_status st = p->pa && p->rowsum ? ql_pack_b_s8(kern, b, n, k, k, &p->pb) : ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (st != QL_OK) {
        ql_s8_prepared_free(p);
        return st;
    }
    ql_pack_a_s8(kern, a, m, k, k, p->pa, p->rowsum);
    *out = p;
    return QL_OK;
}

ql_status ql_s8_prepared_run(ql_s8_prepared *p, int32_t *c, int64_t ldc)
{
    const ql_s8_kernel *kern = p->plan.kern;
    ql_w8a8_epi e = {NULL, p->rowsum, kern->b_offset128, NULL, false, {0}, NULL, 0, c, ldc, false, NULL,
                     p->plan.small ? p->m : 0};
    return ql_gemm_s8_exec(p->threads, p->plan, p->pa, p->m, &p->pb, ql_cpu_kernels_for(kern->isa)->w8a8_epilogue, &e);
}

const char *ql_s8_prepared_kernel(const ql_s8_prepared *p) { return p->name; }

size_t ql_s8_prepared_weight_bytes(const ql_s8_prepared *p) { return (size_t)(p->pb.panels * p->pb.k4 * p->pb.nr * 4); }

void ql_s8_prepared_free(ql_s8_prepared *p)
{
    if (!p) return;
    ql_packed_b_free(&p->pb);
    ql_aligned_free(p->pa);
    ql_aligned_free(p->rowsum);
    free(p);
}
