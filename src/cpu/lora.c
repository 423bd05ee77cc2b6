/* Unmerged LoRA: packing at load, the down product after the prologue, the
 * up product in the tile epilogue (design in lora.h). */
#include "cpu/lora.h"
#include "cpu/registry.h"

#include <math.h>
#include <stdlib.h>

typedef struct lora_item {
    int id;
    int64_t rank;
    double scale;
    int8_t *dq;  /* [rank, k] down codes (rotated), row scale 2^e_r */
    double *upd; /* [n, rank] up·2^e_r·scale */
} lora_item;

struct ql_lora_set {
    int64_t n, k, group;
    const ql_s8_kernel *kern;
    lora_item *items;
    int count, next_id;
    /* the active LoRAs (scale != 0), packed */
    int64_t rtot, rpad;
    double e2; /* 2^E: U holds up / 2^E */
    ql_packed_b d, u;
    int8_t *dq, *uq; /* kern NULL (another backend packs them): D [rtot, k] and U [n, rtot], row-major */
    float *su;
    uint8_t perm[64]; /* in-block order of the kernel's A panels (ql_a_element) */
};

static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

double ql_lora_scale(double strength, double alpha, int has_alpha, int64_t rank)
{
    if (rank <= 0) return 0.0;
    return strength * ((has_alpha ? alpha : (double)rank) / (double)rank);
}

void ql_lora_set_free(ql_lora_set *s)
{
    if (!s) return;
    for (int i = 0; i < s->count; i++) {
        free(s->items[i].dq);
        free(s->items[i].upd);
    }
    free(s->items);
    ql_packed_b_free(&s->d);
    ql_packed_b_free(&s->u);
    free(s->dq);
    free(s->uq);
    ql_aligned_free(s->su);
    free(s);
}

int ql_lora_set_count(const ql_lora_set *s) { return s ? s->count : 0; }
int64_t ql_lora_set_rank(const ql_lora_set *s)
{
    int64_t r = 0;
    for (int i = 0; s && i < s->count; i++) r += s->items[i].rank;
    return r;
}
bool ql_lora_set_active(const ql_lora_set *s) { return s && s->rtot > 0; }

int64_t ql_lora_set_codes(const ql_lora_set *s, const int8_t **dq, const int8_t **uq, const float **su, double *e2)
{
    if (!s || !s->dq) return 0;
    *dq = s->dq, *uq = s->uq, *su = s->su, *e2 = s->e2;
    return s->rtot;
}

/* One row of U: v (rt values) -> int8 codes with su = max|v|/127 (0 if that
 * underflows: the row is below 2^-149 of the largest up value). */
static float quantize_up_row(const double *v, int64_t rt, int8_t *q)
{
    double a = 0.0;
    for (int64_t j = 0; j < rt; j++) a = fmax(a, fabs(v[j]));
    const float su = (float)(a / 127.0);
    for (int64_t j = 0; j < rt; j++) {
        double c = su > 0.0f ? nearbyint(v[j] / (double)su) : 0.0;
        q[j] = (int8_t)(c > 127.0 ? 127.0 : c < -127.0 ? -127.0 : c);
    }
    return su;
}

/* Pack the active LoRAs: D = the concatenated down codes, U = up / 2^E (E:
 * exponent of the largest |up|, so U's scales are far from fp32's limits)
 * quantized per output row. */
static ql_status rebuild(ql_lora_set *s)
{
    ql_packed_b_free(&s->d);
    ql_packed_b_free(&s->u);
    free(s->dq);
    free(s->uq);
    s->dq = s->uq = NULL;
    ql_aligned_free(s->su);
    s->su = NULL;
    s->rtot = 0;
    for (int i = 0; i < s->count; i++)
        if (s->items[i].scale != 0.0) s->rtot += s->items[i].rank;
    s->rpad = s->kern ? ql_kpad(s->kern, s->rtot) : s->rtot;
    if (s->rtot == 0) return QL_OK;
    const int64_t n = s->n, k = s->k, rt = s->rtot;
    int8_t *dq = malloc((size_t)(rt * k) + 1), *uq = malloc((size_t)(n * rt) + 1);
    double *row = malloc((size_t)rt * sizeof(double));
    s->su = ql_aligned_alloc(al64((size_t)n * sizeof(float)));
    ql_status st = QL_OK;
    if (!dq || !uq || !row || !s->su) {
        st = ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_linear_add_lora: cannot allocate the packed LoRA");
        goto done;
    }
    double top = 0.0;
    for (int i = 0, r0 = 0; i < s->count; i++) {
        const lora_item *it = &s->items[i];
        if (it->scale == 0.0) continue;
        memcpy(dq + (int64_t)r0 * k, it->dq, (size_t)(it->rank * k));
        for (int64_t j = 0; j < n * it->rank; j++) top = fmax(top, fabs(it->upd[j]));
        r0 += (int)it->rank;
    }
    int ex = 0;
    if (top > 0.0) frexp(top, &ex);
    s->e2 = ldexp(1.0, ex);
    for (int64_t c = 0; c < n; c++) {
        int64_t j = 0;
        for (int i = 0; i < s->count; i++) {
            const lora_item *it = &s->items[i];
            if (it->scale == 0.0) continue;
            for (int64_t r = 0; r < it->rank; r++) row[j++] = ldexp(it->upd[c * it->rank + r], -ex);
        }
        s->su[c] = quantize_up_row(row, rt, uq + c * rt);
    }
    if (!s->kern) { /* kept as they are: the caller's backend lays them out */
        s->dq = dq, s->uq = uq;
        dq = uq = NULL;
        goto done;
    }
    st = ql_pack_b_s8(s->kern, dq, rt, k, k, &s->d);
    if (st == QL_OK) st = ql_pack_b_s8(s->kern, uq, n, rt, rt, &s->u);
done:
    free(dq);
    free(uq);
    free(row);
    if (st != QL_OK) {
        ql_packed_b_free(&s->d);
        ql_packed_b_free(&s->u);
        s->rtot = 0;
    }
    return st;
}

/* First non-finite element of a [rows, cols] float matrix, or -1. */
static int64_t first_nonfinite(ql_dtype dt, const void *p, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            if (!isfinite(ql_load_f(dt, p, r * ld + c))) return r * cols + c;
    return -1;
}

/* down [R, K] -> rotated fp32 -> int8 codes with power-of-two row scales
 * 2^e_r (smallest e with 127·2^e >= max|row|: codes exact multiples). */
static ql_status make_item(const ql_lora_set *s, const ql_lora_desc *d, lora_item *it)
{
    const char *fn = "ql_linear_add_lora";
    const int64_t rk = d->rank, k = s->k, n = s->n;
    float *rowf = ql_aligned_alloc(al64((size_t)(k > 0 ? k : 1) * sizeof(float)));
    int *ex = malloc((size_t)rk * sizeof(int));
    it->dq = malloc((size_t)(rk * k) + 1);
    it->upd = malloc((size_t)(n * rk) * sizeof(double) + 1);
    if (!rowf || !ex || !it->dq || !it->upd) {
        ql_aligned_free(rowf);
        free(ex);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate the LoRA (rank %lld)", fn, (long long)rk);
    }
    for (int64_t r = 0; r < rk; r++) {
        const void *src = ql_row_cptr(d->down_dtype, d->down, r, d->ld_down);
        for (int64_t j = 0; j < k; j++) rowf[j] = ql_load_f(d->down_dtype, src, j);
        if (s->group > 0) ql_rotate(QL_F32, rowf, 1, k, k, s->group);
        float a = 0.0f;
        for (int64_t j = 0; j < k; j++) a = fmaxf(a, fabsf(rowf[j]));
        int e = 0;
        if (a > 0.0f) {
            double f = frexp((double)a / 127.0, &e); /* a/127 = f·2^e, f in [0.5, 1) */
            if (f == 0.5) e--;
        }
        ex[r] = e;
        for (int64_t j = 0; j < k; j++) it->dq[r * k + j] = (int8_t)nearbyint(ldexp((double)rowf[j], -e));
    }
    for (int64_t c = 0; c < n; c++) {
        const void *src = ql_row_cptr(d->up_dtype, d->up, c, d->ld_up);
        for (int64_t r = 0; r < rk; r++)
            it->upd[c * rk + r] = ldexp((double)ql_load_f(d->up_dtype, src, r), ex[r]) * d->scale;
    }
    ql_aligned_free(rowf);
    free(ex);
    it->rank = rk;
    it->scale = d->scale;
    return QL_OK;
}

ql_status ql_lora_set_add(ql_lora_set **set, const ql_s8_kernel *kern, int64_t n, int64_t k, int64_t group,
                          const ql_lora_desc *d, int *id)
{
    const char *fn = "ql_linear_add_lora";
    QL_CHECK_PTR(fn, d);
    if (d->rank <= 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: rank %lld must be at least 1", fn, (long long)d->rank);
    QL_TRY(ql_check_float_dtype(fn, "down", d->down_dtype));
    QL_TRY(ql_check_float_dtype(fn, "up", d->up_dtype));
    QL_TRY(ql_check_matrix(fn, "down", d->down, d->rank, k, d->ld_down));
    QL_TRY(ql_check_matrix(fn, "up", d->up, n, d->rank, d->ld_up));
    if (!isfinite(d->scale)) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: scale %g is not finite", fn, d->scale);
    int64_t bad = first_nonfinite(d->down_dtype, d->down, d->rank, k, d->ld_down);
    if (bad >= 0)
        return ql_fail(QL_ERR_NONFINITE, "%s: down[%lld, %lld] is NaN or Inf", fn, (long long)(bad / k),
                       (long long)(bad % k));
    bad = first_nonfinite(d->up_dtype, d->up, n, d->rank, d->ld_up);
    if (bad >= 0)
        return ql_fail(QL_ERR_NONFINITE, "%s: up[%lld, %lld] is NaN or Inf", fn, (long long)(bad / d->rank),
                       (long long)(bad % d->rank));
    ql_lora_set *s = *set;
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        s->n = n;
        s->k = k;
        s->group = group;
        s->kern = kern;
        s->next_id = 1;
        for (int q = 0; kern && q < kern->kb; q++) s->perm[q] = (uint8_t)ql_a_element(kern->kb, q);
        *set = s;
    }
    lora_item it = {0};
    ql_status st = make_item(s, d, &it);
    lora_item *items = st == QL_OK ? realloc(s->items, (size_t)(s->count + 1) * sizeof *items) : NULL;
    if (!items) {
        free(it.dq);
        free(it.upd);
        return st != QL_OK ? st : ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    s->items = items;
    it.id = s->next_id++;
    s->items[s->count++] = it;
    if ((st = rebuild(s)) != QL_OK) {
        ql_lora_set_remove(s, it.id);
        return st;
    }
    if (id) *id = it.id;
    return QL_OK;
}

ql_status ql_lora_set_remove(ql_lora_set *s, int id)
{
    for (int i = 0; s && i < s->count; i++) {
        if (s->items[i].id != id) continue;
        free(s->items[i].dq);
        free(s->items[i].upd);
        memmove(&s->items[i], &s->items[i + 1], (size_t)(s->count - i - 1) * sizeof *s->items);
        s->count--;
        return rebuild(s);
    }
    return ql_fail(QL_ERR_INVALID_ARGUMENT, "ql_linear_remove_lora: no LoRA with id %d on this linear", id);
}

/* ---- per call */

/* (int16 kernels, aes = 2, take T panels of int16 codes, as they take A) */
static size_t t_panel_bytes(const ql_lora_set *s, const ql_s8_kernel *kern)
{
    return (size_t)(s->rpad * kern->mr) * (size_t)(kern->aes ? kern->aes : 1);
}

/* per thread: the D × A tiles, then one row of t (int32) and its codes */
static size_t cbuf_bytes(const ql_lora_set *s, const ql_s8_kernel *kern)
{
    return al64((size_t)(s->d.panels * kern->mr * kern->nr) * 4 + (size_t)s->rpad * 5);
}

size_t ql_lora_ws_bytes(const ql_lora_set *s, const ql_s8_kernel *kern, int64_t chunk, int threads)
{
    const size_t panels = (size_t)ql_panels(chunk, kern->mr);
    return al64(panels * t_panel_bytes(s, kern)) + 2 * al64((size_t)chunk * 4) +
           (size_t)threads * cbuf_bytes(s, kern);
}

void ql_lora_run_init(ql_lora_run *r, const ql_lora_set *s, const ql_s8_kernel *kern, void *ws, int64_t chunk,
                      int threads)
{
    char *p = ws;
    const size_t panels = (size_t)ql_panels(chunk, kern->mr);
    memset(r, 0, sizeof *r);
    r->set = s;
    r->kern = kern;
    r->t_packed = (int8_t *)p;
    p += al64(panels * t_panel_bytes(s, kern));
    r->st = (float *)p;
    p += al64((size_t)chunk * 4);
    r->trowsum = (int32_t *)p;
    p += al64((size_t)chunk * 4);
    r->cbuf = (int32_t *)p;
    r->cbuf_stride = cbuf_bytes(s, kern) / 4;
    (void)threads;
}

void ql_lora_down_panel(const ql_lora_run *r, int64_t p, int64_t mc, int64_t k, const int8_t *packed, const float *sx,
                        const int32_t *rowsum, int th)
{
    const ql_lora_set *s = r->set;
    const ql_s8_kernel *kern = r->kern;
    const int mr = kern->mr, nr = kern->nr, kb = kern->kb;
    const int64_t rt = s->rtot, rpad = s->rpad;
    const int aes = kern->aes ? kern->aes : 1;
    const int8_t *a = packed + (size_t)(p * ql_kpad(kern, k) * mr) * (size_t)aes;
    int32_t *cb = r->cbuf + (size_t)th * r->cbuf_stride;
    ql_s8_begin(kern); /* called outside the GEMM's run of tiles */
    for (int64_t jp = 0; jp < s->d.panels; jp++)
        kern->tile(s->d.k4, a, s->d.data + (size_t)(jp * s->d.k4 * nr * 4), cb + jp * mr * nr, 0);
    int8_t *tp = r->t_packed + (size_t)p * t_panel_bytes(s, kern);
    int32_t *scratch = (int32_t *)(cb + s->d.panels * mr * nr); /* rpad values of one row and their codes */
    const ql_lora_t_row_fn t_row = ql_cpu_kernels_for(kern->isa)->lora_t_row; /* the kernel's own T layout */
    for (int i = 0; i < mr; i++) {
        const int64_t row = p * mr + i;
        if (row >= mc) { /* padding rows of the last panel */
            for (int64_t b = 0; b < rpad / kb; b++) memset(tp + (b * mr + i) * kb * aes, 0, (size_t)(kb * aes));
            continue;
        }
        const int32_t corr = kern->b_offset128 ? 128 * rowsum[row] : 0;
        int32_t amax;
        amax = t_row(cb, mr, nr, kb, aes, s->perm, i, rt, rpad, corr, tp, scratch, &r->trowsum[row]);
        /* σ = amax/127 (t_q = rne(t/σ) in [-127, 127]); st = s_x·σ·2^E */
        r->st[row] = amax ? (float)((double)sx[row] * ((double)amax / 127.0) * s->e2) : 0.0f;
    }
}


void ql_lora_epilogue(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    const ql_lora_run *r = arg;
    const ql_lora_set *s = r->set;
    const ql_s8_kernel *kern = r->kern;
    _Alignas(64) int32_t c2[QL_S8_TILE_MAX];
    const int64_t ip = m0 / kern->mr, jp = n0 / kern->nr;
    kern->tile(s->u.k4, r->t_packed + (size_t)ip * t_panel_bytes(s, kern), s->u.data + (size_t)(jp * s->u.k4 * nr * 4),
               c2, 0);
    const ql_lora_tile t = {c2, r->trowsum, r->st, s->su};
    ql_w8a8_epi e = r->base;
    e.lora = &t;
    r->inner(&e, c, nr, m0, n0, mr_eff, nr_eff);
}
