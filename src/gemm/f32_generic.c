/* The float GEMM driver and its portable reference kernel. */
#include "f32.h"
#include "gemm.h"

#include <omp.h>

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

const ql_f32_kernel ql_f32_gemm_4x16__generic = {"f32_gemm_4x16__generic", 4, 16, tile_4x16_generic, decode_generic,
                                                 "f32_gemv_4x32__generic", 4, small_generic, 16};

/* Up to kern->small_max rows the float paths take the small-M route.
 * AVX-512: measured, QLINEAR_SMALL_M=96 against =0 over `qlinear bench
 * --profile qwen3-te --m 48,64,77,96` (fp32 and weight-only totals, one run
 * each: small-M 0.59-0.90x the blocked time at 48-77 rows, 1.2-1.4x at 96:
 * README); AVX2 and generic: 16, an estimate. */
bool ql_f32_small_m(const ql_f32_kernel *kern, int64_t m, int64_t limit)
{
    return kern->small && m <= (limit >= 0 ? limit : kern->small_max);
}

int ql_f32_small_rows(const ql_f32_kernel *kern, int64_t m)
{
    const int64_t groups = (m + kern->small_rows - 1) / kern->small_rows;
    return (int)((m + groups - 1) / groups);
}

void ql_gemm_f32_small_part(const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m, const ql_packed_f32 *b,
                            int64_t jp0, int64_t jp1, ql_f32_epilogue_fn epi, void *arg)
{
    const int nr = kern->nr, rows = ql_f32_small_rows(kern, m);
    const int64_t k = b->k, pe = k * nr;
    const size_t es = ql_dtype_size(b->dtype);
    _Alignas(64) float c[6 * 64]; /* the largest tile */
    for (int64_t jp = jp0; jp < jp1; jp += 2) {
        const int panels = jp1 - jp >= 2 ? 2 : 1;
        const int64_t n0 = jp * nr;
        const int nr_eff = (int)(b->n - n0 < panels * nr ? b->n - n0 : panels * nr);
        for (int64_t r0 = 0; r0 < m; r0 += rows) {
            const int re = (int)(m - r0 < rows ? m - r0 : rows);
            kern->small(re, panels, k, a + r0 * lda, lda, (const char *)b->data + (size_t)(jp * pe) * es, pe, b->dtype, c);
            epi(arg, c, panels * nr, r0, n0, re, nr_eff);
        }
    }
}

const ql_f32_kernel *ql_f32_kernel_for(ql_isa isa)
{
    switch (isa) {
#if QL_X86
    case QL_ISA_AVX512VNNI: return &ql_f32_gemm_12x32__avx512;
    case QL_ISA_AVXVNNI:
    case QL_ISA_AVX2: return &ql_f32_gemm_6x16__avx2;
#endif
#if QL_ARM64
    case QL_ISA_NEON:
    case QL_ISA_NEONDOT:
    case QL_ISA_I8MM: return &ql_f32_gemm_8x8__neon;
#endif
    default: return &ql_f32_gemm_4x16__generic;
    }
}

ql_status ql_pack_b_float(const ql_f32_kernel *kern, ql_dtype src_dt, const void *w, int64_t n, int64_t k,
                          int64_t ldw, ql_dtype store, int threads, ql_packed_f32 *out)
{
    const int nr = kern->nr;
    ql_packed_f32 b = {n, k, (n + nr - 1) / nr, nr, store, NULL};
    const size_t es = ql_dtype_size(store);
    size_t bytes = (size_t)(b.panels * k * nr) * es;
    b.data = ql_aligned_alloc(bytes);
    if (!b.data) return ql_fail(QL_ERR_OUT_OF_MEMORY, "pack weight: cannot allocate %zu bytes", bytes);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < b.panels; p++)
        for (int j = 0; j < nr; j++) {
            const int64_t col = p * nr + j;
            const size_t base = (size_t)(p * k * nr + j);
            for (int64_t kk = 0; kk < k; kk++) {
                size_t at = base + (size_t)(kk * nr);
                if (store == QL_I8) ((int8_t *)b.data)[at] = col < n ? ((const int8_t *)w)[col * ldw + kk] : 0;
                else ql_store_f(store, b.data, (int64_t)at, col < n ? ql_load_f(src_dt, w, col * ldw + kk) : 0.0f);
            }
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

size_t ql_packed_f32_bytes(const ql_packed_f32 *b)
{
    return b ? (size_t)(b->panels * b->k * b->nr) * ql_dtype_size(b->dtype) : 0;
}

#define QL_F_MC 96
#define QL_F_NC 256
#define QL_F_KC 256

ql_status ql_gemm_f32_run(int threads, const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m,
                          const ql_packed_f32 *b, ql_f32_epilogue_fn epi, void *arg)
{
    const int mr = kern->mr, nr = kern->nr;
    const int64_t k = b->k;
    const int64_t mpanels = (m + mr - 1) / mr, npanels = b->panels;
    int64_t mc = (QL_F_MC + mr - 1) / mr, nc = (QL_F_NC + nr - 1) / nr;
    int64_t mblocks, nblocks;
    ql_block_grid(mpanels, npanels, threads, &mc, &nc, &mblocks, &nblocks);
    const int64_t blocks = mblocks * nblocks;
    const size_t es = ql_dtype_size(b->dtype);
    if (threads > blocks) threads = (int)(blocks > 0 ? blocks : 1);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *cbuf = ql_aligned_alloc((size_t)(mc * nc * mr * nr) * sizeof(float));
        float *bdec = b->dtype == QL_F32 ? NULL : ql_aligned_alloc((size_t)(QL_F_KC * nr) * sizeof(float));
        /* the last partial row panel is copied into zero-padded rows so the
         * kernel never reads past A */
        float *tail = (m % mr) ? ql_aligned_alloc((size_t)(mr * (k > 0 ? k : 1)) * sizeof(float)) : NULL;
        int ok = cbuf && (b->dtype == QL_F32 || bdec) && (!(m % mr) || tail);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        if (ok && tail) {
            memset(tail, 0, (size_t)(mr * k) * sizeof(float));
            for (int64_t r = 0; r < m % mr; r++) memcpy(tail + r * k, a + (m - m % mr + r) * lda, (size_t)k * sizeof(float));
        }
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < blocks; blk++) {
            if (!ok) continue;
            const ql_block bk = ql_block_at(blk, mblocks, mc, nc, mpanels, npanels);
            const int64_t ip0 = bk.ip0, ip1 = bk.ip1, jp0 = bk.jp0, jp1 = bk.jp1;
            for (int64_t pc = 0; pc < k; pc += QL_F_KC) {
                const int64_t kc = k - pc < QL_F_KC ? k - pc : QL_F_KC;
                const int last = pc + kc >= k;
                for (int64_t jp = jp0; jp < jp1; jp++) {
                    const char *bslice = (const char *)b->data + (size_t)(jp * k + pc) * (size_t)nr * es;
                    const float *bf = (const float *)bslice;
                    if (bdec) {
                        kern->decode(b->dtype, bslice, kc * nr, bdec);
                        bf = bdec;
                    }
                    for (int64_t ip = ip0; ip < ip1; ip++) {
                        float *c = cbuf + ((jp - jp0) * mc + (ip - ip0)) * mr * nr;
                        const int64_t m0 = ip * mr, n0 = jp * nr;
                        const int mr_eff = (int)(m - m0 < mr ? m - m0 : mr);
                        if (mr_eff < mr) kern->tile(kc, tail + pc, k, bf, c, pc > 0);
                        else kern->tile(kc, a + m0 * lda + pc, lda, bf, c, pc > 0);
                        if (!last) continue;
                        const int nr_eff = (int)(b->n - n0 < nr ? b->n - n0 : nr);
                        epi(arg, c, nr, m0, n0, mr_eff, nr_eff);
                    }
                }
            }
        }
        ql_aligned_free(cbuf);
        ql_aligned_free(bdec);
        ql_aligned_free(tail);
    }
    if (failed) return ql_fail(QL_ERR_OUT_OF_MEMORY, "float gemm: cannot allocate per-thread buffers");
    return QL_OK;
}
