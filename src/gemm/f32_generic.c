#include "f32.h"

#include <omp.h>

static void tile_4x16_generic(int64_t k, const float *a, int64_t lda, const float *b, float *c)
{
    float acc[4][16] = {{0}};
    for (int64_t p = 0; p < k; p++, b += 16)
        for (int r = 0; r < 4; r++) {
            float av = a[r * lda + p];
            for (int j = 0; j < 16; j++) acc[r][j] += av * b[j];
        }
    memcpy(c, acc, sizeof acc);
}

const ql_f32_kernel ql_f32_gemm_4x16__generic = {"f32_gemm_4x16__generic", 4, 16, tile_4x16_generic};

const ql_f32_kernel *ql_f32_kernel_for(ql_isa isa)
{
    return isa == QL_ISA_AVX512VNNI ? &ql_f32_gemm_12x32__avx512 : &ql_f32_gemm_4x16__generic;
}

ql_status ql_pack_b_f32(const ql_f32_kernel *kern, ql_dtype dt, const void *w, int64_t n, int64_t k, int64_t ldw,
                        ql_packed_f32 *out)
{
    const int nr = kern->nr;
    ql_packed_f32 b = {n, k, (n + nr - 1) / nr, nr, NULL};
    size_t bytes = (size_t)(b.panels * k * nr) * sizeof(float);
    b.data = ql_aligned_alloc(bytes);
    if (!b.data) return ql_fail(QL_ERR_OUT_OF_MEMORY, "pack fp32 weight: cannot allocate %zu bytes", bytes);
    for (int64_t p = 0; p < b.panels; p++)
        for (int j = 0; j < nr; j++) {
            int64_t col = p * nr + j;
            float *dst = b.data + (size_t)(p * k * nr) + j;
            if (col >= n) {
                for (int64_t kk = 0; kk < k; kk++) dst[kk * nr] = 0.0f;
                continue;
            }
            const void *src = ql_row_cptr(dt, w, col, ldw);
            for (int64_t kk = 0; kk < k; kk++) dst[kk * nr] = ql_load_f(dt, src, kk);
        }
    *out = b;
    return QL_OK;
}

void ql_packed_f32_free(ql_packed_f32 *b)
{
    if (!b) return;
    ql_aligned_free(b->data);
    b->data = NULL;
}

ql_status ql_gemm_f32_run(int threads, const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m,
                          const ql_packed_f32 *b, ql_f32_epilogue_fn epi, void *arg)
{
    const int mr = kern->mr, nr = kern->nr;
    const int64_t k = b->k;
    const int64_t mpanels = (m + mr - 1) / mr, npanels = b->panels;
    const int64_t mc = (96 + mr - 1) / mr, nc = (256 + nr - 1) / nr;
    const int64_t mblocks = (mpanels + mc - 1) / mc, nblocks = (npanels + nc - 1) / nc, blocks = mblocks * nblocks;
    if (threads > blocks) threads = (int)(blocks > 0 ? blocks : 1);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float c[32 * 64] __attribute__((aligned(64)));
        /* The last partial row panel is copied into zero-padded rows so the
         * kernel never reads past A. */
        float *tail = (m % mr) ? ql_aligned_alloc((size_t)(mr * (k > 0 ? k : 1)) * sizeof(float)) : NULL;
        if ((m % mr) && !tail) {
#pragma omp atomic write
            failed = 1;
        }
        if (tail) {
            memset(tail, 0, (size_t)(mr * k) * sizeof(float));
            for (int64_t r = 0; r < m % mr; r++) memcpy(tail + r * k, a + (m - m % mr + r) * lda, (size_t)k * sizeof(float));
        }
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < blocks; blk++) {
            if (failed) continue;
            int64_t nb = blk / mblocks, mb = blk % mblocks;
            int64_t jp1 = (nb + 1) * nc < npanels ? (nb + 1) * nc : npanels;
            int64_t ip1 = (mb + 1) * mc < mpanels ? (mb + 1) * mc : mpanels;
            for (int64_t jp = nb * nc; jp < jp1; jp++)
                for (int64_t ip = mb * mc; ip < ip1; ip++) {
                    int64_t m0 = ip * mr, n0 = jp * nr;
                    int mr_eff = (int)(m - m0 < mr ? m - m0 : mr);
                    int nr_eff = (int)(b->n - n0 < nr ? b->n - n0 : nr);
                    if (mr_eff < mr) kern->tile(k, tail, k, b->data + (size_t)(jp * k * nr), c);
                    else kern->tile(k, a + m0 * lda, lda, b->data + (size_t)(jp * k * nr), c);
                    epi(arg, c, nr, m0, n0, mr_eff, nr_eff);
                }
        }
        ql_aligned_free(tail);
    }
    if (failed) return ql_fail(QL_ERR_OUT_OF_MEMORY, "fp32 gemm: cannot allocate scratch");
    return QL_OK;
}
