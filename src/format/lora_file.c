/* LoRA files: which module of a LoRA file targets which layer of a base
 * checkpoint (kohya/ComfyUI and PEFT/diffusers names), with every tensor
 * checked before anything is computed. */
#include "format.h"

#include <math.h>
#include <stdlib.h>

static const char *const dot_prefixes[] = {"model.diffusion_model.", "diffusion_model.", "transformer.", "unet."};
static const char *const kohya_prefixes[] = {"model_diffusion_model_", "diffusion_model_", "transformer_", "unet_"};
#define NPREFIX 4
#define KOHYA_HEAD "lora_unet_"

struct ql_lora_plan {
    ql_lora_module *mods;
    int64_t n_mods;
    char **unmatched;
    int64_t n_unmatched;
    char **strings; /* owned strings */
    int64_t n_strings;
};

typedef struct base_layer {
    const char *prefix;
    int64_t n, k;
    int quantized;
} base_layer;

typedef struct key_entry {
    char *key;
    int64_t layer;
} key_entry;

typedef struct lora_piece {
    const char *module; /* points into name copy */
    size_t module_len;
    int role; /* 0 down, 1 up, 2 alpha */
    int kohya; /* lora_down/lora_up (1) or lora_A/lora_B (0); alpha: -1 */
    int64_t tensor;
} lora_piece;

static int cmp_key(const void *a, const void *b)
{
    const key_entry *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->layer > y->layer) - (x->layer < y->layer);
}

static int cmp_piece(const void *a, const void *b)
{
    const lora_piece *x = a, *y = b;
    size_t n = x->module_len < y->module_len ? x->module_len : y->module_len;
    int c = memcmp(x->module, y->module, n);
    if (c) return c;
    if (x->module_len != y->module_len) return x->module_len < y->module_len ? -1 : 1;
    return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static ql_status keep(ql_lora_plan *p, char *s, const char **out)
{
    if (!s) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_lora_plan_create: out of memory");
    char **ns = realloc(p->strings, (size_t)(p->n_strings + 1) * sizeof *ns);
    if (!ns) {
        free(s);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_lora_plan_create: out of memory");
    }
    p->strings = ns;
    p->strings[p->n_strings++] = s;
    *out = s;
    return QL_OK;
}

void ql_lora_plan_destroy(ql_lora_plan *p)
{
    if (!p) return;
    for (int64_t i = 0; i < p->n_strings; i++) free(p->strings[i]);
    free(p->strings);
    free(p->mods);
    free(p->unmatched);
    free(p);
}

int64_t ql_lora_plan_module_count(const ql_lora_plan *p) { return p ? p->n_mods : 0; }
const ql_lora_module *ql_lora_plan_module(const ql_lora_plan *p, int64_t i)
{
    return p && i >= 0 && i < p->n_mods ? &p->mods[i] : NULL;
}
int64_t ql_lora_plan_unmatched_count(const ql_lora_plan *p) { return p ? p->n_unmatched : 0; }
const char *ql_lora_plan_unmatched(const ql_lora_plan *p, int64_t i)
{
    return p && i >= 0 && i < p->n_unmatched ? p->unmatched[i] : NULL;
}

/* The base's linear layers: its int8 layers and its 2-D float `P.weight`s. */
static ql_status base_layers(const ql_checkpoint *c, base_layer **out, int64_t *count)
{
    base_layer *b = calloc((size_t)(c->n_layers + c->n_tensors + 1), sizeof *b);
    if (!b) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_lora_plan_create: out of memory");
    int64_t n = 0;
    for (int64_t i = 0; i < c->n_layers; i++) {
        const ql_layer_info *li = &c->layers[i].info;
        if (!li->supported) continue;
        b[n++] = (base_layer){li->prefix, li->n, li->k, 1};
    }
    for (int64_t i = 0; i < c->n_tensors; i++) {
        const ql_st_tensor *t = &c->tensors[i];
        size_t len = strlen(t->name);
        if (len <= 7 || strcmp(t->name + len - 7, ".weight") || t->ndim != 2) continue;
        if (t->dtype != QL_ST_F32 && t->dtype != QL_ST_F16 && t->dtype != QL_ST_BF16) continue;
        b[n++] = (base_layer){t->name, t->shape[0], t->shape[1], 0}; /* prefix = name up to ".weight" (len - 7) */
    }
    *out = b;
    *count = n;
    return QL_OK;
}

static size_t layer_prefix_len(const base_layer *l) { return l->quantized ? strlen(l->prefix) : strlen(l->prefix) - 7; }

/* name, and name without each of the prefixes it starts with */
static int candidates(const char *name, size_t len, const char *const *prefixes, const char **out, size_t *lens)
{
    int n = 0;
    out[n] = name;
    lens[n++] = len;
    for (int i = 0; i < NPREFIX; i++) {
        size_t pl = strlen(prefixes[i]);
        if (len > pl && !strncmp(name, prefixes[i], pl)) {
            out[n] = name + pl;
            lens[n++] = len - pl;
        }
    }
    return n;
}

static ql_status build_keys(const base_layer *b, int64_t nb, int kohya, key_entry **out, int64_t *count)
{
    key_entry *k = calloc((size_t)(nb * (NPREFIX + 1) + 1), sizeof *k);
    if (!k) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_lora_plan_create: out of memory");
    int64_t n = 0;
    for (int64_t i = 0; i < nb; i++) {
        const char *c[NPREFIX + 1];
        size_t cl[NPREFIX + 1];
        int nc = candidates(b[i].prefix, layer_prefix_len(&b[i]), dot_prefixes, c, cl);
        for (int j = 0; j < nc; j++) {
            char *s = dup_n(c[j], cl[j]);
            if (!s) {
                for (int64_t t = 0; t < n; t++) free(k[t].key);
                free(k);
                return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_lora_plan_create: out of memory");
            }
            for (char *p = s; kohya && *p; p++)
                if (*p == '.') *p = '_';
            k[n++] = (key_entry){s, i};
        }
    }
    qsort(k, (size_t)n, sizeof *k, cmp_key);
    *out = k;
    *count = n;
    return QL_OK;
}

static void free_keys(key_entry *k, int64_t n)
{
    for (int64_t i = 0; k && i < n; i++) free(k[i].key);
    free(k);
}

/* Layers whose key equals s[0..len): appended to hits (distinct). */
static void lookup(const key_entry *k, int64_t nk, const char *s, size_t len, int64_t *hits, int *nh)
{
    int64_t lo = 0, hi = nk;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        int c = strncmp(k[mid].key, s, len);
        if (c == 0 && k[mid].key[len] != 0) c = 1;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    for (int64_t i = lo; i < nk && !strncmp(k[i].key, s, len) && k[i].key[len] == 0; i++) {
        int seen = 0;
        for (int j = 0; j < *nh; j++) seen |= hits[j] == k[i].layer;
        if (!seen && *nh < 8) hits[(*nh)++] = k[i].layer;
    }
}

static int is_float_st(ql_st_dtype d) { return d == QL_ST_F32 || d == QL_ST_F16 || d == QL_ST_BF16; }

static double load_scalar(const ql_checkpoint *c, const ql_st_tensor *t)
{
    const unsigned char *p = ql_st_tensor_data(c, t);
    if (t->dtype == QL_ST_F64) {
        double v;
        memcpy(&v, p, 8);
        return v;
    }
    if (t->dtype == QL_ST_F32) {
        float v;
        memcpy(&v, p, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return t->dtype == QL_ST_F16 ? ql_fp16_to_fp32(h) : ql_bf16_to_fp32(h);
}

/* Check one matched module and fill m. */
static ql_status check_module(const ql_checkpoint *lc, const char *mod, const base_layer *l, int64_t down, int64_t up,
                              int64_t alpha, ql_lora_module *m)
{
    ql_name_buf a, b, ln;
    const char *lname = ql_show(&ln, l->prefix);
    char lbuf[128];
    snprintf(lbuf, sizeof lbuf, "%.*s", (int)(layer_prefix_len(l) < 100 ? layer_prefix_len(l) : 100), lname);
    if (down < 0 || up < 0)
        return ql_fail_file(lc, QL_ERR_FORMAT, "module '%s' (for layer '%s') has no %s tensor", ql_show(&a, mod), lbuf,
                            down < 0 ? "down (lora_down / lora_A)" : "up (lora_up / lora_B)");
    const ql_st_tensor *td = &lc->tensors[down], *tu = &lc->tensors[up];
    const ql_st_tensor *ts[2] = {td, tu};
    for (int i = 0; i < 2; i++) {
        if (!is_float_st(ts[i]->dtype))
            return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s': dtype %s; a LoRA matrix must be F32, F16 or BF16",
                                ql_show(&a, ts[i]->name), ql_st_dtype_name(ts[i]->dtype));
        if (ts[i]->ndim != 2)
            return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s': %d dimensions; a linear LoRA matrix has 2",
                                ql_show(&a, ts[i]->name), ts[i]->ndim);
    }
    const int64_t rank = td->shape[0];
    if (tu->shape[1] != rank)
        return ql_fail_file(lc, QL_ERR_FORMAT, "tensors '%s' [%lld, %lld] and '%s' [%lld, %lld]: ranks differ (%lld vs %lld)",
                            ql_show(&a, td->name), (long long)td->shape[0], (long long)td->shape[1], ql_show(&b, tu->name),
                            (long long)tu->shape[0], (long long)tu->shape[1], (long long)rank, (long long)tu->shape[1]);
    if (rank <= 0)
        return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s': rank 0", ql_show(&a, td->name));
    if (td->shape[1] != l->k)
        return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s' has K = %lld but layer '%s' has K = %lld", ql_show(&a, td->name),
                            (long long)td->shape[1], lbuf, (long long)l->k);
    if (tu->shape[0] != l->n)
        return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s' has N = %lld but layer '%s' has N = %lld", ql_show(&a, tu->name),
                            (long long)tu->shape[0], lbuf, (long long)l->n);
    m->has_alpha = 0;
    m->alpha_value = (double)rank;
    if (alpha >= 0) {
        const ql_st_tensor *t = &lc->tensors[alpha];
        if (t->numel != 1 || t->ndim > 1)
            return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s': alpha must be a scalar, not %d-D with %lld elements",
                                ql_show(&a, t->name), t->ndim, (long long)t->numel);
        if (!is_float_st(t->dtype) && t->dtype != QL_ST_F64)
            return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s': alpha has dtype %s (F32, F16, BF16 or F64 expected)",
                                ql_show(&a, t->name), ql_st_dtype_name(t->dtype));
        double v = load_scalar(lc, t);
        if (!isfinite(v))
            return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s': alpha is %g, not finite", ql_show(&a, t->name), v);
        m->has_alpha = 1;
        m->alpha_value = v;
    }
    m->down = down;
    m->up = up;
    m->alpha = alpha;
    m->rank = rank;
    m->n = l->n;
    m->k = l->k;
    m->quantized = l->quantized;
    return QL_OK;
}

ql_status ql_lora_plan_create(const ql_checkpoint *base, const ql_checkpoint *lc, ql_lora_plan **out)
{
    const char *fn = "ql_lora_plan_create";
    QL_CHECK_PTR(fn, base);
    QL_CHECK_PTR(fn, lc);
    QL_CHECK_PTR(fn, out);
    *out = NULL;
    ql_lora_plan *p = calloc(1, sizeof *p);
    base_layer *bl = NULL;
    key_entry *kd = NULL, *kk = NULL;
    int64_t nbl = 0, nkd = 0, nkk = 0, npieces = 0;
    lora_piece *pieces = NULL;
    int64_t *target = NULL; /* per base layer: the module index that targets it, or -1 */
    ql_status st = p ? QL_OK : ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (st == QL_OK) st = base_layers(base, &bl, &nbl);
    if (st == QL_OK) st = build_keys(bl, nbl, 0, &kd, &nkd);
    if (st == QL_OK) st = build_keys(bl, nbl, 1, &kk, &nkk);
    if (st != QL_OK) goto done;
    pieces = calloc((size_t)(lc->n_tensors + 1), sizeof *pieces);
    p->mods = calloc((size_t)(lc->n_tensors + 1), sizeof *p->mods);
    p->unmatched = calloc((size_t)(lc->n_tensors + 1), sizeof *p->unmatched);
    target = malloc((size_t)(nbl + 1) * sizeof *target);
    if (!pieces || !p->mods || !p->unmatched || !target) {
        st = ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        goto done;
    }
    for (int64_t i = 0; i < nbl; i++) target[i] = -1;
    static const struct { const char *suffix; int role, kohya; } sfx[] = {
        {".lora_down.weight", 0, 1}, {".lora_up.weight", 1, 1}, {".lora_A.weight", 0, 0}, {".lora_B.weight", 1, 0},
        {".alpha", 2, -1}};
    for (int64_t i = 0; i < lc->n_tensors; i++) {
        const char *name = lc->tensors[i].name;
        size_t len = strlen(name);
        int found = 0;
        for (size_t s = 0; s < sizeof sfx / sizeof sfx[0] && !found; s++) {
            size_t sl = strlen(sfx[s].suffix);
            if (len > sl && !strcmp(name + len - sl, sfx[s].suffix)) {
                pieces[npieces++] = (lora_piece){name, len - sl, sfx[s].role, sfx[s].kohya, i};
                found = 1;
            }
        }
        if (!found) p->unmatched[p->n_unmatched++] = lc->tensors[i].name;
    }
    qsort(pieces, (size_t)npieces, sizeof *pieces, cmp_piece);
    for (int64_t i0 = 0; i0 < npieces;) {
        int64_t i1 = i0 + 1;
        while (i1 < npieces && pieces[i1].module_len == pieces[i0].module_len &&
               !memcmp(pieces[i1].module, pieces[i0].module, pieces[i0].module_len))
            i1++;
        const char *mod = pieces[i0].module;
        const size_t ml = pieces[i0].module_len;
        int64_t down = -1, up = -1, alpha = -1;
        int kohya = -1, mixed = 0;
        for (int64_t i = i0; i < i1; i++) {
            const lora_piece *pc = &pieces[i];
            if (pc->kohya >= 0) {
                if (kohya >= 0 && kohya != pc->kohya) mixed = 1;
                kohya = pc->kohya;
            }
            int64_t *slot = pc->role == 0 ? &down : pc->role == 1 ? &up : &alpha;
            *slot = pc->tensor; /* names are unique, so one per role and convention */
        }
        /* the layers this module could mean */
        int64_t hits[8];
        int nh = 0;
        const char *c[NPREFIX + 1];
        size_t cl[NPREFIX + 1];
        int matchable = kohya >= 0 && !mixed;
        if (matchable && kohya == 1) {
            const size_t hl = strlen(KOHYA_HEAD);
            matchable = ml > hl && !strncmp(mod, KOHYA_HEAD, hl);
            int nc = matchable ? candidates(mod + hl, ml - hl, kohya_prefixes, c, cl) : 0;
            for (int j = 0; j < nc; j++) lookup(kk, nkk, c[j], cl[j], hits, &nh);
        } else if (matchable) {
            int nc = candidates(mod, ml, dot_prefixes, c, cl);
            for (int j = 0; j < nc; j++) lookup(kd, nkd, c[j], cl[j], hits, &nh);
        }
        char *mname = dup_n(mod, ml);
        const char *mkept = NULL;
        if ((st = keep(p, mname, &mkept)) != QL_OK) goto done;
        ql_name_buf a, b, m;
        if (nh > 1) {
            char l0[120], l1[120];
            snprintf(l0, sizeof l0, "%.*s", (int)layer_prefix_len(&bl[hits[0]]), ql_show(&a, bl[hits[0]].prefix));
            snprintf(l1, sizeof l1, "%.*s", (int)layer_prefix_len(&bl[hits[1]]), ql_show(&b, bl[hits[1]].prefix));
            st = ql_fail_file(lc, QL_ERR_FORMAT, "module '%s' is ambiguous: it could mean layer '%s' or layer '%s' of %s",
                              ql_show(&m, mkept), l0, l1, base->path);
            goto done;
        }
        if (nh == 0) {
            for (int64_t i = i0; i < i1; i++) p->unmatched[p->n_unmatched++] = lc->tensors[pieces[i].tensor].name;
            i0 = i1;
            continue;
        }
        const base_layer *l = &bl[hits[0]];
        ql_lora_module *md = &p->mods[p->n_mods];
        if ((st = check_module(lc, mkept, l, down, up, alpha, md)) != QL_OK) goto done;
        if (target[hits[0]] >= 0) {
            char l0[120];
            snprintf(l0, sizeof l0, "%.*s", (int)layer_prefix_len(l), ql_show(&a, l->prefix));
            st = ql_fail_file(lc, QL_ERR_FORMAT, "modules '%s' and '%s' both target layer '%s'",
                              ql_show(&b, p->mods[target[hits[0]]].module), ql_show(&m, mkept), l0);
            goto done;
        }
        char *lname = dup_n(l->prefix, layer_prefix_len(l));
        if ((st = keep(p, lname, &md->layer)) != QL_OK) goto done;
        md->module = mkept;
        target[hits[0]] = p->n_mods++;
        i0 = i1;
    }
    if (p->n_mods == 0) {
        ql_name_buf a;
        st = ql_fail_file(lc, QL_ERR_FORMAT, "none of its %lld tensors matches a layer of %s (kohya lora_unet_* or PEFT "
                          "lora_A/lora_B names expected)", (long long)lc->n_tensors, ql_show(&a, base->path));
        goto done;
    }
done:
    free(bl);
    free_keys(kd, nkd);
    free_keys(kk, nkk);
    free(pieces);
    free(target);
    if (st != QL_OK) ql_lora_plan_destroy(p);
    else *out = p;
    return st;
}

ql_status ql_lora_module_load(const ql_checkpoint *lc, const ql_lora_module *m, float *down, float *up)
{
    const char *fn = "ql_lora_module_load";
    QL_CHECK_PTR(fn, lc);
    QL_CHECK_PTR(fn, m);
    QL_CHECK_PTR(fn, down);
    QL_CHECK_PTR(fn, up);
    const int64_t idx[2] = {m->down, m->up};
    float *dst[2] = {down, up};
    for (int i = 0; i < 2; i++) {
        if (idx[i] < 0 || idx[i] >= lc->n_tensors) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: bad tensor index", fn);
        const ql_st_tensor *t = &lc->tensors[idx[i]];
        const unsigned char *p = ql_st_tensor_data(lc, t);
        ql_dtype dt;
        ql_name_buf nb;
        if (ql_st_dtype_to_ql(t->dtype, &dt) != QL_OK || !ql_is_float_dtype(dt))
            return ql_fail_file(lc, QL_ERR_FORMAT, "tensor '%s' is not a float tensor", ql_show(&nb, t->name));
        const size_t es = ql_dtype_size(dt);
        for (int64_t j = 0; j < t->numel; j++) {
            if (dt == QL_F32) memcpy(&dst[i][j], p + (size_t)j * es, 4);
            else {
                uint16_t h;
                memcpy(&h, p + (size_t)j * es, 2);
                dst[i][j] = ql_load_f(dt, &h, 0);
            }
            if (!isfinite(dst[i][j])) {
                ql_name_buf a;
                return ql_fail_file(lc, QL_ERR_NONFINITE, "tensor '%s': element %lld is %s", ql_show(&a, t->name),
                                    (long long)j, isnan(dst[i][j]) ? "NaN" : "Inf");
            }
        }
    }
    return QL_OK;
}
