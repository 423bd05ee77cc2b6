/* The float GEMM driver: packing and the blocked and small-M loops around
 * a table's float micro-kernel. */
#include "cpu/f32.h"
#include "cpu/gemm.h"
#include "cpu/registry.h"

#include <omp.h>

/* Up to kern->small_max rows the float paths take the small-M route
 * (AVX-512: measured with QLINEAR_SMALL_M over `qlinear bench --profile
 * qwen3-te --m 48,64,77,96`, small-M faster up to 77 rows and slower at 96,
 * docs/MEASUREMENTS.md; AVX2 and generic: 16, an estimate). */
bool ql_f32_small_m(const ql_f32_kernel *kern, int64_t m, int64_t limit)
{
    return kern->small && m <= (limit >= 0 ? limit : kern->small_max);
}

int ql_f32_small_panels(const ql_f32_kernel *kern, int64_t m)
{
    return kern->small_wide && ql_f32_small_rows(kern, m) == 1 ? 4 : 2;
}

int ql_f32_small_rows(const ql_f32_kernel *kern, int64_t m)
{
    const int64_t groups = (m + kern->small_rows - 1) / kern->small_rows;
    return (int)((m + groups - 1) / groups);
}

void ql_gemm_f32_small_part(const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m, const ql_packed_f32 *b,
                            int64_t jp0, int64_t jp1, ql_f32_epilogue_fn epi, void *arg)
{
    const int nr = kern->nr, rows = ql_f32_small_rows(kern, m), step = ql_f32_small_panels(kern, m);
    const int64_t k = b->k, pe = b->kp * nr;
    const size_t es = ql_dtype_size(b->dtype);
    _Alignas(64) float c[QL_F32_SMALL_TILE_MAX];
    if (kern->begin) kern->begin(); /* this thread's run of tiles starts */
    for (int64_t jp = jp0; jp < jp1; jp += step) {
        const int panels = jp1 - jp >= step ? step : (int)(jp1 - jp);
        const int64_t n0 = jp * nr;
        const int nr_eff = (int)(b->n - n0 < panels * nr ? b->n - n0 : panels * nr);
        for (int64_t r0 = 0; r0 < m; r0 += rows) {
            const int re = (int)(m - r0 < rows ? m - r0 : rows);
            const float *ar = (const float *)((const char *)a + (size_t)(r0 * lda) * (kern->a_bf16 ? 2 : 4));
            kern->small(re, panels, k, ar, lda, (const char *)b->data + (size_t)(jp * pe) * es, pe, b->dtype, c);
            epi(arg, c, panels * nr, r0, n0, re, nr_eff);
        }
    }
}

ql_status ql_pack_b_float(const ql_f32_kernel *kern, ql_dtype src_dt, const void *w, int64_t n, int64_t k,
                          int64_t ldw, ql_dtype store, int threads, ql_packed_f32 *out)
{
    const int nr = kern->nr, kb = kern->kb ? kern->kb : 1;
    if (kern->kb && store != QL_BF16)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "pack weight: %s takes bf16 weights, not %s", kern->name, ql_dtype_name(store));
    /* tile kernels read whole K blocks: packed bf16 is padded to them (int8
     * codes are decoded per slice, and the decoder pads) */
    const int kal = kern->kb && kern->tile_k > kb ? kern->tile_k : kb;
    const int64_t kp = (k + kal - 1) / kal * kal;
    ql_packed_f32 b = {n, k, (n + nr - 1) / nr, nr, store, NULL, kp};
    const size_t es = ql_dtype_size(store);
    size_t bytes = (size_t)(b.panels * kp * nr) * es;
    b.data = ql_aligned_alloc(bytes);
    if (!b.data) return ql_fail(QL_ERR_OUT_OF_MEMORY, "pack weight: cannot allocate %zu bytes", bytes);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < b.panels; p++)
        for (int j = 0; j < nr; j++) {
            const int64_t col = p * nr + j;
            const size_t base = (size_t)(p * kp * nr + j * kb);
            for (int64_t kk = 0; kk < kp; kk++) { /* element (kk, j) of the panel: [kp/kb][nr][kb] */
                size_t at = base + (size_t)(kk / kb * nr * kb + kk % kb);
                const bool in = col < n && kk < k;
                if (store == QL_I8) ((int8_t *)b.data)[at] = in ? ((const int8_t *)w)[col * ldw + kk] : 0;
                else ql_store_f(store, b.data, (int64_t)at, in ? ql_load_f(src_dt, w, col * ldw + kk) : 0.0f);
            }
        }
    *out = b;
    return QL_OK;
}

void ql_pack_a_bf16_panel(const ql_f32_kernel *kern, const uint16_t *const *rows, int64_t k, int64_t ip, uint16_t *panels)
{
    const int mr = kern->mr;
    if (kern->tile_k) { /* [kp/tk][mr][tk]: row r's block b is row r of the block's A tile */
        const int tk = kern->tile_k;
        const int64_t kp = ql_a_bf16_kp(kern, k);
        uint16_t *d = panels + ip * mr * kp;
        for (int r = 0; r < mr; r++)
            for (int64_t p = 0; p < kp; p += tk) {
                uint16_t *dr = d + (p / tk * mr + r) * tk;
                const int64_t have = rows[r] ? (k - p < tk ? k - p : tk) : 0;
                if (have > 0) memcpy(dr, rows[r] + p, (size_t)have * 2);
                if (have < tk) memset(dr + have, 0, (size_t)(tk - have) * 2);
            }
        return;
    }
    const int64_t k2 = (k + 1) / 2, whole = k / 2;
    uint32_t *d = (uint32_t *)(panels + ip * mr * k2 * 2);
    for (int r = 0; r < mr; r++) {
        const uint16_t *src = rows[r];
        uint32_t *dr = d + r;
        if (!src) {
            for (int64_t p = 0; p < k2; p++) dr[p * mr] = 0;
            continue;
        }
        for (int64_t p = 0; p < whole; p++) memcpy(dr + p * mr, src + 2 * p, 4);
        if (k & 1) dr[whole * mr] = src[k - 1]; /* the pair (k - 1, 0): the low half */
    }
}

void ql_packed_f32_free(ql_packed_f32 *b)
{
    if (!b) return;
    ql_aligned_free(b->data);
    b->data = NULL;
}

size_t ql_packed_f32_bytes(const ql_packed_f32 *b)
{
    return b ? (size_t)(b->panels * b->kp * b->nr) * ql_dtype_size(b->dtype) : 0;
}


ql_status ql_gemm_f32_run(int threads, const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m,
                          const ql_packed_f32 *b, ql_f32_epilogue_fn epi, void *arg)
{
    const int mr = kern->mr, nr = kern->nr;
    const int64_t k = b->k;
    const int64_t mpanels = (m + mr - 1) / mr, npanels = b->panels;
    const ql_blocking bl = ql_cpu_kernels_for(kern->isa)->f32_blocking; /* kc: a multiple of every kb */
    const int64_t fkc = bl.kc;
    int64_t mc = (bl.mc + mr - 1) / mr, nc = (bl.nc + nr - 1) / nr;
    int64_t mblocks, nblocks;
    ql_block_grid(mpanels, npanels, threads, &mc, &nc, &mblocks, &nblocks);
    const int64_t blocks = mblocks * nblocks;
    const size_t es = ql_dtype_size(b->dtype);
    const int64_t kpa = ql_a_bf16_kp(kern, k); /* a_bf16: the packed A panels' K */
    if (threads > blocks) threads = (int)(blocks > 0 ? blocks : 1);
    int failed = 0;
    ql_panel_range ranges[threads]; /* static runs of blocks, then stealing (gemm_s8.c) */
    ql_panel_ranges_init(ranges, blocks, threads);
#pragma omp parallel num_threads(threads)
    {
        float *cbuf = ql_aligned_alloc((size_t)(mc * nc * mr * nr) * sizeof(float));
        const bool decode = b->dtype != QL_F32 && !kern->kb; /* kb kernels read their bf16 blocks in place */
        float *bdec = decode ? ql_aligned_alloc((size_t)(fkc * nr) * sizeof(float)) : NULL;
        /* the last partial row panel is copied into zero-padded rows so the
         * kernel never reads past A (packed bf16 panels are padded already) */
        float *tail = (m % mr) && !kern->a_bf16 ? ql_aligned_alloc((size_t)(mr * (k > 0 ? k : 1)) * sizeof(float)) : NULL;
        int ok = cbuf && (!decode || bdec) && (!(m % mr) || kern->a_bf16 || tail);
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        if (ok && kern->begin) kern->begin(); /* this thread's run of tiles starts */
        if (ok && tail) {
            memset(tail, 0, (size_t)(mr * k) * sizeof(float));
            for (int64_t r = 0; r < m % mr; r++) memcpy(tail + r * k, a + (m - m % mr + r) * lda, (size_t)k * sizeof(float));
        }
        int64_t blk;
        while (ok && ql_panel_next(ranges, omp_get_thread_num(), threads, &blk)) {
            const ql_block bk = ql_block_at(blk, mblocks, mc, nc, mpanels, npanels);
            const int64_t ip0 = bk.ip0, ip1 = bk.ip1, jp0 = bk.jp0, jp1 = bk.jp1;
            for (int64_t pc = 0; pc < k; pc += fkc) {
                const int64_t kc = k - pc < fkc ? k - pc : fkc;
                const int last = pc + kc >= k;
                for (int64_t jp = jp0; jp < jp1; jp++) {
                    /* fkc is a multiple of kb: a slice starts on a block */
                    const char *bslice = (const char *)b->data + (size_t)(jp * b->kp + pc) * (size_t)nr * es;
                    const float *bf = (const float *)bslice;
                    if (bdec) {
                        kern->decode(b->dtype, bslice, kc * nr, bdec);
                        bf = bdec;
                    }
                    for (int64_t ip = ip0; ip < ip1; ip++) {
                        float *c = cbuf + ((jp - jp0) * mc + (ip - ip0)) * mr * nr;
                        const int64_t m0 = ip * mr, n0 = jp * nr;
                        const int mr_eff = (int)(m - m0 < mr ? m - m0 : mr);
                        if (kern->a_bf16) /* packed panel ip, from block pc / (2 or tile_k) on */
                            kern->tile(kc, (const float *)((const uint16_t *)a + ip * mr * kpa + pc * mr), 0, bf, c, pc > 0);
                        else if (mr_eff < mr) kern->tile(kc, tail + pc, k, bf, c, pc > 0);
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
