#include "cpu/gemm.h"
#include "cpu/phase_trace.h"
#include "cpu/registry.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>

const ql_s8_kernel *ql_s8_kernel_rows(const ql_cpu_kernels *kt, int rows)
{
    const int max = kt->s8_rows_max;
    rows = rows < 1 ? 1 : rows > max ? max : rows;
    return kt->s8_rows ? kt->s8_rows[rows - 1] : kt->s8;
}

ql_status ql_pack_b_s8(const ql_s8_kernel *kern, const int8_t *w, int64_t n, int64_t k, int64_t ldw, ql_packed_b *out)
{
    const int nr = kern->nr;
    ql_packed_b b = {n, k, ql_kpad(kern, k) / 4, ql_panels(n, nr), nr, kern->b_offset128, NULL, NULL, NULL, NULL, 0};
    size_t bytes = (size_t)(b.panels * b.k4 * nr * 4);
    b.data = ql_aligned_alloc(bytes);
    if (!b.data) return ql_fail(QL_ERR_OUT_OF_MEMORY, "pack weight: cannot allocate %zu bytes", bytes);
    const uint8_t off = kern->b_offset128 ? 128 : 0;
    const int kg = kern->kg ? kern->kg : 4;
    for (int64_t p = 0; p < b.panels; p++) {
        uint8_t *dst = b.data + (size_t)(p * b.k4 * nr * 4);
        for (int64_t pos = 0; pos < b.k4 * 4; pos++) {
            const int64_t kk = ql_a_element(kern->kb, pos); /* the same k order as A */
            for (int j = 0; j < nr; j++) {
                const int64_t col = p * nr + j;
                const int8_t v = (col < n && kk < k) ? w[col * ldw + kk] : 0;
                dst[((pos / kg) * nr + j) * kg + pos % kg] = (uint8_t)((uint8_t)v + off);
            }
        }
    }
    *out = b;
    return QL_OK;
}

void ql_packed_b_free(ql_packed_b *b)
{
    if (b) ql_aligned_free(b->data);
    if (b) b->data = NULL;
}

void ql_pack_a_s8(const ql_s8_kernel *kern, const int8_t *a, int64_t m, int64_t k, int64_t lda, void *packed,
                  int32_t *rowsum)
{
    const int mr = kern->mr, kb = kern->kb;
    const int64_t kp = ql_kpad(kern, k), panels = ql_panels(m, mr);
    for (int64_t p = 0; p < panels; p++) {
        const size_t base = (size_t)(p * kp * mr);
        for (int r = 0; r < mr; r++) {
            const int64_t row = p * mr + r;
            int32_t sum = 0;
            for (int64_t pos = 0; pos < kp; pos++) {
                const int64_t kk = ql_a_element(kb, pos);
                const int8_t v = (row < m && kk < k) ? a[row * lda + kk] : 0;
                const size_t at = base + ql_a_offset(kb, mr, r, pos);
                if (kern->aes == 2) ((int16_t *)packed)[at] = v;
                else ((int8_t *)packed)[at] = v;
                sum += v;
            }
            if (row < m) rowsum[row] = sum;
        }
    }
}

/* Work is split into blocks of MC rows × NC columns, ordered
 * column-block-major so a thread's consecutive blocks share weight panels.
 * Inside a block, K is walked in slices of KC; for the VNNI kernels each
 * activation panel slice (KC·MR, 24 KiB for 12 rows) stays in L1 while the
 * block's weight micro-panel slices (KC·NR, 64 KiB for 32 columns) stream
 * past it from L2 — 3-13 % faster than the reverse in paired cold-cache
 * runs (AVX-VNNI: 7 %) — and the AVX2 kernel, whose 16 KiB weight slice
 * fits L1, keeps that instead (3-5 %): ql_s8_kernel.a_outer. Partial int32
 * tiles of K > KC wait in a per-thread buffer (MC·NC·4 bytes). KC = 2048
 * beat 512 by 2-5 %. */

/* QLINEAR_S8_BLOCKING=mc,nc,kc[,a|b]: the blocked driver's blocking (and
 * loop order: a = activation panel outer, b = weight panel outer) for every
 * ISA instead of its table's, so a sweep can pick a table's entry on the
 * machine it is for; kc a multiple of 64 (every kernel's K block). Read once;
 * a malformed value is reported once on stderr and ignored. */
typedef struct s8_override {
    bool set;
    ql_blocking bl;
    int order; /* 0: the kernel's; 1: a outer; 2: b outer */
} s8_override;

static s8_override s8_override_parse(void)
{
    s8_override o = {false, {0, 0, 0}, 0};
    const char *v = getenv("QLINEAR_S8_BLOCKING");
    if (!v || !*v) return o;
    char order = 0;
    int n = sscanf(v, "%d,%d,%d,%c", &o.bl.mc, &o.bl.nc, &o.bl.kc, &order);
    if ((n == 3 || (n == 4 && (order == 'a' || order == 'b'))) && o.bl.mc >= 1 && o.bl.nc >= 1 && o.bl.kc >= 64 &&
        o.bl.kc % 64 == 0 && o.bl.mc <= 1 << 16 && o.bl.nc <= 1 << 16 && o.bl.kc <= 1 << 20) {
        o.set = true;
        o.order = n == 4 ? (order == 'a' ? 1 : 2) : 0;
    } else
        fprintf(stderr, "qlinear: QLINEAR_S8_BLOCKING=%s ignored: want mc,nc,kc[,a|b] with kc a multiple of 64\n", v);
    return o;
}

static const s8_override *s8_override_get(void)
{
    static s8_override o;
    static atomic_int state; /* 0: unread, 1: being read, 2: read */
    int expect = 0;
    if (atomic_compare_exchange_strong(&state, &expect, 1)) {
        o = s8_override_parse();
        atomic_store(&state, 2);
    }
    while (atomic_load(&state) != 2) {
    }
    return &o;
}

ql_status ql_gemm_s8_run(int threads, const ql_s8_kernel *kern, const void *packed_a, int64_t m,
                         const ql_packed_b *b, ql_tile_epilogue_fn epi, void *arg)
{
    return ql_gemm_s8_run_pre(threads, kern, packed_a, m, b, NULL, epi, arg);
}

/* Until the prologue has packed row panels [ip0, ip1): a spin, then, should
 * the thread packing them not be running (more threads than cores), yields
 * that let it run. */
static void wait_ready(const ql_gemm_pre *pre, int64_t ip0, int64_t ip1)
{
    for (int spins = 0; !pre->ready(pre->arg, ip0, ip1); spins++)
        if (spins < 4096) ql_cpu_relax();
        else sched_yield();
}

ql_status ql_gemm_s8_run_pre(int threads, const ql_s8_kernel *kern, const void *packed_a, int64_t m,
                             const ql_packed_b *b, const ql_gemm_pre *pre, ql_tile_epilogue_fn epi, void *arg)
{
    const int mr = kern->mr, nr = kern->nr, aes = kern->aes ? kern->aes : 1;
    const s8_override *ov = s8_override_get();
    const ql_blocking bl = ov->set ? ov->bl : ql_cpu_kernels_for(kern->isa)->s8_blocking; /* the kernel's table's */
    /* the int16 kernels widen each weight slice once for the block's rows: b outer only */
    const bool a_outer = ov->order && !kern->tile_b16 ? ov->order == 1 : kern->a_outer;
    const int64_t k4 = b->k4, kc4 = bl.kc / 4;
    const int64_t a_panel = k4 * mr * 4 * aes, b_panel = k4 * nr * 4;
    const int64_t mpanels = ql_panels(m, mr), npanels = b->panels;
    /* K shorter than KC: the block takes more columns (up to 4× NC), so its
     * weight slice keeps the table's size and each activation panel meets
     * more weight panels per visit (6144×256 at M = 1024: +8-12 % on Zen 5) */
    int64_t ncols = bl.nc;
    const ql_cpu_kernels *kt = ql_cpu_kernels_for(kern->isa);
    const int64_t widen = kt->s8_short_k_widen > 0 ? kt->s8_short_k_widen : 4;
    if (a_outer && !ov->set && k4 * 4 < bl.kc) {
        const int64_t f = bl.kc / (k4 * 4);
        ncols *= f < widen ? f : widen;
    }
    /* weights decoded in the GEMM: every block decodes its weight slice once,
     * so a block of 3× the rows decodes each weight a third as often (anima
     * M = 1024 on Zen 5: W4A8 packed 1.01× the int8 layer's time against 1.12×) */
    const int64_t mrows = b->decode && !ov->set ? 3 * (int64_t)bl.mc : bl.mc;
    int64_t mc = (mrows + mr - 1) / mr, nc = (ncols + nr - 1) / nr;
    int64_t mblocks, nblocks;
    ql_block_grid(mpanels, npanels, threads, &mc, &nc, &mblocks, &nblocks);
    const int64_t blocks = mblocks * nblocks;
    if (threads > blocks) threads = (int)(blocks > 0 ? blocks : 1);
    /* K in one slice: each tile's sums go straight to the epilogue, so one
     * tile buffer (L1) serves the whole block; else the block's partial
     * sums wait between slices (MC·NC·4 bytes, L2). Stores into the L2
     * buffer cost the AMX kernel 16 % of its time at M = 1024. */
    const bool one_slice = k4 <= kc4;
    const size_t cbytes = (size_t)(one_slice ? mr * nr : mc * nc * mr * nr) * sizeof(int32_t);
    /* int16 kernels: one widened B micro-panel slice per thread; weights
     * decoded in the GEMM (W4A8/W6A8): the block's decoded K slice */
    const size_t wbytes = kern->tile_b16 ? (size_t)(kc4 * nr * 4) * sizeof(int16_t) : 0;
    const size_t dbytes = b->decode ? (size_t)(nc * (k4 < kc4 ? k4 : kc4) * nr * 4) : 0;
    const char *pa = packed_a;
    int failed = 0;
    /* each thread its static run of blocks first (its L2 keeps what
     * neighbouring blocks share), then blocks from the back of the others'
     * (a thread on a busier core is not waited for at the join) */
    ql_panel_range ranges[threads];
    ql_panel_ranges_init(ranges, blocks, threads);
    ql_phase_trace trace; /* the region's threads write into it: shared, not per thread */
    ql_phase_trace_begin(&trace, threads);
#pragma omp parallel num_threads(threads)
    {
        ql_phase_trace_mark(&trace, omp_get_thread_num(), QL_PT_START);
        int32_t *cbuf = ql_aligned_alloc(cbytes + wbytes + dbytes);
        int16_t *bw = cbuf ? (int16_t *)((char *)cbuf + cbytes) : NULL;
        uint8_t *dbuf = cbuf ? (uint8_t *)cbuf + cbytes + wbytes : NULL;
        if (!cbuf) {
#pragma omp atomic write
            failed = 1;
        }
        if (pre) {
            pre->run(pre->arg, omp_get_thread_num(), omp_get_num_threads());
            ql_phase_trace_mark(&trace, omp_get_thread_num(), QL_PT_PRE);
            if (!pre->ready) {
#pragma omp barrier
            }
        } else
            ql_phase_trace_mark(&trace, omp_get_thread_num(), QL_PT_PRE);
        ql_phase_trace_mark(&trace, omp_get_thread_num(), QL_PT_BARRIER);
        ql_s8_begin(kern);
        int64_t blk;
        while (cbuf && ql_panel_next(ranges, omp_get_thread_num(), threads, &blk)) {
            const ql_block bk = ql_block_at(blk, mblocks, mc, nc, mpanels, npanels);
            if (pre && pre->ready) wait_ready(pre, bk.ip0, bk.ip1);
            for (int64_t pc = 0; pc < k4; pc += kc4) {
                const int64_t kc = k4 - pc < kc4 ? k4 - pc : kc4;
                const int last = pc + kc >= k4;
                const int64_t ni = bk.ip1 - bk.ip0, nj = bk.jp1 - bk.jp0;
                if (b->decode) b->decode(b->src, bk.jp0, bk.jp1, pc, kc, dbuf);
                for (int64_t t = 0; t < ni * nj; t++) {
                    const int64_t ip = bk.ip0 + (a_outer ? t / nj : t % ni);
                    const int64_t jp = bk.jp0 + (a_outer ? t % nj : t / ni);
                    int32_t *c = one_slice ? cbuf : cbuf + ((jp - bk.jp0) * mc + (ip - bk.ip0)) * mr * nr;
                    const int8_t *a = (const int8_t *)(pa + ip * a_panel + pc * mr * 4 * aes);
                    const uint8_t *bs = b->decode ? dbuf + (jp - bk.jp0) * kc * nr * 4 : b->data + jp * b_panel + pc * nr * 4;
                    if (kern->tile_b16) { /* B weight-stationary (a_outer false): widen once per slice */
                        if (ip == bk.ip0) kern->widen((const int8_t *)bs, bw, kc * nr * 4);
                        kern->tile_b16(kc, a, (const uint8_t *)bw, c, pc > 0);
                    } else kern->tile(kc, a, bs, c, pc > 0);
                    if (!last) continue;
                    const int64_t m0 = ip * mr, n0 = jp * nr;
                    const int mr_eff = (int)(m - m0 < mr ? m - m0 : mr);
                    const int nr_eff = (int)(b->n - n0 < nr ? b->n - n0 : nr);
                    epi(arg, c, nr, m0, n0, mr_eff, nr_eff);
                }
            }
        }
        ql_phase_trace_mark(&trace, omp_get_thread_num(), QL_PT_END);
        ql_aligned_free(cbuf);
    }
    ql_phase_trace_end(&trace, m, b->n, k4 * 4, pre != NULL);
    if (failed) return ql_fail(QL_ERR_OUT_OF_MEMORY, "int8 gemm: cannot allocate %zu bytes of tile buffer", cbytes + wbytes + dbytes);
    return QL_OK;
}

/* ---- small M */

void ql_split_panels(int64_t npanels, int t, int threads, int64_t *jp0, int64_t *jp1)
{
    *jp0 = npanels * t / threads;
    *jp1 = npanels * (t + 1) / threads;
}

void ql_panel_ranges_init(ql_panel_range *r, int64_t npanels, int threads)
{
    for (int t = 0; t < threads; t++) {
        int64_t jp0, jp1;
        ql_split_panels(npanels, t, threads, &jp0, &jp1);
        atomic_init(&r[t].lohi, (uint64_t)jp1 << 32 | (uint64_t)jp0);
    }
}

bool ql_panel_next(ql_panel_range *r, int t, int threads, int64_t *jp)
{
    for (int i = 0; i < threads; i++) {
        _Atomic uint64_t *x = &r[(t + i) % threads].lohi;
        uint64_t v = atomic_load_explicit(x, memory_order_relaxed);
        for (;;) {
            const uint64_t lo = v & 0xFFFFFFFFu, hi = v >> 32;
            if (lo >= hi) break;
            /* the owner takes its next panel, a thief the last one */
            const uint64_t want = i == 0 ? hi << 32 | (lo + 1) : (hi - 1) << 32 | lo;
            if (atomic_compare_exchange_weak_explicit(x, &v, want, memory_order_relaxed, memory_order_relaxed)) {
                *jp = (int64_t)(i == 0 ? lo : hi - 1);
                return true;
            }
        }
    }
    return false;
}

void ql_gemm_s8_small_shared(const ql_s8_kernel *kern, const void *packed_a, int64_t m, const ql_packed_b *b,
                             ql_panel_range *ranges, int t, int threads, ql_tile_epilogue_fn epi, void *arg)
{
    int64_t jp;
    while (ql_panel_next(ranges, t, threads, &jp)) ql_gemm_s8_small_part(kern, packed_a, m, b, jp, jp + 1, epi, arg);
}

/* Weights decoded inside the GEMM (W4A8/W6A8) on the small-M path: each
 * panel's K in slices of QL_SMALL_DECODE_KC k4 rows (16 KiB at NR = 32:
 * L1), decoded once into a per-thread buffer, then every row panel's tile
 * over the slice, its sums kept in a per-panel buffer between slices. */
#define QL_SMALL_DECODE_KC 128
#define QL_SMALL_DECODE_PANELS 8 /* row panels whose sums live on the stack */
static void small_part_decoded(const ql_s8_kernel *kern, const void *packed_a, int64_t m, const ql_packed_b *b,
                               int64_t jp0, int64_t jp1, ql_tile_epilogue_fn epi, void *arg)
{
    const int mr = kern->mr, nr = kern->nr, aes = kern->aes ? kern->aes : 1;
    const int64_t k4 = b->k4, a_panel = k4 * mr * 4 * aes, mpanels = ql_panels(m, mr);
    /* a slice a whole number of the kernel's A blocks (kb / 4 k4 rows) */
    const int64_t step = kern->kb / 4 > 0 ? kern->kb / 4 : 1;
    const int64_t kc_max = (QL_SMALL_DECODE_KC + step - 1) / step * step;
    _Alignas(64) uint8_t dbuf[QL_SMALL_DECODE_KC * 64 * 4 + 64 * 64];
    _Alignas(64) int32_t cstack[QL_SMALL_DECODE_PANELS * QL_S8_TILE_MAX];
    int32_t *c = mpanels <= QL_SMALL_DECODE_PANELS ? cstack : ql_aligned_alloc(sizeof(int32_t) * (size_t)(mpanels * QL_S8_TILE_MAX));
    if (!c || (size_t)(kc_max * nr * 4) > sizeof dbuf) { /* cannot happen for the tables' kernels (nr <= 64) */
        if (c != cstack) ql_aligned_free(c);
        return;
    }
    ql_s8_begin(kern);
    for (int64_t jp = jp0; jp < jp1; jp++) {
        const int64_t n0 = jp * nr;
        const int nr_eff = (int)(b->n - n0 < nr ? b->n - n0 : nr);
        for (int64_t pc = 0; pc < k4; pc += kc_max) {
            const int64_t kc = k4 - pc < kc_max ? k4 - pc : kc_max;
            b->decode(b->src, jp, jp + 1, pc, kc, dbuf);
            for (int64_t ip = 0; ip < mpanels; ip++)
                kern->tile(kc, (const int8_t *)((const char *)packed_a + ip * a_panel + pc * mr * 4 * aes), dbuf,
                           c + ip * QL_S8_TILE_MAX, pc > 0);
        }
        for (int64_t ip = 0; ip < mpanels; ip++) {
            const int64_t m0 = ip * mr;
            epi(arg, c + ip * QL_S8_TILE_MAX, nr, m0, n0, (int)(m - m0 < mr ? m - m0 : mr), nr_eff);
        }
    }
    if (c != cstack) ql_aligned_free(c);
}

void ql_gemm_s8_small_part(const ql_s8_kernel *kern, const void *packed_a, int64_t m, const ql_packed_b *b,
                           int64_t jp0, int64_t jp1, ql_tile_epilogue_fn epi, void *arg)
{
    _Alignas(64) int32_t rc[16 * 32];
    if (b->rows && m <= b->rows_max && m * kern->nr <= (int64_t)(sizeof rc / sizeof rc[0])) {
        /* decoded in registers: a few rows against each panel */
        int32_t *c = rc;
        const int mr = kern->mr, nr = kern->nr;
        for (int64_t jp = jp0; jp < jp1; jp++) {
            b->rows(b->src, packed_a, mr, m, jp, c);
            const int64_t n0 = jp * nr;
            const int nr_eff = (int)(b->n - n0 < nr ? b->n - n0 : nr);
            for (int64_t m0 = 0; m0 < m; m0 += mr)
                epi(arg, c + m0 * nr, nr, m0, n0, (int)(m - m0 < mr ? m - m0 : mr), nr_eff);
        }
        return;
    }
    if (b->decode) {
        small_part_decoded(kern, packed_a, m, b, jp0, jp1, epi, arg);
        return;
    }
    const int mr = kern->mr, nr = kern->nr, aes = kern->aes ? kern->aes : 1;
    const int64_t k4 = b->k4, a_panel = k4 * mr * 4 * aes, b_panel = k4 * nr * 4;
    const int64_t mpanels = ql_panels(m, mr);
    _Alignas(64) int32_t c[QL_S8_TILE_MAX];
    ql_s8_begin(kern);
    for (int64_t jp = jp0; jp < jp1; jp++) {
        const int64_t n0 = jp * nr;
        const int nr_eff = (int)(b->n - n0 < nr ? b->n - n0 : nr);
        for (int64_t ip = 0; ip < mpanels; ip++) {
            kern->tile(k4, (const int8_t *)((const char *)packed_a + ip * a_panel), b->data + jp * b_panel, c, 0);
            const int64_t m0 = ip * mr;
            epi(arg, c, nr, m0, n0, (int)(m - m0 < mr ? m - m0 : mr), nr_eff);
        }
    }
}

ql_s8_plan ql_s8_plan_for(const ql_cpu_kernels *kt, int64_t m, int64_t n, int64_t k)
{
    return ql_s8_plan_limit(kt, m, n, k, -1);
}

ql_s8_plan ql_s8_plan_limit(const ql_cpu_kernels *kt, int64_t m, int64_t n, int64_t k, int64_t limit)
{
    (void)n;
    (void)k;
    /* both paths fit the tile height to M: ceil(M / max) panels of equal
     * height (M = 77: 7 × 11 rows, not 7 × 12 with 7 padded rows) */
    const int64_t max = kt->s8_rows_max, mm = m > 0 ? m : 1, panels = (mm + max - 1) / max;
    const ql_s8_kernel *fitted = ql_s8_kernel_rows(kt, (int)((mm + panels - 1) / panels));
    return (ql_s8_plan){fitted, m <= (limit >= 0 ? limit : kt->small_m)};
}

ql_status ql_gemm_s8_exec(int threads, ql_s8_plan plan, const void *packed_a, int64_t m, const ql_packed_b *b,
                          ql_tile_epilogue_fn epi, void *arg)
{
    if (!plan.small) return ql_gemm_s8_run(threads, plan.kern, packed_a, m, b, epi, arg);
    if (threads > b->panels) threads = (int)(b->panels > 0 ? b->panels : 1);
    if (threads <= 1) {
        ql_gemm_s8_small_part(plan.kern, packed_a, m, b, 0, b->panels, epi, arg);
        return QL_OK;
    }
    ql_panel_range *ranges = ql_aligned_alloc(sizeof(ql_panel_range) * (size_t)threads);
    if (!ranges) return ql_fail(QL_ERR_OUT_OF_MEMORY, "int8 gemm: cannot allocate %d panel ranges", threads);
    ql_panel_ranges_init(ranges, b->panels, threads);
#pragma omp parallel num_threads(threads)
    ql_gemm_s8_small_shared(plan.kern, packed_a, m, b, ranges, omp_get_thread_num(), omp_get_num_threads(), epi, arg);
    ql_aligned_free(ranges);
    return QL_OK;
}
