/* Checkpoint commands: inspect, quantize, forward (issue #3).
 * Errors: one line on stderr, "qlinear CMD: message"; exit 1 (2 for usage). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "qlinear.h"

/* ---------------------------------------------------------------- helpers */

static int fail_lib(const char *cmd)
{
    fprintf(stderr, "qlinear %s: %s\n", cmd, ql_last_error());
    return 1;
}

static int usage_err(const char *cmd, const char *what, const char *usage)
{
    fprintf(stderr, "qlinear %s: %s (usage: qlinear %s %s)\n", cmd, what, cmd, usage);
    return 2;
}

static const char *human(char *buf, size_t cap, double bytes)
{
    const char *u[] = {"B", "kB", "MB", "GB", "TB"};
    int i = 0;
    while (bytes >= 1000.0 && i < 4) {
        bytes /= 1000.0;
        i++;
    }
    if (i == 0) snprintf(buf, cap, "%.0f B", bytes);
    else snprintf(buf, cap, "%.1f %s", bytes, u[i]);
    return buf;
}

static void shape_text(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && o < cap; i++) {
        if (i == 8) {
            o += (size_t)snprintf(buf + o, cap - o, ", ...");
            break;
        }
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Print an untrusted string on one line: control bytes as \xNN. */
static void put_safe(FILE *f, const char *s, size_t max)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++, n++) {
        if (n == max) {
            fputs("...", f);
            return;
        }
        if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
}

static int is_float_st(ql_st_dtype d) { return d == QL_ST_F32 || d == QL_ST_F16 || d == QL_ST_BF16 || d == QL_ST_F64; }

/* ---------------------------------------------------------------- inspect */

typedef struct group_total {
    char key[96];
    int64_t layers, tensors;
    uint64_t bytes;
} group_total;

typedef struct inspect_state {
    group_total totals[64];
    int n_totals;
    char **warnings;
    int n_warnings, cap_warnings;
} inspect_state;

static void add_total(inspect_state *s, const char *key, int64_t layers, int64_t tensors, uint64_t bytes)
{
    int i;
    for (i = 0; i < s->n_totals; i++)
        if (!strcmp(s->totals[i].key, key)) break;
    if (i == s->n_totals) {
        if (s->n_totals == 64) i = 63; /* "other" bucket at worst */
        else {
            s->n_totals++;
            snprintf(s->totals[i].key, sizeof s->totals[i].key, "%s", key);
        }
    }
    s->totals[i].layers += layers;
    s->totals[i].tensors += tensors;
    s->totals[i].bytes += bytes;
}

static void warn(inspect_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(inspect_state *s, const char *fmt, ...)
{
    if (s->n_warnings == s->cap_warnings) {
        int cap = s->cap_warnings ? 2 * s->cap_warnings : 16;
        char **p = realloc(s->warnings, (size_t)cap * sizeof *p);
        if (!p) return;
        s->warnings = p;
        s->cap_warnings = cap;
    }
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *d = strdup(buf);
    if (d) s->warnings[s->n_warnings++] = d;
}

/* Length of the tensor-group prefix of a name (up to the last '.'). */
static size_t group_len(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? (size_t)(dot - name) : 0;
}

/* Which layer (index) owns a tensor, or -1: P.weight, P.weight_scale,
 * P.bias, P.comfy_quant and any other P.* of a quantized layer P. */
static int64_t owner_layer(const ql_checkpoint *c, const char *name)
{
    size_t g = group_len(name);
    if (g == 0 && name[0] != '.') return -1;
    char stack[512];
    char *p = g < sizeof stack ? stack : malloc(g + 1);
    if (!p) return -1;
    memcpy(p, name, g);
    p[g] = 0;
    int64_t li = ql_checkpoint_find_layer(c, p);
    if (p != stack) free(p);
    return li;
}

static const char *layer_key(char *buf, size_t cap, const ql_layer_info *l)
{
    if (l->convrot && !strcmp(l->format, "int8_tensorwise"))
        snprintf(buf, cap, "%s convrot %lld", l->format, (long long)l->convrot_group);
    else if (l->bits)
        snprintf(buf, cap, "%s %d-bit %s", l->format, l->bits,
                 l->asymmetric ? "asymmetric" : l->has_codebook ? "codebook" : "uniform");
    else snprintf(buf, cap, "%s", l->format);
    return buf;
}

static void check_scales(inspect_state *s, const ql_checkpoint *c, const ql_layer_info *l)
{
    ql_tensor_info t;
    if (l->weight_scale < 0 || ql_checkpoint_tensor(c, l->weight_scale, &t) != QL_OK || t.dtype != QL_ST_F32) return;
    int64_t bad = 0;
    for (int64_t i = 0; i < t.numel; i++) {
        float v;
        memcpy(&v, (const char *)t.data + 4 * i, 4);
        if (!(v > 0.0f) || isinf(v)) bad++;
    }
    if (bad)
        warn(s, "layer '%s': %lld of %lld weight_scale values are not positive finite numbers (NaN outputs in ComfyUI)",
             l->prefix, (long long)bad, (long long)t.numel);
}

/* What inspect_run gathers before printing: totals by format, warnings,
 * the bytes of each layer's tensors, the file's bytes and its bf16 size. */
typedef struct inspect_sums {
    inspect_state s;
    int64_t *layer_bytes; /* [n_layers]; NULL when out of memory */
    uint64_t total, bf16;
} inspect_sums;

/* Tensors that belong to no layer: totals by dtype and their warnings;
 * the others count toward their layer's bytes. */
static void tally_tensors(inspect_sums *u, const ql_checkpoint *c)
{
    inspect_state *s = &u->s;
    char key[96];
    for (int64_t i = 0; i < ql_checkpoint_tensor_count(c); i++) {
        ql_tensor_info t;
        ql_checkpoint_tensor(c, i, &t);
        u->total += t.bytes;
        int64_t li = owner_layer(c, t.name);
        if (li >= 0) {
            if (u->layer_bytes) u->layer_bytes[li] += (int64_t)t.bytes;
            continue;
        }
        if (is_float_st(t.dtype)) {
            snprintf(key, sizeof key, "float %s", ql_st_dtype_name(t.dtype));
            u->bf16 += (uint64_t)t.numel * 2;
        } else {
            snprintf(key, sizeof key, "other %s", ql_st_dtype_name(t.dtype));
            u->bf16 += t.bytes;
        }
        add_total(s, key, 0, 1, t.bytes);
        size_t len = strlen(t.name);
        if (t.dtype == QL_ST_I8 && len > 7 && !strcmp(t.name + len - 7, ".weight"))
            warn(s, "tensor '%s' is I8 but its layer has no comfy_quant: ComfyUI would load it as a plain weight",
                 t.name);
        if (len > 13 && !strcmp(t.name + len - 13, ".weight_scale"))
            warn(s, "tensor '%s' belongs to no quantized layer: ComfyUI would leave it unused", t.name);
        switch (t.dtype) {
        case QL_ST_F4:
        case QL_ST_F6_E2M3:
        case QL_ST_F6_E3M2:
        case QL_ST_F8_E8M0:
        case QL_ST_F8_E4M3FNUZ:
        case QL_ST_F8_E5M2FNUZ:
        case QL_ST_C64:
            warn(s, "tensor '%s' has dtype %s, which many PyTorch builds cannot load", t.name,
                 ql_st_dtype_name(t.dtype));
            break;
        default: break;
        }
    }
}

/* Quantized layers: totals by format, their bf16 size and their warnings. */
static void tally_layers(inspect_sums *u, const ql_checkpoint *c)
{
    inspect_state *s = &u->s;
    char key[96];
    for (int64_t i = 0; i < ql_checkpoint_layer_count(c); i++) {
        ql_layer_info l;
        ql_checkpoint_layer(c, i, &l);
        add_total(s, layer_key(key, sizeof key, &l), 1, 0, u->layer_bytes ? (uint64_t)u->layer_bytes[i] : 0);
        if (l.k > 0) {
            u->bf16 += (uint64_t)l.n * (uint64_t)l.k * 2;
            if (l.bias >= 0) u->bf16 += (uint64_t)l.n * 2;
        } else if (u->layer_bytes) u->bf16 += (uint64_t)u->layer_bytes[i];
        if (l.weight < 0) warn(s, "layer '%s': format %s but no tensor '%s.weight'", l.prefix, l.format, l.prefix);
        if (!strcmp(l.format, "int8_tensorwise")) {
            check_scales(s, c, &l);
            if (l.convrot && l.convrot_group != 256)
                warn(s, "layer '%s': ConvRot group %lld; ComfyUI's fused CUDA kernels need 256 (slower fallback)",
                     l.prefix, (long long)l.convrot_group);
        }
        if (!strcmp(l.format, "w6a8_int8"))
            warn(s, "layer '%s': w6a8_int8 needs a recent ComfyUI (comfy-kitchen >= 0.2.37)", l.prefix);
    }
}

/* ------------------------------------------------------- inspect --json */

static json_t *tensors_json(const ql_checkpoint *c)
{
    json_t *ta = json_array();
    for (int64_t i = 0; i < ql_checkpoint_tensor_count(c); i++) {
        ql_tensor_info t;
        ql_checkpoint_tensor(c, i, &t);
        json_t *shape = json_array();
        for (int d = 0; d < t.ndim; d++) json_array_append_new(shape, json_integer(t.shape[d]));
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(t.name));
        json_object_set_new(o, "dtype", json_string(ql_st_dtype_name(t.dtype)));
        json_object_set_new(o, "shape", shape);
        json_object_set_new(o, "bytes", json_integer((json_int_t)t.bytes));
        json_object_set_new(o, "offset", json_integer((json_int_t)t.offset));
        json_array_append_new(ta, o);
    }
    return ta;
}

static json_t *layer_json(const ql_checkpoint *c, const ql_layer_info *l, int64_t bytes)
{
    json_t *o = json_object();
    json_object_set_new(o, "prefix", json_string(l->prefix));
    json_object_set_new(o, "format", json_string(l->format));
    json_object_set_new(o, "convrot", json_boolean(l->convrot));
    json_object_set_new(o, "convrot_groupsize", json_integer(l->convrot_group));
    json_object_set_new(o, "n", json_integer(l->n));
    json_object_set_new(o, "k", json_integer(l->k));
    json_object_set_new(o, "n_scale", json_integer(l->n_scale));
    if (l->bits) {
        json_object_set_new(o, "bits", json_integer(l->bits));
        json_object_set_new(o, "group_size", json_integer(l->group_size));
        json_object_set_new(o, "levels", json_string(l->asymmetric ? "asymmetric" : l->has_codebook ? "codebook" : "uniform"));
        json_object_set_new(o, "s_rel_dtype", json_string(ql_st_dtype_name(l->s_rel_dtype)));
    }
    json_object_set_new(o, "bytes", json_integer(bytes));
    ql_tensor_info b;
    if (l->bias >= 0 && ql_checkpoint_tensor(c, l->bias, &b) == QL_OK)
        json_object_set_new(o, "bias_dtype", json_string(ql_st_dtype_name(b.dtype)));
    json_object_set_new(o, "source", json_string(l->source == QL_LAYER_FROM_TENSOR     ? "comfy_quant"
                                                 : l->source == QL_LAYER_FROM_METADATA ? "_quantization_metadata"
                                                                                       : "both"));
    json_object_set_new(o, "supported", json_boolean(l->supported));
    if (!l->supported) json_object_set_new(o, "unsupported_reason", json_string(l->unsupported_reason));
    json_object_set_new(o, "config", json_string(l->config_json));
    return o;
}

static json_t *totals_json(const inspect_sums *u)
{
    json_t *tot = json_object();
    json_object_set_new(tot, "bytes", json_integer((json_int_t)u->total));
    json_object_set_new(tot, "bf16_bytes", json_integer((json_int_t)u->bf16));
    json_t *bf = json_object();
    for (int i = 0; i < u->s.n_totals; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "layers", json_integer(u->s.totals[i].layers));
        json_object_set_new(o, "tensors", json_integer(u->s.totals[i].tensors));
        json_object_set_new(o, "bytes", json_integer((json_int_t)u->s.totals[i].bytes));
        json_object_set_new(bf, u->s.totals[i].key, o);
    }
    json_object_set_new(tot, "by_format", bf);
    return tot;
}

static void inspect_json(const char *path, const ql_checkpoint *c, const inspect_sums *u)
{
    json_t *root = json_object();
    json_object_set_new(root, "file", json_string(path));
    json_object_set_new(root, "file_bytes", json_integer((json_int_t)ql_checkpoint_file_bytes(c)));
    json_object_set_new(root, "header_bytes", json_integer((json_int_t)ql_checkpoint_header_bytes(c)));
    json_t *meta = json_object();
    for (int64_t i = 0; i < ql_checkpoint_metadata_count(c); i++) {
        const char *k, *v;
        ql_checkpoint_metadata(c, i, &k, &v);
        json_object_set_new(meta, k, json_string(v));
    }
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "tensors", tensors_json(c));
    json_t *la = json_array();
    for (int64_t i = 0; i < ql_checkpoint_layer_count(c); i++) {
        ql_layer_info l;
        ql_checkpoint_layer(c, i, &l);
        json_array_append_new(la, layer_json(c, &l, u->layer_bytes ? u->layer_bytes[i] : 0));
    }
    json_object_set_new(root, "layers", la);
    json_object_set_new(root, "totals", totals_json(u));
    json_t *wa = json_array();
    for (int i = 0; i < u->s.n_warnings; i++) json_array_append_new(wa, json_string(u->s.warnings[i]));
    json_object_set_new(root, "warnings", wa);
    /* Strings that are not valid UTF-8 cannot occur: the reader checked. */
    json_dumpf(root, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    fputc('\n', stdout);
    json_decref(root);
}

/* -------------------------------------------------------- inspect (text) */

static void print_layer(const ql_checkpoint *c, const ql_layer_info *l, int64_t bytes)
{
    char b1[32], sh[96];
    ql_tensor_info w, sc, b;
    printf("  ");
    put_safe(stdout, l->prefix, 200);
    printf("  %s", l->format);
    if (l->convrot && !l->bits) printf(" convrot %lld", (long long)l->convrot_group);
    if (l->bits)
        printf(" %d-bit %s group %lld convrot %lld s_rel %s", l->bits,
               l->asymmetric ? "asymmetric" : l->has_codebook ? "codebook" : "uniform", (long long)l->group_size,
               (long long)l->convrot_group, ql_st_dtype_name(l->s_rel_dtype));
    if (l->k > 0) printf("  N=%lld K=%lld", (long long)l->n, (long long)l->k);
    if (l->weight >= 0 && ql_checkpoint_tensor(c, l->weight, &w) == QL_OK) {
        shape_text(sh, sizeof sh, w.shape, w.ndim);
        printf("  weight %s %s", ql_st_dtype_name(w.dtype), sh);
    }
    if (l->weight_scale >= 0 && ql_checkpoint_tensor(c, l->weight_scale, &sc) == QL_OK) {
        shape_text(sh, sizeof sh, sc.shape, sc.ndim);
        printf("  scale %s %s", ql_st_dtype_name(sc.dtype), sh);
    }
    if (l->bias >= 0 && ql_checkpoint_tensor(c, l->bias, &b) == QL_OK) {
        shape_text(sh, sizeof sh, b.shape, b.ndim);
        printf("  bias %s %s", ql_st_dtype_name(b.dtype), sh);
    }
    printf("  %s", human(b1, sizeof b1, (double)bytes));
    if (l->source == QL_LAYER_FROM_METADATA) printf("  (declared in _quantization_metadata)");
    if (!l->supported) printf("  [qlinear cannot run it: %s]", l->unsupported_reason);
    printf("\n");
}

/* Tensors of no layer, grouped by prefix (header order, consecutive). */
static void print_other_tensors(const ql_checkpoint *c)
{
    const int64_t nt = ql_checkpoint_tensor_count(c);
    char b1[32], sh[96];
    int header = 0;
    for (int64_t i = 0; i < nt;) {
        ql_tensor_info t;
        ql_checkpoint_tensor(c, i, &t);
        if (owner_layer(c, t.name) >= 0) {
            i++;
            continue;
        }
        if (!header) {
            printf("tensors:\n");
            header = 1;
        }
        size_t g = group_len(t.name);
        printf("  ");
        char gname[256];
        snprintf(gname, sizeof gname, "%.*s", (int)(g < 255 ? g : 255), t.name);
        put_safe(stdout, g ? gname : "(top level)", 200);
        uint64_t gb = 0;
        int64_t j = i;
        for (; j < nt; j++) {
            ql_tensor_info u;
            ql_checkpoint_tensor(c, j, &u);
            if (group_len(u.name) != g || strncmp(u.name, t.name, g) != 0 || owner_layer(c, u.name) >= 0) break;
            shape_text(sh, sizeof sh, u.shape, u.ndim);
            printf("%s ", j == i ? " " : ";");
            put_safe(stdout, u.name + (g ? g + 1 : 0), 80);
            printf(" %s %s", ql_st_dtype_name(u.dtype), sh);
            gb += u.bytes;
        }
        printf("  %s\n", human(b1, sizeof b1, (double)gb));
        i = j;
    }
}

static void print_totals(const inspect_sums *u)
{
    char b1[32], b2[32];
    printf("totals:\n");
    for (int i = 0; i < u->s.n_totals; i++) {
        printf("  %-34s", u->s.totals[i].key);
        if (u->s.totals[i].layers) printf(" %6lld layers ", (long long)u->s.totals[i].layers);
        else printf(" %6lld tensors", (long long)u->s.totals[i].tensors);
        printf(" %10s\n", human(b1, sizeof b1, (double)u->s.totals[i].bytes));
    }
    printf("  all tensors: %s; the same model in bf16: %s", human(b1, sizeof b1, (double)u->total),
           human(b2, sizeof b2, (double)u->bf16));
    if (u->bf16 > 0) printf(" (%.2fx)", (double)u->total / (double)u->bf16);
    printf("\n");
}

static void inspect_text(const char *path, const ql_checkpoint *c, const inspect_sums *u)
{
    const int64_t nl = ql_checkpoint_layer_count(c);
    char b1[32];
    printf("%s: %s, header %llu bytes, %lld tensors, %lld quantized layers\n", path,
           human(b1, sizeof b1, (double)ql_checkpoint_file_bytes(c)), (unsigned long long)ql_checkpoint_header_bytes(c),
           (long long)ql_checkpoint_tensor_count(c), (long long)nl);
    if (ql_checkpoint_metadata_count(c) > 0) {
        printf("metadata:\n");
        for (int64_t i = 0; i < ql_checkpoint_metadata_count(c); i++) {
            const char *k, *v;
            ql_checkpoint_metadata(c, i, &k, &v);
            printf("  ");
            put_safe(stdout, k, 60);
            printf(" = ");
            put_safe(stdout, v, 100);
            printf("\n");
        }
    }
    if (nl > 0) {
        printf("quantized layers:\n");
        for (int64_t i = 0; i < nl; i++) {
            ql_layer_info l;
            ql_checkpoint_layer(c, i, &l);
            print_layer(c, &l, u->layer_bytes ? u->layer_bytes[i] : 0);
        }
    }
    print_other_tensors(c);
    print_totals(u);
    if (u->s.n_warnings) {
        printf("warnings:\n");
        for (int i = 0; i < u->s.n_warnings; i++) {
            printf("  ");
            put_safe(stdout, u->s.warnings[i], 400);
            printf("\n");
        }
    }
}

static int inspect_run(const char *path, int as_json)
{
    ql_checkpoint *c;
    if (ql_checkpoint_open(path, &c) != QL_OK) return fail_lib("inspect");
    inspect_sums u;
    memset(&u, 0, sizeof u);
    u.layer_bytes = calloc((size_t)(ql_checkpoint_layer_count(c) + 1), sizeof *u.layer_bytes);
    tally_tensors(&u, c);
    tally_layers(&u, c);
    if (as_json) inspect_json(path, c, &u);
    else inspect_text(path, c, &u);
    for (int i = 0; i < u.s.n_warnings; i++) free(u.s.warnings[i]);
    free(u.s.warnings);
    free(u.layer_bytes);
    ql_checkpoint_close(c);
    return 0;
}

int ql_cmd_inspect(int argc, char **argv)
{
    const char *usage = "FILE [--json]";
    const char *file = NULL;
    int as_json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) as_json = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: qlinear inspect %s\n", usage);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) return usage_err("inspect", "unknown option", usage);
        else if (file) return usage_err("inspect", "more than one FILE", usage);
        else file = argv[i];
    }
    if (!file) return usage_err("inspect", "missing FILE", usage);
    return inspect_run(file, as_json);
}

/* --------------------------------------------------------------- quantize */

static volatile sig_atomic_t interrupted;
static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

typedef struct progress_state {
    int tty;
    double last;
    int printed;
} progress_state;

static int on_progress(void *user, const ql_quantize_progress *p)
{
    progress_state *ps = user;
    double mbs = p->seconds > 0 ? (double)p->bytes_done / 1e6 / p->seconds : 0.0;
    /* A line every second on a terminal, every 10 s otherwise; the final
     * call (current == NULL) is left to the summary. */
    if (p->current && p->seconds - ps->last >= (ps->tty ? 1.0 : 10.0)) {
        ps->last = p->seconds;
        fprintf(stderr, "%s[%lld/%lld layers] %.0f/%.0f MB, %.0f MB/s%s", ps->tty ? "\r" : "",
                (long long)p->layers_done, (long long)p->layers_total, (double)p->bytes_done / 1e6,
                (double)p->bytes_total / 1e6, mbs, ps->tty ? "   " : "\n");
        ps->printed = 1;
    }
    return interrupted ? 1 : 0;
}

int ql_cmd_quantize(int argc, char **argv)
{
    const char *usage = "IN OUT --format int8|int8-convrot|w4a8|w4a8-uniform|w6a8 [--group 256] [--group-size 16] "
                        "[--include REGEX] [--exclude REGEX] [--threads N]";
    const char *in = NULL, *out = NULL, *format = NULL;
    ql_quantize_options opt;
    memset(&opt, 0, sizeof opt);
    int group_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: qlinear quantize %s\n", usage);
            return 0;
        } else if (!strcmp(a, "--format") || !strcmp(a, "--group") || !strcmp(a, "--include") ||
                   !strcmp(a, "--exclude") || !strcmp(a, "--threads") || !strcmp(a, "--group-size")) {
            if (!has_val) return usage_err("quantize", "option needs a value", usage);
            const char *v = argv[++i];
            if (!strcmp(a, "--format")) format = v;
            else if (!strcmp(a, "--include")) opt.include = v;
            else if (!strcmp(a, "--exclude")) opt.exclude = v;
            else {
                char *end;
                errno = 0;
                long long x = strtoll(v, &end, 10);
                if (errno || *end || end == v || x <= 0 || x > (1 << 20))
                    return usage_err("quantize", !strcmp(a, "--threads") ? "bad --threads" : "bad --group/--group-size", usage);
                if (!strcmp(a, "--group-size")) opt.group_size = x;
                else if (!strcmp(a, "--group")) {
                    opt.group = x;
                    group_given = 1;
                } else opt.threads = (int)x;
            }
        } else if (a[0] == '-' && a[1]) return usage_err("quantize", "unknown option", usage);
        else if (!in) in = a;
        else if (!out) out = a;
        else return usage_err("quantize", "too many arguments", usage);
    }
    if (!in || !out) return usage_err("quantize", "missing IN or OUT", usage);
    if (!format) return usage_err("quantize", "missing --format", usage);
    if (!strcmp(format, "int8")) opt.target = QL_QUANT_INT8;
    else if (!strcmp(format, "int8-convrot")) opt.target = QL_QUANT_INT8_CONVROT;
    else if (!strcmp(format, "w4a8")) opt.target = QL_QUANT_W4A8;
    else if (!strcmp(format, "w4a8-uniform")) opt.target = QL_QUANT_W4A8_UNIFORM;
    else if (!strcmp(format, "w6a8")) opt.target = QL_QUANT_W6A8;
    else return usage_err("quantize", "--format must be int8, int8-convrot, w4a8, w4a8-uniform or w6a8", usage);
    if (group_given && opt.target == QL_QUANT_INT8)
        return usage_err("quantize", "--group (the ConvRot group) does not apply to --format int8", usage);
    if (opt.group_size && opt.target < QL_QUANT_W4A8)
        return usage_err("quantize", "--group-size applies to --format w4a8, w4a8-uniform and w6a8", usage);

    if (opt.threads == 0) { /* the library's default: QLINEAR_THREADS, else every CPU */
        ql_context *ctx;
        if (ql_context_create(&ctx) != QL_OK) return fail_lib("quantize");
        opt.threads = ql_context_threads(ctx);
        ql_context_destroy(ctx);
    }
    progress_state ps = {isatty(2), 0.0, 0};
    opt.progress = on_progress;
    opt.user = &ps;
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    ql_quantize_result r;
    ql_status st = ql_checkpoint_quantize(in, out, &opt, &r);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (ps.printed && ps.tty) fputc('\n', stderr);
    if (st != QL_OK) {
        if (interrupted) {
            fprintf(stderr, "qlinear quantize: interrupted; %s was not written\n", out);
            return 130;
        }
        return fail_lib("quantize");
    }
    char b1[32], b2[32];
    fprintf(stderr, "qlinear quantize: %lld layers quantized, %lld tensors copied, %s -> %s in %.2f s (%.0f MB/s)\n",
            (long long)r.layers_quantized, (long long)r.tensors_copied, human(b1, sizeof b1, (double)r.bytes_in),
            human(b2, sizeof b2, (double)r.bytes_out), r.seconds,
            r.seconds > 0 ? (double)r.bytes_in / 1e6 / r.seconds : 0.0);
    return 0;
}

/* ---------------------------------------------------------------- forward */

static int same_file(const char *a, const char *b)
{
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

typedef struct forward_args {
    const char *ckpt, *layer, *in, *out; /* CKPT LAYER IN OUT */
    const char *input;                   /* --input NAME */
    int cuda_dev;                        /* --device cuda[:N]; -1: the CPU */
    char *lora_args[64];
    int nlora;
    int bias_mode; /* 0 default, 1 --bias, -1 --no-bias */
    int packed;    /* W4A8/W6A8: decode inside the GEMM instead of once */
    ql_dtype ydt;  /* --out-dtype, when ydt_given */
    int ydt_given;
} forward_args;

/* -1: the arguments are good; otherwise the exit code. */
static int forward_parse(int argc, char **argv, const char *usage, forward_args *a)
{
    const char *pos[4] = {0};
    int npos = 0;
    const char *out_dtype = NULL;
    memset(a, 0, sizeof *a);
    a->cuda_dev = -1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            printf("usage: qlinear forward %s\n", usage);
            return 0;
        } else if (!strcmp(s, "--input") || !strcmp(s, "--out-dtype")) {
            if (i + 1 >= argc) return usage_err("forward", "option needs a value", usage);
            if (!strcmp(s, "--input")) a->input = argv[++i];
            else out_dtype = argv[++i];
        } else if (!strcmp(s, "--packed")) a->packed = 1;
        else if (!strcmp(s, "--lora")) {
            if (i + 1 >= argc) return usage_err("forward", "option needs a value", usage);
            if (a->nlora == 64) return usage_err("forward", "more than 64 --lora", usage);
            a->lora_args[a->nlora++] = argv[++i];
        } else if (!strcmp(s, "--device")) {
            if (i + 1 >= argc) return usage_err("forward", "option needs a value", usage);
            const char *v = argv[++i];
            if (!strncmp(v, "cuda", 4) && (!v[4] || v[4] == ':')) a->cuda_dev = v[4] ? atoi(v + 5) : 0;
            else if (strcmp(v, "cpu")) return usage_err("forward", "--device must be cpu, cuda or cuda:N", usage);
        } else if (!strcmp(s, "--bias")) a->bias_mode = 1;
        else if (!strcmp(s, "--no-bias")) a->bias_mode = -1;
        else if (s[0] == '-' && s[1]) return usage_err("forward", "unknown option", usage);
        else if (npos < 4) pos[npos++] = s;
        else return usage_err("forward", "too many arguments", usage);
    }
    if (npos != 4) return usage_err("forward", "needs CKPT LAYER IN OUT", usage);
    a->ydt = QL_F32;
    if (out_dtype) {
        a->ydt_given = 1;
        if (!strcmp(out_dtype, "fp32")) a->ydt = QL_F32;
        else if (!strcmp(out_dtype, "bf16")) a->ydt = QL_BF16;
        else if (!strcmp(out_dtype, "fp16")) a->ydt = QL_F16;
        else return usage_err("forward", "--out-dtype must be fp32, bf16 or fp16", usage);
    }
    a->ckpt = pos[0], a->layer = pos[1], a->in = pos[2], a->out = pos[3];
    return -1;
}

/* The input tensor: --input, else the only one, else 'x'. 1: printed why not. */
static int forward_input(const ql_checkpoint *xin, const forward_args *a, ql_tensor_info *xt, ql_dtype *xdt)
{
    int64_t ti = -1;
    if (a->input) {
        ti = ql_checkpoint_find(xin, a->input);
        if (ti < 0) {
            fprintf(stderr, "qlinear forward: %s: no tensor '", a->in);
            put_safe(stderr, a->input, 100);
            fprintf(stderr, "'\n");
            return 1;
        }
    } else if (ql_checkpoint_tensor_count(xin) == 1) ti = 0;
    else if ((ti = ql_checkpoint_find(xin, "x")) < 0) {
        fprintf(stderr, "qlinear forward: %s: has %lld tensors and none is called 'x'; choose one with --input\n",
                a->in, (long long)ql_checkpoint_tensor_count(xin));
        return 1;
    }
    ql_checkpoint_tensor(xin, ti, xt);
    if (ql_st_dtype_to_ql(xt->dtype, xdt) != QL_OK || (*xdt != QL_F32 && *xdt != QL_F16 && *xdt != QL_BF16) ||
        (xt->ndim != 1 && xt->ndim != 2)) {
        fprintf(stderr, "qlinear forward: %s: tensor '", a->in);
        put_safe(stderr, xt->name, 100);
        fprintf(stderr, "' must be F32, F16 or BF16 [M, K] (it is %s, %d-D)\n", ql_st_dtype_name(xt->dtype), xt->ndim);
        return 1;
    }
    return 0;
}

/* The layer's descriptor (the bias as --bias/--no-bias ask), for an input
 * of K = k. 1: printed why not. */
static int forward_layer(const ql_checkpoint *ck, const forward_args *a, int64_t k, ql_linear_desc *d, int *quantized)
{
    const char *layer = a->layer;
    size_t ll = strlen(layer);
    char *prefix = strndup(layer, ll >= 7 && !strcmp(layer + ll - 7, ".weight") ? ll - 7 : ll);
    if (!prefix) return 1;
    *quantized = ql_checkpoint_find_layer(ck, prefix) >= 0;
    free(prefix);
    if (ql_checkpoint_linear_desc(ck, layer,
                                  *quantized ? (a->packed ? QL_LINEAR_WXA8_PACKED : QL_LINEAR_W8A8) : QL_LINEAR_DENSE,
                                  d) != QL_OK)
        return fail_lib("forward");
    const int wxa8 = d->wxa8.bits != 0;
    const void **bias = wxa8 ? &d->wxa8.bias : *quantized ? &d->int8.bias : &d->bias;
    if (a->bias_mode == 1 && !*bias) {
        fprintf(stderr, "qlinear forward: %s: layer '", a->ckpt);
        put_safe(stderr, layer, 100);
        fprintf(stderr, "' has no bias (--bias)\n");
        return 1;
    }
    if (a->bias_mode == -1) *bias = NULL;
    const int64_t lk = *quantized && !wxa8 ? d->int8.k : d->k;
    if (k != lk) {
        fprintf(stderr, "qlinear forward: %s: input has K = %lld but layer '", a->in, (long long)k);
        put_safe(stderr, layer, 100);
        fprintf(stderr, "' has K = %lld\n", (long long)lk);
        return 1;
    }
    return 0;
}

/* LoRAs on a float layer: merged into an fp32 copy of its weight [n, lk]
 * (*merged; the caller frees it), which d then points to. */
static int merge_dense_loras(ql_linear_desc *d, int64_t n, int64_t lk, const ql_cli_lora *loras, int nlora,
                             float **merged)
{
    float *wm = *merged = malloc((size_t)(n * lk) * 4 + 4);
    if (!wm || ql_convert(d->weight, d->weight_dtype, wm, QL_F32, n * lk) != QL_OK) return fail_lib("forward");
    for (int l = 0; l < nlora; l++)
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < lk; c++) {
                double s = 0;
                for (int64_t q = 0; q < loras[l].m->rank; q++)
                    s += (double)loras[l].up[r * loras[l].m->rank + q] * loras[l].down[q * lk + c];
                wm[r * lk + c] = (float)(wm[r * lk + c] + loras[l].scale * s);
            }
    d->weight = wm;
    d->weight_dtype = QL_F32;
    d->ld_weight = lk;
    return 0;
}

/* The context (on --device) and the linear; on a quantized layer, the
 * LoRAs stay unmerged beside it. */
static int forward_linear(const forward_args *a, const ql_linear_desc *d, int quantized, int64_t lk,
                          const ql_cli_lora *loras, ql_context **ctx, ql_linear **lin)
{
    if (ql_context_create(ctx) != QL_OK ||
        (a->cuda_dev >= 0 && ql_context_set_device(*ctx, QL_DEVICE_CUDA, a->cuda_dev) != QL_OK) ||
        ql_linear_create(*ctx, d, lin) != QL_OK)
        return fail_lib("forward");
    for (int l = 0; quantized && l < a->nlora; l++) {
        const ql_lora_desc ld = {loras[l].m->rank, loras[l].down, QL_F32, lk, loras[l].up, QL_F32, loras[l].m->rank,
                                 loras[l].scale};
        if (ql_linear_add_lora(*lin, &ld, NULL) != QL_OK) return fail_lib("forward");
    }
    return 0;
}

/* OUT: y [m, n] (or [n] for a 1-D input), with the layer and its kind in
 * the metadata. */
static int forward_write(const forward_args *a, const void *y, size_t ybytes, ql_dtype ydt, int ndim, int64_t m,
                         int64_t n, const char *kind)
{
    ql_st_writer *w = NULL;
    int64_t yshape[2] = {m, n};
    ql_tensor_spec spec = {"y", ql_st_dtype_from_ql(ydt), ndim, ndim == 2 ? yshape : yshape + 1};
    const char *mk[] = {"qlinear_layer", "qlinear_kind"};
    const char *mv[] = {a->layer, kind};
    if (ql_st_writer_open(a->out, &spec, 1, mk, mv, 2, a->in, &w) != QL_OK ||
        ql_st_writer_write(w, 0, 0, y, ybytes) != QL_OK) {
        int rc = fail_lib("forward");
        ql_st_writer_abort(w);
        return rc;
    }
    if (ql_st_writer_finish(w) != QL_OK) return fail_lib("forward");
    return 0;
}

static int forward_run(const forward_args *a)
{
    int rc = 1;
    ql_checkpoint *ck = NULL, *xin = NULL;
    ql_cli_lora *loras = NULL;
    float *wmerged = NULL;
    ql_context *ctx = NULL;
    ql_linear *lin = NULL;
    void *x = NULL, *y = NULL;
    if (ql_checkpoint_open(a->ckpt, &ck) != QL_OK || ql_checkpoint_open(a->in, &xin) != QL_OK) {
        rc = fail_lib("forward");
        goto done;
    }
    ql_tensor_info xt;
    ql_dtype xdt;
    if (forward_input(xin, a, &xt, &xdt)) goto done;
    const ql_dtype ydt = a->ydt_given ? a->ydt : xdt;
    const int64_t m = xt.ndim == 2 ? xt.shape[0] : 1, k = xt.shape[xt.ndim - 1];
    ql_linear_desc d;
    int quantized;
    if (forward_layer(ck, a, k, &d, &quantized)) goto done;
    const int wxa8 = d.wxa8.bits != 0;
    const int64_t n = quantized && !wxa8 ? d.int8.n : d.n, lk = quantized && !wxa8 ? d.int8.k : d.k;
    /* LoRAs: unmerged on an int8 layer; merged into an fp32 copy of a float weight */
    if (a->nlora && ql_cli_loras_load("forward", ck, a->layer, a->lora_args, a->nlora, &loras)) goto done;
    if (a->nlora && !quantized && merge_dense_loras(&d, n, lk, loras, a->nlora, &wmerged)) goto done;
    if (forward_linear(a, &d, quantized, lk, loras, &ctx, &lin)) goto done;
    x = malloc(xt.bytes ? (size_t)xt.bytes : 1);
    size_t ybytes = (size_t)m * (size_t)n * ql_dtype_size(ydt);
    y = malloc(ybytes ? ybytes : 1);
    if (!x || !y) {
        fprintf(stderr, "qlinear forward: out of memory\n");
        goto done;
    }
    memcpy(x, xt.data, (size_t)xt.bytes);
    if ((a->cuda_dev >= 0 ? ql_tool_device_forward(lin, x, xdt, m, k, y, ydt, n)
                          : ql_linear_forward(lin, x, xdt, m, k, y, ydt, n, NULL)) != QL_OK) {
        rc = fail_lib("forward");
        goto done;
    }
    const char *kind = wxa8 ? (a->packed ? (d.wxa8.bits == 6 ? "w6a8-packed" : "w4a8-packed")
                                         : (d.wxa8.bits == 6 ? "w6a8" : "w4a8"))
                       : quantized ? "w8a8"
                                   : "dense";
    rc = forward_write(a, y, ybytes, ydt, xt.ndim, m, n, kind);
done:
    free(x);
    free(y);
    ql_linear_destroy(lin);
    ql_context_destroy(ctx);
    ql_checkpoint_close(ck);
    ql_checkpoint_close(xin);
    ql_cli_loras_free(loras, a->nlora);
    free(wmerged);
    return rc;
}

int ql_cmd_forward(int argc, char **argv)
{
    const char *usage = "CKPT LAYER IN.safetensors OUT.safetensors [--input NAME] [--out-dtype fp32|bf16|fp16] "
                        "[--bias|--no-bias] [--device cpu|cuda[:N]] [--lora FILE[:STRENGTH]]... [--packed]";
    forward_args a;
    int rc = forward_parse(argc, argv, usage, &a);
    if (rc >= 0) return rc;
    if (same_file(a.out, a.ckpt)) {
        fprintf(stderr, "qlinear forward: %s: refusing to overwrite the checkpoint\n", a.out);
        return 1;
    }
    return forward_run(&a);
}

#ifndef QL_HAVE_CUDA_BENCH
#include "core/core.h" /* ql_fail */

/* Built without CUDA: the context refuses the device before this is reached. */
ql_status ql_tool_device_forward(ql_linear *lin, const void *x, ql_dtype xdt, int64_t m, int64_t k, void *y,
                                 ql_dtype ydt, int64_t n)
{
    (void)lin, (void)x, (void)xdt, (void)m, (void)k, (void)y, (void)ydt, (void)n;
    return ql_fail(QL_ERR_UNSUPPORTED, "qlinear forward: this qlinear was built without CUDA");
}
#endif
