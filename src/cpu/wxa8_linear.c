/* W4A8/W6A8 layers on the W8A8 pipeline (docs/FORMATS.md §5.4). */
#include "cpu/wxa8_linear.h"

#include <stdlib.h>

#include "quant/wxa8.h"

ql_status ql_wxa8_linear_prepare(const ql_linear_desc *d, ql_wxa8_prepared *out)
{
    const char *fn = "ql_linear_create";
    const ql_wxa8_weight *w = &d->wxa8; /* checked */
    memset(out, 0, sizeof *out);
    const int packed = d->kind == QL_LINEAR_WXA8_PACKED;
    if (w->correction && d->kind != QL_LINEAR_W8A8 && !packed)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: an asymmetric W4A8 layer (with a correction) runs as W8A8 or WXA8_PACKED",
                       fn);
    if (packed && w->s_rel_f32)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "%s: WXA8_PACKED decodes e4m3 group scales; this layer's s_rel is fp32 (use W8A8: decode once)", fn);
    out->desc = *d;
    out->desc.kind = packed ? QL_LINEAR_W8A8 : d->kind;
    out->desc.int8 = (ql_int8_weight){w->n, w->k, (const int8_t *)w->q, w->k, w->s_channel, w->n, w->convrot_group,
                                      w->bias, w->bias_dtype};
    QL_TRY(ql_check_int8_weight(fn, &out->desc.int8));
    if (w->correction) {
        const int64_t ng = w->k / w->group;
        out->corr = ql_aligned_alloc((size_t)(ng * w->n) * sizeof(float));
        if (!out->corr) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        for (int64_t i = 0; i < ng * w->n; i++) out->corr[i] = ql_load_f(w->correction_dtype, w->correction, i);
        out->corr_group = w->group;
    }
    if (packed) {
        out->packed = w;
        return QL_OK;
    }
    out->grid = malloc((size_t)(w->n * w->k) + 1);
    ql_status st = out->grid ? ql_wxa8_decode(w, out->grid, w->k)
                             : ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate the decoded weight", fn);
    if (st != QL_OK) {
        free(out->grid);
        ql_aligned_free(out->corr);
        memset(out, 0, sizeof *out);
        return st;
    }
    out->desc.int8.q = out->grid;
    return QL_OK;
}

typedef struct corr_epi {
    ql_w8a8_epi e;
    const float *corr, *S; /* corr [ng, n]; S [m, ng] */
    int64_t n, ng;
} corr_epi;

static void corr_epilogue(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const corr_epi *ce = arg;
    const ql_w8a8_epi *e = &ce->e;
    float t[64];
    for (int r = 0; r < mr_eff; r++) {
        const int64_t row = m0 + r;
        const int32_t off = e->offset128 ? 128 * e->rowsum[row] : 0;
        for (int j = 0; j < nr_eff; j++) t[j] = 0.0f;
        for (int64_t g = 0; g < ce->ng; g++) {
            const float sv = ce->S[row * ce->ng + g];
            const float *cg = ce->corr + g * ce->n + n0;
            for (int j = 0; j < nr_eff; j++) t[j] = t[j] + sv * cg[j];
        }
        for (int j = 0; j < nr_eff; j++) {
            const int64_t col = n0 + j;
            const float sxw = e->sx[row] * e->sw[e->sw_scalar ? 0 : col];
            const float v = (float)(c[r * nr + j] - off) * sxw + e->sx[row] * t[j];
            ql_store_f(e->plan.y_dtype, e->y, row * e->ldy + col, ql_epilogue_scalar(&e->plan, v, row, col));
        }
    }
}

ql_status ql_wxa8_gemm_corrected(int threads, const ql_s8_kernel *kern, const int8_t *packed_a, int64_t m,
                                 const ql_packed_b *b, const ql_w8a8_epi *e, const float *corr, int64_t group, int64_t k)
{
    const int64_t ng = k / group, kp = ql_kpad(kern, k);
    float *S = ql_aligned_alloc((size_t)(m * ng) * sizeof(float));
    if (!S) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_forward: cannot allocate the group sums");
    /* S[m, g] = Σ_{k in g} x_q[m, k], read back from the packed panels */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t row = 0; row < m; row++) {
        const int8_t *panel = packed_a + (row / kern->mr) * kp * kern->mr;
        const int r = (int)(row % kern->mr);
        float *s = S + row * ng;
        for (int64_t g = 0; g < ng; g++) s[g] = 0.0f;
        for (int64_t pos = 0; pos < kp; pos++) { /* exact: |S| < 2^24 */
            const int64_t kk = ql_a_element(kern->kb, pos);
            if (kk < k) s[kk / group] += (float)panel[ql_a_offset(kern->kb, kern->mr, r, pos)];
        }
    }
    corr_epi ce = {*e, corr, S, b->n, ng};
    ql_status st = ql_gemm_s8_run(threads, kern, packed_a, m, b, corr_epilogue, &ce);
    ql_aligned_free(S);
    return st;
}
