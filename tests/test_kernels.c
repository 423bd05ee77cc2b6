/* Every CPU kernel table the registry holds, entry by entry, against the
 * generic table (its twins) on random data from the seed: no ISA is named
 * here, so a new table is tested without a test edit. For each table
 * i < ql_cpu_kernels_count() that ql_isa_supported(kt->isa):
 *  - sanity (every built table, run or not): s8_rows_max >= 1; every row
 *    variant shares the main kernel's nr, kb, kg, aes, b_offset128 and isa
 *    (and is the r-row one where s8_rows is set); the tiles fit the drivers'
 *    stack buffers; blocking > 0, s8 kc a multiple of 4 and of each s8
 *    kernel's kb, f32 kc of each float kernel's kb; the kernels the pipeline
 *    pairs (s8_decoded: c4 int8 panels of 8-column chunks; s8_int8_a: int8 A);
 *  - s8 (main), every row variant ql_s8_kernel_rows(kt, r), s8_decoded,
 *    s8_int8_a: exact int32 C = A·Bᵀ against int64 sums through
 *    ql_pack_b_s8 / ql_pack_a_s8 (int16 A for aes = 2) and ql_gemm_s8_exec,
 *    small-M and blocked, 1 and 2 threads, the kernel's table's epilogue in
 *    raw mode (c_out), K across KC slices, full-range, all -128 and ±extreme
 *    codes, the tails of 32×32 tiles (M 1..64, N 1..96, K 1..3000 with
 *    non-multiples of 4 and 64); the gaps between C rows untouched;
 *  - prologue: the same sx bits, rowsum and code at every (row, k) as the
 *    generic prologue, padding columns and rows >= m zero, sx/rowsum past m
 *    untouched, nothing written past the panels; rows split over several
 *    calls; fp32/fp16/bf16, group 0 and every ql_group_valid group up to
 *    1024, K not a multiple of kb; NaN/Inf rows, rows rotating to Inf,
 *    zero, denormal and outlier rows;
 *  - w8a8_epilogue: the same output bits (or raw int32) as the generic one
 *    on one tile of the table's s8 mr×nr (partial mr_eff/nr_eff too) with
 *    bias, residual + residual_scale, GELU, LoRA term, each output dtype,
 *    finite_weights both ways, offset128 = the kernel's b_offset128, NaN,
 *    tiny and huge row scales, full-width tiles with one row whose outputs
 *    are denormal (the fast paths' per-row checks); and on the taller
 *    tiles of another built table sharing the epilogue (amx's 32 rows on
 *    avx512vnni's);
 *  - f32_epilogue: the same bits as ql_f32_epilogue_generic on fp32 tiles
 *    (NaN/Inf/denormal sums) with col_scale none / scalar / per column;
 *  - f32 and bf16 kernels with kb = 0 (weights stored fp32, bf16, int8):
 *    within a float64 bound (below), and the small-M path bit-identical to
 *    the blocked one where the kernel has one; kb = 4 (BFMMLA layout):
 *    bit-identical to ql_bf16_gemm_8x8c4__generic through the same driver;
 *    the VDPBF16PS kernels (a_bf16: bf16 and wo_bf16 entries) bit-identical
 *    to their twins (generic/bf16_generic.c), blocked and small-M; the tile
 *    kernels (a_bf16 with tile_k: AMX-BF16) within the TDPBF16PS float64
 *    bound (test_bf16), blocked (1, 2 threads, K across slices) and small-M
 *    bit-identical to each other, M/N/K tails of the 32×32×32 tile, NaN/Inf
 *    and denormal activations (their bits beside the SDM model's: counted);
 *  - input_act_row: every activation, dtype and weight dtype, K 1..80 and
 *    odd larger K (rms_norm's cascade past 16 and 256 blocks), rows of the
 *    special kinds above plus values at the exp/tanh clamps and the tanh
 *    polynomial's edge, written into a buffer whose gap past K must stay;
 *  - rows_to_f32, quantize_rows, sr_row, lowrank_add, wxa8_decode (panels
 *    of the table's s8_decoded from library-quantized and random W4A8/W6A8
 *    weights), lora_t_row (where kt->s8 has kb 64, nr 32, aes 1): bit for
 *    bit against the generic entry (NaN: any NaN, payloads are counted);
 *    signed zeros count: rows_to_f32 also gets a fixed row of
 *    (-0, -0, +0, +0, ...), whose rotation has -0 in the generic order.
 * An entry that is the generic one itself is reported "same as generic"
 * and not compared. About 1 s natively, a few seconds under qemu. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cpu/generic/generic.h"
#include "cpu/registry.h"
#include "cpu/wxa8_panels.h"
#include "quant/quant.h"
#include "quant/wxa8.h"
#include "testutil.h"

static const ql_cpu_kernels *gen; /* the generic table: the twins */
static const char *tname;         /* the table under test */
static int64_t nan_payloads;      /* outputs where both sides are NaN with different bits */

static const ql_dtype dts[3] = {QL_F32, QL_F16, QL_BF16};
static const int64_t groups[] = {0, 4, 16, 64, 256, 1024};
#define NGROUPS ((int)(sizeof groups / sizeof groups[0]))

/* 64-byte aligned, exactly `bytes` long (so ASan sees an overrun) */
static void *xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) {
        printf("out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static int same_f(float a, float b)
{
    if (fbits(a) == fbits(b)) return 1;
    if (isnan(a) && isnan(b)) return nan_payloads++, 1;
    return 0;
}
/* element i of two dtype buffers: same bytes, or both NaN */
static int same_elem(ql_dtype dt, const void *a, const void *b, int64_t i)
{
    const size_t es = ql_dtype_size(dt);
    if (!memcmp((const char *)a + (size_t)i * es, (const char *)b + (size_t)i * es, es)) return 1;
    const float x = ql_load_f(dt, a, i), y = ql_load_f(dt, b, i);
    if (isnan(x) && isnan(y)) return nan_payloads++, 1;
    return 0;
}
static int is_nan_f(float v) { return v != v; }

/* ------------------------------------------------------------ test rows */

enum { ROW_NORMAL, ROW_NAN, ROW_INF, ROW_HUGE, ROW_ZERO, ROW_TINY, ROW_OUTLIER, ROW_KINDS };
static const char *const row_kind_names[ROW_KINDS] = {"normal", "NaN", "Inf", "huge", "zero", "denormal", "outlier"};

static int pick_row_kind(void) { return tu_range(0, 9) < 6 ? ROW_NORMAL : (int)tu_range(1, ROW_KINDS - 1); }

/* One row of k values of dt at x + base: Gaussian of a random scale, or a
 * special row: a NaN, an Inf, values near the dtype's maximum (finite, but
 * a rotation overflows them), zeros, denormals, one outlier. */
static void fill_row(ql_dtype dt, void *x, int64_t base, int64_t k, int kind)
{
    const int e = dt == QL_F16 ? (int)tu_range(-8, 4) : (int)tu_range(-20, 20);
    for (int64_t j = 0; j < k; j++) {
        double v;
        if (kind == ROW_HUGE) v = (dt == QL_F16 ? 60000.0 : 3.0e38) * (0.6 + 0.4 * tu_uniform()) * (tu_next() & 1 ? 1 : -1);
        else if (kind == ROW_ZERO) v = tu_next() & 1 ? 0.0 : -0.0;
        else if (kind == ROW_TINY) v = ldexp(tu_gauss(), dt == QL_F16 ? -20 : -136);
        else v = ldexp(tu_gauss(), e);
        ql_store_f(dt, x, base + j, (float)v);
    }
    const int64_t at = tu_range(0, k - 1);
    if (kind == ROW_NAN) ql_store_f(dt, x, base + at, NAN);
    if (kind == ROW_INF) ql_store_f(dt, x, base + at, tu_next() & 1 ? INFINITY : -INFINITY);
    if (kind == ROW_OUTLIER) ql_store_f(dt, x, base + at, (float)ldexp(3.0, e + (dt == QL_F16 ? 6 : 12)));
}

/* m rows of k values, row stride ldx; the gap past k holds NaN (a read past
 * the row would show). kinds (may be NULL) gets each row's kind. */
static void *make_rows(ql_dtype dt, int64_t m, int64_t k, int64_t ldx, int *kinds, int specials)
{
    void *x = malloc((size_t)(m * ldx) * ql_dtype_size(dt) + 1);
    for (int64_t r = 0; r < m; r++) {
        const int kind = specials ? pick_row_kind() : ROW_NORMAL;
        if (kinds) kinds[r] = kind;
        fill_row(dt, x, r * ldx, k, kind);
        for (int64_t j = k; j < ldx; j++) ql_store_f(dt, x, r * ldx + j, NAN);
    }
    return x;
}

static int64_t k_for_group(int64_t g, int c, int kb)
{
    if (g == 0) {
        static const int64_t fixed[] = {1, 3, 17};
        if (c < 3) return fixed[c];
        if (c == 3) return kb + 1;
        return tu_range(1, 700);
    }
    const int64_t maxmul = 2048 / g > 0 ? 2048 / g : 1;
    return g * (c == 0 ? 1 : tu_range(1, maxmul));
}

/* --------------------------------------------------------- table sanity */

static int s8_seen(const ql_s8_kernel *const *list, int n, const ql_s8_kernel *k)
{
    for (int i = 0; i < n; i++)
        if (list[i] == k) return 1;
    return 0;
}

/* The distinct s8 kernels of a table: main, row variants, decoded, int8_a. */
static int table_s8_kernels(const ql_cpu_kernels *kt, const ql_s8_kernel *out[40])
{
    int n = 0;
    out[n++] = kt->s8;
    for (int r = 1; r <= kt->s8_rows_max && n < 38; r++) {
        const ql_s8_kernel *k = ql_s8_kernel_rows(kt, r);
        if (k && !s8_seen(out, n, k)) out[n++] = k;
    }
    if (kt->s8_decoded && !s8_seen(out, n, kt->s8_decoded)) out[n++] = kt->s8_decoded;
    if (kt->s8_int8_a && !s8_seen(out, n, kt->s8_int8_a)) out[n++] = kt->s8_int8_a;
    return n;
}

static void check_s8_kernel(const ql_s8_kernel *k, const char *role)
{
    const int kg = k->kg ? k->kg : 4, aes = k->aes ? k->aes : 1;
    CHECK(k->name && k->tile, "%s %s: a kernel without name or tile", tname, role);
    CHECK(k->mr >= 1 && k->nr >= 1 && k->mr * k->nr <= QL_S8_TILE_MAX,
          "%s %s %s: %dx%d tile exceeds the drivers' %d-element tile buffers", tname, role, k->name, k->mr, k->nr,
          QL_S8_TILE_MAX);
    CHECK(k->kb == 4 || k->kb == 8 || k->kb == 32 || k->kb == 64, "%s %s %s: kb %d", tname, role, k->name, k->kb);
    CHECK(kg == 2 || kg == 4 || kg == 8, "%s %s %s: kg %d", tname, role, k->name, kg);
    CHECK(aes == 1 || (aes == 2 && k->tile_b16 && k->widen), "%s %s %s: aes %d (int16 needs tile_b16 and widen)", tname, role,
          k->name, aes);
    const ql_cpu_kernels *own = ql_cpu_kernels_for(k->isa);
    CHECK(own != NULL, "%s %s %s: its isa %s has no table in this build", tname, role, k->name, ql_isa_name(k->isa));
    if (!own) return;
    const int blk = k->kb > 4 ? k->kb : 4;
    CHECK(own->s8_blocking.kc % blk == 0, "%s %s %s: its table's s8 kc %d is not a multiple of max(4, kb %d)", tname, role,
          k->name, own->s8_blocking.kc, k->kb);
}

static void check_f32_kernel(const ql_cpu_kernels *kt, const ql_f32_kernel *k, const char *role)
{
    CHECK(k && k->name && k->tile, "%s %s: missing kernel or tile", tname, role);
    if (!k) return;
    CHECK(k->mr >= 1 && k->nr >= 1, "%s %s %s: tile %dx%d", tname, role, k->name, k->mr, k->nr);
    CHECK(k->kb == 0 || k->kb == 4 || (k->kb == 2 && k->a_bf16), "%s %s %s: kb %d (a_bf16 %d)", tname, role, k->name, k->kb,
          k->a_bf16);
    CHECK(k->kb || k->decode, "%s %s %s: a kb-0 kernel needs a decoder (bf16 / int8 slices)", tname, role, k->name);
    CHECK(!k->tile_k || (k->a_bf16 && k->tile_k % 2 == 0 && k->mr <= 32), "%s %s %s: tile_k %d needs bf16 A, even, mr <= 32",
          tname, role, k->name, k->tile_k);
    CHECK(!k->a_bf16 || k->mr <= 32, "%s %s %s: %d rows exceed the A panel packers' 32", tname, role, k->name, k->mr);
    if (k->small)
        CHECK(k->small_name && k->small_rows >= 1 && k->small_rows * (k->small_wide ? 4 : 2) * k->nr <= QL_F32_SMALL_TILE_MAX,
              "%s %s %s: small tile %d rows x %dx%d exceeds the driver's buffer of %d", tname, role, k->name, k->small_rows,
              k->small_wide ? 4 : 2, k->nr, QL_F32_SMALL_TILE_MAX);
    const int kb = k->kb ? k->kb : 1;
    const ql_cpu_kernels *own = ql_cpu_kernels_for(k->isa);
    CHECK(own != NULL, "%s %s %s: its isa %s has no table", tname, role, k->name, ql_isa_name(k->isa));
    if (own) CHECK(own->f32_blocking.kc % kb == 0, "%s %s %s: its table's f32 kc %d not a multiple of kb %d", tname, role, k->name,
                   own->f32_blocking.kc, kb);
    CHECK(kt->f32_blocking.kc % kb == 0, "%s %s %s: f32 kc %d not a multiple of kb %d", tname, role, k->name,
          kt->f32_blocking.kc, kb);
    if (own && k->tile_k) /* the driver slices K by its table's kc: whole tile blocks */
        CHECK(own->f32_blocking.kc % k->tile_k == 0, "%s %s %s: its table's f32 kc %d not a multiple of tile_k %d", tname, role,
              k->name, own->f32_blocking.kc, k->tile_k);
}

static void check_sanity(const ql_cpu_kernels *kt)
{
    CHECK(kt->s8 && kt->s8_rows_max >= 1, "%s: no s8 kernel or s8_rows_max %d < 1", tname, kt->s8_rows_max);
    if (!kt->s8) return;
    const ql_s8_kernel *m = kt->s8;
    check_s8_kernel(m, "s8");
    for (int r = 1; r <= kt->s8_rows_max; r++) {
        const ql_s8_kernel *k = ql_s8_kernel_rows(kt, r);
        CHECK(k != NULL, "%s: no %d-row variant", tname, r);
        if (!k) continue;
        char role[32];
        snprintf(role, sizeof role, "s8_rows[%d]", r - 1);
        check_s8_kernel(k, role);
        CHECK(k->nr == m->nr && k->kb == m->kb && (k->kg ? k->kg : 4) == (m->kg ? m->kg : 4) &&
                  (k->aes ? k->aes : 1) == (m->aes ? m->aes : 1) && k->b_offset128 == m->b_offset128 && k->isa == m->isa,
              "%s: %d-row variant %s does not share %s's nr/kb/kg/aes/b_offset128/isa (%d/%d/%d/%d/%d/%d vs %d/%d/%d/%d/%d/%d)",
              tname, r, k->name, m->name, k->nr, k->kb, k->kg, k->aes, k->b_offset128, (int)k->isa, m->nr, m->kb, m->kg, m->aes,
              m->b_offset128, (int)m->isa);
        if (kt->s8_rows) CHECK(k->mr == r, "%s: s8_rows[%d] = %s has %d rows", tname, r - 1, k->name, k->mr);
    }
    CHECK(kt->s8_blocking.mc > 0 && kt->s8_blocking.nc > 0 && kt->s8_blocking.kc > 0 && kt->s8_blocking.kc % 4 == 0,
          "%s: s8 blocking %d/%d/%d", tname, kt->s8_blocking.mc, kt->s8_blocking.nc, kt->s8_blocking.kc);
    CHECK(kt->f32_blocking.mc > 0 && kt->f32_blocking.nc > 0 && kt->f32_blocking.kc > 0, "%s: f32 blocking %d/%d/%d", tname,
          kt->f32_blocking.mc, kt->f32_blocking.nc, kt->f32_blocking.kc);
    CHECK(kt->small_m >= 0, "%s: small_m %lld", tname, (long long)kt->small_m);
    CHECK(kt->s8_decoded && kt->s8_int8_a, "%s: s8_decoded / s8_int8_a unresolved", tname);
    if (kt->s8_decoded) {
        const ql_s8_kernel *d = kt->s8_decoded;
        check_s8_kernel(d, "s8_decoded");
        const int kg = d->kg ? d->kg : 4, aes = d->aes ? d->aes : 1;
        CHECK((kg == 4 && aes == 1) || (kg == 2 && aes == 2), "%s: s8_decoded %s must take k in quads of int8 A or in pairs "
              "of int16 A, as the decoders write (kg %d aes %d)", tname, d->name, kg, aes);
        CHECK(d->nr % 8 == 0, "%s: s8_decoded %s: the packed panels hold 8-column chunks (nr %d)", tname, d->name, d->nr);
    }
    if (kt->s8_int8_a) {
        check_s8_kernel(kt->s8_int8_a, "s8_int8_a");
        CHECK((kt->s8_int8_a->aes ? kt->s8_int8_a->aes : 1) == 1, "%s: s8_int8_a %s has int16 A", tname, kt->s8_int8_a->name);
    }
    check_f32_kernel(kt, kt->f32, "f32");
    check_f32_kernel(kt, kt->bf16, "bf16");
    if (kt->wo_bf16) { /* reads f32's int8 packing */
        check_f32_kernel(kt, kt->wo_bf16, "wo_bf16");
        CHECK(kt->wo_bf16->nr == kt->f32->nr && !kt->wo_bf16->kb && kt->wo_bf16->a_bf16 && kt->wo_bf16->decode,
              "%s: wo_bf16 %s does not read %s's int8 panels with bf16 A", tname, kt->wo_bf16->name, kt->f32->name);
    }
    CHECK(kt->prologue && kt->w8a8_epilogue && kt->wxa8_decode && kt->lora_t_row && kt->f32_epilogue && kt->rows_to_f32 &&
              kt->quantize_rows && kt->sr_row && kt->lowrank_add,
          "%s: an entry is unresolved (NULL)", tname);
}

/* ------------------------------------------------------------- int8 GEMM */

typedef struct {
    int64_t m, n, k, lda, ldb;
    int mode;
    int8_t *a, *b;
    int64_t *ref;
} s8_case;

static void fill_codes(int8_t *p, int64_t n, int mode)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = mode == 0 ? (int8_t)(tu_next() & 0xff) : mode == 1 ? (int8_t)-128 : (int8_t)(tu_next() & 1 ? 127 : -128);
}

static s8_case make_s8_case(int64_t m, int64_t n, int64_t k, int mode)
{
    s8_case c = {m, n, k, k + tu_range(0, 3), k + tu_range(0, 3), mode, NULL, NULL, NULL};
    c.a = malloc((size_t)(m * c.lda));
    c.b = malloc((size_t)(n * c.ldb));
    c.ref = malloc((size_t)(m * n) * sizeof(int64_t));
    fill_codes(c.a, m * c.lda, mode);
    fill_codes(c.b, n * c.ldb, mode);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t s = 0;
            for (int64_t p = 0; p < k; p++) s += (int64_t)c.a[i * c.lda + p] * c.b[j * c.ldb + p];
            c.ref[i * n + j] = s;
        }
    return c;
}

static void run_s8(const ql_s8_kernel *kern, const char *role, const s8_case *sc, int small, int threads)
{
    const int64_t m = sc->m, n = sc->n, k = sc->k, ldc = n + tu_range(0, 3);
    const int aes = kern->aes ? kern->aes : 1;
    ql_packed_b pb;
    CHECK_OK(ql_pack_b_s8(kern, sc->b, n, k, sc->ldb, &pb));
    void *pa = xalloc(ql_packed_a_bytes(kern, m, k) * (size_t)aes);
    int32_t *rowsum = xalloc((size_t)m * sizeof(int32_t));
    int32_t *c = xalloc((size_t)(m * ldc) * sizeof(int32_t));
    for (int64_t i = 0; i < m * ldc; i++) c[i] = 0x5a5a5a5a;
    ql_pack_a_s8(kern, sc->a, m, k, sc->lda, pa, rowsum);
    ql_w8a8_epi e = {NULL, rowsum, kern->b_offset128, NULL, false, {0}, NULL, 0, c, ldc, false, NULL, small ? m : 0};
    const ql_s8_plan plan = {kern, small != 0};
    CHECK_OK(ql_gemm_s8_exec(threads, plan, pa, m, &pb, ql_cpu_kernels_for(kern->isa)->w8a8_epilogue, &e));
    int64_t bad = 0, gaps = 0, fi = -1, fj = -1;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++)
            if (c[i * ldc + j] != sc->ref[i * n + j]) {
                if (!bad) fi = i, fj = j;
                bad++;
            }
        for (int64_t j = n; j < ldc && i + 1 < m; j++) gaps += c[i * ldc + j] != 0x5a5a5a5a;
    }
    CHECK(bad == 0 && gaps == 0,
          "%s %s %s %s t%d: M=%lld N=%lld K=%lld mode %d: %lld wrong (first [%lld,%lld] = %d, want %lld), %lld gap writes",
          tname, role, kern->name, small ? "small-M" : "blocked", threads, (long long)m, (long long)n, (long long)k, sc->mode,
          (long long)bad, (long long)fi, (long long)fj, bad ? c[fi * ldc + fj] : 0, bad ? (long long)sc->ref[fi * n + fj] : 0LL,
          (long long)gaps);
    ql_packed_b_free(&pb);
    free(pa);
    free(rowsum);
    free(c);
}

static s8_case s8_cases[64];
static int n_s8_cases;
static const ql_s8_kernel *s8_done[64];
static int n_s8_done;

static void make_s8_cases(void)
{
    /* edge tiles, K tails of every kb, K past the KC slices (512 and 2048) */
    const int64_t fixed[][4] = {{1, 1, 1, 0},     {1, 33, 17, 0},   {13, 1, 5, 0},     {12, 32, 64, 0},  {25, 65, 3, 0},
                                {7, 9, 1023, 0},  {5, 40, 2051, 0}, {17, 50, 600, 0},  {3, 20, 4100, 1}, {9, 37, 777, 2},
                                {24, 48, 256, 0}, {2, 13, 65, 0},   {11, 31, 2049, 2}};
    /* the 32x32 tiles (AMX: 16-row halves, 16-column halves, 64-k blocks,
     * KC = 1024): every tail, and all -128 / ±extreme codes across slices */
    const int64_t tall[][4] = {{32, 32, 64, 0},  {33, 33, 65, 2},   {16, 16, 128, 1}, {17, 48, 300, 2},  {40, 70, 299, 0},
                               {31, 70, 1, 0},   {40, 64, 4, 2},    {1, 70, 63, 0},   {20, 17, 2048, 0}, {32, 64, 1088, 1},
                               {64, 96, 3000, 2}, {15, 31, 1025, 2}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        s8_cases[n_s8_cases++] = make_s8_case(fixed[i][0], fixed[i][1], fixed[i][2], (int)fixed[i][3]);
    for (size_t i = 0; i < sizeof tall / sizeof tall[0]; i++)
        s8_cases[n_s8_cases++] = make_s8_case(tall[i][0], tall[i][1], tall[i][2], (int)tall[i][3]);
    for (int i = 0; i < 10; i++) s8_cases[n_s8_cases++] = make_s8_case(tu_range(1, 40), tu_range(1, 80), tu_range(1, 700), 0);
    for (int i = 0; i < 10; i++)
        s8_cases[n_s8_cases++] = make_s8_case(tu_range(1, 40), tu_range(1, 70), tu_range(1, 300), (int)tu_range(0, 2));
}

static void test_s8(const ql_cpu_kernels *kt)
{
    const ql_s8_kernel *ks[40];
    const int nk = table_s8_kernels(kt, ks);
    int tested = 0;
    for (int i = 0; i < nk; i++) {
        const ql_s8_kernel *kern = ks[i];
        if (s8_seen(s8_done, n_s8_done, kern)) continue; /* another table's, tested there */
        if (!ql_isa_supported(kern->isa)) {
            printf("  s8 kernel %s: its isa %s is not run by this CPU (skipped)\n", kern->name, ql_isa_name(kern->isa));
            continue;
        }
        const char *role = kern == kt->s8 ? "s8" : kern == kt->s8_decoded ? "s8_decoded" : kern == kt->s8_int8_a ? "s8_int8_a" : "s8_rows";
        for (int c = 0; c < n_s8_cases; c++)
            for (int small = 0; small <= 1; small++) run_s8(kern, role, &s8_cases[c], small, 1 + (c + small) % 2);
        if (n_s8_done < 64) s8_done[n_s8_done++] = kern;
        tested++;
    }
    if (tested) printf("  s8: %d kernel(s) exact against int64 (%d shapes, small-M and blocked)\n", tested, n_s8_cases);
    else printf("  s8: every kernel tested with an earlier table\n");
}

/* -------------------------------------------------------------- prologue */

static void prologue_case(const ql_cpu_kernels *kt, ql_dtype dt, int64_t g, int64_t m, int64_t k, int mr)
{
    const int kb = kt->s8->kb;
    const int64_t ldx = k + tu_range(0, 3);
    int kinds[64];
    void *x = make_rows(dt, m, k, ldx, kinds, 1);
    const int64_t panels = ql_panels(m, mr), rows = panels * mr, kp = ql_kpad(kt->s8, k);
    const size_t pbytes = (size_t)(rows * kp);
    int8_t *pt = xalloc(pbytes + 64);
    memset(pt, 0x5a, pbytes + 64);
    const int64_t gpanels = ql_panels(m, 4), k4 = ql_k4(k);
    int8_t *pg = xalloc((size_t)(gpanels * 4 * k4 * 4));
    float *sxt = xalloc((size_t)(rows + 1) * 4), *sxg = xalloc((size_t)(gpanels * 4) * 4);
    int32_t *rst = xalloc((size_t)(rows + 1) * 4), *rsg = xalloc((size_t)(gpanels * 4) * 4);
    memset(sxt, 0x5a, (size_t)(rows + 1) * 4);
    memset(rst, 0x5a, (size_t)(rows + 1) * 4);
    const size_t sbytes = (size_t)(((k + 63) & ~(int64_t)63) * 5 + 128);
    float *st = xalloc(sbytes), *sg = xalloc(sbytes);
    memset(st, 0x7f, sbytes); /* garbage (3.39e38 each): a kernel must not depend on it */
    memset(sg, 0x7f, sbytes);
    /* the rows in up to three calls (threads split panels, even mid-panel) */
    const int64_t cut1 = tu_range(0, rows), cut2 = tu_range(cut1, rows);
    kt->prologue(dt, x, ldx, m, k, g, mr, 0, cut1, pt, sxt, rst, st);
    kt->prologue(dt, x, ldx, m, k, g, mr, cut1, cut2, pt, sxt, rst, st);
    kt->prologue(dt, x, ldx, m, k, g, mr, cut2, rows, pt, sxt, rst, st);
    gen->prologue(dt, x, ldx, m, k, g, 4, 0, gpanels * 4, pg, sxg, rsg, sg);
    int64_t bad_codes = 0, bad_sx = 0, bad_sum = 0, bad_pad = 0, fr = -1, fk = -1;
    int got0 = 0, want0 = 0;
    for (int64_t row = 0; row < rows; row++) {
        const int8_t *panel = pt + (size_t)((row / mr) * kp * mr);
        const int r = (int)(row % mr);
        if (row < m) {
            bad_sx += !same_f(sxt[row], sxg[row]);
            bad_sum += rst[row] != rsg[row];
        } else {
            int32_t canary;
            memset(&canary, 0x5a, 4);
            bad_pad += memcmp(&sxt[row], &canary, 4) != 0 || rst[row] != canary;
        }
        for (int64_t pos = 0; pos < kp; pos++) {
            const int64_t kk = ql_a_element(kb, pos);
            const int got = panel[ql_a_offset(kb, mr, r, pos)];
            const int want = row < m && kk < k ? pg[(size_t)((row / 4) * k4 * 4 * 4) + ql_a_offset(4, 4, (int)(row % 4), kk)] : 0;
            if (got != want) {
                if (!bad_codes) fr = row, fk = kk, got0 = got, want0 = want;
                bad_codes++;
            }
        }
    }
    int32_t canary;
    memset(&canary, 0x5a, 4);
    bad_pad += memcmp(&sxt[rows], &canary, 4) != 0 || rst[rows] != canary;
    int64_t over = 0;
    for (size_t i = pbytes; i < pbytes + 64; i++) over += pt[i] != 0x5a;
    CHECK(bad_codes == 0 && bad_sx == 0 && bad_sum == 0 && bad_pad == 0 && over == 0,
          "%s prologue %s G=%lld M=%lld K=%lld mr %d (calls [0,%lld) [%lld,%lld) [%lld,%lld)): %lld codes differ (first row %lld "
          "(%s) k %lld: %d, generic %d), %lld sx, %lld rowsums, %lld sx/rowsum writes past m, %lld bytes past the panels",
          tname, ql_dtype_name(dt), (long long)g, (long long)m, (long long)k, mr, (long long)cut1, (long long)cut1,
          (long long)cut2, (long long)cut2, (long long)rows, (long long)bad_codes, (long long)fr,
          fr >= 0 && fr < m ? row_kind_names[kinds[fr]] : "padding", (long long)fk, got0, want0, (long long)bad_sx,
          (long long)bad_sum, (long long)bad_pad, (long long)over);
    if (bad_sx) /* name the first row */
        for (int64_t row = 0; row < m; row++)
            if (!same_f(sxt[row], sxg[row])) {
                printf("    first sx difference: row %lld (%s): %a, generic %a\n", (long long)row, row_kind_names[kinds[row]],
                       sxt[row], sxg[row]);
                break;
            }
    free(x);
    free(pt); free(pg); free(sxt); free(sxg); free(rst); free(rsg); free(st); free(sg);
}

static void test_prologue(const ql_cpu_kernels *kt)
{
    int mrs[40], nmr = 0;
    for (int r = 0; r <= kt->s8_rows_max; r++) {
        const int mr = r == 0 ? kt->s8->mr : ql_s8_kernel_rows(kt, r)->mr;
        int seen = 0;
        for (int i = 0; i < nmr; i++) seen |= mrs[i] == mr;
        if (!seen) mrs[nmr++] = mr;
    }
    int cases = 0;
    for (int di = 0; di < 3; di++)
        for (int gi = 0; gi < NGROUPS; gi++) {
            const int64_t g = groups[gi];
            CHECK(g == 0 || ql_group_valid(g), "group %lld should be valid", (long long)g);
            const int n = g == 0 ? 8 : 5;
            for (int c = 0; c < n; c++, cases++) {
                const int64_t k = k_for_group(g, c, kt->s8->kb), m = c == 0 ? 1 : tu_range(1, 25);
                prologue_case(kt, dts[di], g, m, k, mrs[tu_range(0, nmr - 1)]);
            }
        }
    printf("  prologue: %d cases (mr: %d height%s, groups 0..1024, fp32/fp16/bf16)\n", cases, nmr, nmr > 1 ? "s" : "");
}

/* ----------------------------------------------------- W8A8 tile epilogue */

/* a value as the epilogue plan holds it: fp32 rounded to the output dtype */
static float plan_value(ql_dtype dt, double v) { return ql_round_to(dt, (float)v); }

static int w8a8_epi_counts[2]; /* tiles; clean full-width bf16 tiles without residual or GELU */

static void w8a8_epi_case(const ql_cpu_kernels *kt, int it, int tile_mr)
{
    const ql_s8_kernel *kern = kt->s8;
    const int mr = tile_mr, nr = kern->nr;
    const ql_dtype ydt = dts[it % 3];
    /* plain: a full-width bf16 tile without residual or GELU (the common
     * case, which the vector epilogues take their fast path on), with clean
     * scales (it % 12 == 2) or special ones (== 5: the fast path's checks) */
    const bool plain = it % 12 == 2 || it % 12 == 5, probe = it % 12 == 5;
    const int mr_eff = it % 4 == 0 || (probe && tu_range(0, 1)) ? mr : (int)tu_range(1, mr);
    const int nr_eff = it % 2 == 0 || plain ? nr : (int)tu_range(1, nr);
    const int64_t M = mr + tu_range(0, 5), N = 2 * nr + tu_range(0, 7);
    const int64_t m0 = tu_range(0, M - mr_eff), n0 = tu_range(0, N - nr_eff), ldy = N + tu_range(0, 3);
    const bool off = kern->b_offset128, raw = it % 8 == 7;
    int32_t *c = xalloc((size_t)(mr * nr) * 4), *rowsum = xalloc((size_t)M * 4);
    float *sx = xalloc((size_t)M * 4);
    /* half the tiles clean (the vector epilogues' fast paths), half with
     * special row scales: the floor 1e-30 (denormal products), huge (Inf
     * outputs), NaN (a non-finite input row) */
    const bool special = it % 2 == 1;
    w8a8_epi_counts[0]++;
    for (int64_t r = 0; r < M; r++) {
        rowsum[r] = (int32_t)tu_range(-(1 << 20), 1 << 20);
        const int kind = special ? (int)tu_range(0, 5) : 9;
        sx[r] = kind == 0 ? 1e-30f : kind == 1 ? 2.6e36f : kind == 2 ? NAN : (float)ldexp(0.5 + 0.5 * tu_uniform(), -(int)tu_range(0, 30));
    }
    /* probe: clean row scales but one, 1e-30 (the floor), and every weight
     * scale 2^-30, small sums and no bias: that row's outputs (~1e-39) are
     * denormal, which only the exact path rounds right, so an epilogue
     * that takes its fast path without checking every row of the tile
     * (32 on amx) shows */
    if (probe) {
        for (int64_t r = 0; r < M; r++) sx[r] = (float)ldexp(0.5 + 0.5 * tu_uniform(), -(int)tu_range(0, 30));
        sx[m0 + tu_range(mr_eff > 16 && tu_range(0, 1) ? 16 : 0, mr_eff - 1)] = 1e-30f;
    }
    /* small sums in some special tiles: with a tiny scale the products are
     * denormal */
    const int32_t cmag = probe || (special && tu_range(0, 2) == 0) ? 8 : 1 << 28;
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            c[r * nr + j] = (int32_t)tu_range(-cmag, cmag) + (off ? 128 * rowsum[m0 + (r < mr_eff ? r : 0)] : 0) * (cmag == 8);
            if (r < mr_eff && tu_range(0, 15) == 0) c[r * nr + j] = off ? 128 * rowsum[m0 + r] : 0; /* acc = 0 */
        }
    /* weight scales: scalar or per column; sometimes one exactly 0, tiny or
     * above 64 (then finite_weights must be false) */
    const bool sw_scalar = tu_range(0, 2) == 0;
    float *sw = xalloc((size_t)N * 4);
    bool finite = true;
    const int sw_e = (int)tu_range(0, 20);
    for (int64_t j = 0; j < N; j++) sw[j] = probe ? 0x1p-30f : (float)ldexp(tu_gauss(), -sw_e);
    const int swk = special && !probe ? (int)tu_range(0, 4) : 9;
    const int64_t sj = sw_scalar ? 0 : n0 + tu_range(0, nr_eff - 1);
    if (swk == 0) sw[sj] = 0.0f;
    if (swk == 1) sw[sj] = 1e-38f;
    if (swk == 2) sw[sj] = 100.0f, finite = false;
    float *bias = NULL;
    if (!probe && tu_range(0, 2)) {
        bias = xalloc((size_t)N * 4);
        for (int64_t j = 0; j < N; j++) bias[j] = plan_value(ydt, tu_gauss() * ldexp(1.0, -(int)tu_range(0, 12)));
        const int bk = special ? (int)tu_range(0, 3) : 9;
        const int64_t bj = n0 + tu_range(0, nr_eff - 1);
        if (bk == 0) bias[bj] = 0.0f;
        if (bk == 1) bias[bj] = plan_value(ydt, ldexp(tu_next() & 1 ? 1.0 : -1.0, -120)); /* nonzero below 2^-118 */
        if (bk == 2) bias[bj] = plan_value(ydt, ldexp(1.0, -130));                       /* fp32/bf16: denormal */
        if (bk == 3 && tu_range(0, 1)) bias[bj] = INFINITY, finite = false;
    }
    const size_t es = ql_dtype_size(ydt);
    void *res = NULL, *rs = NULL;
    const int64_t ldr = N + tu_range(0, 2);
    if (!plain && tu_range(0, 2) == 0) {
        res = malloc((size_t)(M * ldr) * es);
        rs = malloc((size_t)N * es);
        tu_fill_gauss(ydt, res, M * ldr, 1.0);
        tu_fill_gauss(ydt, rs, N, 1.0);
    }
    ql_lora_tile lt = {0};
    int32_t *lc = NULL, *lrs = NULL;
    float *lst = NULL, *lsu = NULL;
    if (tu_range(0, 3) == 0) {
        lc = xalloc((size_t)(mr * nr) * 4);
        lrs = xalloc((size_t)M * 4);
        lst = xalloc((size_t)M * 4);
        lsu = xalloc((size_t)N * 4);
        for (int i = 0; i < mr * nr; i++) lc[i] = (int32_t)tu_range(-(1 << 20), 1 << 20);
        for (int64_t r = 0; r < M; r++) lrs[r] = (int32_t)tu_range(-(1 << 12), 1 << 12), lst[r] = (float)ldexp(tu_uniform(), -(int)tu_range(0, 20));
        for (int64_t j = 0; j < N; j++) lsu[j] = (float)(tu_gauss() * 1e-3);
        lt = (ql_lora_tile){lc, lrs, lst, lsu};
    }
    const ql_epi_plan plan = {ydt, bias, res, ldr, rs, !plain && tu_range(0, 2) == 0 ? QL_ACTIVATION_GELU : QL_ACTIVATION_NONE};
    if (!special && !raw && ydt == QL_BF16 && !res && !plan.act && nr_eff == nr) w8a8_epi_counts[1]++;
    const int64_t ldc = N + tu_range(0, 2);
    const size_t ybytes = raw ? (size_t)(M * ldc) * 4 : (size_t)(M * ldy) * es;
    void *yt = xalloc(ybytes), *yg = xalloc(ybytes);
    memset(yt, 0x5a, ybytes);
    memset(yg, 0x5a, ybytes);
    const bool fw = finite && tu_range(0, 3) != 0;
    ql_w8a8_epi e = {sx, rowsum, off, sw, sw_scalar, plan, raw ? NULL : yt, ldy, raw ? (int32_t *)yt : NULL, ldc, fw,
                     lc ? &lt : NULL, tu_range(0, 1) ? M : 0};
    ql_w8a8_epi eg = e;
    eg.y = raw ? NULL : yg;
    eg.c_out = raw ? (int32_t *)yg : NULL;
    kt->w8a8_epilogue(&e, c, nr, m0, n0, mr_eff, nr_eff);
    gen->w8a8_epilogue(&eg, c, nr, m0, n0, mr_eff, nr_eff);
    const ql_dtype cdt = raw ? QL_F32 : ydt; /* raw: compare the int32 words as 4-byte elements */
    const int64_t ld = raw ? ldc : ldy, count = M * ld;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < count; i++) {
        const int ok = raw ? ((int32_t *)yt)[i] == ((int32_t *)yg)[i] : same_elem(cdt, yt, yg, i);
        if (!ok) {
            if (!bad) first = i;
            bad++;
        }
    }
    if (bad) {
        const int64_t row = first / ld, col = first % ld;
        const float got = raw ? (float)((int32_t *)yt)[first] : ql_load_f(ydt, yt, first);
        const float want = raw ? (float)((int32_t *)yg)[first] : ql_load_f(ydt, yg, first);
        CHECK(0,
              "%s w8a8_epilogue y=%s%s tile %dx%d eff %dx%d at (%lld,%lld) of %lldx%lld: bias %d res %d gelu %d lora %d sw %s "
              "finite_weights %d offset128 %d: %lld outputs differ, first [%lld,%lld] %a, generic %a (sx %a, sw %a, acc %d)",
              tname, ql_dtype_name(ydt), raw ? " raw" : "", mr, nr, mr_eff, nr_eff, (long long)m0, (long long)n0, (long long)M,
              (long long)N, bias != NULL, res != NULL, plan.act, lc != NULL, sw_scalar ? "scalar" : "per column", fw, off,
              (long long)bad, (long long)row, (long long)col, got, want, row < M ? sx[row] : 0.0f,
              sw[sw_scalar ? 0 : col < N ? col : 0],
              row >= m0 && row < m0 + mr_eff && col >= n0 && col < n0 + nr_eff
                  ? c[(row - m0) * nr + (col - n0)] - (off ? 128 * rowsum[row] : 0)
                  : 0);
    } else CHECK(1, "");
    free(c); free(rowsum); free(sx); free(sw); free(bias); free(res); free(rs);
    free(lc); free(lrs); free(lst); free(lsu); free(yt); free(yg);
}

/* ----------------------------------------------------- float tile epilogue */

static void f32_epi_case(const ql_cpu_kernels *kt, int it)
{
    const ql_f32_kernel *fk = kt->f32;
    const int mr = it % 2 && fk->small ? fk->small_rows : fk->mr, nr = it % 4 >= 2 ? 2 * fk->nr : fk->nr;
    const ql_dtype ydt = dts[it % 3];
    const int mr_eff = it % 5 == 0 ? mr : (int)tu_range(1, mr), nr_eff = it % 3 == 0 ? nr : (int)tu_range(1, nr);
    const int64_t M = mr + tu_range(0, 4), N = nr + tu_range(0, 9);
    const int64_t m0 = tu_range(0, M - mr_eff), n0 = tu_range(0, N - nr_eff), ldy = N + tu_range(0, 3);
    float *c = xalloc((size_t)(mr * nr) * 4);
    const int ce = (int)tu_range(-30, 30);
    const bool special = it % 2 == 1;
    for (int i = 0; i < mr * nr; i++) {
        const int kind = special ? (int)tu_range(0, 20) : 9;
        c[i] = kind == 0 ? NAN : kind == 1 ? INFINITY : kind == 2 ? -INFINITY : kind == 3 ? 0x1p-140f : kind == 4 ? 0.0f
                                                                                   : (float)ldexp(tu_gauss(), ce);
    }
    const int csk = (int)tu_range(0, 2);
    float *cs = NULL;
    if (csk) {
        cs = xalloc((size_t)N * 4);
        for (int64_t j = 0; j < N; j++) cs[j] = (float)ldexp(0.5 + tu_uniform(), -(int)tu_range(0, 16));
        if (tu_range(0, 3) == 0) cs[csk == 1 ? 0 : n0 + tu_range(0, nr_eff - 1)] = 0.0f;
    }
    float *bias = NULL;
    if (tu_range(0, 1)) {
        bias = xalloc((size_t)N * 4);
        for (int64_t j = 0; j < N; j++) bias[j] = plan_value(ydt, tu_gauss());
    }
    const size_t es = ql_dtype_size(ydt);
    void *res = NULL, *rs = NULL;
    const int64_t ldr = N + tu_range(0, 2);
    if (tu_range(0, 2) == 0) {
        res = malloc((size_t)(M * ldr) * es);
        rs = malloc((size_t)N * es);
        tu_fill_gauss(ydt, res, M * ldr, 1.0);
        tu_fill_gauss(ydt, rs, N, 1.0);
    }
    const ql_epi_plan plan = {ydt, bias, res, ldr, rs, tu_range(0, 2) == 0 ? QL_ACTIVATION_GELU : QL_ACTIVATION_NONE};
    const size_t ybytes = (size_t)(M * ldy) * es;
    void *yt = xalloc(ybytes), *yg = xalloc(ybytes);
    memset(yt, 0x5a, ybytes);
    memset(yg, 0x5a, ybytes);
    ql_f32_epi e = {plan, yt, ldy, cs, csk == 1}, eg = e;
    eg.y = yg;
    kt->f32_epilogue(&e, c, nr, m0, n0, mr_eff, nr_eff);
    gen->f32_epilogue(&eg, c, nr, m0, n0, mr_eff, nr_eff);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < M * ldy; i++)
        if (!same_elem(ydt, yt, yg, i)) {
            if (!bad) first = i;
            bad++;
        }
    CHECK(bad == 0,
          "%s f32_epilogue y=%s tile %dx%d eff %dx%d at (%lld,%lld): col_scale %s bias %d res %d gelu %d: %lld outputs differ, "
          "first [%lld,%lld] %a, generic %a",
          tname, ql_dtype_name(ydt), mr, nr, mr_eff, nr_eff, (long long)m0, (long long)n0,
          csk == 0 ? "none" : csk == 1 ? "scalar" : "per column", bias != NULL, res != NULL, plan.act, (long long)bad,
          (long long)(first / ldy), (long long)(first % ldy), bad ? ql_load_f(ydt, yt, first) : 0.0f,
          bad ? ql_load_f(ydt, yg, first) : 0.0f);
    free(c); free(cs); free(bias); free(res); free(rs); free(yt); free(yg);
}

/* --------------------------------------------------------- float kernels */

typedef struct {
    float *y;
    int64_t ldy;
} copy_arg;

static void epi_copy(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const copy_arg *e = arg;
    for (int r = 0; r < mr_eff; r++)
        for (int j = 0; j < nr_eff; j++) e->y[(m0 + r) * e->ldy + n0 + j] = c[r * nr + j];
}

static float bf16_value(float v) { return ql_bf16_to_fp32(ql_fp32_to_bf16(v)); }

/* The bound. Each output is y = Σ_p a_p·w_p over K terms whose products
 * are exact in float64 (24-bit by 24-bit significands, or an int8 code).
 * Whatever the kernel does — FMA chains, a multiply then an add, any order
 * or tree of additions, K sliced into KC blocks and resumed — every term
 * goes through at most K + 1 roundings to fp32 (one for the product, when
 * not fused, and at most K - 1 additions on its way to the result), each
 * of relative size <= u = 2^-24 (nearest even), so the classic argument
 * (Higham, Accuracy and Stability, §3.1) gives
 *     |ŷ - y| <= γ_{K+1}·Σ|a_p·w_p|,   γ_n = n·u / (1 - n·u),
 * provided nothing underflows (the operands here are normal and of
 * moderate range: no product or partial sum comes near 2^-126, but K·2^-149
 * covers gradual underflow anyway) or overflows. The float64 reference adds
 * at most K·2^-53·Σ|a·w|. A wrong, missing or doubled term moves y by
 * about one |a·w|, which is ~Σ|a·w|/K: far above the bound (K·2^-24·Σ). */
static int64_t off_bound(const float *a, int64_t lda, const float *w, int64_t m, int64_t n, int64_t k, const float *y,
                         int64_t *first)
{
    const double u = 0x1p-24, g = (double)(k + 1) * u / (1 - (double)(k + 1) * u);
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, s = 0;
            for (int64_t p = 0; p < k; p++) {
                const double t = (double)a[i * lda + p] * w[j * k + p];
                ref += t;
                s += fabs(t);
            }
            const double got = y[i * n + j];
            const double bound = g * s + (double)k * 0x1p-53 * s + (double)k * 0x1p-149;
            if (!(fabs(got - ref) <= bound)) {
                if (!bad) *first = i * n + j;
                bad++;
            }
        }
    return bad;
}

static const ql_f32_kernel *f32_done[32];
static int n_f32_done;

static void f32_case(const ql_f32_kernel *kern, ql_dtype store, int64_t m, int64_t n, int64_t k, int threads)
{
    const int64_t lda = k + tu_range(0, 3);
    float *a = malloc((size_t)(m * lda) * 4);
    const int ae = (int)tu_range(-6, 6), we = (int)tu_range(-10, 10);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t p = 0; p < k; p++) {
            const float v = (float)ldexp(tu_gauss(), ae);
            a[i * lda + p] = store == QL_BF16 ? bf16_value(v) : v; /* bf16 compute: operands rounded to bf16 */
        }
        for (int64_t p = k; p < lda; p++) a[i * lda + p] = NAN; /* never read */
    }
    float *weff = malloc((size_t)(n * k) * 4 + 4);
    int8_t *w8 = malloc((size_t)(n * k) + 1);
    float *wf = malloc((size_t)(n * k) * 4 + 4);
    for (int64_t i = 0; i < n * k; i++) {
        w8[i] = (int8_t)(tu_next() & 0xff);
        wf[i] = (float)ldexp(tu_gauss(), we);
        weff[i] = store == QL_I8 ? (float)w8[i] : store == QL_BF16 ? bf16_value(wf[i]) : wf[i];
    }
    ql_packed_f32 b;
    CHECK_OK(ql_pack_b_float(kern, store == QL_I8 ? QL_I8 : QL_F32, store == QL_I8 ? (const void *)w8 : (const void *)wf, n, k,
                             k, store, 1, &b));
    float *y = malloc((size_t)(m * n) * 4), *ys = malloc((size_t)(m * n) * 4);
    for (int64_t i = 0; i < m * n; i++) y[i] = ys[i] = NAN;
    copy_arg ca = {y, n}, cs = {ys, n};
    CHECK_OK(ql_gemm_f32_run(threads, kern, a, lda, m, &b, epi_copy, &ca));
    int64_t first = -1;
    const int64_t bad = off_bound(a, lda, weff, m, n, k, y, &first);
    CHECK(bad == 0, "%s f32 kernel %s (w %s) t%d M=%lld N=%lld K=%lld: %lld outputs off the float64 bound (first [%lld,%lld] = %a)",
          tname, kern->name, ql_dtype_name(store), threads, (long long)m, (long long)n, (long long)k, (long long)bad,
          (long long)(first / n), (long long)(first % n), bad ? y[first] : 0.0f);
    if (kern->small) {
        ql_gemm_f32_small_part(kern, a, lda, m, &b, 0, b.panels, epi_copy, &cs);
        int64_t diff = 0, fd = -1;
        for (int64_t i = 0; i < m * n; i++)
            if (fbits(y[i]) != fbits(ys[i])) {
                if (!diff) fd = i;
                diff++;
            }
        CHECK(diff == 0, "%s f32 kernel %s (w %s) M=%lld N=%lld K=%lld: small-M %s differs from the blocked path at %lld outputs "
              "(first [%lld,%lld] %a vs %a)", tname, kern->name, ql_dtype_name(store), (long long)m, (long long)n, (long long)k,
              kern->small_name, (long long)diff, (long long)(fd / n), (long long)(fd % n), diff ? ys[fd] : 0.0f,
              diff ? y[fd] : 0.0f);
    }
    ql_packed_f32_free(&b);
    free(a); free(weff); free(w8); free(wf); free(y); free(ys);
}

/* bf16 kernels of the BFMMLA layout (kb = 4) against their portable twin,
 * bit for bit, through the same driver; some denormal operands (flushed by
 * BFMMLA, and by the twin). */
static void bf16kb_case(const ql_f32_kernel *kern, int64_t m, int64_t n, int64_t k, int threads)
{
    const ql_f32_kernel *twin = &ql_bf16_gemm_8x8c4__generic;
    float *a = malloc((size_t)(m * k) * 4 + 4), *w = malloc((size_t)(n * k) * 4 + 4);
    const int we = (int)tu_range(-20, 20);
    for (int64_t i = 0; i < m * k; i++) a[i] = bf16_value((float)tu_gauss());
    for (int64_t i = 0; i < n * k; i++) w[i] = bf16_value((float)ldexp(tu_gauss(), we));
    if (k > 3 && m > 1) a[k + 2] = ql_bf16_to_fp32(0x0011); /* a denormal */
    ql_packed_f32 bk, bt;
    CHECK_OK(ql_pack_b_float(kern, QL_F32, w, n, k, k, QL_BF16, 1, &bk));
    CHECK_OK(ql_pack_b_float(twin, QL_F32, w, n, k, k, QL_BF16, 1, &bt));
    float *y = malloc((size_t)(m * n) * 4), *yt = malloc((size_t)(m * n) * 4);
    copy_arg ca = {y, n}, ct = {yt, n};
    CHECK_OK(ql_gemm_f32_run(threads, kern, a, k, m, &bk, epi_copy, &ca));
    CHECK_OK(ql_gemm_f32_run(1, twin, a, k, m, &bt, epi_copy, &ct));
    int64_t diff = 0, fd = -1;
    for (int64_t i = 0; i < m * n; i++)
        if (!same_f(y[i], yt[i])) {
            if (!diff) fd = i;
            diff++;
        }
    CHECK(diff == 0, "%s bf16 kernel %s t%d M=%lld N=%lld K=%lld: %lld outputs differ from %s (first [%lld,%lld] %a vs %a)", tname,
          kern->name, threads, (long long)m, (long long)n, (long long)k, (long long)diff, twin->name, (long long)(fd / n),
          (long long)(fd % n), diff ? y[fd] : 0.0f, diff ? yt[fd] : 0.0f);
    ql_packed_f32_free(&bk);
    ql_packed_f32_free(&bt);
    free(a); free(w); free(y); free(yt);
}

/* m bf16 rows (stride k) as the packed A panels of an a_bf16 kernel. */
static uint16_t *pack_a_bf16(const ql_f32_kernel *kern, const uint16_t *x, int64_t m, int64_t k)
{
    uint16_t *pa = malloc(ql_packed_a_bf16_bytes(kern, m, k) + 2);
    const uint16_t *rows[32];
    for (int64_t ip = 0; ip * kern->mr < m; ip++) {
        for (int r = 0; r < kern->mr; r++) rows[r] = ip * kern->mr + r < m ? x + (ip * kern->mr + r) * k : NULL;
        ql_pack_a_bf16_panel(kern, rows, k, ip, pa);
    }
    return pa;
}

/* VDPBF16PS kernels (a_bf16: dense kb = 2, or weight-only int8 codes) against
 * their portable twin, bit for bit: blocked (1, 2 threads) and small-M. */
static void vdp_case(const ql_f32_kernel *kern, int64_t m, int64_t n, int64_t k, int threads)
{
    const int i8 = kern->kb == 0;
    const ql_f32_kernel *twin = i8 ? &ql_bf16_gemm_12x32c2i8__generic : &ql_bf16_gemm_12x32c2__generic;
    uint16_t *x = malloc((size_t)(m * k) * 2 + 2);
    float *w = malloc((size_t)(n * k) * 4 + 4);
    int8_t *q = malloc((size_t)(n * k) + 1);
    const int we = (int)tu_range(-20, 20);
    for (int64_t i = 0; i < m * k; i++) x[i] = ql_fp32_to_bf16((float)tu_gauss());
    const int sym = (int)(tu_next() & 1); /* half the cases: codes within ±127 (the sym variant runs too) */
    for (int64_t i = 0; i < n * k; i++) w[i] = bf16_value((float)ldexp(tu_gauss(), we)), q[i] = (int8_t)(tu_next() & 0xff);
    for (int64_t i = 0; sym && i < n * k; i++) q[i] = q[i] == -128 ? 127 : q[i];
    if (k > 3 && m > 1) x[k + 2] = 0x0011; /* a denormal */
    ql_packed_f32 bk, bt;
    CHECK_OK(ql_pack_b_float(kern, i8 ? QL_I8 : QL_F32, i8 ? (const void *)q : (const void *)w, n, k, k, i8 ? QL_I8 : QL_BF16, 1, &bk));
    CHECK_OK(ql_pack_b_float(twin, i8 ? QL_I8 : QL_F32, i8 ? (const void *)q : (const void *)w, n, k, k, i8 ? QL_I8 : QL_BF16, 1, &bt));
    uint16_t *pa = pack_a_bf16(kern, x, m, k);
    float *y = malloc((size_t)(m * n) * 4), *yt = malloc((size_t)(m * n) * 4), *ys = malloc((size_t)(m * n) * 4);
    copy_arg ca = {y, n}, ct = {yt, n}, cs = {ys, n};
    CHECK_OK(ql_gemm_f32_run(threads, kern, (const float *)pa, 0, m, &bk, epi_copy, &ca));
    CHECK_OK(ql_gemm_f32_run(1, twin, (const float *)pa, 0, m, &bt, epi_copy, &ct));
    if (kern->small) ql_gemm_f32_small_part(kern, (const float *)x, k, m, &bk, 0, bk.panels, epi_copy, &cs);
    int64_t diff = 0, ds = 0, fd = -1;
    for (int64_t i = 0; i < m * n; i++) {
        if (!same_f(y[i], yt[i]) && !diff++) fd = i;
        ds += kern->small && !same_f(ys[i], yt[i]);
    }
    CHECK(diff == 0 && ds == 0, "%s VDPBF16PS kernel %s t%d M=%lld N=%lld K=%lld: %lld blocked / %lld small-M outputs differ "
          "from %s (first [%lld,%lld] %a vs %a)", tname, kern->name, threads, (long long)m, (long long)n, (long long)k,
          (long long)diff, (long long)ds, twin->name, (long long)(fd / n), (long long)(fd % n), diff ? y[fd] : 0.0f,
          diff ? yt[fd] : 0.0f);
    if (i8 && kern->sym) { /* codes within ±127: the sym variant, same packing */
        for (int64_t i = 0; i < m * n; i++) y[i] = ys[i] = -1.0f;
        int sym = 1;
        for (int64_t i = 0; i < n * k; i++) sym &= q[i] != -128;
        if (sym) {
            CHECK_OK(ql_gemm_f32_run(threads, kern->sym, (const float *)pa, 0, m, &bk, epi_copy, &ca));
            if (kern->sym->small) ql_gemm_f32_small_part(kern->sym, (const float *)x, k, m, &bk, 0, bk.panels, epi_copy, &cs);
            int64_t d2 = 0;
            for (int64_t i = 0; i < m * n; i++) d2 += !same_f(y[i], yt[i]) + (kern->sym->small && !same_f(ys[i], yt[i]));
            CHECK(d2 == 0, "%s VDPBF16PS kernel %s M=%lld N=%lld K=%lld: %lld outputs differ from %s", tname, kern->sym->name,
                  (long long)m, (long long)n, (long long)k, (long long)d2, twin->name);
        }
    }
    ql_packed_f32_free(&bk);
    ql_packed_f32_free(&bt);
    free(x); free(w); free(q); free(pa); free(y); free(yt); free(ys);
}

/* Tile kernels (a_bf16 with tile_k: TDPBF16PS) where the CPU runs them:
 * no bit-exact twin (the instruction's order is not architected), so the
 * float64 bound of docs/NUMERICS.md §4.2 (as test_bf16),
 *     |y - Σ x·w| <= γ_{K+1}·S + D + (1 + γ_{K+1})·(K + 2·ceil(K/32))·2^-126,
 * NaN where float64 gives NaN; blocked on 1 and 2 threads and small-M give
 * the same bits (any NaN); the bits beside the SDM model's are counted. */
static int64_t tile_outputs, tile_model_diff;

static int64_t tile_off_bound(const uint16_t *x, int64_t m, const float *w, int64_t n, int64_t k, const float *y,
                              int64_t *first)
{
    const double u = 0x1p-24, g = (double)(k + 1) * u / (1 - (double)(k + 1) * u);
    const double f = (double)(k + 2 * ((k + 31) / 32)) * 0x1p-126;
    int64_t bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, s = 0, d = 0;
            for (int64_t p = 0; p < k; p++) {
                const float xv = ql_bf16_to_fp32(x[i * k + p]), wv = w[j * k + p];
                const double t = (double)xv * wv;
                ref += t;
                s += fabs(t);
                if ((xv != 0 && fabsf(xv) < 0x1p-126f) || (wv != 0 && fabsf(wv) < 0x1p-126f)) d += fabs(t);
            }
            const float got = y[i * n + j];
            const int ok = isnan(ref) ? isnan(got) : fabs(ref) >= 0x1p128 ? got == copysign(INFINITY, ref)
                                                                          : fabs(got - ref) <= g * s + d + (1 + g) * f;
            if (!ok && !bad++) *first = i * n + j;
        }
    return bad;
}

static void tile_case(const ql_f32_kernel *kern, int64_t m, int64_t n, int64_t k, int threads, int special)
{
    const int i8 = kern->kb == 0;
    const ql_f32_kernel *model = i8 ? &ql_bf16_tdp_32x32c2i8__generic : &ql_bf16_tdp_32x32c2__generic;
    uint16_t *x = malloc((size_t)(m * k) * 2 + 2);
    float *w = malloc((size_t)(n * k) * 4 + 4), *weff = malloc((size_t)(n * k) * 4 + 4);
    int8_t *q = malloc((size_t)(n * k) + 1);
    const int we = (int)tu_range(-20, 20);
    for (int64_t i = 0; i < m * k; i++) x[i] = ql_fp32_to_bf16((float)tu_gauss());
    for (int64_t i = 0; i < n * k; i++) w[i] = bf16_value((float)ldexp(tu_gauss(), we)), q[i] = (int8_t)(tu_next() & 0xff);
    if (special && m > 2) { /* a NaN row, an Inf row (NaN where it meets a 0 code), denormal activations in another */
        x[(m - 1) * k + k / 2] = 0x7fc1;
        x[(m / 2) * k + (k - 1)] = 0xff80;
        for (int64_t p = 0; p < k; p += 3) x[1 * k + p] = (uint16_t)tu_range(1, 0x7f);
    }
    if (i8 && (tu_next() & 1))
        for (int64_t i = 0; i < n * k; i++) q[i] = q[i] == -128 ? 127 : q[i]; /* the sym variant runs too */
    for (int64_t i = 0; i < n * k; i++) weff[i] = i8 ? (float)q[i] : w[i];
    ql_packed_f32 bk, bm;
    CHECK_OK(ql_pack_b_float(kern, i8 ? QL_I8 : QL_F32, i8 ? (const void *)q : (const void *)w, n, k, k, i8 ? QL_I8 : QL_BF16, 1, &bk));
    CHECK_OK(ql_pack_b_float(model, i8 ? QL_I8 : QL_F32, i8 ? (const void *)q : (const void *)w, n, k, k, i8 ? QL_I8 : QL_BF16, 1, &bm));
    uint16_t *pa = pack_a_bf16(kern, x, m, k);
    const size_t cnt = (size_t)(m * n) + 1;
    float *y1 = malloc(cnt * 4), *y2 = malloc(cnt * 4), *ys = malloc(cnt * 4), *ym = malloc(cnt * 4);
    for (size_t i = 0; i < cnt; i++) y1[i] = y2[i] = ys[i] = ym[i] = -7.0f; /* poisoned: an unwritten output shows */
    copy_arg c1 = {y1, n}, c2 = {y2, n}, cs = {ys, n}, cm = {ym, n};
    CHECK_OK(ql_gemm_f32_run(1, kern, (const float *)pa, 0, m, &bk, epi_copy, &c1));
    CHECK_OK(ql_gemm_f32_run(threads, kern, (const float *)pa, 0, m, &bk, epi_copy, &c2));
    CHECK_OK(ql_gemm_f32_run(1, model, (const float *)pa, 0, m, &bm, epi_copy, &cm));
    if (kern->small) ql_gemm_f32_small_part(kern, (const float *)x, k, m, &bk, 0, bk.panels, epi_copy, &cs);
    int64_t first = -1;
    const int64_t bad = tile_off_bound(x, m, weff, n, k, y1, &first);
    CHECK(bad == 0, "%s tile kernel %s M=%lld N=%lld K=%lld%s: %lld outputs off the float64 bound (first [%lld,%lld] = %a)", tname,
          kern->name, (long long)m, (long long)n, (long long)k, special ? " (NaN/Inf/denormal rows)" : "", (long long)bad,
          (long long)(first / n), (long long)(first % n), bad ? y1[first] : 0.0f);
    int64_t d2 = 0, dsm = 0;
    for (int64_t i = 0; i < m * n; i++) {
        d2 += !same_f(y1[i], y2[i]);
        dsm += kern->small && !same_f(y1[i], ys[i]);
        tile_model_diff += !same_f(y1[i], ym[i]);
    }
    tile_outputs += m * n;
    CHECK(d2 == 0 && dsm == 0, "%s tile kernel %s M=%lld N=%lld K=%lld: %lld outputs differ on %d threads, %lld on the small-M path",
          tname, kern->name, (long long)m, (long long)n, (long long)k, (long long)d2, threads, (long long)dsm);
    if (i8 && kern->sym) {
        int sym = 1;
        for (int64_t i = 0; i < n * k; i++) sym &= q[i] != -128;
        if (sym) {
            for (size_t i = 0; i < cnt; i++) y2[i] = ys[i] = -7.0f;
            CHECK_OK(ql_gemm_f32_run(threads, kern->sym, (const float *)pa, 0, m, &bk, epi_copy, &c2));
            if (kern->sym->small) ql_gemm_f32_small_part(kern->sym, (const float *)x, k, m, &bk, 0, bk.panels, epi_copy, &cs);
            int64_t d3 = 0;
            for (int64_t i = 0; i < m * n; i++) d3 += !same_f(y1[i], y2[i]) + (kern->sym->small && !same_f(y1[i], ys[i]));
            CHECK(d3 == 0, "%s tile kernel %s M=%lld N=%lld K=%lld: %lld outputs differ from %s", tname, kern->sym->name,
                  (long long)m, (long long)n, (long long)k, (long long)d3, kern->name);
        }
    }
    ql_packed_f32_free(&bk);
    ql_packed_f32_free(&bm);
    free(x); free(w); free(weff); free(q); free(pa); free(y1); free(y2); free(ys); free(ym);
}

static void float_shape(const ql_f32_kernel *kern, int c, int64_t *m, int64_t *n, int64_t *k)
{
    static const int64_t ks[] = {1, 3, 4, 5, 255, 256, 257, 600, 17, 64};
    const int mr = kern->mr, nr = kern->nr;
    const int64_t ms[] = {1, mr > 1 ? mr - 1 : 1, mr, mr + 1, 2 * mr + 3, 2};
    const int64_t ns[] = {1, nr, nr + 1, 2 * nr + 5, nr > 1 ? nr - 1 : 1, 3 * nr};
    *m = c < 12 ? ms[c % 6] : tu_range(1, 40);
    *n = c < 12 ? ns[(c / 2) % 6] : tu_range(1, 70);
    *k = c < 10 ? ks[c] : tu_range(1, 700);
}

static void test_float_kernels(const ql_cpu_kernels *kt)
{
    const ql_f32_kernel *ks[3] = {kt->f32, kt->bf16, kt->wo_bf16};
    for (int i = 0; i < 3; i++) {
        const ql_f32_kernel *kern = ks[i];
        if (!kern) continue;
        if (i == 1 && kern == ks[0]) {
            printf("  bf16 = the f32 kernel (bf16 weights widened to fp32 FMAs): tested as f32 with bf16 weights\n");
            continue;
        }
        int done = 0;
        for (int d = 0; d < n_f32_done; d++) done |= f32_done[d] == kern;
        if (done) {
            printf("  %s %s: tested with an earlier table\n", i == 2 ? "wo_bf16" : i ? "bf16" : "f32", kern->name);
            continue;
        }
        if (!ql_isa_supported(kern->isa)) {
            printf("  %s %s: its isa %s is not run by this CPU (skipped)\n", i ? "bf16" : "f32", kern->name, ql_isa_name(kern->isa));
            continue;
        }
        if (n_f32_done < 32) f32_done[n_f32_done++] = kern;
        const int cases = 24;
        if (kern->a_bf16 && kern->tile_k) {
            static const int64_t tks[] = {1, 2, 3, 17, 31, 32, 33, 63, 64, 65, 511, 512, 513, 1025, 1100};
            const int ntk = (int)(sizeof tks / sizeof tks[0]);
            tile_outputs = tile_model_diff = 0;
            for (int c = 0; c < 30; c++) {
                int64_t m, n, k;
                float_shape(kern, c, &m, &n, &k);
                if (c < ntk) k = tks[c];
                if (c >= 24) m = tu_range(60, 100); /* small-M limit and beyond: 2-4 row panels */
                tile_case(kern, m, n, k, 2 + c % 2, c % 3 == 0);
            }
            printf("  %s %s: within the TDPBF16PS float64 bound, 1-3 threads and small-M bit-identical (30 shapes); %lld of "
                   "%lld outputs with other bits than the SDM model\n", i == 2 ? "wo_bf16" : "bf16", kern->name,
                   (long long)tile_model_diff, (long long)tile_outputs);
            continue;
        }
        if (kern->a_bf16) {
            if (kern->isa == QL_ISA_GENERIC) continue; /* a twin itself */
            for (int c = 0; c < cases; c++) {
                int64_t m, n, k;
                float_shape(kern, c, &m, &n, &k);
                vdp_case(kern, m, n, k, 1 + c % 2);
            }
            printf("  %s %s: bit-identical to its twin (%d shapes, blocked and small-M)\n", i == 2 ? "wo_bf16" : "bf16", kern->name,
                   cases);
            continue;
        }
        if (kern->kb) {
            const ql_f32_kernel *twin = &ql_bf16_gemm_8x8c4__generic;
            if (kern == twin) continue;
            if (kern->mr != twin->mr || kern->nr != twin->nr || kern->kb != twin->kb) {
                printf("  %s %s: kb %d but not the %s layout: no twin to compare with (skipped)\n", i ? "bf16" : "f32", kern->name,
                       kern->kb, twin->name);
                continue;
            }
            for (int c = 0; c < cases; c++) {
                int64_t m, n, k;
                float_shape(kern, c, &m, &n, &k);
                bf16kb_case(kern, m, n, k, 1 + c % 2);
            }
            printf("  %s %s: bit-identical to %s (%d shapes)\n", i ? "bf16" : "f32", kern->name, twin->name, cases);
            continue;
        }
        static const ql_dtype stores[3] = {QL_F32, QL_BF16, QL_I8};
        for (int s = 0; s < 3; s++)
            for (int c = 0; c < cases; c++) {
                int64_t m, n, k;
                float_shape(kern, c, &m, &n, &k);
                f32_case(kern, stores[s], m, n, k, 1 + c % 2);
            }
        printf("  %s %s: within γ(K+1) of float64 (weights fp32/bf16/int8, %d shapes each)%s\n", i ? "bf16" : "f32", kern->name,
               cases, kern->small ? ", small-M path bit-identical to the blocked one" : " (no small-M path)");
    }
}

/* ------------------------------------------------------------ rows_to_f32 */

static void rows_case(const ql_cpu_kernels *kt, ql_dtype dt, int64_t g, int64_t k, int round_bf16)
{
    const int64_t m = tu_range(1, 7), ldx = k + tu_range(0, 3), ldo = ((k + 15) & ~(int64_t)15) + 16 * tu_range(0, 1);
    int kinds[8];
    void *x = make_rows(dt, m, k, ldx, kinds, 1);
    const int64_t r0 = tu_range(0, m - 1), r1 = tu_range(r0 + 1, m);
    const size_t bytes = (size_t)(m * ldo) * 4;
    float *ot = xalloc(bytes), *og = xalloc(bytes);
    memset(ot, 0x5b, bytes);
    memset(og, 0x5b, bytes);
    kt->rows_to_f32(dt, x, ldx, r0, r1, k, g, round_bf16, ot, ldo);
    gen->rows_to_f32(dt, x, ldx, r0, r1, k, g, round_bf16, og, ldo);
    int64_t bad = 0, fr = -1, fj = -1, outside = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < ldo; j++) {
            const int64_t i = r * ldo + j;
            if (r < r0 || r >= r1) outside += fbits(ot[i]) != 0x5b5b5b5bu;
            else if (j < k && !same_f(ot[i], og[i])) {
                if (!bad) fr = r, fj = j;
                bad++;
            }
        }
    CHECK(bad == 0 && outside == 0,
          "%s rows_to_f32 %s G=%lld K=%lld round_bf16 %d rows [%lld,%lld): %lld values differ (first row %lld (%s) col %lld: %a, "
          "generic %a), %lld writes outside the rows",
          tname, ql_dtype_name(dt), (long long)g, (long long)k, round_bf16, (long long)r0, (long long)r1, (long long)bad,
          (long long)fr, fr >= 0 ? row_kind_names[kinds[fr]] : "-", (long long)fj, bad ? ot[fr * ldo + fj] : 0.0f,
          bad ? og[fr * ldo + fj] : 0.0f, (long long)outside);
    free(x); free(ot); free(og);
}

/* input_act_row against the generic (scalar) row. */
static void input_act_case(const ql_cpu_kernels *kt, int it)
{
    static const int64_t big[] = {255, 513, 1031, 4096, 8223};
    static const float edges[] = {0.55f, -0.55f, 0x1.19999ap-1f, 0x1.199998p-1f, 10.0f, -10.0f, 9.0f, 44.5f, -52.0f,
                                  89.0f, -104.0f, 88.7f, -87.4f, 1e-30f, -1e-38f, 0x1p-149f, 3.0f, -3.0f, 0.0f, -0.0f};
    const int act = 1 + it % 3;
    const ql_dtype dt = dts[(it / 3) % 3], wdt = dts[tu_range(0, 2)];
    const int64_t k = it < 240 ? 1 + it % 80 : big[it % 5], cols = ql_input_act_cols(act, k);
    const int kind = pick_row_kind();
    void *x = xalloc((size_t)cols * 4), *w = xalloc((size_t)k * 4);
    fill_row(dt, x, 0, cols, kind);
    if (it % 4 == 1)
        for (int e = 0; e < 6; e++) ql_store_f(dt, x, tu_range(0, cols - 1), edges[tu_range(0, 19)]);
    for (int64_t j = 0; j < k; j++) ql_store_f(wdt, w, j, (float)(1.0 + 0.5 * tu_gauss()));
    const ql_input_act_plan p = {act, dt, w, wdt, it % 2 ? 1e-6f : 0.0f};
    const size_t bytes = (size_t)(k + 8) * 4;
    char *ot = xalloc(bytes), *og = xalloc(bytes);
    memset(ot, 0x5b, bytes);
    memset(og, 0x5b, bytes);
    kt->input_act_row(&p, x, k, ot);
    gen->input_act_row(&p, x, k, og);
    int64_t bad = 0, first = -1;
    for (int64_t j = 0; j < k; j++)
        if (!same_elem(dt, ot, og, j)) {
            if (!bad) first = j;
            bad++;
        }
    const size_t used = (size_t)k * ql_dtype_size(dt);
    CHECK(bad == 0 && !memcmp(ot + used, og + used, bytes - used),
          "%s input_act_row %d %s (weight %s) K=%lld row %s: %lld values differ (first col %lld: %a, generic %a), or a "
          "write past K", tname, act, ql_dtype_name(dt), ql_dtype_name(wdt), (long long)k, row_kind_names[kind],
          (long long)bad, (long long)first, bad ? ql_load_f(dt, ot, first) : 0.0f, bad ? ql_load_f(dt, og, first) : 0.0f);
    free(x); free(w); free(ot); free(og);
}

/* Every bf16 and fp16 bit pattern through gelu_tanh and swiglu (up = 1, so
 * the output is silu(gate) rounded): the vector rows look these up in
 * tables (quant/act_table.h), the generic row computes them, so this
 * compares the whole table with the scalar functions. */
static void input_act_all16(const ql_cpu_kernels *kt)
{
    const int64_t k = 65536;
    uint16_t *x = xalloc((size_t)(2 * k) * 2), *ot = xalloc((size_t)k * 2), *og = xalloc((size_t)k * 2);
    static const ql_dtype d16[2] = {QL_BF16, QL_F16};
    int64_t checked = 0;
    for (int d = 0; d < 2; d++)
        for (int act = QL_INPUT_ACT_GELU_TANH; act <= QL_INPUT_ACT_SWIGLU; act++) {
            const ql_dtype dt = d16[d];
            for (int64_t v = 0; v < k; v++) x[v] = (uint16_t)v;
            for (int64_t v = 0; v < k; v++) ql_store_f(dt, x + k, v, 1.0f);
            const ql_input_act_plan p = {act, dt, NULL, QL_F32, 0.0f};
            kt->input_act_row(&p, x, k, ot);
            gen->input_act_row(&p, x, k, og);
            int64_t bad = 0, first = -1;
            for (int64_t v = 0; v < k; v++)
                if (!same_elem(dt, ot, og, v)) {
                    if (!bad) first = v;
                    bad++;
                }
            CHECK(bad == 0, "%s input_act_row %d %s, every bit pattern: %lld of 65536 differ (first input 0x%04llx: %a, "
                  "generic %a)", tname, act, ql_dtype_name(dt), (long long)bad, (long long)first,
                  bad ? ql_load_f(dt, ot, first) : 0.0f, bad ? ql_load_f(dt, og, first) : 0.0f);
            checked += k;
        }
    printf("  input_act_row: every bf16 and fp16 input of gelu_tanh and swiglu (%lld values)\n", (long long)checked);
    free(x); free(ot); free(og);
}

/* A fixed row of signed zeros, (-0, -0, +0, +0) repeated: the rotation's
 * butterflies give -0 (a - b with a = b = -0 ... ) in the generic order, so a
 * kernel that forms b - a for -(a - b) shows here whatever the seed. */
static void rows_signed_zero(const ql_cpu_kernels *kt, ql_dtype dt, int64_t g)
{
    const int64_t k = g > 0 ? (g > 64 ? g : 64) : 64, ldo = k;
    void *x = malloc((size_t)k * ql_dtype_size(dt));
    for (int64_t j = 0; j < k; j++) ql_store_f(dt, x, j, j % 4 < 2 ? -0.0f : 0.0f);
    float *ot = xalloc((size_t)ldo * 4), *og = xalloc((size_t)ldo * 4);
    kt->rows_to_f32(dt, x, k, 0, 1, k, g, 0, ot, ldo);
    gen->rows_to_f32(dt, x, k, 0, 1, k, g, 0, og, ldo);
    int64_t bad = 0, first = -1;
    for (int64_t j = 0; j < k; j++)
        if (fbits(ot[j]) != fbits(og[j])) {
            if (!bad) first = j;
            bad++;
        }
    CHECK(bad == 0, "%s rows_to_f32 %s G=%lld K=%lld, the row (-0, -0, +0, +0, ...): %lld of %lld values differ in sign (first "
          "col %lld: %a, generic %a)", tname, ql_dtype_name(dt), (long long)g, (long long)k, (long long)bad, (long long)k,
          (long long)first, bad ? ot[first] : 0.0f, bad ? og[first] : 0.0f);
    free(x); free(ot); free(og);
}

/* ---------------------------------------------------------- quantize_rows */

static void quant_case(const ql_cpu_kernels *kt, ql_dtype dt, int64_t g, int64_t k)
{
    const int64_t m = tu_range(1, 7), ldx = k + tu_range(0, 3), ldq = k + tu_range(0, 5);
    int kinds[8];
    void *x = make_rows(dt, m, k, ldx, kinds, 1);
    const int64_t r0 = tu_range(0, m - 1), r1 = tu_range(r0 + 1, m);
    int8_t *qt = malloc((size_t)(m * ldq)), *qg = malloc((size_t)(m * ldq));
    memset(qt, 0x5a, (size_t)(m * ldq));
    memset(qg, 0x5a, (size_t)(m * ldq));
    float *st = malloc((size_t)m * 4), *sg = malloc((size_t)m * 4);
    memset(st, 0x5a, (size_t)m * 4);
    memset(sg, 0x5a, (size_t)m * 4);
    const size_t sbytes = (size_t)((k + 15) & ~(int64_t)15) * 4;
    float *sct = xalloc(sbytes), *scg = xalloc(sbytes);
    const int64_t bt = kt->quantize_rows(dt, x, ldx, r0, r1, k, g, qt, ldq, st, sct);
    const int64_t bg = gen->quantize_rows(dt, x, ldx, r0, r1, k, g, qg, ldq, sg, scg);
    int64_t bad = 0, fr = -1, fj = -1, bad_s = 0;
    for (int64_t r = 0; r < m; r++) {
        bad_s += !same_f(st[r], sg[r]);
        for (int64_t j = 0; j < ldq; j++)
            if (qt[r * ldq + j] != qg[r * ldq + j]) {
                if (!bad) fr = r, fj = j;
                bad++;
            }
    }
    CHECK(bt == bg && bad == 0 && bad_s == 0,
          "%s quantize_rows %s G=%lld K=%lld rows [%lld,%lld): returned %lld, generic %lld; %lld code bytes differ (first row "
          "%lld (%s) col %lld: %d, generic %d), %lld scales differ",
          tname, ql_dtype_name(dt), (long long)g, (long long)k, (long long)r0, (long long)r1, (long long)bt, (long long)bg,
          (long long)bad, (long long)fr, fr >= 0 ? row_kind_names[kinds[fr]] : "-", (long long)fj, bad ? qt[fr * ldq + fj] : 0,
          bad ? qg[fr * ldq + fj] : 0, (long long)bad_s);
    /* the generic quantizer itself: bad rows are NaN / Inf rows or huge rows that rotate to Inf */
    for (int64_t r = r0; r < r1; r++)
        if (kinds[r] == ROW_NAN || kinds[r] == ROW_INF) {
            CHECK(bg >= r0 && bg <= r && is_nan_f(sg[r]), "generic quantize_rows: row %lld (%s) not reported (%lld) or scale %a",
                  (long long)r, row_kind_names[kinds[r]], (long long)bg, sg[r]);
            break;
        }
    free(x); free(qt); free(qg); free(st); free(sg); free(sct); free(scg);
}

/* ------------------------------------------------------------------ sr_row */

static void sr_case(const ql_cpu_kernels *kt, int it)
{
    static const int64_t ks[] = {1, 15, 16, 17, 31, 100, 1000};
    const int64_t k = it < 7 ? ks[it] : tu_range(1, 400);
    float *v = malloc((size_t)k * 4);
    const int e = (int)tu_range(-30, 30);
    float a = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        v[j] = (float)ldexp(tu_gauss(), e);
        if (tu_range(0, 20) == 0) v[j] = 0.0f;
        a = fabsf(v[j]) > a ? fabsf(v[j]) : a;
    }
    /* the row's own scale, or a smaller one (codes clamp at -128 / 127) */
    const float s = it % 3 == 2 ? ql_sr_scale(a) * 0.25f : ql_sr_scale(a);
    uint64_t seed = tu_next();
    if (it % 5 == 0) seed = tu_next() & 0xff;
    if (!seed) seed = 1;
    int64_t idx0 = (int64_t)(tu_next() >> 24);
    if (it % 4 == 1) /* the low word of idx + seed wraps within the row */
        idx0 = (int64_t)((0x1FFFFFFF8ull - (seed & 0xFFFFFFFFull) - (uint64_t)tu_range(0, 20)) & 0xFFFFFFFFull) +
               ((int64_t)tu_range(0, 1000) << 32);
    int8_t *qt = malloc((size_t)k + 16), *qg = malloc((size_t)k + 16);
    memset(qt, 0x5a, (size_t)k + 16);
    memset(qg, 0x5a, (size_t)k + 16);
    kt->sr_row(v, k, s, idx0, seed, qt);
    gen->sr_row(v, k, s, idx0, seed, qg);
    int64_t bad = 0, first = -1;
    for (int64_t j = 0; j < k + 16; j++)
        if (qt[j] != qg[j]) {
            if (!bad) first = j;
            bad++;
        }
    CHECK(bad == 0, "%s sr_row K=%lld s=%a idx0=%lld seed=%llu: %lld codes differ (first %lld: %d, generic %d)", tname,
          (long long)k, s, (long long)idx0, (unsigned long long)seed, (long long)bad, (long long)first, bad ? qt[first] : 0,
          bad ? qg[first] : 0);
    free(v); free(qt); free(qg);
}

/* ------------------------------------------------------------ lowrank_add */

static void lowrank_case(const ql_cpu_kernels *kt, int it)
{
    static const int64_t ks[] = {1, 7, 16, 100, 513, 1100};
    const int64_t rows = tu_range(1, 5), k = it < 6 ? ks[it] : tu_range(1, 1200), ld = k + tu_range(0, 3), rank = tu_range(1, 20);
    float *wt = malloc((size_t)(rows * ld) * 4), *wg = malloc((size_t)(rows * ld) * 4);
    float *up = malloc((size_t)(rows * rank) * 4), *down = malloc((size_t)(rank * k) * 4);
    for (int64_t i = 0; i < rows * ld; i++) wt[i] = wg[i] = (float)(tu_gauss() * 0.05);
    for (int64_t i = 0; i < rows * rank; i++) up[i] = (float)(tu_gauss() * 0.1);
    for (int64_t i = 0; i < rank * k; i++) down[i] = (float)(tu_gauss() * 0.1);
    const float c = (float)(tu_gauss() * 2.0);
    kt->lowrank_add(wt, rows, k, ld, up, rank, down, c);
    gen->lowrank_add(wg, rows, k, ld, up, rank, down, c);
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < rows * ld; i++)
        if (fbits(wt[i]) != fbits(wg[i])) {
            if (!bad) first = i;
            bad++;
        }
    CHECK(bad == 0, "%s lowrank_add rows %lld K=%lld ld %lld rank %lld: %lld values differ (first [%lld,%lld] %a, generic %a)",
          tname, (long long)rows, (long long)k, (long long)ld, (long long)rank, (long long)bad, (long long)(first / ld),
          (long long)(first % ld), bad ? wt[first] : 0.0f, bad ? wg[first] : 0.0f);
    free(wt); free(wg); free(up); free(down);
}

/* ------------------------------------------------------------ wxa8_decode */

/* A W4A8/W6A8 weight: quantized by the library (lib = 1; mode, group and
 * the ConvRot group as given) or random codes and e4m3 scales (lib = 0:
 * zero, subnormal and large scales, where the grid clamps at ±127). */
typedef struct {
    ql_wxa8_weight w;
    uint8_t *q, *s_rel;
    float *s_channel, lut[16];
} wxa8_made;

static int make_wxa8(wxa8_made *o, int lib, ql_wxa8_mode mode, int64_t n, int64_t k, int64_t group, int64_t cg)
{
    memset(o, 0, sizeof *o);
    const int bits = mode == QL_WXA8_6BIT ? 6 : 4;
    const int64_t rb = ql_wxa8_row_bytes(bits, k), ng = k / group;
    o->q = malloc((size_t)(n * rb));
    o->s_rel = malloc((size_t)(n * ng));
    o->s_channel = malloc((size_t)n * 4);
    ql_wxa8_fixed_lut(o->lut);
    const float *cb = mode == QL_WXA8_CODEBOOK ? o->lut : NULL;
    if (lib) {
        float *wf = malloc((size_t)(n * k) * 4);
        tu_fill_gauss(QL_F32, wf, n * k, 0.02);
        for (int64_t j = 0; j < group && j < k; j++) wf[j] = 0.0f; /* a zero group */
        const ql_wxa8_qparams p = {mode, group, cg, cb, 0};
        const ql_status st = ql_wxa8_quantize(QL_F32, wf, n, k, k, &p, o->q, rb, o->s_rel, o->s_channel, NULL);
        free(wf);
        if (st != QL_OK) {
            CHECK_OK(st);
            return 0;
        }
    } else {
        uint8_t *codes = malloc((size_t)k);
        for (int64_t r = 0; r < n; r++) {
            for (int64_t j = 0; j < k; j++) codes[j] = (uint8_t)(tu_next() % (bits == 6 ? 64 : 16));
            ql_wxa8_pack_row(bits, codes, k, o->q + r * rb);
        }
        free(codes);
        for (int64_t i = 0; i < n * ng; i++) {
            const int kind = (int)(tu_next() % 8);
            o->s_rel[i] = kind == 0 ? (uint8_t)tu_range(0, 7) : kind == 1 ? (uint8_t)tu_range(0x70, 0x7E) : (uint8_t)tu_range(0x08, 0x6F);
        }
        for (int64_t i = 0; i < n; i++) o->s_channel[i] = (float)(1e-3 * (0.5 + tu_uniform()));
    }
    o->w = (ql_wxa8_weight){.n = n, .k = k, .bits = bits, .q = o->q, .ldq = rb, .s_rel = o->s_rel, .s_rel_f32 = 0,
                            .s_channel = o->s_channel, .codebook = cb, .group = group, .convrot_group = cg};
    return 1;
}

static void free_wxa8(wxa8_made *o)
{
    free(o->q);
    free(o->s_rel);
    free(o->s_channel);
}

/* The register decode of a few rows (wxa8_rows) against the int8 grid of
 * ql_wxa8_decode, exact: weights packed as the kernel stores them (+ 128
 * for VNNI, signed for AMX) and the other way (the flag flipped on a copy
 * of the kernel), so that both layouts run wherever AVX-512 does; random
 * activations over the whole int8 range, 1..rows_max rows. */
static void wxa8_rows_case(const ql_cpu_kernels *kt, const wxa8_made *o, int it)
{
    const ql_wxa8_weight *w = &o->w;
    const int64_t n = w->n, k = w->k;
    int8_t *grid = xalloc((size_t)(n * k));
    CHECK_OK(ql_wxa8_decode(w, grid, k));
    for (int flip = 0; flip < 2; flip++) {
        ql_s8_kernel ks = *kt->s8_decoded;
        if (flip) ks.b_offset128 = !ks.b_offset128;
        ql_wxa8_panels p;
        ql_packed_b b;
        CHECK_OK(ql_wxa8_panels_pack(&ks, w, &p, &b));
        if (!kt->wxa8_rows_ok(&p, &ks)) {
            ql_wxa8_panels_free(&p);
            continue;
        }
        const int64_t m = it % 7 == 0 ? 1 : tu_range(1, kt->wxa8_rows_max);
        int8_t *a = xalloc((size_t)(m * k));
        for (int64_t i = 0; i < m * k; i++) a[i] = (int8_t)tu_range(-128, 127);
        if (it % 5 == 1)
            for (int64_t i = 0; i < k; i++) a[i] = -128; /* a row at the limit: + 128 is 0 */
        /* the kernel's own A (int16 codes where aes = 2) and NR columns a panel */
        const int nr = ks.nr, aes = ks.aes ? ks.aes : 1;
        void *pa = xalloc(ql_packed_a_bytes(&ks, m, k) * (size_t)aes);
        int32_t *rowsum = xalloc((size_t)m * sizeof(int32_t)), *c = xalloc((size_t)(m * nr) * sizeof(int32_t));
        ql_pack_a_s8(&ks, a, m, k, k, pa, rowsum);
        int64_t bad = 0, fr = -1, fc = -1;
        for (int64_t jp = 0; jp < p.panels; jp++) {
            kt->wxa8_rows(&p, (const int8_t *)pa, ks.mr, m, jp, c);
            for (int64_t r = 0; r < m; r++)
                for (int64_t j = 0; j < nr && jp * nr + j < n; j++) {
                    int64_t want = ks.b_offset128 ? 128 * (int64_t)rowsum[r] : 0;
                    for (int64_t q = 0; q < k; q++) want += (int64_t)a[r * k + q] * grid[(jp * nr + j) * k + q];
                    if (c[r * nr + j] != want && !bad++) fr = r, fc = jp * nr + j;
                }
        }
        CHECK(bad == 0, "%s wxa8_rows (%s, %d bits, weights %s) M=%lld N=%lld K=%lld: %lld outputs wrong (first row %lld col %lld)",
              tname, ks.name, w->bits, ks.b_offset128 ? "+ 128" : "signed", (long long)m, (long long)n, (long long)k,
              (long long)bad, (long long)fr, (long long)fc);
        free(a), free(pa), free(rowsum), free(c);
        ql_wxa8_panels_free(&p);
    }
    free(grid);
}

static void wxa8_case(const ql_cpu_kernels *kt, int it)
{
    const ql_s8_kernel *kern = kt->s8_decoded;
    static const ql_wxa8_mode modes[] = {QL_WXA8_CODEBOOK, QL_WXA8_UNIFORM, QL_WXA8_6BIT};
    const ql_wxa8_mode mode = modes[it % 3];
    const int lib = it % 4 != 3;
    static const int64_t g4[] = {4, 8, 16, 32, 64}, g6[] = {16, 32, 64};
    const int64_t group = mode == QL_WXA8_6BIT ? g6[tu_range(0, 2)] : g4[tu_range(0, 4)];
    const int64_t cg = it % 3 == 0 ? 16 : it % 3 == 1 ? 64 : 256;
    int64_t unit = group > cg ? group : cg; /* K: a multiple of the group, the ConvRot group and 16 (32 for 6 bits) */
    if (unit < 32) unit = 32;
    const int64_t k = unit * tu_range(1, unit >= 256 ? 3 : 6) + (unit < 64 && it % 2 ? unit : 0);
    const int64_t n = it % 5 == 0 ? 1 : tu_range(1, 3 * kern->nr);
    wxa8_made o;
    if (!make_wxa8(&o, lib, mode, n, k, group, cg)) return;
    CHECK_OK(ql_wxa8_check(&o.w));
    ql_wxa8_panels p;
    ql_packed_b b;
    CHECK_OK(ql_wxa8_panels_pack(kern, &o.w, &p, &b));
    const int nr = p.nr;
    /* the whole weight, then a random block of panels and k4 rows (the GEMM's K slices) */
    for (int part = 0; part < 2; part++) {
        int64_t jp0 = 0, jp1 = p.panels, pc = 0, kc = p.k4;
        if (part) {
            jp0 = tu_range(0, p.panels - 1);
            jp1 = tu_range(jp0 + 1, p.panels);
            pc = tu_range(0, p.k4 - 1);
            kc = tu_range(1, p.k4 - pc);
            const int64_t step = kern->kb / 4; /* the GEMM's slices: whole A blocks (the vector decoders' case) */
            if (it % 2 && step > 1 && p.k4 >= step) {
                pc = pc / step * step;
                kc = kc / step * step > 0 ? kc / step * step : step;
                if (pc + kc > p.k4) pc = p.k4 - kc;
            }
        }
        const size_t bytes = (size_t)((jp1 - jp0) * kc * nr * 4);
        uint8_t *dt = xalloc(bytes + 64), *dg = xalloc(bytes + 64);
        memset(dt, 0x5a, bytes + 64);
        memset(dg, 0x5a, bytes + 64);
        kt->wxa8_decode(&p, jp0, jp1, pc, kc, dt);
        gen->wxa8_decode(&p, jp0, jp1, pc, kc, dg);
        int64_t bad = 0, first = -1;
        for (size_t i = 0; i < bytes + 64; i++)
            if (dt[i] != dg[i]) {
                if (!bad) first = (int64_t)i;
                bad++;
            }
        CHECK(bad == 0,
              "%s wxa8_decode (%s, %d bits, %s weight, group %lld, ConvRot %lld) N=%lld K=%lld panels [%lld,%lld) k4 rows "
              "[%lld,%lld): %lld bytes differ (first %lld: %u, generic %u)",
              tname, kern->name, o.w.bits, lib ? "quantized" : "random", (long long)group, (long long)cg, (long long)n,
              (long long)k, (long long)jp0, (long long)jp1, (long long)pc, (long long)(pc + kc), (long long)bad, (long long)first,
              bad ? dt[first] : 0, bad ? dg[first] : 0);
        if (!part) { /* the generic decoder itself: the int8 grid of ql_wxa8_decode, at the kernel's packed positions */
            int8_t *grid = malloc((size_t)(n * k));
            CHECK_OK(ql_wxa8_decode(&o.w, grid, k));
            const uint8_t off = kern->b_offset128 ? 128 : 0;
            const int kg = kern->kg ? kern->kg : 4; /* [rows][nr][kg]: k in groups of kg at the kernel's positions */
            const int64_t rows = p.k4 * 4 / kg;
            int64_t wrong = 0;
            for (int64_t jp = 0; jp < p.panels; jp++)
                for (int64_t r = 0; r < rows; r++)
                    for (int j = 0; j < nr; j++)
                        for (int t = 0; t < kg; t++) {
                            const int64_t col = jp * nr + j, kk = ql_a_element(kern->kb, kg * r + t);
                            const int want = col < n && kk < k ? grid[col * k + kk] : 0;
                            wrong += dg[(size_t)(((jp * rows + r) * nr + j) * kg + t)] != (uint8_t)((uint8_t)want + off);
                        }
            CHECK(wrong == 0, "generic wxa8_decode (%s, %d bits) N=%lld K=%lld: %lld bytes not the grid of ql_wxa8_decode",
                  kern->name, o.w.bits, (long long)n, (long long)k, (long long)wrong);
            free(grid);
        }
        free(dt);
        free(dg);
    }
    ql_wxa8_panels_free(&p);
    if (kt->wxa8_rows) wxa8_rows_case(kt, &o, it);
    free_wxa8(&o);
}

/* ------------------------------------------------------------ lora_t_row */

static void t_row_case(const ql_cpu_kernels *kt, int it, const int *mrs, int nmr)
{
    const ql_s8_kernel *kern = kt->s8;
    const int nr = kern->nr, kb = kern->kb, aes = kern->aes ? kern->aes : 1;
    const int64_t rt = it < 5 ? (int64_t[]){1, 3, 17, 64, 128}[it] : tu_range(1, 300), rpad = (rt + kb - 1) / kb * kb;
    const int mr = mrs[it % nmr], i = (int)tu_range(0, mr - 1), kind = (int)tu_range(0, 4);
    const int64_t dpanels = (rt + nr - 1) / nr;
    int32_t *cb = xalloc((size_t)(dpanels * mr * nr) * 4);
    int32_t *sct = xalloc((size_t)rpad * 5 + 64), *scg = xalloc((size_t)rpad * 5 + 64);
    const size_t tbytes = (size_t)(rpad * mr * aes);
    int8_t *tt = xalloc(tbytes), *tg = xalloc(tbytes);
    memset(tt, 0x11, tbytes);
    memset(tg, 0x11, tbytes);
    const int32_t mag = kind == 0 ? 3 : kind == 1 ? 127 * 127 * 300 : 1 << 29;
    const int32_t corr = kind == 4 ? (int32_t)tu_range(-(1 << 28), 1 << 28) : 0;
    for (int64_t j = 0; j < dpanels * mr * nr; j++) cb[j] = (int32_t)tu_range(-mag, mag) + corr;
    if (kind == 2) /* ties: amax 254, odd t give x.5 */
        for (int64_t c = 0; c < rt; c++) cb[((c / nr) * mr + i) * nr + c % nr] = c == 0 ? 254 : (int32_t)tu_range(-127, 127) * 2 + 1;
    if (it % 37 == 0) /* a zero row */
        for (int64_t c = 0; c < rt; c++) cb[((c / nr) * mr + i) * nr + c % nr] = corr;
    uint8_t perm[64];
    for (int q = 0; q < kb; q++) perm[q] = (uint8_t)ql_a_element(kb, q);
    int32_t s_t = 0, s_g = 0;
    const int32_t a_t = kt->lora_t_row(cb, mr, nr, kb, aes, perm, i, rt, rpad, corr, tt, sct, &s_t);
    const int32_t a_g = gen->lora_t_row(cb, mr, nr, kb, aes, perm, i, rt, rpad, corr, tg, scg, &s_g);
    int64_t diff = 0, first = -1;
    for (size_t b = 0; b < tbytes; b++)
        if (tt[b] != tg[b]) {
            if (!diff) first = (int64_t)b;
            diff++;
        }
    CHECK(a_t == a_g && s_t == s_g && diff == 0,
          "%s lora_t_row (rank %lld, mr %d, row %d, kind %d, corr %d): amax %d/%d sum %d/%d, %lld bytes of the T panel differ "
          "(first %lld)",
          tname, (long long)rt, mr, i, kind, corr, a_t, a_g, s_t, s_g, (long long)diff, (long long)first);
    free(cb); free(sct); free(scg); free(tt); free(tg);
}

/* ---------------------------------------------------------------- driver */

typedef struct {
    const char *name;
    int same;
} entry_fact;

#define N_ENTRY_FACTS 13
/* Which of kt's entries are the generic table's own (the scalar twins). */
static void entry_facts(const ql_cpu_kernels *kt, entry_fact f[N_ENTRY_FACTS])
{
    const entry_fact all[N_ENTRY_FACTS] = {
        {"s8", kt->s8 == gen->s8},
        {"prologue", kt->prologue == gen->prologue},
        {"w8a8_epilogue", kt->w8a8_epilogue == gen->w8a8_epilogue},
        {"wxa8_decode", kt->wxa8_decode == gen->wxa8_decode},
        {"lora_t_row", kt->lora_t_row == gen->lora_t_row},
        {"f32", kt->f32 == gen->f32},
        {"bf16", kt->bf16 == gen->bf16},
        {"f32_epilogue", kt->f32_epilogue == gen->f32_epilogue},
        {"rows_to_f32", kt->rows_to_f32 == gen->rows_to_f32},
        {"quantize_rows", kt->quantize_rows == gen->quantize_rows},
        {"sr_row", kt->sr_row == gen->sr_row},
        {"lowrank_add", kt->lowrank_add == gen->lowrank_add},
        {"input_act_row", kt->input_act_row == gen->input_act_row},
    };
    memcpy(f, all, sizeof all);
}

static void report_entries(const ql_cpu_kernels *kt)
{
    entry_fact f[N_ENTRY_FACTS];
    entry_facts(kt, f);
    char own[512] = "", same[512] = "";
    for (size_t i = 0; i < N_ENTRY_FACTS; i++) {
        char *dst = f[i].same ? same : own;
        if (*dst) strcat(dst, ", ");
        strcat(dst, f[i].name);
    }
    printf("  own entries: %s\n", *own ? own : "(none)");
    printf("  same as generic (not compared): %s\n", *same ? same : "(none)");
    printf("  s8 %s (%dx%d kb %d%s%s), %d row variant(s), s8_decoded %s, s8_int8_a %s; f32 %s, bf16 %s, wo_bf16 %s\n",
           kt->s8->name, kt->s8->mr, kt->s8->nr, kt->s8->kb, kt->s8->b_offset128 ? ", B + 128" : "",
           kt->s8->aes == 2 ? ", int16 A" : "", kt->s8_rows ? kt->s8_rows_max : 0, kt->s8_decoded->name, kt->s8_int8_a->name,
           kt->f32->name, kt->bf16->name, kt->wo_bf16 ? kt->wo_bf16->name : "(the f32 kernel)");
}

static void test_table(const ql_cpu_kernels *kt)
{
    const bool is_gen = kt == gen;
    report_entries(kt);
    test_s8(kt);
    test_float_kernels(kt);
    if (is_gen) {
        printf("  the generic table: its twin entries are the reference\n");
        return;
    }
    if (kt->prologue != gen->prologue) test_prologue(kt);
    if (kt->w8a8_epilogue != gen->w8a8_epilogue) {
        w8a8_epi_counts[0] = w8a8_epi_counts[1] = 0;
        for (int it = 0; it < 600; it++) w8a8_epi_case(kt, it, kt->s8->mr);
        printf("  w8a8_epilogue: %d tiles of %dx%d against the generic epilogue (%d clean full-width bf16 ones without "
               "residual or GELU)\n", w8a8_epi_counts[0], kt->s8->mr, kt->s8->nr, w8a8_epi_counts[1]);
        /* the taller tiles of another built table (run by this CPU or not)
         * that shares this epilogue and nr: amx's 32 rows on avx512vnni's */
        int tall = kt->s8->mr;
        for (int i = 0; i < ql_cpu_kernels_count(); i++) {
            const ql_cpu_kernels *o = ql_cpu_kernels_at(i);
            if (o->w8a8_epilogue == kt->w8a8_epilogue && o->s8->nr == kt->s8->nr && o->s8->mr > tall) tall = o->s8->mr;
        }
        if (tall > kt->s8->mr) {
            w8a8_epi_counts[0] = w8a8_epi_counts[1] = 0;
            for (int it = 0; it < 400; it++) w8a8_epi_case(kt, it, tall);
            printf("  w8a8_epilogue: %d tiles of %dx%d (a taller table's) against the generic epilogue (%d clean)\n",
                   w8a8_epi_counts[0], tall, kt->s8->nr, w8a8_epi_counts[1]);
        }
    }
    if (kt->f32_epilogue != gen->f32_epilogue) {
        for (int it = 0; it < 240; it++) f32_epi_case(kt, it);
        printf("  f32_epilogue: 240 tiles against the generic epilogue\n");
    }
    if (kt->rows_to_f32 != gen->rows_to_f32 || kt->quantize_rows != gen->quantize_rows) {
        int cases = 0;
        for (int di = 0; di < 3; di++)
            for (int gi = 0; gi < NGROUPS; gi++)
                for (int c = 0; c < (groups[gi] ? 5 : 8); c++, cases++) {
                    const int64_t k = k_for_group(groups[gi], c, 64);
                    if (kt->rows_to_f32 != gen->rows_to_f32) rows_case(kt, dts[di], groups[gi], k, c % 2);
                    if (kt->quantize_rows != gen->quantize_rows) quant_case(kt, dts[di], groups[gi], k);
                }
        if (kt->rows_to_f32 != gen->rows_to_f32)
            for (int gi = 0; gi < NGROUPS; gi++) rows_signed_zero(kt, dts[gi % 3], groups[gi]);
        printf("  rows_to_f32 / quantize_rows: %d cases each (where own)\n", cases);
    }
    if (kt->input_act_row != gen->input_act_row) {
        for (int it = 0; it < 300; it++) input_act_case(kt, it);
        input_act_all16(kt);
        printf("  input_act_row: 300 rows\n");
    }
    if (kt->sr_row != gen->sr_row) {
        for (int it = 0; it < 100; it++) sr_case(kt, it);
        printf("  sr_row: 100 rows\n");
    }
    if (kt->lowrank_add != gen->lowrank_add) {
        for (int it = 0; it < 30; it++) lowrank_case(kt, it);
        printf("  lowrank_add: 30 cases\n");
    }
    if (kt->wxa8_decode != gen->wxa8_decode) {
        const ql_cpu_kernels *pair = ql_cpu_kernels_for(kt->s8_decoded->isa);
        if (pair->wxa8_decode != kt->wxa8_decode)
            printf("  wxa8_decode: not the decoder of s8_decoded %s's table (%s): never paired with it, not compared\n",
                   kt->s8_decoded->name, ql_isa_name(kt->s8_decoded->isa));
        else {
            for (int it = 0; it < 36; it++) wxa8_case(kt, it);
            printf("  wxa8_decode: 36 weights on %s panels\n", kt->s8_decoded->name);
        }
    }
    if (kt->lora_t_row != gen->lora_t_row) {
        const ql_s8_kernel *k = kt->s8;
        if (k->kb != 64 || k->nr != 32 || (k->aes ? k->aes : 1) != 1)
            printf("  lora_t_row: the helper is for kb 64, nr 32, int8 A; %s has kb %d nr %d aes %d (skipped)\n", k->name, k->kb,
                   k->nr, k->aes ? k->aes : 1);
        else {
            int mrs[40], nmr = 0;
            for (int r = 0; r <= kt->s8_rows_max; r++) {
                const int mr = r == 0 ? k->mr : ql_s8_kernel_rows(kt, r)->mr;
                int seen = 0;
                for (int i = 0; i < nmr; i++) seen |= mrs[i] == mr;
                if (!seen) mrs[nmr++] = mr;
            }
            for (int it = 0; it < 200; it++) t_row_case(kt, it, mrs, nmr);
            printf("  lora_t_row: 200 rows\n");
        }
    }
}

/* No table runs an entry on the scalar twin where a lesser table of its
 * line has a vector one: a table that lists its entries without a base
 * keeps the generic ones for any it forgets (amx and avxvnni once ran the
 * input activations that way). Checked on every built table, run or not. */
static void check_no_fallback(void)
{
    static const ql_isa line[][2] = {{QL_ISA_AVXVNNI, QL_ISA_AVX2},      {QL_ISA_AVX512VNNI, QL_ISA_AVX2},
                                     {QL_ISA_AVX512BF16, QL_ISA_AVX512VNNI}, {QL_ISA_AMX, QL_ISA_AVX512VNNI},
                                     {QL_ISA_NEONDOT, QL_ISA_NEON},       {QL_ISA_I8MM, QL_ISA_NEONDOT},
                                     {QL_ISA_NEONBF16, QL_ISA_I8MM}};
    int pairs = 0;
    for (size_t i = 0; i < sizeof line / sizeof line[0]; i++) {
        const ql_cpu_kernels *hi = NULL, *lo = NULL;
        for (int t = 0; t < ql_cpu_kernels_count(); t++) {
            const ql_cpu_kernels *kt = ql_cpu_kernels_at(t);
            if (kt->isa == line[i][0]) hi = kt;
            if (kt->isa == line[i][1]) lo = kt;
        }
        if (!hi || !lo) continue; /* not built for this architecture */
        pairs++;
        entry_fact fh[N_ENTRY_FACTS], fl[N_ENTRY_FACTS];
        entry_facts(hi, fh);
        entry_facts(lo, fl);
        for (int e = 0; e < N_ENTRY_FACTS; e++)
            CHECK(!fh[e].same || fl[e].same, "table %s runs %s on the generic twin, where %s has its own", ql_isa_name(hi->isa),
                  fh[e].name, ql_isa_name(lo->isa));
    }
    CHECK(pairs > 0 || ql_cpu_kernels_count() == 1, "no pair of tables of one line was found among %d tables",
          ql_cpu_kernels_count());
    printf("tables of one line, no entry below the lesser table's: %d pairs\n", pairs);
}

int main(void)
{
    tu_init("test_kernels");
    gen = ql_cpu_kernels_for(QL_ISA_GENERIC);
    CHECK(gen != NULL && gen->isa == QL_ISA_GENERIC, "no generic table");
    if (!gen) return tu_finish();
    const int count = ql_cpu_kernels_count();
    CHECK(count >= 1 && ql_cpu_kernels_at(count - 1) == gen, "the registry's last table is not the generic one");
    make_s8_cases();
    check_no_fallback();
    /* generic first (the reference's own exactness), then from the oldest up */
    for (int i = count - 1; i >= 0; i--) {
        const ql_cpu_kernels *kt = ql_cpu_kernels_at(i);
        tname = ql_isa_name(kt->isa);
        CHECK(ql_cpu_kernels_for(kt->isa) == kt, "%s: ql_cpu_kernels_for does not return the walked table", tname);
        check_sanity(kt);
        if (!ql_isa_supported(kt->isa)) {
            /* a decoder of another table's ISA (AVX-VNNI's is AVX2's) still runs: its panels against the generic ones */
            const ql_cpu_kernels *own = NULL;
            for (int j = 0; j < count; j++)
                if (ql_cpu_kernels_at(j) != kt && ql_cpu_kernels_at(j)->wxa8_decode == kt->wxa8_decode) own = ql_cpu_kernels_at(j);
            if (own && own != gen && ql_isa_supported(own->isa)) {
                for (int it = 0; it < 36; it++) wxa8_case(kt, it);
                printf("table %s: not run by this CPU; its wxa8_decode (%s's) on 36 weights of %s panels\n", tname,
                       ql_isa_name(own->isa), kt->s8_decoded->name);
            } else
                printf("table %s: not run by this CPU (sanity only)\n", tname);
            continue;
        }
        printf("table %s:\n", tname);
        const int before = tu_failed;
        test_table(kt);
        printf("  -> %s\n", tu_failed == before ? "ok" : "FAILURES");
    }
    if (nan_payloads) printf("note: %lld outputs NaN on both sides with different NaN bits (not a failure)\n", (long long)nan_payloads);
    for (int c = 0; c < n_s8_cases; c++) {
        free(s8_cases[c].a);
        free(s8_cases[c].b);
        free(s8_cases[c].ref);
    }
    return tu_finish();
}
