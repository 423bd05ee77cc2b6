/* The CPU backend: weights packed once at creation for the context's ISA
 * table; a forward runs the fused pipeline (prologue, int8 or float GEMM,
 * epilogue) with the context's threads. Arguments arrive checked. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "cpu/lora.h"
#include "cpu/registry.h"
#include "cpu/wxa8_linear.h"
#include "cpu/wxa8_panels.h"
#include "linear/prologue_cache.h"
#include "quant/input_act.h"

/* Rows quantized and multiplied per step: bounds the packed-activation
 * buffer (rows·K bytes) for very tall inputs. A multiple of every MR. */
#define QL_M_CHUNK 12288

typedef struct cpu_linear {
    ql_context *ctx;
    const ql_cpu_kernels *kt; /* the context's ISA's table at creation */
    ql_linear_kind kind;
    int64_t n, k;
    /* int8 weight (W8A8): packed for the kernel, plus its scales */
    const ql_s8_kernel *s8;
    ql_packed_b b8;
    float *sw;
    int64_t n_sw;
    int64_t group;
    /* float-GEMM weight: fp32 / bf16 (DENSE), int8 codes (WEIGHT_ONLY); for
     * DEQUANT the plain int8 codes, expanded on every call */
    const ql_f32_kernel *f32;
    ql_packed_f32 bf;
    ql_dtype compute;
    bool codes_sym; /* weight-only: no code is -128 (the kernels' sym variant) */
    int8_t *codes;
    /* the bias as each output dtype sees it (bias.to(out_dtype)), as fp32:
     * [0] fp32, [1] fp16, [2] bf16 (indexed by ql_dtype); NULL: no bias */
    float *bias[3];
    /* W8A8 epilogue facts (see ql_w8a8_epi.finite_weights), per output dtype;
     * scales_small: its weight-scale half, for a per-call bias */
    bool finite_weights[3];
    bool scales_small;
    /* W4A8/W6A8: codes decoded inside the GEMM (b8 decodes from wp), and
     * the asymmetric correction [k/corr_group, n] (fp32), NULL if none */
    ql_wxa8_panels *wp;
    float *corr;
    int64_t corr_group;
    ql_lora_set *lora; /* unmerged LoRAs (W8A8 only); NULL: none */
} cpu_linear;


static void cpu_destroy(void *impl)
{
    cpu_linear *l = impl;
    if (!l) return;
    ql_packed_b_free(&l->b8);
    ql_packed_f32_free(&l->bf);
    ql_aligned_free(l->sw);
    ql_aligned_free(l->codes);
    ql_wxa8_panels_free(l->wp);
    free(l->wp);
    ql_aligned_free(l->corr);
    for (int i = 0; i < 3; i++) ql_aligned_free(l->bias[i]);
    ql_lora_set_free(l->lora);
    free(l);
}

static ql_status copy_bias(cpu_linear *l, const void *bias, ql_dtype dt, int64_t n)
{
    if (!bias) return QL_OK;
    QL_TRY(ql_check_float_dtype("ql_linear_create", "bias", dt));
    const ql_dtype outs[3] = {QL_F32, QL_F16, QL_BF16};
    for (int i = 0; i < 3; i++) QL_TRY(ql_bias_to_f32("ql_linear_create", bias, dt, n, outs[i], &l->bias[outs[i]]));
    return QL_OK;
}

static ql_status create_int8(cpu_linear *l, const ql_linear_desc *d, const ql_wxa8_weight *packed)
{
    const ql_int8_weight *w = &d->int8; /* checked */
    l->n = w->n;
    l->k = w->k;
    l->group = w->convrot_group;
    l->n_sw = w->n_scale;
    l->sw = ql_aligned_alloc((size_t)w->n_scale * sizeof(float));
    if (!l->sw) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_create: out of memory");
    memcpy(l->sw, w->scale, (size_t)w->n_scale * sizeof(float));
    QL_TRY(copy_bias(l, w->bias, w->bias_dtype, w->n));
    bool scales_ok = true;
    for (int64_t i = 0; i < w->n_scale; i++) scales_ok &= fabsf(w->scale[i]) <= 64.0f;
    l->scales_small = scales_ok;
    for (int t = 0; t < 3; t++) {
        l->finite_weights[t] = scales_ok;
        for (int64_t i = 0; l->bias[t] && i < w->n; i++) l->finite_weights[t] &= fabsf(l->bias[t][i]) <= 3.402823466e38f;
    }
    if (d->kind == QL_LINEAR_W8A8) {
        /* the table names the kernels that W4A8/W6A8 layers run on */
        l->s8 = l->corr ? l->kt->s8_int8_a : l->kt->s8;
        if (packed) {
            l->wp = calloc(1, sizeof *l->wp);
            if (!l->wp) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_create: out of memory");
            l->s8 = l->kt->s8_decoded;
            if (l->corr && l->s8->aes == 2) l->s8 = l->kt->s8_int8_a; /* the correction reads int8 A back, not int16 */
            return ql_wxa8_panels_pack(l->s8, packed, l->wp, &l->b8);
        }
        return ql_pack_b_s8(l->s8, w->q, w->n, w->k, w->ldq, &l->b8);
    }
    l->f32 = l->kt->f32;
    l->compute = QL_F32;
    if (d->kind == QL_LINEAR_WEIGHT_ONLY) { /* codes stay int8, decoded slice by slice */
        l->codes_sym = true;
        for (int64_t r = 0; r < w->n && l->codes_sym; r++)
            for (int64_t i = 0; i < w->k; i++) l->codes_sym &= w->q[r * w->ldq + i] != -128;
        return ql_pack_b_float(l->f32, QL_I8, w->q, w->n, w->k, w->ldq, QL_I8, l->ctx->threads, &l->bf);
    }
    /* DEQUANT keeps the int8 codes resident and expands them on every call. */
    size_t bytes = (size_t)(w->n * w->k);
    l->codes = ql_aligned_alloc(bytes);
    if (!l->codes) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_create: cannot allocate %zu bytes", bytes);
    for (int64_t r = 0; r < w->n; r++) memcpy(l->codes + r * w->k, w->q + r * w->ldq, (size_t)w->k);
    return QL_OK;
}

static ql_status create_layer(cpu_linear *l, const ql_linear_desc *d)
{
    const char *fn = "ql_linear_create";
    switch (d->kind) {
    case QL_LINEAR_W8A8:
    case QL_LINEAR_WEIGHT_ONLY:
    case QL_LINEAR_DEQUANT:
    case QL_LINEAR_WXA8_PACKED:
        if (!d->wxa8.bits) return create_int8(l, d, NULL);
        {
            ql_wxa8_prepared wp;
            QL_TRY(ql_wxa8_linear_prepare(d, &wp));
            l->corr = wp.corr;
            l->corr_group = wp.corr_group;
            l->kind = wp.desc.kind;
            ql_status st = create_int8(l, &wp.desc, wp.packed);
            free(wp.grid);
            return st;
        }
    case QL_LINEAR_DENSE:
        l->n = d->n;
        l->k = d->k;
        /* bf16 compute: operands rounded to bf16, so BFMMLA (where the ISA has
         * it) multiplies exactly the values the other kernels do; its sums
         * round their own way (docs/NUMERICS.md) */
        l->f32 = d->compute_dtype == QL_BF16 ? l->kt->bf16 : l->kt->f32;
        l->compute = d->compute_dtype;
        QL_TRY(copy_bias(l, d->bias, d->bias_dtype, d->n));
        return ql_pack_b_float(l->f32, d->weight_dtype, d->weight, d->n, d->k, d->ld_weight, d->compute_dtype,
                               l->ctx->threads, &l->bf);
    default: return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown linear kind %d", fn, (int)d->kind);
    }
}

static ql_status cpu_create(ql_context *ctx, const ql_linear_desc *d, void **impl, ql_layer_facts *info)
{
    cpu_linear *l = calloc(1, sizeof *l);
    if (!l) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_create: out of memory");
    l->ctx = ctx;
    l->kt = ql_cpu_kernels_for(ctx->isa);
    l->kind = d->kind;
    ql_status st = create_layer(l, d);
    if (st != QL_OK) {
        cpu_destroy(l);
        return st;
    }
    *info = (ql_layer_facts){l->kind, l->n, l->k, l->group};
    *impl = l;
    return QL_OK;
}

static size_t cpu_weight_bytes(const void *impl)
{
    const cpu_linear *l = impl;
    const size_t corr = l->corr ? (size_t)(l->k / l->corr_group * l->n) * 4 : 0;
    if (l->wp) return ql_wxa8_panels_bytes(l->wp) + (size_t)l->n_sw * 4 + corr;
    if (l->kind == QL_LINEAR_W8A8) return (size_t)(l->b8.panels * l->b8.k4 * l->b8.nr * 4) + (size_t)l->n_sw * 4 + corr;
    if (l->kind == QL_LINEAR_DEQUANT) return (size_t)(l->n * l->k) + (size_t)l->n_sw * 4;
    return ql_packed_f32_bytes(&l->bf) + (size_t)l->n_sw * 4;
}

/* Threads for one forward of m rows. Below QL_SERIAL_WORK multiply-adds the
 * call stays on the calling thread and never enters a parallel region: waking
 * a sleeping OpenMP worker (OMP_WAIT_POLICY=passive, or a pool idle past its
 * spin) costs ~100 µs, more than a tiny layer's whole work. The split of
 * rows and N panels over threads never changes a result, so both routes are
 * bit-identical (tested). Threshold measured (docs/MEASUREMENTS.md, tiny layers). */
#define QL_SERIAL_WORK ((int64_t)1 << 20)
static int forward_threads(const cpu_linear *l, int64_t m)
{
    const int64_t lim = l->ctx->serial_work >= 0 ? l->ctx->serial_work : QL_SERIAL_WORK;
    return (double)m * (double)l->n * (double)l->k < (double)lim ? 1 : l->ctx->threads;
}

/* ---- W8A8 */

/* One chunk's prologue, shared by the threads of the GEMM's parallel region. */
typedef struct {
    const ql_s8_kernel *kern;
    const ql_cpu_kernels *ops; /* the table of kern's ISA: its prologue */
    ql_dtype xdt;
    const void *xc;
    int64_t ldx, mc, k, group;
    void *packed;
    float *sx;
    int32_t *rowsum;
    char *scratch;
    size_t scratch_bytes, stage_off;
    ql_lora_run *lora; /* NULL: none */
    const ql_input_act_plan *act; /* NULL: none */
    size_t act_off;               /* the activated row in each thread's scratch */
    /* the chunk's work units (runs of unit_rows rows, or whole panels: see
     * prologue_part), split over `planned` threads with stealing */
    ql_panel_range *units;
    int planned;
    int64_t unit_rows, nunits;
    /* per unit: packed (release), for ql_gemm_pre.ready; NULL: a barrier */
    _Atomic unsigned char *done;
} prologue_job;

/* Rows [r0, r1) of the m rows at x into packed, by the ISA's prologue. With
 * an input activation, row by row: the activated row goes to the thread's
 * scratch and the prologue reads it there (ldx 0: every row index finds
 * it), while the panel position, scale and sum stay the row's own. */
static void prologue_rows(const prologue_job *j, const void *x, int64_t m, int64_t r0, int64_t r1, int8_t *packed,
                          float *sx, int32_t *rowsum, char *mine)
{
    const ql_prologue_fn pro = j->ops->prologue;
    const int mr = j->kern->mr;
    if (!j->act) {
        pro(j->xdt, x, j->ldx, m, j->k, j->group, mr, r0, r1, packed, sx, rowsum, (float *)mine);
        return;
    }
    void *row = mine + j->act_off;
    int64_t r = r0;
    for (; r < r1 && r < m; r++) {
        j->ops->input_act_row(j->act, ql_row_cptr(j->xdt, x, r, j->ldx), j->k, row);
        pro(j->xdt, row, 0, m, j->k, j->group, mr, r, r + 1, packed, sx, rowsum, (float *)mine);
    }
    if (r < r1) pro(j->xdt, row, 0, m, j->k, j->group, mr, r, r1, packed, sx, rowsum, (float *)mine); /* padding: zeros */
}

static bool prologue_by_rows(const prologue_job *j) { return j->kern->aes != 2 && !j->lora; }

/* Before each region that runs prologue_part: the units over `planned`
 * threads (at least the region's). int8 kernels without LoRA take runs of
 * rows (padding rows included), about four per thread, so M = 77 in 7
 * panels is not 4 panels against 3; the int16 kernels (a panel is staged as
 * int8, then widened) and the LoRA down product (per finished panel) take
 * whole panels. */
static void prologue_units_init(prologue_job *j, ql_panel_range *units, int planned)
{
    const int64_t rows = ql_panels(j->mc, j->kern->mr) * j->kern->mr;
    const int64_t per = (rows + 4 * (int64_t)planned - 1) / (4 * (int64_t)planned);
    j->units = units;
    j->planned = planned;
    j->unit_rows = prologue_by_rows(j) ? (per > 0 ? per : 1) : j->kern->mr;
    j->nunits = (rows + j->unit_rows - 1) / j->unit_rows;
    ql_panel_ranges_init(units, j->nunits, planned);
    if (j->done)
        for (int64_t u = 0; u < j->nunits; u++) atomic_init(&j->done[u], 0);
}

/* Units that prologue_units_init makes of m rows over `planned` threads, at most. */
static int64_t prologue_units_max(const ql_s8_kernel *kern, int64_t m, int planned)
{
    const int64_t panels = ql_panels(m, kern->mr), by_rows = 4 * (int64_t)planned + 1;
    return panels > by_rows ? panels : by_rows;
}

/* ql_gemm_pre.ready: the units holding row panels [ip0, ip1) are packed. */
static bool prologue_ready(void *arg, int64_t ip0, int64_t ip1)
{
    const prologue_job *j = arg;
    const int64_t mr = j->kern->mr, u0 = ip0 * mr / j->unit_rows;
    int64_t u1 = (ip1 * mr + j->unit_rows - 1) / j->unit_rows;
    if (u1 > j->nunits) u1 = j->nunits;
    for (int64_t u = u0; u < u1; u++)
        if (!atomic_load_explicit(&j->done[u], memory_order_acquire)) return false;
    return true;
}

/* Thread t of the region: its own units, then the others' (a thread on a
 * busier core is not waited for at the barrier after the prologue). */
static void prologue_part(void *arg, int t, int n)
{
    (void)n; /* at most j->planned */
    const prologue_job *j = arg;
    const ql_s8_kernel *kern = j->kern;
    const int mr = kern->mr;
    char *mine = j->scratch + j->scratch_bytes * (size_t)t;
    const int64_t rows = ql_panels(j->mc, mr) * mr;
    int64_t u;
    if (prologue_by_rows(j)) {
        while (ql_panel_next(j->units, t, j->planned, &u)) {
            const int64_t r0 = u * j->unit_rows, r1 = r0 + j->unit_rows < rows ? r0 + j->unit_rows : rows;
            prologue_rows(j, j->xc, j->mc, r0, r1, j->packed, j->sx, j->rowsum, mine);
            if (j->done) atomic_store_explicit(&j->done[u], 1, memory_order_release);
        }
        return;
    }
    const int64_t panel = ql_kpad(kern, j->k) * mr;
    while (ql_panel_next(j->units, t, j->planned, &u)) {
        const int64_t p = u;
        if (kern->aes == 2) { /* panel p as panel 0 of the rows from r0 on, widened from an int8 staging panel */
            const int64_t r0 = p * mr;
            int8_t *stage = (int8_t *)(mine + j->stage_off);
            prologue_rows(j, ql_row_cptr(j->xdt, j->xc, r0, j->ldx), j->mc - r0, 0, mr, stage, j->sx + r0, j->rowsum + r0,
                          mine);
            kern->widen(stage, (int16_t *)j->packed + p * panel, panel);
        } else
            prologue_rows(j, j->xc, j->mc, p * mr, (p + 1) * mr, j->packed, j->sx, j->rowsum, mine);
        if (j->lora) ql_lora_down_panel(j->lora, p, j->mc, j->k, j->packed, j->sx, j->rowsum, t);
        if (j->done) atomic_store_explicit(&j->done[u], 1, memory_order_release);
    }
}

static ql_s8_plan w8a8_plan(const cpu_linear *l, int64_t m)
{
    /* asymmetric corrections run blocked; weights decoded in the GEMM
     * (W4A8/W6A8) too, except up to the table's decoded_small_m rows where
     * its fitted kernels share the decoded kernel's B layout */
    const ql_cpu_kernels *kt = ql_cpu_kernels_for(l->s8->isa);
    if (l->corr) return (ql_s8_plan){l->s8, false};
    if (l->b8.decode) {
        /* (and up to the register decode's rows, on every CPU that has it) */
        const int64_t rows = l->b8.rows ? l->b8.rows_max : 0;
        const int64_t limit = l->ctx->small_m >= 0 ? l->ctx->small_m : kt->decoded_small_m > rows ? kt->decoded_small_m : rows;
        if (kt->s8 != l->s8 || m > limit) return (ql_s8_plan){l->s8, false};
        return ql_s8_plan_limit(kt, m, l->n, l->k, limit);
    }
    return ql_s8_plan_limit(kt, m, l->n, l->k, l->ctx->small_m);
}

static ql_status forward_w8a8(cpu_linear *l, const void *x, ql_dtype xdt, int64_t m, int64_t ldx, void *y,
                              ql_dtype ydt, int64_t ldy, const ql_epi_plan *plan, bool finite_weights,
                              const ql_input_act_plan *act, const ql_epilogue *call)
{
    const int64_t chunk = m < QL_M_CHUNK ? m : QL_M_CHUNK;
    const ql_s8_plan sp = w8a8_plan(l, chunk);
    const ql_s8_kernel *kern = sp.kern;
    const ql_cpu_kernels *ops = ql_cpu_kernels_for(kern->isa);
    const int threads = forward_threads(l, m), mr = kern->mr, aes = kern->aes ? kern->aes : 1;
    const int64_t k = l->k, kp = (k + 63) & ~(int64_t)63;
    /* one workspace: packed activations | row scales | row sums | per-thread scratch (+ int8 staging panel,
     * + the activated row) */
    const size_t a_bytes = (ql_packed_a_bytes(kern, chunk, k) * (size_t)aes + 63) & ~(size_t)63;
    const size_t v_bytes = ((size_t)chunk * 4 + 63) & ~(size_t)63;
    const size_t act_off = ((size_t)kp * 5 + 127 + (aes == 2 ? (size_t)(kp * mr) : 0)) & ~(size_t)63;
    const size_t scratch_bytes = act_off + (act ? (size_t)kp * ql_dtype_size(xdt) : 0);
    const bool lora = ql_lora_set_active(l->lora);
    const size_t base_bytes = a_bytes + 2 * v_bytes + scratch_bytes * (size_t)threads;
    bool arena;
    char *ws = ql_scratch_acquire(l->ctx, base_bytes + (lora ? ql_lora_ws_bytes(l->lora, kern, chunk, threads) : 0), &arena);
    if (!ws) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_forward: cannot allocate the activation buffers");
    ql_lora_run lr;
    if (lora) ql_lora_run_init(&lr, l->lora, kern, ws + base_bytes, chunk, threads);
    prologue_job pj = {kern, ops, xdt, NULL, ldx, 0, k, l->group, ws, (float *)(ws + a_bytes),
                       (int32_t *)(ws + a_bytes + v_bytes), ws + a_bytes + 2 * v_bytes, scratch_bytes,
                       ((size_t)kp * 5 + 127) & ~(size_t)63, lora ? &lr : NULL, act, act_off, NULL, 0, 0, 0, NULL};
    ql_panel_range units[threads]; /* the prologue's (prologue_units_init) */
    _Atomic unsigned char done[prologue_units_max(kern, chunk, threads)];
    if (!l->ctx->prologue_barrier) pj.done = done;
    const ql_gemm_pre pre = {prologue_part, pj.done ? prologue_ready : NULL, &pj};
    /* the prologue cache (qlinear.h): one chunk, no LoRA (its down projection
     * runs inside the prologue); a hit skips the prologue, a miss fills it */
    ql_prologue_cache *pc = call && !lora && m <= chunk ? call->prologue_cache : NULL;
    ql_prologue_key key;
    bool hit = false;
    if (pc) {
        key = ql_prologue_key_of(call, x, xdt, m, ldx, k, l->group, kern);
        hit = pc->valid && ql_prologue_key_equal(&pc->key, &key);
        if (!hit && !ql_prologue_cache_reserve(pc, a_bytes + 2 * v_bytes)) pc = NULL; /* no memory: run without it */
    }
    if (pc) {
        pj.packed = pc->buf;
        pj.sx = (float *)(pc->buf + a_bytes);
        pj.rowsum = (int32_t *)(pc->buf + a_bytes + v_bytes);
    }
    ql_status st = QL_OK;
    if (l->corr && lora) {
        st = ql_fail(QL_ERR_UNSUPPORTED, "ql_linear_forward: unmerged LoRA on an asymmetric W4A8 layer is not supported");
        goto done;
    }
    for (int64_t m0 = 0; m0 < m; m0 += chunk) {
        const int64_t mc = m - m0 < chunk ? m - m0 : chunk;
        pj.xc = ql_row_cptr(xdt, x, m0, ldx);
        pj.mc = mc;
        prologue_units_init(&pj, units, threads);
        ql_w8a8_epi e = {pj.sx, pj.rowsum, kern->b_offset128, l->sw, l->n_sw == 1, *plan,
                         ql_row_ptr(ydt, y, m0, ldy), ldy, NULL, 0, finite_weights, NULL, sp.small ? mc : 0};
        if (e.plan.residual) e.plan.residual = ql_row_cptr(ydt, e.plan.residual, m0, e.plan.ld_residual);
        if (lora) {
            lr.base = e;
            lr.inner = ops->w8a8_epilogue;
        }
        ql_tile_epilogue_fn epi = lora ? ql_lora_epilogue : ops->w8a8_epilogue;
        void *epi_arg = lora ? (void *)&lr : (void *)&e;
        if (sp.small) { /* one parallel region: rows quantized, then N split (ql_panel_next) */
            const int nt = threads < l->b8.panels ? threads : (int)l->b8.panels;
            if (nt <= 1) {
                if (!hit) prologue_part(&pj, 0, 1);
                ql_gemm_s8_small_part(kern, pj.packed, mc, &l->b8, 0, l->b8.panels, epi, epi_arg);
                continue;
            }
            ql_panel_range ranges[nt];
#pragma omp parallel num_threads(nt)
            {
                const int t = omp_get_thread_num(), n = omp_get_num_threads();
                if (t == 0) ql_panel_ranges_init(ranges, l->b8.panels, n);
                if (!hit) prologue_part(&pj, t, n);
#pragma omp barrier
                ql_gemm_s8_small_shared(kern, pj.packed, mc, &l->b8, ranges, t, n, epi, epi_arg);
            }
            continue;
        }
        if (l->corr) { /* the corrected GEMM reads the packed rows back: its own region */
            const int64_t panels = ql_panels(mc, mr);
            const int pt = threads < panels ? threads : (int)panels;
            if (!hit) {
#pragma omp parallel num_threads(pt)
                prologue_part(&pj, omp_get_thread_num(), omp_get_num_threads());
            }
            st = ql_wxa8_gemm_corrected(threads, kern, pj.packed, mc, &l->b8, &e, l->corr, l->corr_group, l->k);
        } else
            st = ql_gemm_s8_run_pre(threads, kern, pj.packed, mc, &l->b8, hit ? NULL : &pre, epi, epi_arg);
        if (st != QL_OK) goto done;
    }
    if (pc) {
        if (hit) pc->hits++;
        else {
            pc->key = key;
            pc->valid = true;
            pc->misses++;
        }
    }
done:
    ql_scratch_release(l->ctx, ws, arena);
    return st;
}

/* ---- float paths (DENSE, WEIGHT_ONLY, DEQUANT) */

/* x rows [r0, r1) -> fp32 rows for the float GEMM: rotated (and rounded to
 * x's dtype) for ConvRot weight-only, rounded to bf16 for bf16 compute. */
static void rows_to_f32(const cpu_linear *l, const void *x, ql_dtype xdt, int64_t ldx, int64_t r0, int64_t r1,
                        int64_t group, float *a, int64_t lda)
{
    const int round_bf16 = l->compute == QL_BF16 && xdt != QL_BF16;
    l->kt->rows_to_f32(xdt, x, ldx, r0, r1, l->k, group, round_bf16, a, lda);
}

/* rows_to_f32, after the input activation if any: row by row through the
 * thread's row buffer `row` (read with ldx 0, as the prologue does). */
static void act_rows_to_f32(const cpu_linear *l, const ql_input_act_plan *act, const void *x, ql_dtype xdt, int64_t ldx,
                            int64_t r0, int64_t r1, int64_t group, float *a, int64_t lda, char *row)
{
    if (!act) {
        rows_to_f32(l, x, xdt, ldx, r0, r1, group, a, lda);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        l->kt->input_act_row(act, ql_row_cptr(xdt, x, r, ldx), l->k, row);
        rows_to_f32(l, row, xdt, 0, r, r + 1, group, a, lda);
    }
}

/* Rows [r0, r1) of x as bf16 rows a (stride lda) for a VDPBF16PS kernel
 * (a_bf16): through the fp32 conversion (rotation, rounding to bf16, input
 * activation) into the thread's fp32 row f, then each value's bf16 (exact:
 * it holds one); a bf16 input without either copied as it is. */
static void act_rows_to_bf16(const cpu_linear *l, const ql_input_act_plan *act, const void *x, ql_dtype xdt,
                             int64_t ldx, int64_t r0, int64_t r1, int64_t group, uint16_t *a, int64_t lda, float *f,
                             char *row)
{
    const int64_t k = l->k;
    for (int64_t r = r0; r < r1; r++) {
        uint16_t *out = a + r * lda;
        if (xdt == QL_BF16 && group == 0 && !act) {
            memcpy(out, ql_row_cptr(xdt, x, r, ldx), (size_t)k * 2);
            continue;
        }
        act_rows_to_f32(l, act, ql_row_cptr(xdt, x, r, ldx), xdt, ldx, 0, 1, group, f, lda, row);
        for (int64_t i = 0; i < k; i++) {
            uint32_t u;
            memcpy(&u, f + i, 4);
            out[i] = (uint16_t)(u >> 16);
        }
    }
}

/* Row panel ip of the m rows of x as a packed bf16 A panel (blocked
 * VDPBF16PS and TDPBF16PS kernels): a bf16 input read in place, others converted into
 * the thread's rows h (mr rows of stride lda) first. */
static void act_panel_to_bf16(const cpu_linear *l, const ql_f32_kernel *kern, const ql_input_act_plan *act,
                              const void *x, ql_dtype xdt, int64_t ldx, int64_t m, int64_t ip, int64_t group,
                              uint16_t *panels, int64_t lda, float *f, uint16_t *h, char *row)
{
    const int mr = kern->mr;
    const uint16_t *rows[32]; /* mr <= 32 (AMX) */
    const bool plain = xdt == QL_BF16 && group == 0 && !act;
    for (int r = 0; r < mr; r++) {
        const int64_t i = ip * mr + r;
        if (i >= m) rows[r] = NULL;
        else if (plain) rows[r] = ql_row_cptr(xdt, x, i, ldx);
        else {
            act_rows_to_bf16(l, act, ql_row_cptr(xdt, x, i, ldx), xdt, ldx, 0, 1, group, h + r * lda, lda, f, row);
            rows[r] = h + r * lda;
        }
    }
    ql_pack_a_bf16_panel(kern, rows, l->k, ip, panels);
}

/* The float kernel of a forward: weight-only layers with bf16 activations
 * take the table's bf16-activation kernel where it has one (wo_bf16:
 * VDPBF16PS, or TDPBF16PS on amx). */
static const ql_f32_kernel *float_kernel(const cpu_linear *l, ql_dtype xdt)
{
    const ql_f32_kernel *w = l->kt->wo_bf16;
    if (l->kind == QL_LINEAR_WEIGHT_ONLY && xdt == QL_BF16 && w) return l->codes_sym && w->sym ? w->sym : w;
    return l->f32;
}

static ql_status forward_float(cpu_linear *l, const ql_packed_f32 *b, int64_t group, const void *x, ql_dtype xdt,
                               int64_t m, int64_t ldx, void *y, ql_dtype ydt, int64_t ldy, const ql_epi_plan *plan,
                               const ql_input_act_plan *act)
{
    const ql_f32_kernel *kern = float_kernel(l, xdt);
    const bool abf = kern->a_bf16; /* A as bf16 rows */
    const int64_t k = l->k, lda = abf ? (k + 31) & ~(int64_t)31 : (k + 15) & ~(int64_t)15;
    const int64_t chunk = m < QL_M_CHUNK ? m : QL_M_CHUNK;
    const bool small = ql_f32_small_m(kern, chunk, l->ctx->small_m);
    /* the input read in place: fp32 rows for the fp32 kernels; bf16 rows for
     * the small-M bf16 tiles (the blocked ones read packed A panels) */
    const bool direct = group == 0 && !act && (abf ? xdt == QL_BF16 && small : xdt == QL_F32 && l->compute == QL_F32);
    const int threads = forward_threads(l, m);
    /* the converted rows, then per thread: the activated row, and for a_bf16
     * the fp32 row the bf16 one is taken from */
    const size_t a_bytes = ((abf && !small ? ql_packed_a_bf16_bytes(kern, chunk, k) : (size_t)(chunk * lda) * (abf ? 2 : 4)) + 63) &
                           ~(size_t)63;
    const size_t row_bytes = ((size_t)k * ql_dtype_size(xdt) + 63) & ~(size_t)63;
    /* per thread: the fp32 row, mr bf16 rows (a packed panel's) and the activated row */
    const size_t thread_bytes = (act ? row_bytes : 0) + (abf ? (size_t)lda * (4 + 2 * (size_t)kern->mr) : 0);
    bool arena = false;
    char *ws = direct ? NULL : ql_scratch_acquire(l->ctx, a_bytes + thread_bytes * (size_t)threads, &arena);
    if (!direct && !ws) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_forward: cannot allocate the fp32 activations");
    float *a = (float *)ws;
    const bool wo = l->kind == QL_LINEAR_WEIGHT_ONLY;
    ql_f32_epi e = {*plan, NULL, ldy, wo ? l->sw : NULL, wo && l->n_sw == 1};
    const ql_f32_epilogue_fn epi = l->kt->f32_epilogue;
    ql_status st = QL_OK;
/* rows [r0, r1) of the chunk converted by thread t */
#define QL_CONVERT(r0, r1, t)                                                                                           \
    do {                                                                                                                \
        char *mine_ = ws + a_bytes + thread_bytes * (size_t)(t);                                                        \
        char *row_ = act ? mine_ + (abf ? (size_t)lda * (4 + 2 * (size_t)kern->mr) : 0) : NULL;                         \
        if (abf) act_rows_to_bf16(l, act, xc, xdt, ldx, r0, r1, group, (uint16_t *)a, lda, (float *)mine_, row_);       \
        else act_rows_to_f32(l, act, xc, xdt, ldx, r0, r1, group, a, lda, row_);                                         \
    } while (0)
    for (int64_t m0 = 0; m0 < m && st == QL_OK; m0 += chunk) {
        const int64_t mc = m - m0 < chunk ? m - m0 : chunk;
        const void *xc = ql_row_cptr(xdt, x, m0, ldx);
        e.y = ql_row_ptr(ydt, y, m0, ldy);
        e.plan.residual = plan->residual ? ql_row_cptr(ydt, plan->residual, m0, plan->ld_residual) : NULL;
        const float *ac = direct ? (const float *)xc : a;
        const int64_t ldac = direct ? ldx : lda;
        if (small) { /* one parallel region: rows converted, then N split */
            const int nt = threads < b->panels ? threads : (int)b->panels;
            if (nt <= 1) {
                if (!direct) QL_CONVERT(0, mc, 0);
                ql_gemm_f32_small_part(kern, ac, ldac, mc, b, 0, b->panels, epi, &e);
                continue;
            }
            const int unit = ql_f32_small_panels(kern, mc); /* the tiles take two (or four) panels at a time */
            const int64_t pairs = (b->panels + unit - 1) / unit;
            ql_panel_range ranges[nt];
#pragma omp parallel num_threads(nt)
            {
                const int t = omp_get_thread_num(), n = omp_get_num_threads();
                if (t == 0) ql_panel_ranges_init(ranges, pairs, n);
                if (!direct) QL_CONVERT(mc * t / n, mc * (t + 1) / n, t);
#pragma omp barrier
                int64_t pair;
                while (ql_panel_next(ranges, t, n, &pair))
                    ql_gemm_f32_small_part(kern, ac, ldac, mc, b, unit * pair,
                                           unit * pair + unit < b->panels ? unit * pair + unit : b->panels, epi, &e);
            }
            continue;
        }
        if (abf) { /* packed A panels */
            const int64_t panels = (mc + kern->mr - 1) / kern->mr;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
            for (int64_t ip = 0; ip < panels; ip++) {
                char *mine = ws + a_bytes + thread_bytes * (size_t)omp_get_thread_num();
                act_panel_to_bf16(l, kern, act, xc, xdt, ldx, mc, ip, group, (uint16_t *)a, lda, (float *)mine,
                                  (uint16_t *)(mine + (size_t)lda * 4), act ? mine + (size_t)lda * (4 + 2 * (size_t)kern->mr) : NULL);
            }
        } else if (!direct) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
            for (int64_t r = 0; r < mc; r++) QL_CONVERT(r, r + 1, omp_get_thread_num());
        }
        st = ql_gemm_f32_run(threads, kern, ac, ldac, mc, b, epi, &e);
    }
#undef QL_CONVERT
    if (ws) ql_scratch_release(l->ctx, ws, arena);
    return st;
}

static ql_status forward_dequant(cpu_linear *l, const void *x, ql_dtype xdt, int64_t m, int64_t ldx, void *y,
                                 ql_dtype ydt, int64_t ldy, const ql_epi_plan *plan, const ql_input_act_plan *act)
{
    /* What a stock host does without an int8 GEMM: expand the whole weight
     * (un-rotating ConvRot weights) on every call, then a dense GEMM. */
    float *w = ql_aligned_alloc((size_t)(l->n * l->k) * sizeof(float));
    if (!w) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_forward: cannot allocate the dequantized weight");
    int failed = 0;
    const int64_t step = 64; /* rows per task: the reference dequantizer, spread over the threads */
    const int threads = forward_threads(l, m);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t r0 = 0; r0 < l->n; r0 += step) {
        const int64_t rows = l->n - r0 < step ? l->n - r0 : step;
        const float *sc = l->n_sw == 1 ? l->sw : l->sw + r0;
        if (ql_dequantize(l->codes + r0 * l->k, rows, l->k, l->k, sc, l->n_sw == 1 ? 1 : rows, l->group, QL_F32,
                          w + r0 * l->k, l->k) != QL_OK) {
#pragma omp atomic write
            failed = 1;
        }
    }
    ql_packed_f32 b = {0};
    ql_status st = failed ? ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_forward: cannot dequantize the weight")
                          : ql_pack_b_float(l->f32, QL_F32, w, l->n, l->k, l->k, QL_F32, threads, &b);
    ql_aligned_free(w);
    if (st == QL_OK) st = forward_float(l, &b, 0, x, xdt, m, ldx, y, ydt, ldy, plan, act);
    ql_packed_f32_free(&b);
    return st;
}

/* The bias of this call as fp32 values in the output dtype: the layer's,
 * or the caller's override, rounded like it (a copy in *own only when some
 * value is not already an output-dtype value). */
static ql_status call_bias(const cpu_linear *l, const ql_epilogue *epi, ql_dtype ydt, const float **bias, float **own,
                           bool *finite_weights)
{
    *own = NULL;
    *bias = l->bias[ydt];
    *finite_weights = l->finite_weights[ydt];
    if (!epi || !epi->bias) return QL_OK;
    const float *b = epi->bias;
    bool exact = true;
    for (int64_t i = 0; exact && i < l->n; i++) exact = ql_round_to(ydt, b[i]) == b[i] || isnan(b[i]);
    if (!exact) {
        QL_TRY(ql_bias_to_f32("ql_linear_forward", b, QL_F32, l->n, ydt, own));
        b = *own;
    }
    *bias = b;
    bool finite = l->scales_small;
    for (int64_t i = 0; finite && i < l->n; i++) finite = fabsf(b[i]) <= 3.402823466e38f;
    *finite_weights = finite;
    return QL_OK;
}

static ql_status forward_one(cpu_linear *l, const void *x, ql_dtype xdt, int64_t m, int64_t ldx, void *y, ql_dtype ydt,
                             int64_t ldy, const ql_epilogue *epi)
{
    if (l->n == 0) return QL_OK;
    ql_epi_plan plan = {ydt, NULL, epi ? epi->residual : NULL, epi ? epi->ld_residual : 0,
                        epi ? epi->residual_scale : NULL, epi ? epi->activation : 0};
    float *own = NULL;
    bool finite_weights;
    QL_TRY(call_bias(l, epi, ydt, &plan.bias, &own, &finite_weights));
    const ql_input_act_plan actp = ql_input_act_plan_of(epi, xdt);
    const ql_input_act_plan *act = actp.code ? &actp : NULL;
    ql_status st = QL_OK;
    if (l->k == 0) { /* empty contraction: acc = 0 */
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < l->n; c++) ql_store_f(ydt, y, r * ldy + c, ql_epilogue_scalar(&plan, 0.0f, r, c));
    } else if (l->kind == QL_LINEAR_W8A8)
        st = forward_w8a8(l, x, xdt, m, ldx, y, ydt, ldy, &plan, finite_weights, act, epi);
    else if (l->kind == QL_LINEAR_DEQUANT)
        st = forward_dequant(l, x, xdt, m, ldx, y, ydt, ldy, &plan, act);
    else
        st = forward_float(l, &l->bf, l->kind == QL_LINEAR_WEIGHT_ONLY ? l->group : 0, x, xdt, m, ldx, y, ydt, ldy, &plan,
                           act);
    ql_aligned_free(own);
    return st;
}

/* Layers sharing an input run one after another, through a prologue cache
 * of this call (unless the caller gave one): W8A8 layers packed for the same
 * kernel quantize the input once, the others run their own prologue. */
static ql_status cpu_forward(const char *fn, ql_context *ctx, void *const *impls, int count, const void *x, ql_dtype xdt,
                             int64_t m, int64_t ldx, void *const *ys, ql_dtype ydt, const int64_t *ldys,
                             const ql_epilogue *const *epis)
{
    (void)fn, (void)ctx;
    ql_prologue_cache mine = {0};
    ql_status st = QL_OK;
    for (int i = 0; i < count && st == QL_OK; i++) {
        const ql_epilogue *e = epis ? epis[i] : NULL;
        ql_epilogue with = e ? *e : (ql_epilogue){0};
        if (count > 1 && !with.prologue_cache) {
            with.prologue_cache = &mine;
            with.prologue_generation = 0;
            e = &with;
        }
        st = forward_one(impls[i], x, xdt, m, ldx, ys[i], ydt, ldys[i], e);
    }
    ql_aligned_free(mine.buf);
    return st;
}

static void cpu_describe(const void *impl, int64_t m, char *buf, size_t len)
{
    const cpu_linear *l = impl;
    if (l->kind == QL_LINEAR_W8A8) {
        const ql_s8_plan sp = w8a8_plan(l, m < QL_M_CHUNK ? m : QL_M_CHUNK);
        snprintf(buf, len, "%s%s", sp.kern->name, sp.small ? " small-M" : "");
        return;
    }
    const ql_f32_kernel *f = l->f32;
    const bool small = ql_f32_small_m(f, m, l->ctx->small_m);
    if (small) snprintf(buf, len, "%s small-M %dx%d", f->small_name, ql_f32_small_rows(f, m), ql_f32_small_panels(f, m) * f->nr);
    else snprintf(buf, len, "%s", f->name);
    /* weight-only: the kernel of bf16 activations too, where it differs */
    const ql_f32_kernel *w = l->kind == QL_LINEAR_WEIGHT_ONLY ? float_kernel(l, QL_BF16) : f;
    if (w != f) {
        const size_t used = strlen(buf);
        if (ql_f32_small_m(w, m, l->ctx->small_m))
            snprintf(buf + used, len - used, "; bf16 x: %s small-M %dx%d", w->small_name, ql_f32_small_rows(w, m),
                     ql_f32_small_panels(w, m) * w->nr);
        else snprintf(buf + used, len - used, "; bf16 x: %s", w->name);
    }
}

/* ---- unmerged LoRA (lora.c) */

static ql_status cpu_add_lora(void *impl, const ql_lora_desc *d, int *id)
{
    cpu_linear *l = impl;
    if (l->kind != QL_LINEAR_W8A8 && l->kind != QL_LINEAR_WXA8_PACKED)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "ql_linear_add_lora: only W8A8 and WXA8_PACKED linears take unmerged LoRAs (this one is kind %d)",
                       (int)l->kind);
    if (l->corr)
        return ql_fail(QL_ERR_UNSUPPORTED, "ql_linear_add_lora: unmerged LoRA on an asymmetric W4A8 layer is not supported");
    return ql_lora_set_add(&l->lora, l->s8, l->n, l->k, l->group, d, id);
}
static ql_status cpu_remove_lora(void *impl, int id) { return ql_lora_set_remove(((cpu_linear *)impl)->lora, id); }
static int cpu_lora_count(const void *impl) { return ql_lora_set_count(((const cpu_linear *)impl)->lora); }
static int64_t cpu_lora_rank(const void *impl) { return ql_lora_set_rank(((const cpu_linear *)impl)->lora); }

/* ---- bare GEMM */

static ql_status cpu_gemm_s8s8s32(ql_context *ctx, int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                                  const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc)
{
    const char *fn = "ql_gemm_s8s8s32";
    if (m == 0 || n == 0) return QL_OK;
    const ql_s8_plan plan = ql_s8_plan_limit(ql_cpu_kernels_for(ctx->isa), m, n, k, ctx->small_m);
    const ql_s8_kernel *kern = plan.kern;
    ql_packed_b pb;
    QL_TRY(ql_pack_b_s8(kern, b, n, k, ldb, &pb));
    void *pa = ql_aligned_alloc(ql_packed_a_bytes(kern, m, k) * (size_t)(kern->aes ? kern->aes : 1));
    int32_t *rowsum = ql_aligned_alloc((size_t)m * sizeof(int32_t));
    if (!pa || !rowsum) {
        ql_packed_b_free(&pb);
        ql_aligned_free(pa);
        ql_aligned_free(rowsum);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    ql_pack_a_s8(kern, a, m, k, lda, pa, rowsum);
    ql_w8a8_epi e = {NULL, rowsum, kern->b_offset128, NULL, false, {0}, NULL, 0, c, ldc, false, NULL, plan.small ? m : 0};
    ql_status st = ql_gemm_s8_exec(ctx->threads, plan, pa, m, &pb, ql_cpu_kernels_for(kern->isa)->w8a8_epilogue, &e);
    ql_packed_b_free(&pb);
    ql_aligned_free(pa);
    ql_aligned_free(rowsum);
    return st;
}

const ql_backend ql_backend_cpu = {
    .name = "cpu",
    .check_device = NULL,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .forward = cpu_forward,
    .describe = cpu_describe,
    .last_kernel = NULL,
    .weight_bytes = cpu_weight_bytes,
    .add_lora = cpu_add_lora,
    .remove_lora = cpu_remove_lora,
    .lora_count = cpu_lora_count,
    .lora_rank = cpu_lora_rank,
    .gemm_s8s8s32 = cpu_gemm_s8s8s32,
};
