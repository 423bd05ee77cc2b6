/* Quantize a float checkpoint into ComfyUI's int8_tensorwise format
 * (optionally ConvRot), asym_w4a8_int8 or w6a8_int8, one block of rows at a
 * time from the mapping. */
#include "format.h"
#include "cpu/ops.h"

#include <ctype.h>
#include <omp.h>
#include <regex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "quant/quant.h"
#include "quant/wxa8.h"

#define BLOCK_BYTES ((uint64_t)4 << 20)  /* input bytes per block of rows */
#define BATCH_BYTES ((uint64_t)64 << 20) /* input bytes between progress reports */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int contains_ci(const char *s, size_t n, const char *needle)
{
    size_t m = strlen(needle);
    for (size_t i = 0; i + m <= n; i++) {
        size_t j = 0;
        while (j < m && tolower((unsigned char)s[i + j]) == needle[j]) j++;
        if (j == m) return 1;
    }
    return 0;
}

static int default_name_ok(const char *name)
{
    size_t len = strlen(name) - 7; /* without ".weight" */
    const char *mod = name;
    for (size_t i = 0; i < len; i++)
        if (name[i] == '.') mod = name + i + 1;
    size_t ml = (size_t)(name + len - mod);
    if (contains_ci(mod, ml, "norm") || contains_ci(mod, ml, "embed")) return 0;
    if ((ml == 3 && (contains_ci(mod, ml, "emb") || contains_ci(mod, ml, "wte") || contains_ci(mod, ml, "wpe"))))
        return 0;
    if (ml >= 2 && tolower((unsigned char)mod[0]) == 'l' && tolower((unsigned char)mod[1]) == 'n') return 0;
    return 1;
}

int ql_quantize_selects(const ql_tensor_info *t, int64_t group, int default_names)
{
    if (!t || !t->name) return 0;
    if (t->dtype != QL_ST_F32 && t->dtype != QL_ST_F16 && t->dtype != QL_ST_BF16) return 0;
    if (t->ndim != 2 || t->shape[0] <= 0 || t->shape[1] <= 0) return 0;
    if (group > 1 && t->shape[1] % group != 0) return 0;
    size_t len = strlen(t->name);
    if (len <= 7 || strcmp(t->name + len - 7, ".weight") != 0) return 0;
    return default_names ? default_name_ok(t->name) : 1;
}

/* One output tensor: either a copy of input tensor `src`, or one of the three
 * tensors of a quantized layer. */
typedef enum { OUT_COPY, OUT_CODES, OUT_SCALE, OUT_CONFIG, OUT_SREL, OUT_CODEBOOK } out_kind;

typedef struct out_tensor {
    out_kind kind;
    int64_t src;  /* input tensor */
    char *name;   /* owned for SCALE/CONFIG */
    int64_t shape[2];
} out_tensor;

typedef struct job {
    ql_checkpoint *c;
    ql_st_writer *w;
    const ql_quantize_options *opt;
    int64_t group; /* 0: plain int8 */
    int threads;
    /* W4A8/W6A8: bits 4 or 6 (0: int8), the quantizer's parameters and the
     * tensor's codebook */
    int bits;
    ql_wxa8_qparams wp;
    float codebook[16];
    uint8_t **rbuf; /* s_rel bytes of a block */
    int8_t **qbuf;
    float **sbuf;
    void **xbuf; /* aligned copy of misaligned input rows */
    /* progress */
    ql_quantize_progress prog;
    double t0, last_report;
    /* first error of a worker */
    _Atomic int failed;
    ql_status err;
    char errmsg[512];
} job;

static int report(job *j, const char *current, int force)
{
    double t = now_s();
    j->prog.seconds = t - j->t0;
    j->prog.current = current;
    if (!j->opt->progress) return 0;
    if (!force && t - j->last_report < 0.25) return 0;
    j->last_report = t;
    return j->opt->progress(j->opt->user, &j->prog);
}

static void drop_pages(const ql_checkpoint *c, const void *p, uint64_t bytes)
{
    if (!c->mapped || bytes == 0) return;
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p, e = a + (uintptr_t)bytes;
    uintptr_t lo = (a + (uintptr_t)ps - 1) & ~((uintptr_t)ps - 1), hi = e & ~((uintptr_t)ps - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static ql_status cancelled(job *j)
{
    ql_name_buf nb;
    return ql_fail(QL_ERR_IO, "%s: cancelled", ql_show(&nb, j->c->path));
}

static ql_status copy_tensor(job *j, int64_t out_index, const ql_st_tensor *t)
{
    const unsigned char *p = ql_st_tensor_data(j->c, t);
    uint64_t bytes = t->end - t->begin;
    for (uint64_t off = 0; off < bytes;) {
        uint64_t chunk = bytes - off < BATCH_BYTES ? bytes - off : BATCH_BYTES;
        QL_TRY(ql_st_writer_write(j->w, out_index, off, p + off, (size_t)chunk));
        drop_pages(j->c, p + off, chunk);
        off += chunk;
        j->prog.bytes_done += chunk;
        if (report(j, t->name, 0)) return cancelled(j);
    }
    return QL_OK;
}

static void free_buffers(job *j)
{
    for (int th = 0; th < j->threads; th++) {
        ql_aligned_free(j->qbuf[th]);
        ql_aligned_free(j->sbuf[th]);
        ql_aligned_free(j->xbuf[th]);
        ql_aligned_free(j->rbuf[th]);
        j->rbuf[th] = NULL;
        j->qbuf[th] = NULL;
        j->sbuf[th] = NULL;
        j->xbuf[th] = NULL;
    }
}

static ql_status quantize_blocks(job *j, const ql_st_tensor *t, ql_dtype dt, const unsigned char *src, int misaligned,
                                 int64_t rows, int64_t i_codes, int64_t i_scale);

static ql_status quantize_tensor(job *j, const ql_st_tensor *t, int64_t i_codes, int64_t i_scale)
{
    ql_dtype dt;
    ql_st_dtype_to_ql(t->dtype, &dt);
    const int64_t n = t->shape[0], k = t->shape[1];
    const size_t es = ql_dtype_size(dt);
    const unsigned char *src = ql_st_tensor_data(j->c, t);
    const int misaligned = ((uintptr_t)src % es) != 0;
    int64_t rows = (int64_t)(BLOCK_BYTES / ((uint64_t)k * es));
    if (rows < 1) rows = 1;
    if (rows > n) rows = n;
    /* Per-thread buffers for one block of rows. */
    const size_t qbytes = (size_t)rows * (size_t)k, xbytes = misaligned ? qbytes * es : 1;
    for (int th = 0; th < j->threads; th++) {
        j->qbuf[th] = ql_aligned_alloc(qbytes);
        j->sbuf[th] = ql_aligned_alloc((size_t)rows * sizeof(float));
        j->xbuf[th] = ql_aligned_alloc(xbytes);
        j->rbuf[th] = ql_aligned_alloc(j->bits ? (size_t)rows * (size_t)(k / j->wp.group) : 1);
        if (!j->qbuf[th] || !j->sbuf[th] || !j->xbuf[th] || !j->rbuf[th]) {
            free_buffers(j);
            ql_name_buf nb, tb;
            return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: tensor '%s': cannot allocate %zu bytes of row buffers",
                           ql_show(&nb, j->c->path), ql_show(&tb, t->name), qbytes + xbytes);
        }
    }
    ql_status result = QL_OK;
    if (j->bits && j->wp.mode == QL_WXA8_CODEBOOK) { /* one codebook per tensor, written as the fifth output */
        const void *w = src;
        void *copy = NULL;
        if (misaligned && !(w = copy = malloc((size_t)(n * k) * es)))
            result = ql_fail(QL_ERR_OUT_OF_MEMORY, "out of memory");
        if (copy) memcpy(copy, src, (size_t)(n * k) * es);
        if (result == QL_OK) result = ql_wxa8_fit_codebook(dt, w, n, k, k, &j->wp, j->codebook, NULL);
        free(copy);
        if (result != QL_OK) {
            ql_name_buf nb, tb;
            char why[256];
            snprintf(why, sizeof why, "%s", ql_last_error());
            result = ql_fail(result, "%s: tensor '%s': %s", ql_show(&nb, j->c->path), ql_show(&tb, t->name), why);
        }
        j->wp.codebook = j->codebook;
        if (result == QL_OK) result = ql_st_writer_write(j->w, i_codes + 4, 0, j->codebook, sizeof j->codebook);
    }
    if (result == QL_OK) result = quantize_blocks(j, t, dt, src, misaligned, rows, i_codes, i_scale);
    free_buffers(j);
    return result;
}

static ql_status quantize_blocks(job *j, const ql_st_tensor *t, ql_dtype dt, const unsigned char *src, int misaligned,
                                 int64_t rows, int64_t i_codes, int64_t i_scale)
{
    const int64_t n = t->shape[0], k = t->shape[1];
    const size_t es = ql_dtype_size(dt);
    const int64_t nblocks = (n + rows - 1) / rows;
    int64_t per_batch = (int64_t)(BATCH_BYTES / BLOCK_BYTES);
    if (per_batch < j->threads) per_batch = j->threads;
    for (int64_t b0 = 0; b0 < nblocks; b0 += per_batch) {
        int64_t b1 = b0 + per_batch < nblocks ? b0 + per_batch : nblocks;
#pragma omp parallel for num_threads(j->threads) schedule(dynamic, 1)
        for (int64_t b = b0; b < b1; b++) {
            if (atomic_load(&j->failed)) continue;
            int th = omp_get_thread_num();
            int64_t r0 = b * rows, nr = n - r0 < rows ? n - r0 : rows;
            const void *x = src + (size_t)r0 * (size_t)k * es;
            if (misaligned) {
                memcpy(j->xbuf[th], x, (size_t)nr * (size_t)k * es);
                x = j->xbuf[th];
            }
            int8_t *q = j->qbuf[th];
            float *s = j->sbuf[th];
            const int64_t rb = j->bits ? ql_wxa8_row_bytes(j->bits, k) : k, ng = j->bits ? k / j->wp.group : 0;
            ql_status st = j->bits ? ql_wxa8_quantize(dt, x, nr, k, k, &j->wp, (uint8_t *)q, rb, j->rbuf[th], s, NULL)
                                   : ql_quantize_weight_rows(dt, x, nr, k, k, j->group, q, k, s);
            if (st == QL_ERR_NONFINITE) {
                int64_t bad = 0;
                while (bad < nr && s[bad] == s[bad]) bad++;
                ql_name_buf nb, tb;
                st = ql_fail(QL_ERR_NONFINITE, "%s: tensor '%s': row %lld holds%s NaN or Inf; refusing to quantize it",
                             ql_show(&nb, j->c->path), ql_show(&tb, t->name), (long long)(r0 + bad),
                             j->group > 0 ? " (or rotates to)" : "");
            }
            if (st == QL_OK) st = ql_st_writer_write(j->w, i_codes, (uint64_t)r0 * (uint64_t)rb, q, (size_t)nr * (size_t)rb);
            if (st == QL_OK) st = ql_st_writer_write(j->w, i_scale, (uint64_t)r0 * 4u, s, (size_t)nr * 4u);
            if (st == QL_OK && j->bits) /* s_rel: the layer's fourth output */
                st = ql_st_writer_write(j->w, i_codes + 3, (uint64_t)r0 * (uint64_t)ng, j->rbuf[th], (size_t)(nr * ng));
            if (st != QL_OK) {
#pragma omp critical(ql_quantize_error)
                if (j->err == QL_OK) {
                    j->err = st;
                    snprintf(j->errmsg, sizeof j->errmsg, "%s", ql_last_error());
                    atomic_store(&j->failed, 1);
                }
            }
        }
        if (j->err != QL_OK) return ql_fail(j->err, "%s", j->errmsg);
        uint64_t r_end = (uint64_t)(b1 * rows < n ? b1 * rows : n), r_beg = (uint64_t)(b0 * rows);
        drop_pages(j->c, src + r_beg * (uint64_t)k * es, (r_end - r_beg) * (uint64_t)k * es);
        j->prog.bytes_done += (r_end - r_beg) * (uint64_t)k * es;
        if (report(j, t->name, 0)) return cancelled(j);
    }
    return QL_OK;
}

static int cmp_begin(const void *a, const void *b, void *ctx)
{
    const ql_st_tensor *t = ctx;
    uint64_t x = t[*(const int64_t *)a].begin, y = t[*(const int64_t *)b].begin;
    return x < y ? -1 : x > y;
}

/* What the target makes: bits 4 or 6 (0: int8), the ConvRot group (0:
 * none), the K a selected weight must be a multiple of, and the W4A8/W6A8
 * quantizer's parameters. */
typedef struct target_plan {
    int bits;
    int64_t group, sel_group;
    ql_wxa8_qparams wp;
} target_plan;

static ql_status plan_target(const char *fn, const ql_quantize_options *opt, target_plan *p)
{
    memset(p, 0, sizeof *p);
    const int bits = opt->target == QL_QUANT_W6A8 ? 6 : opt->target >= QL_QUANT_W4A8 ? 4 : 0;
    int64_t group = 0, sel_group = 1;
    ql_wxa8_qparams wp = {opt->target == QL_QUANT_W6A8 ? QL_WXA8_6BIT
                          : opt->target == QL_QUANT_W4A8_UNIFORM ? QL_WXA8_UNIFORM : QL_WXA8_CODEBOOK,
                          opt->group_size ? opt->group_size : 16, opt->group ? opt->group : 256, NULL, 1};
    if (bits) {
        if (!ql_group_valid(wp.convrot_group))
            return ql_fail(QL_ERR_UNSUPPORTED, "%s: ConvRot group %lld is not a power of 4 between 4 and 65536", fn,
                           (long long)wp.convrot_group);
        if (!ql_wxa8_group_ok(bits, wp.group) || wp.group > 65536)
            return ql_fail(QL_ERR_UNSUPPORTED,
                           bits == 6 ? "%s: group size %lld must be a multiple of 16 for w6a8"
                                     : "%s: group size %lld must be 4, 8, 16 or a multiple of 16",
                           fn, (long long)wp.group);
        /* K must be a multiple of 16 (32), the group and the ConvRot group */
        int64_t a = wp.group, b = wp.convrot_group;
        while (b) {
            int64_t t = a % b;
            a = b;
            b = t;
        }
        sel_group = wp.group / a * wp.convrot_group;
        if (sel_group % (bits == 6 ? 32 : 16)) sel_group *= 2;
        if (sel_group % (bits == 6 ? 32 : 16)) sel_group *= 2;
        group = wp.convrot_group;
    } else if (opt->target == QL_QUANT_INT8_CONVROT) {
        group = opt->group ? opt->group : 256;
        if (!ql_group_valid(group))
            return ql_fail(QL_ERR_UNSUPPORTED, "%s: ConvRot group %lld is not a power of 4 between 4 and 65536", fn,
                           (long long)group);
        sel_group = group;
    }
    p->bits = bits;
    p->group = group;
    p->sel_group = sel_group;
    p->wp = wp;
    return QL_OK;
}

/* --include / --exclude, compiled where given. */
typedef struct name_filters {
    regex_t rin, rex;
    int have_in, have_ex;
} name_filters;

static ql_status compile_filters(const char *fn, const ql_quantize_options *opt, name_filters *f)
{
    const char *res[2] = {opt->include, opt->exclude};
    regex_t *rs[2] = {&f->rin, &f->rex};
    f->have_in = f->have_ex = 0;
    for (int r = 0; r < 2; r++) {
        if (!res[r]) continue;
        int e = regcomp(rs[r], res[r], REG_EXTENDED | REG_NOSUB);
        if (e != 0) {
            char eb[160];
            regerror(e, rs[r], eb, sizeof eb);
            if (f->have_in) regfree(&f->rin);
            f->have_in = 0;
            ql_name_buf nb;
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s regex '%s': %s", fn, r ? "exclude" : "include",
                           ql_show(&nb, res[r]), eb);
        }
        if (r) f->have_ex = 1;
        else f->have_in = 1;
    }
    return QL_OK;
}

static void free_filters(name_filters *f)
{
    if (f->have_in) regfree(&f->rin);
    if (f->have_ex) regfree(&f->rex);
}

/* The output: each input tensor maps to a copy, or to the three to five
 * tensors of a quantized layer. outs and specs hold 5 per input tensor. */
typedef struct out_plan {
    out_tensor *outs;
    ql_tensor_spec *specs;
    int64_t n_out, layers_total;
    uint64_t bytes_total;
} out_plan;

/* Whether input tensor `ti` is quantized: the default selection (or the
 * filters), and none of the layer's tensor names taken already. *names
 * gets the layer's scale, comfy_quant, s_rel and codebook names (those
 * the target writes; the others NULL). */
static ql_status select_tensor(const char *fn, const ql_checkpoint *c, const ql_tensor_info *ti, const target_plan *p,
                               const name_filters *f, int *selected, char *names[4])
{
    const int bits = p->bits;
    int sel = ql_quantize_selects(ti, p->sel_group, !f->have_in);
    if (sel && f->have_in) sel = regexec(&f->rin, ti->name, 0, NULL, 0) == 0;
    if (sel && f->have_ex) sel = regexec(&f->rex, ti->name, 0, NULL, 0) != 0;
    size_t plen = strlen(ti->name) - 7;
    char *sname = NULL, *cname = NULL, *rname = NULL, *bname = NULL;
    if (sel) {
        sname = malloc(plen + 32);
        cname = malloc(plen + 32);
        rname = malloc(plen + 32);
        bname = malloc(plen + 32);
        if (!sname || !cname || !rname || !bname) {
            free(sname), free(cname), free(rname), free(bname);
            return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        }
        snprintf(sname, plen + 32, "%.*s.%s", (int)plen, ti->name, bits ? "weight_s_channel" : "weight_scale");
        snprintf(cname, plen + 32, "%.*s.comfy_quant", (int)plen, ti->name);
        snprintf(rname, plen + 32, "%.*s.weight_s_rel", (int)plen, ti->name);
        snprintf(bname, plen + 32, "%.*s.weight_codebook", (int)plen, ti->name);
        /* A layer that already has any of the names is left alone. */
        if (ql_checkpoint_find(c, sname) >= 0 || ql_checkpoint_find(c, cname) >= 0 ||
            (bits && (ql_checkpoint_find(c, rname) >= 0 || ql_checkpoint_find(c, bname) >= 0))) {
            free(sname), free(cname), free(rname), free(bname);
            sel = 0;
        }
        if (sel && !bits) {
            free(rname), free(bname);
            rname = bname = NULL;
        }
        if (sel && bits && p->wp.mode != QL_WXA8_CODEBOOK) {
            free(bname);
            bname = NULL;
        }
    }
    *selected = sel;
    names[0] = sel ? sname : NULL, names[1] = sel ? cname : NULL, names[2] = sel ? rname : NULL;
    names[3] = sel ? bname : NULL;
    return QL_OK;
}

static ql_status plan_outputs(const char *fn, const ql_checkpoint *c, const target_plan *p, const name_filters *f,
                              size_t cq_len, out_plan *op)
{
    const int bits = p->bits;
    for (int64_t i = 0; i < c->n_tensors; i++) {
        ql_tensor_info ti;
        ql_checkpoint_tensor(c, i, &ti);
        op->bytes_total += ti.bytes;
        int sel = 0;
        char *names[4] = {NULL, NULL, NULL, NULL};
        QL_TRY(select_tensor(fn, c, &ti, p, f, &sel, names));
        out_tensor *o = &op->outs[op->n_out];
        ql_tensor_spec *sp = &op->specs[op->n_out];
        if (!sel) {
            o[0] = (out_tensor){OUT_COPY, i, NULL, {0, 0}};
            sp[0] = (ql_tensor_spec){ti.name, ti.dtype, ti.ndim, ti.shape};
            op->n_out++;
            continue;
        }
        op->layers_total++;
        char *sname = names[0], *cname = names[1], *rname = names[2], *bname = names[3];
        const int64_t rb = bits ? ql_wxa8_row_bytes(bits, ti.shape[1]) : ti.shape[1];
        o[0] = (out_tensor){OUT_CODES, i, NULL, {ti.shape[0], rb}};
        o[1] = (out_tensor){OUT_SCALE, i, sname, {ti.shape[0], 1}};
        o[2] = (out_tensor){OUT_CONFIG, i, cname, {(int64_t)cq_len, 0}};
        sp[0] = (ql_tensor_spec){ti.name, QL_ST_I8, 2, o[0].shape};
        sp[1] = (ql_tensor_spec){sname, QL_ST_F32, bits ? 1 : 2, o[1].shape};
        sp[2] = (ql_tensor_spec){cname, QL_ST_U8, 1, o[2].shape};
        op->n_out += 3;
        if (bits) {
            o[3] = (out_tensor){OUT_SREL, i, rname, {ti.shape[0], ti.shape[1] / p->wp.group}};
            sp[3] = (ql_tensor_spec){rname, QL_ST_F8_E4M3, 2, o[3].shape};
            op->n_out++;
            if (bname) {
                o[4] = (out_tensor){OUT_CODEBOOK, i, bname, {16, 0}};
                sp[4] = (ql_tensor_spec){bname, QL_ST_F32, 1, o[4].shape};
                op->n_out++;
            }
        }
    }
    return QL_OK;
}

/* The job's settings and per-thread buffer slots. */
static ql_status job_init(const char *fn, job *j, ql_checkpoint *c, ql_st_writer *w, const ql_quantize_options *opt,
                          const target_plan *p, const out_plan *op)
{
    j->c = c;
    j->w = w;
    j->opt = opt;
    j->group = p->group;
    j->bits = p->bits;
    j->wp = p->wp;
    j->threads = opt->threads > 0 ? opt->threads : omp_get_max_threads();
    if (j->threads < 1) j->threads = 1;
    j->qbuf = calloc((size_t)j->threads, sizeof *j->qbuf);
    j->sbuf = calloc((size_t)j->threads, sizeof *j->sbuf);
    j->xbuf = calloc((size_t)j->threads, sizeof *j->xbuf);
    j->rbuf = calloc((size_t)j->threads, sizeof *j->rbuf);
    if (!j->qbuf || !j->sbuf || !j->xbuf || !j->rbuf) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    j->prog.layers_total = op->layers_total;
    j->prog.bytes_total = op->bytes_total;
    j->t0 = now_s();
    j->last_report = j->t0 - 1.0; /* the first piece of work is reported */
    return QL_OK;
}

/* Every input tensor copied or quantized, in input order (sequential reads
 * of the mapping); `order` has room for every input tensor. */
static ql_status write_outputs(const char *fn, job *j, const out_plan *op, int64_t *order, const char *cq_json,
                               size_t cq_len, ql_quantize_result *result)
{
    ql_checkpoint *c = j->c;
    int64_t *where = calloc((size_t)(c->n_tensors + 1), sizeof *where); /* first output of each input */
    if (!where) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int64_t o = op->n_out - 1; o >= 0; o--) where[op->outs[o].src] = o;
    for (int64_t i = 0; i < c->n_tensors; i++) order[i] = i;
    qsort_r(order, (size_t)c->n_tensors, sizeof *order, cmp_begin, c->tensors);
    ql_status st = QL_OK;
    for (int64_t ii = 0; ii < c->n_tensors && st == QL_OK; ii++) {
        int64_t i = order[ii], o = where[i];
        const ql_st_tensor *t = &c->tensors[i];
        if (op->outs[o].kind == OUT_COPY) {
            st = copy_tensor(j, o, t);
            if (result) result->tensors_copied++;
            continue;
        }
        st = quantize_tensor(j, t, o, o + 1);
        if (st == QL_OK) st = ql_st_writer_write(j->w, o + 2, 0, cq_json, cq_len);
        if (st == QL_OK) {
            j->prog.layers_done++;
            if (report(j, t->name, 0)) st = cancelled(j);
        }
    }
    free(where);
    return st;
}

ql_status ql_checkpoint_quantize(const char *in_path, const char *out_path, const ql_quantize_options *opt,
                                 ql_quantize_result *result)
{
    const char *fn = "ql_checkpoint_quantize";
    QL_CHECK_PTR(fn, in_path);
    QL_CHECK_PTR(fn, out_path);
    QL_CHECK_PTR(fn, opt);
    if (result) memset(result, 0, sizeof *result);
    if (opt->target < QL_QUANT_INT8 || opt->target > QL_QUANT_W6A8)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown target %d", fn, (int)opt->target);
    target_plan p;
    QL_TRY(plan_target(fn, opt, &p));
    name_filters f;
    QL_TRY(compile_filters(fn, opt, &f));

    ql_checkpoint *c = NULL;
    ql_st_writer *w = NULL;
    out_plan op;
    memset(&op, 0, sizeof op);
    int64_t *order = NULL;
    job j;
    memset(&j, 0, sizeof j);
    char cq_json[160];
    size_t cq_len = p.bits ? ql_comfy_quant_json_wxa8(opt->target, p.wp.group, p.wp.convrot_group, cq_json, sizeof cq_json)
                           : ql_comfy_quant_json(opt->target, p.group, cq_json, sizeof cq_json);
    ql_status st = ql_checkpoint_open(in_path, &c);
    if (st != QL_OK) goto done;

    op.outs = calloc((size_t)(5 * c->n_tensors + 1), sizeof *op.outs);
    op.specs = calloc((size_t)(5 * c->n_tensors + 1), sizeof *op.specs);
    order = calloc((size_t)(c->n_tensors + 1), sizeof *order);
    if (!op.outs || !op.specs || !order) {
        st = ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        goto done;
    }
    if ((st = plan_outputs(fn, c, &p, &f, cq_len, &op)) != QL_OK) goto done;
    st = ql_st_writer_open(out_path, op.specs, op.n_out, (const char *const *)c->meta_keys,
                           (const char *const *)c->meta_values, c->n_meta, in_path, &w);
    if (st != QL_OK) goto done;
    if ((st = job_init(fn, &j, c, w, opt, &p, &op)) != QL_OK) goto done;
    if ((st = write_outputs(fn, &j, &op, order, cq_json, cq_len, result)) != QL_OK) goto done;
    if (report(&j, NULL, 1)) {
        st = cancelled(&j);
        goto done;
    }
    st = ql_st_writer_finish(w);
    w = NULL;
    if (st == QL_OK && result) {
        result->layers_quantized = j.prog.layers_done;
        result->bytes_in = op.bytes_total;
        result->seconds = now_s() - j.t0;
        struct stat sb;
        if (stat(out_path, &sb) == 0) result->bytes_out = (uint64_t)sb.st_size;
    }
done:
    if (w) ql_st_writer_abort(w);
    free(j.qbuf);
    free(j.sbuf);
    free(j.xbuf);
    free(j.rbuf);
    if (op.outs)
        for (int64_t o = 0; o < op.n_out; o++) free(op.outs[o].name);
    free(op.outs);
    free(op.specs);
    free(order);
    ql_checkpoint_close(c);
    free_filters(&f);
    return st;
}
