/* ql_linear: weights packed once at creation; forward runs the fused
 * pipeline for the context's ISA with the context's threads. */
#include "linear.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "../gemm/f32.h"
#include "../gemm/gemm.h"
#include "../gemm/wxa8_panels.h"
#include "kernels.h"
#include "lora.h"
#include "../cuda/cuda_backend.h"
#include "wxa8_linear.h"

/* Rows quantized and multiplied per step: bounds the packed-activation
 * buffer (rows·K bytes) for very tall inputs. A multiple of every MR. */
#define QL_M_CHUNK 12288

struct ql_linear {
    ql_context *ctx;
    struct ql_cuda_linear *cuda; /* set when the layer runs on a CUDA device */
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
    int8_t *codes;
    /* the bias as each output dtype sees it (bias.to(out_dtype)), as fp32:
     * [0] fp32, [1] fp16, [2] bf16 (indexed by ql_dtype); NULL: no bias */
    float *bias[3];
    /* W8A8 epilogue facts (see ql_w8a8_epi.finite_weights), per output dtype */
    bool finite_weights[3];
    /* W4A8/W6A8: codes decoded inside the GEMM (b8 decodes from wp), and
     * the asymmetric correction [k/corr_group, n] (fp32), NULL if none */
    ql_wxa8_panels *wp;
    float *corr;
    int64_t corr_group;
    ql_lora_set *lora; /* unmerged LoRAs (W8A8 only); NULL: none */
};

typedef struct {
    ql_prologue_fn prologue;
    ql_tile_epilogue_fn epilogue;
} isa_ops;

static isa_ops ops_for(ql_isa isa);
ql_tile_epilogue_fn ql_w8a8_epilogue_for(ql_isa isa) { return ops_for(isa).epilogue; }

static isa_ops ops_for(ql_isa isa)
{
    switch (isa) {
#if QL_X86
    case QL_ISA_AVX512VNNI: return (isa_ops){ql_prologue_avx512, ql_w8a8_epilogue_avx512};
    case QL_ISA_AVXVNNI:
    case QL_ISA_AVX2: return (isa_ops){ql_prologue_avx2, ql_w8a8_epilogue_avx2};
#endif
#if QL_ARM64
    case QL_ISA_NEONBF16:
    case QL_ISA_I8MM: return (isa_ops){ql_prologue_neon_k8, ql_w8a8_epilogue_neon};
    case QL_ISA_NEONDOT:
    case QL_ISA_NEON: return (isa_ops){ql_prologue_neon, ql_w8a8_epilogue_neon};
#endif
    default: return (isa_ops){ql_prologue_generic, ql_w8a8_epilogue_generic};
    }
}

void ql_linear_destroy(ql_linear *l)
{
    if (!l) return;
    ql_cuda_linear_destroy(l->cuda);
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

static ql_status copy_bias(ql_linear *l, const void *bias, ql_dtype dt, int64_t n)
{
    if (!bias) return QL_OK;
    QL_TRY(ql_check_float_dtype("ql_linear_create", "bias", dt));
    const ql_dtype outs[3] = {QL_F32, QL_F16, QL_BF16};
    for (int i = 0; i < 3; i++) QL_TRY(ql_bias_to_f32("ql_linear_create", bias, dt, n, outs[i], &l->bias[outs[i]]));
    return QL_OK;
}

static ql_status create_int8(ql_linear *l, const ql_linear_desc *d, const ql_wxa8_weight *packed)
{
    const ql_int8_weight *w = &d->int8;
    QL_TRY(ql_check_int8_weight("ql_linear_create", w));
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
    for (int t = 0; t < 3; t++) {
        l->finite_weights[t] = scales_ok;
        for (int64_t i = 0; l->bias[t] && i < w->n; i++) l->finite_weights[t] &= fabsf(l->bias[t][i]) <= 3.402823466e38f;
    }
    if (d->kind == QL_LINEAR_W8A8) {
        l->s8 = ql_s8_kernel_for(l->ctx->isa);
        /* W4A8/W6A8 decode to int8 panels of 4-byte k groups and read int8
         * activations back for the correction: on the int16 (AVX2) kernel
         * they run on the generic one (not yet widened; see README) */
        if (l->s8->aes == 2 && (packed || l->corr)) l->s8 = &ql_s8_gemm_4x8c4__generic;
        if (packed) {
            l->wp = calloc(1, sizeof *l->wp);
            if (!l->wp) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_create: out of memory");
#if QL_ARM64
            /* the W4A8/W6A8 decode writes c4 panels; the SDOT kernel's 12-column and
             * the SMMLA kernel's 8-k panels are not wired in yet: the NEON kernel */
            if (l->s8->isa == QL_ISA_NEONDOT || l->s8->isa == QL_ISA_I8MM) l->s8 = &ql_s8_gemm_4x8c4__neon;
#endif
            return ql_wxa8_panels_pack(l->s8, packed, l->wp, &l->b8);
        }
        return ql_pack_b_s8(l->s8, w->q, w->n, w->k, w->ldq, &l->b8);
    }
    l->f32 = ql_f32_kernel_for(l->ctx->isa);
    l->compute = QL_F32;
    if (d->kind == QL_LINEAR_WEIGHT_ONLY) /* codes stay int8, decoded slice by slice */
        return ql_pack_b_float(l->f32, QL_I8, w->q, w->n, w->k, w->ldq, QL_I8, l->ctx->threads, &l->bf);
    /* DEQUANT keeps the int8 codes resident and expands them on every call. */
    size_t bytes = (size_t)(w->n * w->k);
    l->codes = ql_aligned_alloc(bytes);
    if (!l->codes) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_create: cannot allocate %zu bytes", bytes);
    for (int64_t r = 0; r < w->n; r++) memcpy(l->codes + r * w->k, w->q + r * w->ldq, (size_t)w->k);
    return QL_OK;
}

/* A W8A8 layer on the context's CUDA device: weight, scales, bias uploaded once. */
static ql_status create_cuda(ql_linear *l, const ql_linear_desc *d)
{
    const char *fn = "ql_linear_create";
    if (d->kind != QL_LINEAR_W8A8)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: only W8A8 linears run on CUDA devices (kind %d asked)", fn, (int)d->kind);
    if (d->wxa8.bits)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "%s: W4A8/W6A8 layers run on the CPU (on CUDA: decode with ql_wxa8_decode into an int8 layer)", fn);
    QL_TRY(ql_check_int8_weight(fn, &d->int8));
    l->n = d->int8.n;
    l->k = d->int8.k;
    float *bias = NULL;
    if (d->int8.bias) {
        bias = malloc((size_t)(l->n > 0 ? l->n : 1) * sizeof(float));
        if (!bias) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        for (int64_t i = 0; i < l->n; i++) bias[i] = ql_load_f(d->int8.bias_dtype, d->int8.bias, i);
    }
    ql_status st = ql_cuda_linear_create(l->ctx->device_index, &d->int8, bias, &l->cuda);
    free(bias);
    return st;
}

ql_status ql_linear_create(ql_context *ctx, const ql_linear_desc *d, ql_linear **out)
{
    const char *fn = "ql_linear_create";
    QL_CHECK_PTR(fn, ctx);
    QL_CHECK_PTR(fn, d);
    QL_CHECK_PTR(fn, out);
    *out = NULL;
    ql_linear *l = calloc(1, sizeof *l);
    if (!l) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    l->ctx = ctx;
    l->kind = d->kind;
    ql_status st;
    if (ctx->device == QL_DEVICE_CUDA) {
        st = create_cuda(l, d);
        if (st != QL_OK) {
            ql_linear_destroy(l);
            return st;
        }
        *out = l;
        return QL_OK;
    }
    switch (d->kind) {
    case QL_LINEAR_W8A8:
    case QL_LINEAR_WEIGHT_ONLY:
    case QL_LINEAR_DEQUANT:
    case QL_LINEAR_WXA8_PACKED:
        if (d->wxa8.bits) st = ql_wxa8_linear_create(d, &l->corr, &l->corr_group, &l->kind, create_int8, l);
        else if (d->kind == QL_LINEAR_WXA8_PACKED)
            st = ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: kind WXA8_PACKED needs a W4A8/W6A8 weight (desc.wxa8)", fn);
        else st = create_int8(l, d, NULL);
        break;
    case QL_LINEAR_DENSE:
        if ((st = ql_check_float_dtype(fn, "weight", d->weight_dtype)) != QL_OK) break;
        if ((st = ql_check_matrix(fn, "weight", d->weight, d->n, d->k, d->ld_weight)) != QL_OK) break;
        if (d->compute_dtype != QL_F32 && d->compute_dtype != QL_BF16) {
            st = ql_fail(QL_ERR_UNSUPPORTED, "%s: dense compute dtype %s is not supported (fp32 or bf16)", fn,
                         ql_dtype_name(d->compute_dtype));
            break;
        }
        l->n = d->n;
        l->k = d->k;
        /* bf16 compute: operands rounded to bf16, so BFMMLA (where the ISA has
         * it) multiplies exactly the values the other kernels do; its sums
         * round their own way (README, Numerics contract) */
        l->f32 = d->compute_dtype == QL_BF16 ? ql_bf16_kernel_for(ctx->isa) : ql_f32_kernel_for(ctx->isa);
        l->compute = d->compute_dtype;
        if ((st = copy_bias(l, d->bias, d->bias_dtype, d->n)) != QL_OK) break;
        st = ql_pack_b_float(l->f32, d->weight_dtype, d->weight, d->n, d->k, d->ld_weight, d->compute_dtype, ctx->threads, &l->bf);
        break;
    default: st = ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown linear kind %d", fn, (int)d->kind);
    }
    if (st != QL_OK) {
        ql_linear_destroy(l);
        return st;
    }
    *out = l;
    return QL_OK;
}

const char *ql_linear_cuda_kernel(const ql_linear *l) { return l && l->cuda ? ql_cuda_linear_kernel(l->cuda) : ""; }

size_t ql_linear_weight_bytes(const ql_linear *l)
{
    if (!l) return 0;
    if (l->cuda) return ql_cuda_linear_weight_bytes(l->cuda);
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
 * bit-identical (tested). Threshold measured: README, "tiny layers". */
#define QL_SERIAL_WORK ((int64_t)1 << 20)
static int forward_threads(const ql_linear *l, int64_t m)
{
    const int64_t lim = l->ctx->serial_work >= 0 ? l->ctx->serial_work : QL_SERIAL_WORK;
    return (double)m * (double)l->n * (double)l->k < (double)lim ? 1 : l->ctx->threads;
}

/* ---- W8A8 */

/* One chunk's prologue, shared by the threads of the GEMM's parallel region. */
typedef struct {
    const ql_s8_kernel *kern;
    isa_ops ops;
    ql_dtype xdt;
    const void *xc;
    int64_t ldx, mc, k, group;
    void *packed;
    float *sx;
    int32_t *rowsum;
    char *scratch;
    size_t scratch_bytes, stage_off;
    ql_lora_run *lora; /* NULL: none */
} prologue_job;

/* Thread t of n: int8 kernels without LoRA split the rows (padding rows
 * included) evenly, so M = 77 in 7 panels is not 4 panels against 3; the
 * int16 kernels (a panel is staged as int8, then widened) and the LoRA down
 * product (per finished panel) split whole panels. */
static void prologue_part(void *arg, int t, int n)
{
    const prologue_job *j = arg;
    const ql_s8_kernel *kern = j->kern;
    const int mr = kern->mr;
    char *mine = j->scratch + j->scratch_bytes * (size_t)t;
    const int64_t panels = ql_panels(j->mc, mr);
    if (kern->aes != 2 && !j->lora) {
        const int64_t rows = panels * mr;
        j->ops.prologue(j->xdt, j->xc, j->ldx, j->mc, j->k, j->group, mr, rows * t / n, rows * (t + 1) / n, j->packed,
                        j->sx, j->rowsum, (float *)mine);
        return;
    }
    const int64_t panel = ql_kpad(kern, j->k) * mr;
    for (int64_t p = panels * t / n; p < panels * (t + 1) / n; p++) {
        if (kern->aes == 2) { /* panel p as panel 0 of the rows from r0 on, widened from an int8 staging panel */
            const int64_t r0 = p * mr;
            int8_t *stage = (int8_t *)(mine + j->stage_off);
            j->ops.prologue(j->xdt, ql_row_cptr(j->xdt, j->xc, r0, j->ldx), j->ldx, j->mc - r0, j->k, j->group, mr, 0, mr,
                            stage, j->sx + r0, j->rowsum + r0, (float *)mine);
            kern->widen(stage, (int16_t *)j->packed + p * panel, panel);
        } else
            j->ops.prologue(j->xdt, j->xc, j->ldx, j->mc, j->k, j->group, mr, p * mr, (p + 1) * mr, j->packed, j->sx,
                            j->rowsum, (float *)mine);
        if (j->lora) ql_lora_down_panel(j->lora, p, j->mc, j->k, j->packed, j->sx, j->rowsum, t);
    }
}

static ql_s8_plan w8a8_plan(const ql_linear *l, int64_t m)
{
    /* weights decoded in the GEMM (W4A8/W6A8) and asymmetric corrections run blocked */
    if (l->corr || l->b8.decode) return (ql_s8_plan){l->s8, false};
    return ql_s8_plan_limit(l->s8->isa, m, l->n, l->k, l->ctx->small_m);
}

static ql_status forward_w8a8(ql_linear *l, const void *x, ql_dtype xdt, int64_t m, int64_t ldx, void *y,
                              ql_dtype ydt, int64_t ldy, const ql_epi_plan *plan)
{
    const int64_t chunk = m < QL_M_CHUNK ? m : QL_M_CHUNK;
    const ql_s8_plan sp = w8a8_plan(l, chunk);
    const ql_s8_kernel *kern = sp.kern;
    const isa_ops ops = ops_for(kern->isa);
    const int threads = forward_threads(l, m), mr = kern->mr, aes = kern->aes ? kern->aes : 1;
    const int64_t k = l->k, kp = (k + 63) & ~(int64_t)63;
    /* one workspace: packed activations | row scales | row sums | per-thread scratch (+ int8 staging panel) */
    const size_t a_bytes = (ql_packed_a_bytes(kern, chunk, k) * (size_t)aes + 63) & ~(size_t)63;
    const size_t v_bytes = ((size_t)chunk * 4 + 63) & ~(size_t)63;
    const size_t scratch_bytes = ((size_t)kp * 5 + 127 + (aes == 2 ? (size_t)(kp * mr) : 0)) & ~(size_t)63;
    const bool lora = ql_lora_set_active(l->lora);
    const size_t base_bytes = a_bytes + 2 * v_bytes + scratch_bytes * (size_t)threads;
    bool arena;
    char *ws = ql_scratch_acquire(l->ctx, base_bytes + (lora ? ql_lora_ws_bytes(l->lora, kern, chunk, threads) : 0), &arena);
    if (!ws) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_forward: cannot allocate the activation buffers");
    ql_lora_run lr;
    if (lora) ql_lora_run_init(&lr, l->lora, kern, ws + base_bytes, chunk, threads);
    prologue_job pj = {kern, ops, xdt, NULL, ldx, 0, k, l->group, ws, (float *)(ws + a_bytes),
                       (int32_t *)(ws + a_bytes + v_bytes), ws + a_bytes + 2 * v_bytes, scratch_bytes,
                       ((size_t)kp * 5 + 127) & ~(size_t)63, lora ? &lr : NULL};
    ql_status st = QL_OK;
    if (l->corr && lora) {
        st = ql_fail(QL_ERR_UNSUPPORTED, "ql_linear_forward: unmerged LoRA on an asymmetric W4A8 layer is not supported");
        goto done;
    }
    for (int64_t m0 = 0; m0 < m; m0 += chunk) {
        const int64_t mc = m - m0 < chunk ? m - m0 : chunk;
        pj.xc = ql_row_cptr(xdt, x, m0, ldx);
        pj.mc = mc;
        ql_w8a8_epi e = {pj.sx, pj.rowsum, kern->b_offset128, l->sw, l->n_sw == 1, *plan,
                         ql_row_ptr(ydt, y, m0, ldy), ldy, NULL, 0, l->finite_weights[ydt], NULL, sp.small ? mc : 0};
        if (e.plan.residual) e.plan.residual = ql_row_cptr(ydt, e.plan.residual, m0, e.plan.ld_residual);
        if (lora) {
            lr.base = e;
            lr.inner = ops.epilogue;
        }
        ql_tile_epilogue_fn epi = lora ? ql_lora_epilogue : ops.epilogue;
        void *epi_arg = lora ? (void *)&lr : (void *)&e;
        if (sp.small) { /* one parallel region: rows quantized, then N split (ql_panel_next) */
            const int nt = threads < l->b8.panels ? threads : (int)l->b8.panels;
            if (nt <= 1) {
                prologue_part(&pj, 0, 1);
                ql_gemm_s8_small_part(kern, pj.packed, mc, &l->b8, 0, l->b8.panels, epi, epi_arg);
                continue;
            }
            ql_panel_range ranges[nt];
#pragma omp parallel num_threads(nt)
            {
                const int t = omp_get_thread_num(), n = omp_get_num_threads();
                if (t == 0) ql_panel_ranges_init(ranges, l->b8.panels, n);
                prologue_part(&pj, t, n);
#pragma omp barrier
                ql_gemm_s8_small_shared(kern, pj.packed, mc, &l->b8, ranges, t, n, epi, epi_arg);
            }
            continue;
        }
        if (l->corr) { /* the corrected GEMM reads the packed rows back: its own region */
            const int64_t panels = ql_panels(mc, mr);
            const int pt = threads < panels ? threads : (int)panels;
#pragma omp parallel num_threads(pt)
            prologue_part(&pj, omp_get_thread_num(), omp_get_num_threads());
            st = ql_wxa8_gemm_corrected(threads, kern, pj.packed, mc, &l->b8, &e, l->corr, l->corr_group, l->k);
        } else st = ql_gemm_s8_run_pre(threads, kern, pj.packed, mc, &l->b8, prologue_part, &pj, epi, epi_arg);
        if (st != QL_OK) goto done;
    }
done:
    ql_scratch_release(l->ctx, ws, arena);
    return st;
}

/* ---- float paths (DENSE, WEIGHT_ONLY, DEQUANT) */

void ql_f32_epilogue_generic(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_f32_epi *e = arg;
    for (int r = 0; r < mr_eff; r++)
        for (int j = 0; j < nr_eff; j++) {
            float v = c[r * nr + j];
            if (e->col_scale) v *= e->col_scale[e->col_scale_scalar ? 0 : n0 + j];
            ql_store_f(e->plan.y_dtype, e->y, (m0 + r) * e->ldy + n0 + j, ql_epilogue_scalar(&e->plan, v, m0 + r, n0 + j));
        }
}

/* x rows [r0, r1) -> fp32 rows for the float GEMM: rotated (and rounded to
 * x's dtype) for ConvRot weight-only, rounded to bf16 for bf16 compute. */
static void rows_to_f32(const ql_linear *l, const void *x, ql_dtype xdt, int64_t ldx, int64_t r0, int64_t r1,
                        int64_t group, float *a, int64_t lda)
{
    const int round_bf16 = l->compute == QL_BF16 && xdt != QL_BF16;
#if QL_X86
    const bool simd = l->f32 == &ql_f32_gemm_12x32__avx512;
#endif
    const int64_t k = l->k;
    for (int64_t r = r0; r < r1; r++) {
#if QL_X86
        if (simd) {
            ql_rows_to_f32_avx512(xdt, x, ldx, r, r + 1, k, group, round_bf16, a, lda);
            continue;
        }
#endif
        ql_load_row_rotated(xdt, ql_row_cptr(xdt, x, r, ldx), k, group, a + r * lda);
        if (round_bf16)
            for (int64_t j = 0; j < k; j++) a[r * lda + j] = ql_round_to(QL_BF16, a[r * lda + j]);
    }
}

static ql_status forward_float(ql_linear *l, const ql_packed_f32 *b, int64_t group, const void *x, ql_dtype xdt,
                               int64_t m, int64_t ldx, void *y, ql_dtype ydt, int64_t ldy, const ql_epi_plan *plan)
{
    const int64_t k = l->k, lda = (k + 15) & ~(int64_t)15;
    const int64_t chunk = m < QL_M_CHUNK ? m : QL_M_CHUNK;
    const bool direct = xdt == QL_F32 && group == 0 && l->compute == QL_F32;
    bool arena = false;
    float *a = direct ? NULL : ql_scratch_acquire(l->ctx, (size_t)(chunk * lda) * sizeof(float), &arena);
    if (!direct && !a) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_forward: cannot allocate the fp32 activations");
    const bool wo = l->kind == QL_LINEAR_WEIGHT_ONLY;
    ql_f32_epi e = {*plan, NULL, ldy, wo ? l->sw : NULL, wo && l->n_sw == 1};
    const int threads = forward_threads(l, m);
#if QL_X86
    ql_f32_epilogue_fn epi = l->f32 == &ql_f32_gemm_12x32__avx512 ? ql_f32_epilogue_avx512
                           : l->f32 == &ql_f32_gemm_6x16__avx2  ? ql_f32_epilogue_avx2
                                                                : ql_f32_epilogue_generic;
#elif QL_ARM64
    ql_f32_epilogue_fn epi = l->f32 == &ql_f32_gemm_8x8__neon || l->f32 == &ql_bf16_gemm_8x8c4__neonbf16 ? ql_f32_epilogue_neon
                                                                                         : ql_f32_epilogue_generic;
#else
    ql_f32_epilogue_fn epi = ql_f32_epilogue_generic;
#endif
    ql_status st = QL_OK;
    for (int64_t m0 = 0; m0 < m && st == QL_OK; m0 += chunk) {
        const int64_t mc = m - m0 < chunk ? m - m0 : chunk;
        const void *xc = ql_row_cptr(xdt, x, m0, ldx);
        e.y = ql_row_ptr(ydt, y, m0, ldy);
        e.plan.residual = plan->residual ? ql_row_cptr(ydt, plan->residual, m0, plan->ld_residual) : NULL;
        const float *ac = direct ? (const float *)xc : a;
        const int64_t ldac = direct ? ldx : lda;
        if (ql_f32_small_m(l->f32, mc, l->ctx->small_m)) { /* one parallel region: rows converted, then N split */
            const int nt = threads < b->panels ? threads : (int)b->panels;
            if (nt <= 1) {
                if (!direct) rows_to_f32(l, xc, xdt, ldx, 0, mc, group, a, lda);
                ql_gemm_f32_small_part(l->f32, ac, ldac, mc, b, 0, b->panels, epi, &e);
                continue;
            }
            const int64_t pairs = (b->panels + 1) / 2; /* the tiles take two panels at a time */
            ql_panel_range ranges[nt];
#pragma omp parallel num_threads(nt)
            {
                const int t = omp_get_thread_num(), n = omp_get_num_threads();
                if (t == 0) ql_panel_ranges_init(ranges, pairs, n);
                if (!direct) rows_to_f32(l, xc, xdt, ldx, mc * t / n, mc * (t + 1) / n, group, a, lda);
#pragma omp barrier
                int64_t pair;
                while (ql_panel_next(ranges, t, n, &pair))
                    ql_gemm_f32_small_part(l->f32, ac, ldac, mc, b, 2 * pair, 2 * pair + 2 < b->panels ? 2 * pair + 2 : b->panels,
                                           epi, &e);
            }
            continue;
        }
        if (!direct) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
            for (int64_t r = 0; r < mc; r++) rows_to_f32(l, xc, xdt, ldx, r, r + 1, group, a, lda);
        }
        st = ql_gemm_f32_run(threads, l->f32, ac, ldac, mc, b, epi, &e);
    }
    if (a) ql_scratch_release(l->ctx, a, arena);
    return st;
}

static ql_status forward_dequant(ql_linear *l, const void *x, ql_dtype xdt, int64_t m, int64_t ldx, void *y,
                                 ql_dtype ydt, int64_t ldy, const ql_epi_plan *plan)
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
    if (st == QL_OK) st = forward_float(l, &b, 0, x, xdt, m, ldx, y, ydt, ldy, plan);
    ql_packed_f32_free(&b);
    return st;
}

ql_status ql_linear_forward(ql_linear *l, const void *x, ql_dtype xdt, int64_t m, int64_t ldx, void *y, ql_dtype ydt,
                            int64_t ldy, const ql_epilogue *epi)
{
    const char *fn = "ql_linear_forward";
    QL_CHECK_PTR(fn, l);
    QL_TRY(ql_check_forward_args(fn, l->n, l->k, x, xdt, m, ldx, y, ydt, ldy, epi));
    if (m == 0 || l->n == 0) return QL_OK;
    if (l->cuda && epi && epi->activation)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: the CUDA backend has no activation epilogue (GELU); apply it after the linear", fn);
    if (l->cuda)
        return ql_cuda_linear_forward(&l->cuda, 1, &l->ctx->cuda_ws, l->ctx->cuda_stream, x, xdt, m, ldx, &y, ydt, &ldy,
                                      epi ? &epi : NULL);
    ql_epi_plan plan = {ydt, NULL, epi ? epi->residual : NULL, epi ? epi->ld_residual : 0,
                        epi ? epi->residual_scale : NULL, epi ? epi->activation : 0};
    plan.bias = l->bias[ydt];
    ql_status st;
    if (l->k == 0) { /* empty contraction: acc = 0 */
        st = QL_OK;
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < l->n; c++) ql_store_f(ydt, y, r * ldy + c, ql_epilogue_scalar(&plan, 0.0f, r, c));
    } else if (l->kind == QL_LINEAR_W8A8) st = forward_w8a8(l, x, xdt, m, ldx, y, ydt, ldy, &plan);
    else if (l->kind == QL_LINEAR_DEQUANT) st = forward_dequant(l, x, xdt, m, ldx, y, ydt, ldy, &plan);
    else st = forward_float(l, &l->bf, l->kind == QL_LINEAR_WEIGHT_ONLY ? l->group : 0, x, xdt, m, ldx, y, ydt, ldy, &plan);
    return st;
}

ql_status ql_linear_forward_shared(ql_linear *const *lins, int count, const void *x, ql_dtype xdt, int64_t m, int64_t ldx,
                                   void *const *ys, ql_dtype ydt, const int64_t *ldys, const ql_epilogue *const *epis)
{
    const char *fn = "ql_linear_forward_shared";
    QL_CHECK_PTR(fn, lins);
    QL_CHECK_PTR(fn, ys);
    QL_CHECK_PTR(fn, ldys);
    if (count < 1 || count > QL_SHARED_MAX)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: count = %d is not in 1..%d", fn, count, QL_SHARED_MAX);
    const ql_linear *l0 = lins[0];
    QL_CHECK_PTR(fn, l0);
    ql_cuda_linear *cl[QL_SHARED_MAX];
    for (int i = 0; i < count; i++) {
        const ql_linear *l = lins[i];
        const ql_epilogue *epi = epis ? epis[i] : NULL;
        QL_CHECK_PTR(fn, l);
        if (l->ctx != l0->ctx || l->k != l0->k || l->kind != l0->kind || l->group != l0->group || !l->cuda != !l0->cuda)
            return ql_fail(QL_ERR_INVALID_ARGUMENT,
                           "%s: layer %d (kind %d, K = %lld, group %lld) does not share layer 0's context, kind (%d), K (%lld) "
                           "and rotation group (%lld)",
                           fn, i, (int)l->kind, (long long)l->k, (long long)l->group, (int)l0->kind, (long long)l0->k,
                           (long long)l0->group);
        QL_TRY(ql_check_forward_args(fn, l->n, l->k, x, xdt, m, ldx, ys[i], ydt, ldys[i], epi));
        if (ys[i] == x)
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: output %d is the input: the other layers still read it", fn, i);
        if (l->cuda && epi && epi->activation)
            return ql_fail(QL_ERR_UNSUPPORTED, "%s: the CUDA backend has no activation epilogue (GELU); apply it after the linear",
                           fn);
        cl[i] = l->cuda;
    }
    if (m == 0) return QL_OK;
    if (l0->cuda && l0->k > 0 && count > 1)
        return ql_cuda_linear_forward(cl, count, &l0->ctx->cuda_ws, l0->ctx->cuda_stream, x, xdt, m, ldx, ys, ydt, ldys, epis);
    /* one layer, or the CPU backends (which fuse the prologue into each layer's packing): one after another */
    for (int i = 0; i < count; i++) QL_TRY(ql_linear_forward(lins[i], x, xdt, m, ldx, ys[i], ydt, ldys[i], epis ? epis[i] : NULL));
    return QL_OK;
}

void ql_linear_describe(const ql_linear *l, int64_t m, char *buf, size_t len)
{
    if (!buf || !len) return;
    if (!l) {
        snprintf(buf, len, "-");
        return;
    }
    if (l->cuda) {
        snprintf(buf, len, "cuda");
        return;
    }
    if (l->kind == QL_LINEAR_W8A8) {
        const ql_s8_plan sp = w8a8_plan(l, m < QL_M_CHUNK ? m : QL_M_CHUNK);
        snprintf(buf, len, "%s%s", sp.kern->name, sp.small ? " small-M" : "");
        return;
    }
    const bool small = ql_f32_small_m(l->f32, m, l->ctx->small_m);
    if (small) snprintf(buf, len, "%s small-M %dx%d", l->f32->small_name, ql_f32_small_rows(l->f32, m), 2 * l->f32->nr);
    else snprintf(buf, len, "%s", l->f32->name);
}

/* ---- unmerged LoRA (lora.c) */

ql_status ql_linear_add_lora(ql_linear *l, const ql_lora_desc *d, int *id)
{
    QL_CHECK_PTR("ql_linear_add_lora", l);
    if (l->kind != QL_LINEAR_W8A8 && l->kind != QL_LINEAR_WXA8_PACKED)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "ql_linear_add_lora: only W8A8 and WXA8_PACKED linears take unmerged LoRAs (this one is kind %d)",
                       (int)l->kind);
    if (l->corr)
        return ql_fail(QL_ERR_UNSUPPORTED, "ql_linear_add_lora: unmerged LoRA on an asymmetric W4A8 layer is not supported");
    if (l->cuda)
        return ql_fail(QL_ERR_UNSUPPORTED, "ql_linear_add_lora: unmerged LoRAs run on the CPU backends only, not on CUDA devices");
    return ql_lora_set_add(&l->lora, l->s8, l->n, l->k, l->group, d, id);
}
ql_status ql_linear_remove_lora(ql_linear *l, int id)
{
    QL_CHECK_PTR("ql_linear_remove_lora", l);
    return ql_lora_set_remove(l->lora, id);
}
int ql_linear_lora_count(const ql_linear *l) { return l ? ql_lora_set_count(l->lora) : 0; }
int64_t ql_linear_lora_rank(const ql_linear *l) { return l ? ql_lora_set_rank(l->lora) : 0; }

/* ---- bare GEMM */

ql_status ql_gemm_s8s8s32(ql_context *ctx, int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                          const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc)
{
    const char *fn = "ql_gemm_s8s8s32";
    QL_CHECK_PTR(fn, ctx);
    QL_TRY(ql_check_matrix(fn, "a", a, m, k, lda));
    QL_TRY(ql_check_matrix(fn, "b", b, n, k, ldb));
    QL_TRY(ql_check_matrix(fn, "c", c, m, n, ldc));
    if (k > QL_MAX_K)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: K = %lld exceeds %d, where int32 accumulation could overflow", fn,
                       (long long)k, QL_MAX_K);
    if (ctx->device == QL_DEVICE_CUDA)
        return ql_cuda_gemm_s8s8s32(ctx->device_index, ctx->cuda_stream, m, n, k, a, lda, b, ldb, c, ldc);
    if (m == 0 || n == 0) return QL_OK;
    const ql_s8_plan plan = ql_s8_plan_limit(ctx->isa, m, n, k, ctx->small_m);
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
    ql_status st = ql_gemm_s8_exec(ctx->threads, plan, pa, m, &pb, ops_for(kern->isa).epilogue, &e);
    ql_packed_b_free(&pb);
    ql_aligned_free(pa);
    ql_aligned_free(rowsum);
    return st;
}

/* ---- fast weight quantization (for the checkpoint quantizer) */

ql_status ql_quantize_weight_rows(ql_dtype dtype, const void *w, int64_t rows, int64_t k, int64_t ldw, int64_t group,
                                  int8_t *q, int64_t ldq, float *scale)
{
    const char *fn = group > 0 ? "ql_quantize_convrot_weight" : "ql_quantize_rowwise";
    if (!QL_X86 || !ql_isa_supported(QL_ISA_AVX512VNNI) || !ql_is_float_dtype(dtype) || k <= 0 || rows <= 0)
        return group > 0 ? ql_quantize_convrot_weight(dtype, w, rows, k, ldw, group, q, ldq, scale)
                         : ql_quantize_rowwise(dtype, w, rows, k, ldw, q, ldq, scale);
    QL_TRY(ql_check_matrix(fn, "x", w, rows, k, ldw));
    QL_TRY(ql_check_matrix(fn, "q", q, rows, k, ldq));
    QL_CHECK_PTR(fn, scale);
    if (group > 0) QL_TRY(ql_check_group(fn, group, k));
    float *scratch = ql_aligned_alloc((size_t)((k + 15) & ~(int64_t)15) * sizeof(float));
    if (!scratch) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate a row of %lld floats", fn, (long long)k);
#if QL_X86
    int64_t bad = ql_quantize_rows_avx512(dtype, w, ldw, 0, rows, k, group, q, ldq, scale, scratch);
#else
    int64_t bad = -1; /* not reached: the reference quantizers above */
#endif
    ql_aligned_free(scratch);
    if (bad >= 0)
        return ql_fail(QL_ERR_NONFINITE, "%s: row %lld %s NaN or Inf; its codes are 0 and its scale NaN", fn,
                       (long long)bad, group > 0 ? "holds (or rotates to)" : "holds");
    return QL_OK;
}
