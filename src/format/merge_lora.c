/* Merge LoRAs into a checkpoint: dequantize, add the deltas in fp32,
 * requantize into the same layout (stochastic or nearest), copy the rest. */
#include "format.h"
#include "cpu/ops.h"

#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#include "quant/quant.h"
#include "quant/wxa8.h"

#define BLOCK_BYTES ((uint64_t)4 << 20) /* fp32 bytes of one block of rows */

typedef struct lora_use {
    const ql_checkpoint *lc;
    const ql_lora_module *m;
    double strength;
} lora_use;

typedef struct touched {
    const char *prefix;
    int quantized;
    int64_t weight, scale; /* tensor indices in the base (scale -1 for float layers) */
    int64_t n, k, n_scale, group;
    /* W4A8 / W6A8 (bits != 0): the stored layout, kept by the requantization */
    int bits;
    ql_wxa8_mode mode;
    int s_rel_f32;
    int64_t s_rel, s_channel, correction, wgroup; /* tensor indices (-1: none), group_size */
    ql_dtype corr_dt;
    float codebook[16];
    lora_use *uses;
    int n_uses;
    /* loaded for the merge */
    float **down, **up, *coef;
} touched;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *strip_prefix(const char *p)
{
    static const char *const pre[] = {"model.diffusion_model.", "diffusion_model.", "transformer.", "unet."};
    for (int i = 0; i < 4; i++) {
        size_t l = strlen(pre[i]);
        if (!strncmp(p, pre[i], l) && p[l]) return p + l;
    }
    return p;
}

/* Rows [r0, r0 + rows) of the merged weight, fp32, un-rotated, row stride
 * ld (= k rounded up to 16); tmp is a second buffer of the same size. */
static void merged_rows(const ql_checkpoint *c, const touched *t, int64_t r0, int64_t rows, int64_t ld, float *w,
                        float *tmp, const float *scales)
{
    const int64_t k = t->k;
    const ql_st_tensor *wt = &c->tensors[t->weight];
    const unsigned char *src = ql_st_tensor_data(c, wt);
    if (t->bits) { /* w_rot = grid·s_channel (+ correction), un-rotated in fp32 (ql_wxa8_dequantize's arithmetic) */
        const int64_t ng = k / t->wgroup, rb = ql_wxa8_row_bytes(t->bits, k);
        const unsigned char *sr = ql_st_tensor_data(c, &c->tensors[t->s_rel]);
        const unsigned char *sc = ql_st_tensor_data(c, &c->tensors[t->s_channel]);
        const void *co = t->correction >= 0 ? ql_st_tensor_data(c, &c->tensors[t->correction]) : NULL;
        float values[64];
        ql_wxa8_weight vw = {.bits = t->bits, .codebook = t->mode == QL_WXA8_CODEBOOK ? t->codebook : NULL};
        ql_wxa8_values(&vw, values);
        uint8_t *codes = (uint8_t *)w; /* k bytes, consumed before w is written */
        for (int64_t i = 0; i < rows; i++) {
            const int64_t r = r0 + i;
            float sch;
            memcpy(&sch, sc + 4 * r, 4);
            ql_wxa8_unpack_row(t->bits, src + r * rb, k, codes);
            for (int64_t g = 0; g < ng; g++) {
                float srel;
                if (t->s_rel_f32) memcpy(&srel, sr + 4 * (r * ng + g), 4);
                else srel = ql_e4m3_to_fp32(sr[r * ng + g]);
                const float corr = co ? ql_load_f(t->corr_dt, co, g * t->n + r) : 0.0f;
                for (int64_t j = g * t->wgroup; j < (g + 1) * t->wgroup; j++) {
                    float v = (float)ql_wxa8_grid(values[codes[j]], srel) * sch;
                    tmp[i * ld + j] = co ? v + corr : v;
                }
            }
        }
        ql_rotate_rows_f32(tmp, rows, k, ld, t->group, w, ld);
    } else if (t->quantized) { /* w = q·s, then un-rotated (H is an involution) */
        float *dst = t->group ? tmp : w;
        for (int64_t i = 0; i < rows; i++) {
            const float s = scales[t->n_scale == 1 ? 0 : r0 + i];
            const int8_t *q = (const int8_t *)src + (r0 + i) * k;
            for (int64_t j = 0; j < k; j++) dst[i * ld + j] = (float)q[j] * s;
        }
        if (t->group) ql_rotate_rows_f32(tmp, rows, k, ld, t->group, w, ld);
    } else {
        ql_dtype dt;
        ql_st_dtype_to_ql(wt->dtype, &dt);
        const size_t es = ql_dtype_size(dt);
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < k; j++) {
                const size_t off = (size_t)((r0 + i) * k + j) * es;
                if (dt == QL_F32) memcpy(&w[i * ld + j], src + off, 4);
                else {
                    uint16_t h;
                    memcpy(&h, src + off, 2);
                    w[i * ld + j] = ql_load_f(dt, &h, 0);
                }
            }
    }
    for (int u = 0; u < t->n_uses; u++) {
        if (t->coef[u] == 0.0f) continue;
        const int64_t rk = t->uses[u].m->rank;
        ql_lowrank_add(w, rows, k, ld, t->up[u] + r0 * rk, rk, t->down[u], t->coef[u]);
    }
}

typedef struct mjob {
    const ql_checkpoint *c;
    ql_st_writer *w;
    const ql_merge_options *opt;
    int threads;
    _Atomic int failed;
    ql_status err;
    char errmsg[512];
} mjob;

static void record(mjob *j, ql_status st)
{
    if (st == QL_OK) return;
#pragma omp critical(ql_merge_error)
    if (j->err == QL_OK) {
        j->err = st;
        snprintf(j->errmsg, sizeof j->errmsg, "%s", ql_last_error());
        atomic_store(&j->failed, 1);
    }
}

static ql_status nonfinite_row(const mjob *j, const touched *t, int64_t row)
{
    ql_name_buf a;
    return ql_fail_file(j->c, QL_ERR_NONFINITE, "layer '%s': row %lld of the merged weight holds NaN or Inf",
                        ql_show(&a, t->prefix), (long long)row);
}

/* The merge key's seed: CRC-32 of diffusion_model.<path>.weight (or the prefix asked for). */
static uint64_t layer_seed(const mjob *j, const touched *t)
{
    char key[4096];
    snprintf(key, sizeof key, "%s%s.weight", j->opt->seed_prefix ? j->opt->seed_prefix : "diffusion_model.",
             strip_prefix(t->prefix));
    return ql_crc32_key(key);
}

/* W4A8 / W6A8: requantize into the stored layout (docs/FORMATS.md §5.2, §5.6):
 * the stored codebook, group sizes and s_rel dtype, the 6-bit scale search
 * off, stochastic (the final assignment, ql_wxa8_quantize_ex) or nearest. */
static ql_status merge_layer_wxa8(mjob *j, touched *t, int64_t rows, int64_t ld, int64_t nblocks, size_t fbytes)
{
    const ql_checkpoint *c = j->c;
    const int64_t n = t->n, k = t->k, ng = k / t->wgroup, rb = ql_wxa8_row_bytes(t->bits, k);
    const size_t ses = t->s_rel_f32 ? 4 : 1;
    const ql_wxa8_qparams p = {t->mode, t->wgroup, t->group, t->mode == QL_WXA8_CODEBOOK ? t->codebook : NULL, 0};
    const uint64_t seed = j->opt->stochastic ? layer_seed(j, t) : 0;
    float *corr = NULL; /* the whole correction, [n, ng] fp32, written transposed at the end */
    if (t->correction >= 0 && !(corr = malloc((size_t)(n * ng) * 4 + 4)))
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "merge: out of memory");
#pragma omp parallel num_threads(j->threads)
    {
        float *w = ql_aligned_alloc(fbytes), *tmp = ql_aligned_alloc(fbytes), *sch = malloc((size_t)rows * 4);
        uint8_t *q = malloc((size_t)(rows * rb) + 1), *srel = malloc((size_t)(rows * ng) * ses + 1);
        if (!w || !tmp || !sch || !q || !srel) record(j, ql_fail(QL_ERR_OUT_OF_MEMORY, "merge: out of memory"));
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblocks; b++) {
            if (atomic_load(&j->failed)) continue;
            const int64_t r0 = b * rows, nr = n - r0 < rows ? n - r0 : rows;
            merged_rows(c, t, r0, nr, ld, w, tmp, NULL);
            const ql_wxa8_qoptions o = {t->s_rel_f32, seed, r0 * k, QL_SR_CUDA_PCG};
            ql_status st = ql_wxa8_quantize_ex(QL_F32, w, nr, k, ld, &p, &o, q, rb, srel, sch, corr ? corr + r0 * ng : NULL);
            if (st == QL_ERR_NONFINITE) {
                int64_t bad = 0;
                while (bad < nr && sch[bad] == sch[bad]) bad++;
                st = nonfinite_row(j, t, r0 + bad);
            }
            if (st == QL_OK) st = ql_st_writer_write(j->w, t->weight, (uint64_t)(r0 * rb), q, (size_t)(nr * rb));
            if (st == QL_OK) st = ql_st_writer_write(j->w, t->s_rel, (uint64_t)(r0 * ng) * ses, srel, (size_t)(nr * ng) * ses);
            if (st == QL_OK) st = ql_st_writer_write(j->w, t->s_channel, (uint64_t)r0 * 4, sch, (size_t)nr * 4);
            record(j, st);
        }
        ql_aligned_free(w);
        ql_aligned_free(tmp);
        free(sch);
        free(q);
        free(srel);
    }
    ql_status st = j->err != QL_OK ? ql_fail(j->err, "%s", j->errmsg) : QL_OK;
    if (st == QL_OK && corr) { /* [ng, n] in the stored dtype, rounded to nearest */
        const size_t es = ql_dtype_size(t->corr_dt);
        void *ct = malloc((size_t)(n * ng) * es + 4);
        if (!ct) st = ql_fail(QL_ERR_OUT_OF_MEMORY, "merge: out of memory");
        for (int64_t g = 0; ct && g < ng; g++)
            for (int64_t r = 0; r < n; r++) ql_store_f(t->corr_dt, ct, g * n + r, corr[r * ng + g]);
        if (st == QL_OK) st = ql_st_writer_write(j->w, t->correction, 0, ct, (size_t)(n * ng) * es);
        free(ct);
    }
    free(corr);
    return st;
}

/* Pass 1 of a tensorwise int8 layer: the merged weight's absmax. */
static ql_status merged_absmax(mjob *j, const touched *t, const float *scales, int64_t rows, int64_t ld,
                               int64_t nblocks, size_t fbytes, float *absmax)
{
    const ql_checkpoint *c = j->c;
    const int64_t n = t->n, k = t->k;
    float gmax = 0.0f;
#pragma omp parallel num_threads(j->threads)
    {
        float *w = ql_aligned_alloc(fbytes), *tmp = ql_aligned_alloc(fbytes);
        float lmax = 0.0f;
        if (!w || !tmp) record(j, ql_fail(QL_ERR_OUT_OF_MEMORY, "merge: out of memory"));
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblocks; b++) {
            if (atomic_load(&j->failed)) continue;
            const int64_t r0 = b * rows, nr = n - r0 < rows ? n - r0 : rows;
            merged_rows(c, t, r0, nr, ld, w, tmp, scales);
            for (int64_t i = 0; i < nr; i++)
                for (int64_t x = 0; x < k; x++) {
                    const float v = fabsf(w[i * ld + x]);
                    if (!(v <= 3.40282347e38f)) {
                        record(j, nonfinite_row(j, t, r0 + i));
                        i = nr;
                        break;
                    }
                    lmax = v > lmax ? v : lmax;
                }
        }
#pragma omp critical(ql_merge_max)
        gmax = lmax > gmax ? lmax : gmax;
        ql_aligned_free(w);
        ql_aligned_free(tmp);
    }
    *absmax = gmax;
    return j->err != QL_OK ? ql_fail(j->err, "%s", j->errmsg) : QL_OK;
}

static ql_status merge_layer(mjob *j, touched *t)
{
    const ql_checkpoint *c = j->c;
    const int64_t n = t->n, k = t->k;
    const int sr = j->opt->stochastic;
    const uint64_t seed = layer_seed(j, t);
    /* the stored scales, aligned */
    float *scales = NULL;
    if (t->quantized && !t->bits) {
        scales = malloc((size_t)t->n_scale * 4);
        if (!scales) return ql_fail(QL_ERR_OUT_OF_MEMORY, "merge: out of memory");
        memcpy(scales, ql_st_tensor_data(c, &c->tensors[t->scale]), (size_t)t->n_scale * 4);
    }
    const int64_t ld = (k + 15) & ~(int64_t)15;
    int64_t rows = (int64_t)(BLOCK_BYTES / ((uint64_t)(ld > 0 ? ld : 1) * 4));
    if (rows < 1) rows = 1;
    if (rows > n) rows = n;
    const int64_t nblocks = n > 0 ? (n + rows - 1) / rows : 0;
    const size_t fbytes = (size_t)(rows * ld) * 4 + 64;
    if (t->bits) return merge_layer_wxa8(j, t, rows, ld, nblocks, fbytes);
    const int tensorwise = t->quantized && t->n_scale == 1;
    float gmax = 0.0f, gscale = 0.0f;
    if (tensorwise) { /* pass 1: the merged tensor's absmax */
        ql_status st = merged_absmax(j, t, scales, rows, ld, nblocks, fbytes, &gmax);
        if (st != QL_OK) {
            free(scales);
            return st;
        }
        gscale = sr ? ql_sr_scale(gmax) : ql_scale_from_absmax(gmax);
    }
#pragma omp parallel num_threads(j->threads)
    {
        float *w = ql_aligned_alloc(fbytes), *tmp = ql_aligned_alloc(fbytes);
        int8_t *q = malloc((size_t)(rows * k) + 1);
        float *s = malloc((size_t)rows * 4);
        if (!w || !tmp || !q || !s) record(j, ql_fail(QL_ERR_OUT_OF_MEMORY, "merge: out of memory"));
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < nblocks; b++) {
            if (atomic_load(&j->failed)) continue;
            const int64_t r0 = b * rows, nr = n - r0 < rows ? n - r0 : rows;
            merged_rows(c, t, r0, nr, ld, w, tmp, scales);
            ql_status st = QL_OK;
            if (!t->quantized) { /* rounded to nearest in the weight's dtype, written compact */
                const ql_st_tensor *wt = &c->tensors[t->weight];
                ql_dtype dt;
                ql_st_dtype_to_ql(wt->dtype, &dt);
                for (int64_t i = 0; i < nr && st == QL_OK; i++)
                    for (int64_t x = 0; x < k; x++) {
                        if (!isfinite(w[i * ld + x])) {
                            st = nonfinite_row(j, t, r0 + i);
                            break;
                        }
                        ql_store_f(dt, tmp, i * k + x, w[i * ld + x]);
                    }
                if (st == QL_OK)
                    st = ql_st_writer_write(j->w, t->weight, (uint64_t)(r0 * k) * ql_dtype_size(dt), tmp,
                                            (size_t)(nr * k) * ql_dtype_size(dt));
                record(j, st);
                continue;
            }
            if (tensorwise) {
                for (int64_t i = 0; i < nr; i++)
                    for (int64_t x = 0; x < k; x++)
                        q[i * k + x] = sr ? ql_sr_code(w[i * ld + x], gscale, (r0 + i) * k + x, seed)
                                          : ql_quantize_value(QL_F32, w[i * ld + x], gscale);
            } else if (!sr) {
                st = ql_quantize_weight_rows(QL_F32, w, nr, k, ld, t->group, q, k, s);
            } else {
                const float *rw = w;
                if (t->group > 0) {
                    ql_rotate_rows_f32(w, nr, k, ld, t->group, tmp, ld);
                    rw = tmp;
                }
                st = ql_quantize_rowwise_sr(rw, nr, k, ld, r0 * k, seed, q, k, s);
            }
            if (st == QL_ERR_NONFINITE) {
                int64_t bad = 0;
                while (bad < nr && s[bad] == s[bad]) bad++;
                st = nonfinite_row(j, t, r0 + bad);
            }
            if (st == QL_OK) st = ql_st_writer_write(j->w, t->weight, (uint64_t)(r0 * k), q, (size_t)(nr * k));
            if (st == QL_OK && !tensorwise) st = ql_st_writer_write(j->w, t->scale, (uint64_t)r0 * 4, s, (size_t)nr * 4);
            record(j, st);
        }
        ql_aligned_free(w);
        ql_aligned_free(tmp);
        free(q);
        free(s);
    }
    free(scales);
    if (j->err != QL_OK) return ql_fail(j->err, "%s", j->errmsg);
    if (tensorwise) return ql_st_writer_write(j->w, t->scale, 0, &gscale, 4);
    return QL_OK;
}

/* What a W4A8/W6A8 requantization needs of the stored layer. */
static ql_status wxa8_mergeable(const ql_checkpoint *base, const ql_layer_info *li)
{
    ql_name_buf a, b;
    if (li->asymmetric && li->has_codebook)
        return ql_fail_file(base, QL_ERR_UNSUPPORTED,
                            "layer '%s': a correction and a codebook together (tensor '%s'): no quantizer writes this "
                            "layout, so it cannot be requantized into it",
                            ql_show(&a, li->prefix), ql_show(&b, base->tensors[li->codebook].name));
    if (li->has_codebook) {
        float cb[16];
        memcpy(cb, ql_st_tensor_data(base, &base->tensors[li->codebook]), 64);
        for (int i = 1; i < 16; i++)
            if (!(cb[i] >= cb[i - 1]))
                return ql_fail_file(base, QL_ERR_FORMAT,
                                    "tensor '%s': codebook[%d] = %g is below codebook[%d] = %g; a requantization needs an "
                                    "ascending codebook",
                                    ql_show(&a, base->tensors[li->codebook].name), i, cb[i], i - 1, cb[i - 1]);
    }
    return QL_OK;
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!strcmp(a, b)) return 1;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int cmp_begin(const void *a, const void *b, void *ctx)
{
    const ql_st_tensor *t = ctx;
    uint64_t x = t[*(const int64_t *)a].begin, y = t[*(const int64_t *)b].begin;
    return x < y ? -1 : x > y;
}

/* Strengths finite, and OUT none of the inputs. */
static ql_status check_inputs(const char *fn, const char *base_path, const ql_lora_input *loras, int64_t n_loras,
                              const char *out_path)
{
    for (int64_t i = 0; i < n_loras; i++) {
        QL_CHECK_PTR(fn, loras[i].path);
        if (!isfinite(loras[i].strength))
            return ql_fail_path(loras[i].path, QL_ERR_INVALID_ARGUMENT, "strength %g is not finite", loras[i].strength);
        if (same_file(out_path, loras[i].path) || same_file(out_path, base_path))
            return ql_fail_path(out_path, QL_ERR_INVALID_ARGUMENT, "refusing to write over an input");
    }
    return QL_OK;
}

/* The layers the LoRAs touch, and which of them each base tensor belongs to
 * (-1: none). */
typedef struct touched_set {
    touched *tl;
    int64_t ntl;
    int64_t *by_tensor;
} touched_set;

/* The touched layer of weight `widx` of the base: a new one, set up from the
 * base's layer, where none is yet. */
static ql_status touch_layer(const char *fn, touched_set *ts, const ql_checkpoint *base, const ql_lora_module *md,
                             int64_t widx, int64_t n_loras, touched **out)
{
    int64_t ti = ts->by_tensor[widx];
    if (ti < 0) {
        ti = ts->ntl++;
        touched *t = &ts->tl[ti];
        t->s_rel = t->s_channel = t->correction = -1;
        t->prefix = md->layer;
        t->quantized = md->quantized;
        t->weight = widx;
        t->scale = -1;
        t->n = md->n;
        t->k = md->k;
        if (md->quantized) {
            ql_layer_info li;
            ql_checkpoint_layer(base, ql_checkpoint_find_layer(base, md->layer), &li);
            t->scale = li.weight_scale;
            t->n_scale = li.n_scale;
            t->group = li.convrot ? li.convrot_group : 0;
            if (li.bits) { /* W4A8 / W6A8: always rotated; writes s_rel, s_channel (and a correction) */
                t->bits = li.bits;
                t->group = li.convrot_group;
                t->wgroup = li.group_size;
                t->s_rel = li.s_rel;
                t->s_channel = li.s_channel;
                t->correction = li.correction;
                t->s_rel_f32 = li.s_rel_dtype == QL_ST_F32;
                t->mode = li.bits == 6 ? QL_WXA8_6BIT
                          : li.asymmetric ? QL_WXA8_ASYM
                          : li.has_codebook ? QL_WXA8_CODEBOOK
                                            : QL_WXA8_UNIFORM;
                if (li.has_codebook) memcpy(t->codebook, ql_st_tensor_data(base, &base->tensors[li.codebook]), 64);
                if (li.correction >= 0) ql_st_dtype_to_ql(base->tensors[li.correction].dtype, &t->corr_dt);
                ts->by_tensor[li.s_rel] = ts->by_tensor[li.s_channel] = ti;
                if (li.correction >= 0) ts->by_tensor[li.correction] = ti;
            } else ts->by_tensor[li.weight_scale] = ti;
        }
        ts->by_tensor[widx] = ti;
        t->uses = calloc((size_t)n_loras, sizeof *t->uses);
        t->down = calloc((size_t)n_loras, sizeof *t->down);
        t->up = calloc((size_t)n_loras, sizeof *t->up);
        t->coef = calloc((size_t)n_loras, sizeof *t->coef);
        if (!t->uses || !t->down || !t->up || !t->coef) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    *out = &ts->tl[ti];
    return QL_OK;
}

/* Every module of every plan, on its touched layer. */
static ql_status collect_touched(const char *fn, const ql_checkpoint *base, ql_lora_plan *const *plans,
                                 ql_checkpoint *const *lc, const ql_lora_input *loras, int64_t n_loras, touched_set *ts)
{
    int64_t maxl = 0;
    for (int64_t i = 0; i < n_loras; i++) maxl += ql_lora_plan_module_count(plans[i]);
    ts->tl = calloc((size_t)(maxl + 1), sizeof *ts->tl);
    ts->by_tensor = malloc((size_t)(base->n_tensors + 1) * sizeof *ts->by_tensor);
    if (!ts->tl || !ts->by_tensor) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int64_t i = 0; i < base->n_tensors; i++) ts->by_tensor[i] = -1;
    for (int64_t i = 0; i < n_loras; i++)
        for (int64_t m = 0; m < ql_lora_plan_module_count(plans[i]); m++) {
            const ql_lora_module *md = ql_lora_plan_module(plans[i], m);
            int64_t widx;
            if (md->quantized) {
                ql_layer_info li;
                ql_checkpoint_layer(base, ql_checkpoint_find_layer(base, md->layer), &li);
                widx = li.weight;
                if (li.bits) QL_TRY(wxa8_mergeable(base, &li));
            } else {
                char *nm = malloc(strlen(md->layer) + 8);
                if (!nm) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
                sprintf(nm, "%s.weight", md->layer);
                widx = ql_checkpoint_find(base, nm);
                free(nm);
            }
            touched *t = NULL;
            QL_TRY(touch_layer(fn, ts, base, md, widx, n_loras, &t));
            t->uses[t->n_uses++] = (lora_use){lc[i], md, loras[i].strength};
        }
    return QL_OK;
}

/* A touched layer's tensors, written when its weight (base tensor i) comes
 * up: the modules loaded, then merged, or at strength 0 copied bit for bit. */
static ql_status write_touched(const char *fn, mjob *j, touched *t, int64_t i)
{
    const ql_checkpoint *base = j->c;
    const ql_st_tensor *bt = &base->tensors[i];
    ql_status st = QL_OK;
    for (int u = 0; u < t->n_uses && st == QL_OK; u++) {
        const ql_lora_module *md = t->uses[u].m;
        t->down[u] = malloc((size_t)(md->rank * md->k) * 4 + 4);
        t->up[u] = malloc((size_t)(md->n * md->rank) * 4 + 4);
        t->coef[u] = (float)ql_lora_scale(t->uses[u].strength, md->alpha_value, md->has_alpha, md->rank);
        st = t->down[u] && t->up[u] ? ql_lora_module_load(t->uses[u].lc, md, t->down[u], t->up[u])
                                    : ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int any = 0;
    for (int u = 0; u < t->n_uses; u++) any |= t->coef[u] != 0.0f;
    if (st == QL_OK && !any) { /* strength 0: the layer is left as it is, bit for bit */
        st = ql_st_writer_write(j->w, i, 0, ql_st_tensor_data(base, bt), (size_t)(bt->end - bt->begin));
        const int64_t owned[4] = {t->bits ? -1 : t->scale, t->s_rel, t->s_channel, t->correction};
        for (int o = 0; o < 4 && st == QL_OK; o++)
            if (owned[o] >= 0) {
                const ql_st_tensor *sct = &base->tensors[owned[o]];
                st = ql_st_writer_write(j->w, owned[o], 0, ql_st_tensor_data(base, sct), (size_t)(sct->end - sct->begin));
            }
    } else if (st == QL_OK) st = merge_layer(j, t);
    for (int u = 0; u < t->n_uses; u++) {
        free(t->down[u]);
        free(t->up[u]);
        t->down[u] = t->up[u] = NULL;
    }
    return st;
}

ql_status ql_checkpoint_merge_lora(const char *base_path, const ql_lora_input *loras, int64_t n_loras,
                                   const char *out_path, const ql_merge_options *opt, ql_merge_result *result)
{
    const char *fn = "ql_checkpoint_merge_lora";
    QL_CHECK_PTR(fn, base_path);
    QL_CHECK_PTR(fn, out_path);
    QL_CHECK_PTR(fn, opt);
    if (n_loras < 1 || !loras) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: no LoRA given", fn);
    if (result) memset(result, 0, sizeof *result);
    QL_TRY(check_inputs(fn, base_path, loras, n_loras, out_path));
    const double t0 = now_s();
    ql_checkpoint *base = NULL;
    ql_checkpoint **lc = calloc((size_t)n_loras, sizeof *lc);
    ql_lora_plan **plans = calloc((size_t)n_loras, sizeof *plans);
    touched_set ts = {NULL, 0, NULL};
    int64_t *order = NULL;
    ql_tensor_spec *specs = NULL;
    ql_st_writer *w = NULL;
    mjob j;
    memset(&j, 0, sizeof j);
    ql_status st = lc && plans ? QL_OK : ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (st == QL_OK) st = ql_checkpoint_open(base_path, &base);
    for (int64_t i = 0; i < n_loras && st == QL_OK; i++) {
        st = ql_checkpoint_open(loras[i].path, &lc[i]);
        if (st == QL_OK) st = ql_lora_plan_create(base, lc[i], &plans[i]);
    }
    if (st != QL_OK) goto done;
    if ((st = collect_touched(fn, base, plans, lc, loras, n_loras, &ts)) != QL_OK) goto done;
    /* the output: the base's tensors, same names, dtypes and shapes */
    specs = calloc((size_t)(base->n_tensors + 1), sizeof *specs);
    order = calloc((size_t)(base->n_tensors + 1), sizeof *order);
    if (!specs || !order) {
        st = ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        goto done;
    }
    uint64_t bytes_total = 0;
    for (int64_t i = 0; i < base->n_tensors; i++) {
        const ql_st_tensor *t = &base->tensors[i];
        specs[i] = (ql_tensor_spec){t->name, t->dtype, t->ndim, t->shape};
        bytes_total += t->end - t->begin;
        order[i] = i;
    }
    st = ql_st_writer_open(out_path, specs, base->n_tensors, (const char *const *)base->meta_keys,
                           (const char *const *)base->meta_values, base->n_meta, base_path, &w);
    if (st != QL_OK) goto done;
    j.c = base;
    j.w = w;
    j.opt = opt;
    j.threads = opt->threads > 0 ? opt->threads : omp_get_max_threads();
    if (j.threads < 1) j.threads = 1;
    qsort_r(order, (size_t)base->n_tensors, sizeof *order, cmp_begin, base->tensors);
    ql_quantize_progress prog = {0, ts.ntl, 0, bytes_total, 0.0, NULL};
    for (int64_t ii = 0; ii < base->n_tensors && st == QL_OK; ii++) {
        const int64_t i = order[ii];
        const ql_st_tensor *bt = &base->tensors[i];
        const uint64_t bytes = bt->end - bt->begin;
        prog.current = bt->name;
        if (ts.by_tensor[i] < 0) {
            st = ql_st_writer_write(w, i, 0, ql_st_tensor_data(base, bt), (size_t)bytes);
            if (result) result->tensors_copied++;
        } else if (i == ts.tl[ts.by_tensor[i]].weight) {
            st = write_touched(fn, &j, &ts.tl[ts.by_tensor[i]], i);
            prog.layers_done++;
        } /* else: a touched layer's scale, written with its weight */
        prog.bytes_done += bytes;
        prog.seconds = now_s() - t0;
        if (st == QL_OK && opt->progress && opt->progress(opt->user, &prog)) st = ql_fail_path(base_path, QL_ERR_IO, "cancelled");
    }
    if (st != QL_OK) goto done;
    st = ql_st_writer_finish(w);
    w = NULL;
    if (st == QL_OK && result) {
        result->layers_merged = ts.ntl;
        result->bytes_in = bytes_total;
        result->seconds = now_s() - t0;
        struct stat sb;
        if (stat(out_path, &sb) == 0) result->bytes_out = (uint64_t)sb.st_size;
    }
done:
    if (w) ql_st_writer_abort(w);
    for (int64_t i = 0; ts.tl && i < ts.ntl; i++) {
        free(ts.tl[i].uses);
        free(ts.tl[i].down);
        free(ts.tl[i].up);
        free(ts.tl[i].coef);
    }
    free(ts.tl);
    free(ts.by_tensor);
    free(order);
    free(specs);
    for (int64_t i = 0; i < n_loras; i++) {
        if (plans) ql_lora_plan_destroy(plans[i]);
        if (lc) ql_checkpoint_close(lc[i]);
    }
    free(plans);
    free(lc);
    ql_checkpoint_close(base);
    return st;
}
