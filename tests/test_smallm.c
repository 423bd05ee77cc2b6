/* The small-M path (N split across threads, whole-K tiles with a row count
 * fitted to M) on every ISA and thread count:
 *  - W8A8 linears bit-identical to the eager reference for M = 1..20 and
 *    around the switch to the blocked path, odd N and K, strided x and y;
 *  - the raw int8 GEMM exact against int64 sums for M = 1..20, with the
 *    extreme codes -128 / 127;
 *  - the float paths (dense fp32, dense bf16, weight-only) give the same bits
 *    for every row whether it runs in a small batch (small-M path) or in a
 *    tall one (the blocked path, checked against float64 in test_linear);
 *  - the dynamic panel split: every weight panel taken exactly once;
 *  - layers larger than the last-level cache (weights from DRAM), W8A8 and
 *    W4A8 packed, M = 1, 16, 77: every ISA and thread count bit-identical
 *    to the generic table;
 *  - the path choice: small-M up to the limit, blocked above it, and (on
 *    both paths) row tiles that never multiply a padded row more than once
 *    per panel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/registry.h"
#include "testutil.h"

/* every ISA this CPU runs, generic first (tu_isas: the registry walked) */
static ql_isa isas[32];
static int n_isas;
static const ql_dtype dts[] = {QL_F32, QL_BF16, QL_F16};

static int64_t odd(int64_t lo, int64_t hi) { return tu_range(lo, hi) | 1; }

static int is_small(ql_linear *lin, int64_t m)
{
    char buf[128];
    ql_linear_describe(lin, m, buf, sizeof buf);
    return strstr(buf, "small-M") != NULL;
}

/* W8A8 against ql_int8_linear_ref, bit for bit; returns whether the small-M
 * path ran. */
static int w8a8_case(ql_context *ctx, int64_t m, int64_t n, int64_t k, int64_t g)
{
    const int64_t ldx = k + tu_range(0, 5), ldy = n + tu_range(0, 5);
    const ql_dtype xdt = dts[tu_range(0, 2)], ydt = dts[tu_range(0, 2)], bdt = dts[tu_range(0, 2)];
    const int with_bias = (int)tu_range(0, 1), with_res = tu_range(0, 3) == 0;
    int8_t *q = malloc((size_t)(n * k));
    float *s = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)(tu_next() & 0xff);
    for (int64_t i = 0; i < n; i++) s[i] = (float)((0.5 + tu_uniform()) * 1e-3);
    void *x = malloc((size_t)(m * ldx) * 4), *bias = malloc((size_t)n * 4), *res = malloc((size_t)(m * ldy) * 4),
         *rs = malloc((size_t)n * 4), *y0 = malloc((size_t)(m * ldy) * 4), *y1 = malloc((size_t)(m * ldy) * 4);
    tu_fill_gauss(xdt, x, m * ldx, 1.0);
    tu_fill_gauss(bdt, bias, n, 0.5);
    tu_fill_gauss(ydt, res, m * ldy, 1.0);
    tu_fill_gauss(ydt, rs, n, 1.0);
    memset(y0, 0x5a, (size_t)(m * ldy) * 4);
    memset(y1, 0x5a, (size_t)(m * ldy) * 4);
    ql_epilogue epi = {.residual = res, .ld_residual = ldy, .residual_scale = rs};
    ql_int8_weight w = {n, k, q, k, s, n, g, with_bias ? bias : NULL, bdt};
    CHECK_OK(ql_int8_linear_ref(&w, x, xdt, m, ldx, y0, ydt, ldy, with_res ? &epi : NULL));
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    int small = 0;
    if (lin) {
        small = is_small(lin, m);
        CHECK_OK(ql_linear_forward(lin, x, xdt, m, ldx, y1, ydt, ldy, with_res ? &epi : NULL));
    }
    /* every byte, the unwritten gaps between rows included */
    const size_t es = ql_dtype_size(ydt);
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldy; j++) {
            const void *a = (const char *)y0 + (size_t)(i * ldy + j) * es, *b = (const char *)y1 + (size_t)(i * ldy + j) * es;
            if (j < n) {
                const float fa = ql_load_f(ydt, y0, i * ldy + j), fb = ql_load_f(ydt, y1, i * ldy + j);
                bad += !(memcmp(a, b, es) == 0 || (isnan(fa) && isnan(fb)));
            } else bad += memcmp(a, b, es) != 0;
        }
    CHECK(bad == 0, "%s t%d %s M=%lld N=%lld K=%lld G=%lld x=%s y=%s bias=%d res=%d: %lld outputs differ from the reference",
          ql_isa_name(ql_context_isa(ctx)), ql_context_threads(ctx), small ? "small-M" : "blocked", (long long)m,
          (long long)n, (long long)k, (long long)g, ql_dtype_name(xdt), ql_dtype_name(ydt), with_bias, with_res,
          (long long)bad);
    ql_linear_destroy(lin);
    free(q); free(s); free(x); free(bias); free(res); free(rs); free(y0); free(y1);
    return small;
}

static void gemm_case(ql_context *ctx, int64_t m, int64_t n, int64_t k, int extremes)
{
    const int64_t lda = k + tu_range(0, 3), ldb = k + tu_range(0, 3), ldc = n + tu_range(0, 3);
    int8_t *a = malloc((size_t)(m * lda)), *b = malloc((size_t)(n * ldb));
    int32_t *c = malloc((size_t)(m * ldc) * 4);
    for (int64_t i = 0; i < m * lda; i++) a[i] = extremes ? (tu_next() & 1 ? 127 : -128) : (int8_t)(tu_next() & 0xff);
    for (int64_t i = 0; i < n * ldb; i++) b[i] = extremes ? (tu_next() & 1 ? 127 : -128) : (int8_t)(tu_next() & 0xff);
    CHECK_OK(ql_gemm_s8s8s32(ctx, m, n, k, a, lda, b, ldb, c, ldc));
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t sum = 0;
            for (int64_t p = 0; p < k; p++) sum += (int64_t)a[i * lda + p] * b[j * ldb + p];
            bad += c[i * ldc + j] != sum;
        }
    CHECK(bad == 0, "%s t%d gemm M=%lld N=%lld K=%lld extremes=%d: %lld wrong", ql_isa_name(ql_context_isa(ctx)),
          ql_context_threads(ctx), (long long)m, (long long)n, (long long)k, extremes, (long long)bad);
    free(a); free(b); free(c);
}

/* A float linear on `tall` rows (blocked path) and the same rows in batches
 * of 1..20 and up to the AVX-512 limit of 80 (small-M path): the same bits. */
static void float_case(ql_context *ctx, const char *what, const ql_linear_desc *d, ql_dtype xdt, ql_dtype ydt, int64_t k,
                       int64_t n)
{
    const int64_t tall = 97, ldx = k + tu_range(0, 5), ldy = n + tu_range(0, 5);
    void *x = malloc((size_t)(tall * ldx) * 4), *y0 = malloc((size_t)(tall * ldy) * 4), *y1 = malloc((size_t)(tall * ldy) * 4);
    tu_fill_gauss(xdt, x, tall * ldx, 1.0);
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, d, &lin));
    if (!lin) { free(x); free(y0); free(y1); return; }
    CHECK(!is_small(lin, tall), "%s: %lld rows took the small-M path", what, (long long)tall);
    CHECK_OK(ql_linear_forward(lin, x, xdt, tall, ldx, y0, ydt, ldy, NULL));
    const size_t es = ql_dtype_size(ydt);
    const int64_t batches[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 33, 48, 77, 80};
    for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
        const int64_t batch = batches[bi];
        memset(y1, 0, (size_t)(tall * ldy) * 4);
        int small = 1;
        for (int64_t r0 = 0; r0 < tall; r0 += batch) {
            const int64_t rows = tall - r0 < batch ? tall - r0 : batch;
            small &= is_small(lin, rows);
            CHECK_OK(ql_linear_forward(lin, ql_row_cptr(xdt, x, r0, ldx), xdt, rows, ldx, ql_row_ptr(ydt, y1, r0, ldy), ydt,
                                       ldy, NULL));
        }
        int64_t bad = 0;
        for (int64_t i = 0; i < tall; i++)
            bad += memcmp((const char *)y0 + (size_t)(i * ldy) * es, (const char *)y1 + (size_t)(i * ldy) * es, (size_t)n * es) != 0;
        CHECK(bad == 0, "%s %s t%d batches of %lld (%s) N=%lld K=%lld x=%s y=%s: %lld rows differ from the tall batch", what,
              ql_isa_name(ql_context_isa(ctx)), ql_context_threads(ctx), (long long)batch, small ? "small-M" : "mixed",
              (long long)n, (long long)k, ql_dtype_name(xdt), ql_dtype_name(ydt), (long long)bad);
    }
    ql_linear_destroy(lin);
    free(x); free(y0); free(y1);
}

static void float_cases(ql_context *ctx)
{
    const int64_t n = odd(1, 150), k = odd(1, 400);
    const ql_dtype xdt = dts[tu_range(0, 2)], ydt = dts[tu_range(0, 2)];
    float *w = malloc((size_t)(n * k) * 4), *s = malloc((size_t)n * 4), *bias = malloc((size_t)n * 4);
    tu_fill_gauss(QL_F32, w, n * k, 0.05);
    tu_fill_gauss(QL_F32, bias, n, 0.5);
    for (int64_t i = 0; i < n; i++) s[i] = (float)((0.5 + tu_uniform()) * 1e-2);
    for (int c = 0; c < 2; c++) {
        ql_linear_desc d = {.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = w, .ld_weight = k, .weight_dtype = QL_F32,
                            .compute_dtype = c ? QL_BF16 : QL_F32, .bias = bias, .bias_dtype = QL_F32};
        float_case(ctx, c ? "dense bf16" : "dense fp32", &d, c ? xdt : QL_F32, ydt, k, n);
    }
    const int64_t g = tu_range(0, 1) ? 256 : 0, kq = g ? 256 * tu_range(1, 2) : k;
    int8_t *q = malloc((size_t)(n * kq));
    for (int64_t i = 0; i < n * kq; i++) q[i] = (int8_t)(tu_next() & 0xff);
    ql_linear_desc d = {.kind = QL_LINEAR_WEIGHT_ONLY, .int8 = {n, kq, q, kq, s, n, g, bias, QL_F32}};
    float_case(ctx, g ? "weight-only G=256" : "weight-only", &d, xdt, ydt, kq, n);
    free(w); free(s); free(bias); free(q);
}

/* The choice: small-M exactly up to a limit, then blocked; the fitted tile
 * height covers M with fewer padded rows than row panels. */
static void test_plan(void)
{
    for (int t = 0; t < ql_cpu_kernels_count(); t++) { /* every built table, run by this CPU or not */
        const ql_cpu_kernels *kt = ql_cpu_kernels_at(t);
        int64_t limit = 0;
        for (int64_t m = 1; m <= 200; m++) {
            const ql_s8_plan p = ql_s8_plan_for(kt, m, 1024, 1024);
            if (p.small && limit == m - 1) limit = m;
            CHECK(p.small == (m <= limit), "%s: M=%lld small=%d after the limit %lld", ql_isa_name(kt->isa), (long long)m,
                  p.small, (long long)limit);
            const ql_s8_kernel *base = kt->s8;
            CHECK(p.kern->nr == base->nr && p.kern->kb == base->kb && p.kern->b_offset128 == base->b_offset128 &&
                      (p.kern->kg ? p.kern->kg : 4) == (base->kg ? base->kg : 4),
                  "%s: %s packs B unlike %s", ql_isa_name(kt->isa), p.kern->name, base->name);
            if (kt->s8_rows) { /* both paths fit the height to the row variants */
                const int64_t panels = (m + p.kern->mr - 1) / p.kern->mr;
                CHECK(p.kern->mr <= kt->s8_rows_max && panels * p.kern->mr - m < panels &&
                          panels == (m + kt->s8_rows_max - 1) / kt->s8_rows_max,
                      "%s: M=%lld runs %lld panels of %s", ql_isa_name(kt->isa), (long long)m, (long long)panels, p.kern->name);
            } else CHECK(p.kern == kt->s8, "%s: M=%lld runs %s", ql_isa_name(kt->isa), (long long)m, p.kern->name);
        }
        CHECK(limit >= 1 && limit < 200, "%s: small-M limit %lld", ql_isa_name(kt->isa), (long long)limit);
        printf("  %s: small-M path up to M = %lld\n", ql_isa_name(kt->isa), (long long)limit);
        const ql_f32_kernel *fk = kt->f32;
        if (!fk->small) { /* no small-M float route: every height runs blocked */
            for (int64_t m = 1; m <= 64; m++) CHECK(!ql_f32_small_m(fk, m, -1), "%s: a small-M route at M=%lld", fk->name, (long long)m);
            continue;
        }
        for (int64_t m = 1; m <= 64; m++) {
            const int rows = ql_f32_small_rows(fk, m);
            const int64_t groups = (m + rows - 1) / rows;
            CHECK(rows >= 1 && rows <= fk->small_rows && groups == (m + fk->small_rows - 1) / fk->small_rows,
                  "%s: float M=%lld in groups of %d", fk->name, (long long)m, rows);
        }
    }
}

/* The small-M path's panel split (ql_panel_next): threads taking panels in
 * a random interleaving get every panel exactly once; each owner walks its
 * static range upward until a thief (taking from the back) meets it. */
static void test_panel_split(void)
{
    for (int c = 0; c < 200; c++) {
        const int threads = (int)tu_range(1, 6);
        const int64_t npanels = tu_range(0, 3) == 0 ? tu_range(0, threads) : tu_range(1, 300);
        ql_panel_range *r = aligned_alloc(64, sizeof *r * (size_t)threads); /* 64-byte aligned type */
        ql_panel_ranges_init(r, npanels, threads);
        int *seen = calloc((size_t)npanels + 1, sizeof(int));
        int64_t *last = malloc(sizeof(int64_t) * (size_t)threads);
        bool *done = calloc((size_t)threads, sizeof(bool));
        for (int t = 0; t < threads; t++) last[t] = -1;
        int64_t taken = 0;
        for (int active = threads; active > 0;) {
            const int t = (int)tu_range(0, threads - 1);
            if (done[t]) continue;
            int64_t jp0, jp1, jp = -1;
            if (!ql_panel_next(r, t, threads, &jp)) {
                done[t] = true;
                active--;
                continue;
            }
            CHECK(jp >= 0 && jp < npanels, "panel split: thread %d of %d got panel %lld of %lld", t, threads, (long long)jp,
                  (long long)npanels);
            if (jp < 0 || jp >= npanels) break;
            seen[jp]++;
            taken++;
            ql_split_panels(npanels, t, threads, &jp0, &jp1);
            if (jp >= jp0 && jp < jp1) { /* its own range: in order */
                CHECK(jp == (last[t] < 0 ? jp0 : last[t] + 1), "panel split: owner %d took %lld after %lld", t, (long long)jp,
                      (long long)last[t]);
                last[t] = jp;
            }
        }
        for (int t = 0; t < threads; t++) {
            int64_t jp;
            CHECK(!ql_panel_next(r, t, threads, &jp), "panel split: a panel left after every thread finished");
        }
        int64_t bad = 0;
        for (int64_t j = 0; j < npanels; j++) bad += seen[j] != 1;
        CHECK(bad == 0 && taken == npanels, "panel split: %lld panels over %d threads: %lld taken, %lld not exactly once",
              (long long)npanels, threads, (long long)taken, (long long)bad);
        free(r);
        free(seen);
        free(last);
        free(done);
    }
}

/* The last-level cache (sysfs; 32 MiB where Linux does not say). */
static size_t llc_bytes(void)
{
    size_t v = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        char buf[64] = "", *end = NULL;
        if (fgets(buf, sizeof buf, f)) v = (size_t)strtoull(buf, &end, 10);
        if (v && end && (*end == 'K' || *end == 'k')) v <<= 10;
        else if (v && end && *end == 'M') v <<= 20;
        fclose(f);
    }
    return v ? v : (size_t)32 << 20;
}

/* One linear (W8A8 or W4A8 packed) on `isa` with t threads: y (fp32). */
static void dram_run(ql_context *ctx, ql_isa isa, int t, const ql_linear_desc *d, const uint16_t *x, int64_t m, float *y,
                     int *small)
{
    CHECK_OK(ql_context_set_isa(ctx, isa));
    CHECK_OK(ql_context_set_threads(ctx, t));
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, d, &lin));
    if (!lin) return;
    *small = is_small(lin, m);
    const int64_t k = d->kind == QL_LINEAR_W8A8 ? d->int8.k : d->wxa8.k, n = d->kind == QL_LINEAR_W8A8 ? d->int8.n : d->wxa8.n;
    memset(y, 0x5a, (size_t)(m * n) * 4);
    CHECK_OK(ql_linear_forward(lin, x, QL_BF16, m, k, y, QL_F32, n, NULL));
    ql_linear_destroy(lin);
}

/* Layers whose weight exceeds the last-level cache (so the small-M path
 * streams it from DRAM: its prefetches run ahead of what the caches hold)
 * at M = 1, 16 and 77 on every ISA and 1..3 threads: bit-identical to the
 * generic table's linear (itself checked against the reference above).
 * W8A8 (int8 weights > 1.5 LLC) and W4A8 packed (codes + scales > 1.1 LLC,
 * decoded into the GEMM). */
static void test_dram_sized(ql_context *ctx)
{
    /* under qemu-user (scripts/test.sh sets QEMU_CPU) the caches are the host's and every
     * instruction is emulated: the same paths over layers sized for a nominal 4 MiB */
    size_t llc = getenv("QEMU_CPU") ? (size_t)4 << 20 : llc_bytes();
    /* an LLC over 64 MiB (Sapphire Rapids' 300-480 MB): layers sized for 64 MiB, which then come
     * from the L3 — the same paths and the same bits — since a 720 MB layer packed for every ISA,
     * thread count and M took 8.5 min here (and far longer under ASan) */
    if (llc > (size_t)64 << 20) llc = (size_t)64 << 20;
    for (int kind = 0; kind < 2; kind++) {
        const int64_t k = 4096, bytes_per_row = kind ? k / 2 + k / 16 : k;
        const size_t wbytes = (size_t)((kind ? 1.1 : 1.5) * (double)llc);
        const int64_t n = (int64_t)(wbytes / (size_t)bytes_per_row + 31) / 32 * 32 + 7;
        const int64_t mmax = 77;
        uint16_t *x = malloc((size_t)(mmax * k) * 2);
        tu_fill_gauss(QL_BF16, x, mmax * k, 1.0);
        int8_t *q = NULL;
        uint8_t *codes = NULL, *srel = NULL;
        float *s = malloc((size_t)n * 4), *bias = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++) s[i] = (float)((0.5 + tu_uniform()) * 1e-3), bias[i] = (float)tu_uniform();
        ql_linear_desc d = {0};
        if (!kind) {
            q = malloc((size_t)(n * k));
            for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)(tu_next() & 0xff);
            d.kind = QL_LINEAR_W8A8;
            d.int8 = (ql_int8_weight){n, k, q, k, s, n, 256, bias, QL_F32};
        } else {
            codes = malloc((size_t)(n * k / 2));
            srel = malloc((size_t)(n * k / 16));
            for (int64_t i = 0; i < n * k / 2; i++) codes[i] = (uint8_t)tu_next();
            for (int64_t i = 0; i < n * k / 16; i++) srel[i] = (uint8_t)(0x40 + tu_range(0, 0x1f)); /* 2 .. 30: clamps */
            d.kind = QL_LINEAR_WXA8_PACKED;
            d.wxa8 = (ql_wxa8_weight){.n = n, .k = k, .bits = 4, .q = codes, .ldq = k / 2, .s_rel = srel, .s_channel = s,
                                      .group = 16, .convrot_group = 256, .bias = bias, .bias_dtype = QL_F32};
        }
        float *y0 = malloc((size_t)(mmax * n) * 4), *y1 = malloc((size_t)(mmax * n) * 4);
        const int64_t ms[] = {1, 16, 77};
        for (int mi = 0; mi < 3; mi++) {
            const int64_t m = ms[mi];
            int small = 0;
            dram_run(ctx, QL_ISA_GENERIC, 2, &d, x, m, y0, &small);
            for (int i = 0; i < n_isas; i++) {
                if (!ql_isa_supported(isas[i])) continue;
                for (int t = 1; t <= 3; t++) {
                    if (isas[i] == QL_ISA_GENERIC && t == 2) continue;
                    dram_run(ctx, isas[i], t, &d, x, m, y1, &small);
                    int64_t bad = 0;
                    for (int64_t j = 0; j < m * n; j++) bad += memcmp(&y0[j], &y1[j], 4) != 0;
                    CHECK(bad == 0, "DRAM-sized %s [%lld x %lld] (%.1f MB, LLC %.1f MB) %s t%d %s M=%lld: %lld outputs differ from generic",
                          kind ? "w4a8-packed" : "w8a8", (long long)n, (long long)k, (double)(n * bytes_per_row) / 1e6,
                          (double)llc / 1e6, ql_isa_name(isas[i]), t, small ? "small-M" : "blocked", (long long)m, (long long)bad);
                }
            }
        }
        free(x); free(q); free(codes); free(srel); free(s); free(bias); free(y0); free(y1);
    }
}

int main(void)
{
    tu_init("test_smallm");
    n_isas = tu_isas(isas);
    test_plan();
    test_panel_split();
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    for (int i = 0; i < n_isas; i++) {
        if (!ql_isa_supported(isas[i])) { printf("  skip %s: not supported by this CPU\n", ql_isa_name(isas[i])); continue; }
        CHECK_OK(ql_context_set_isa(ctx, isas[i]));
        for (int t = 1; t <= 3; t++) {
            CHECK_OK(ql_context_set_threads(ctx, t));
            int smalls = 0, want = 0, blocked = 0;
            for (int64_t m = 1; m <= 20; m++) {
                const int64_t g = m % 2 ? 0 : 256, k = g ? 256 * tu_range(1, 3) : odd(1, 700);
                smalls += w8a8_case(ctx, m, odd(1, 150), k, g);
                want += ql_s8_plan_for(ql_cpu_kernels_for(isas[i]), m, 1, 1).small;
                gemm_case(ctx, m, odd(1, 120), odd(1, 600), m % 5 == 0);
            }
            /* around the switch to the blocked path, and tall */
            for (int64_t m = 21; m <= 70; m += 7) blocked += !w8a8_case(ctx, m, odd(30, 300), 256 * tu_range(1, 2), 256);
            /* heights fitted on both paths (AVX2: 5 × 5 rows, 13 × 6 blocked; AVX-512: 7 × 11 small-M, 9 × 11 blocked),
             * the last over several K slices (partial sums carried by the fitted tiles) */
            const int64_t fitted[] = {25, 77, 97};
            for (int c = 0; c < 3; c++)
                blocked += !w8a8_case(ctx, fitted[c], odd(30, 200), c == 2 ? odd(2100, 4400) : 256 * tu_range(1, 3), c == 2 ? 0 : 256);
            gemm_case(ctx, 25, odd(1, 40), odd(2100, 4400), 1);
            blocked += !w8a8_case(ctx, 300, odd(1, 100), odd(1, 300), 0);
            CHECK(smalls == want && want >= 16 && blocked >= 1, "%s t%d: %d of 20 small cases on the small-M path (want %d), %d blocked",
                  ql_isa_name(isas[i]), t, smalls, want, blocked);
            float_cases(ctx);
        }
    }
    test_dram_sized(ctx);
    ql_context_destroy(ctx);
    return tu_finish();
}
