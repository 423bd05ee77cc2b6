/* LoRA on the command line: `qlinear merge-lora` and the LoRAs of
 * `qlinear forward --lora FILE[:STRENGTH]`. Errors: one line on stderr,
 * exit 1 (2 for usage). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "qlinear.h"

int ql_cli_lora_arg(const char *arg, double def, char **path, double *strength)
{
    const char *colon = strrchr(arg, ':');
    *strength = def;
    if (colon && colon[1]) {
        char *end;
        errno = 0;
        double s = strtod(colon + 1, &end);
        if (!errno && *end == 0 && isfinite(s)) { /* FILE:S; otherwise the ':' is part of the file name */
            *path = strndup(arg, (size_t)(colon - arg));
            *strength = s;
            return *path != NULL;
        }
    }
    *path = strdup(arg);
    return *path != NULL;
}

static void put_name(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
}

/* ------------------------------------------------------ forward --lora */

void ql_cli_loras_free(ql_cli_lora *l, int n)
{
    for (int i = 0; l && i < n; i++) {
        free(l[i].path);
        free(l[i].down);
        free(l[i].up);
        ql_lora_plan_destroy(l[i].plan);
        ql_checkpoint_close(l[i].ck);
    }
    free(l);
}

int ql_cli_loras_load(const char *cmd, const ql_checkpoint *base, const char *layer, char *const *args, int n,
                      ql_cli_lora **out)
{
    ql_cli_lora *l = calloc((size_t)n + 1, sizeof *l);
    *out = l;
    if (!l) {
        fprintf(stderr, "qlinear %s: out of memory\n", cmd);
        return 1;
    }
    size_t ll = strlen(layer);
    if (ll >= 7 && !strcmp(layer + ll - 7, ".weight")) ll -= 7;
    for (int i = 0; i < n; i++) {
        if (!ql_cli_lora_arg(args[i], 1.0, &l[i].path, &l[i].strength)) {
            fprintf(stderr, "qlinear %s: out of memory\n", cmd);
            return 1;
        }
        if (ql_checkpoint_open(l[i].path, &l[i].ck) != QL_OK || ql_lora_plan_create(base, l[i].ck, &l[i].plan) != QL_OK) {
            fprintf(stderr, "qlinear %s: %s\n", cmd, ql_last_error());
            return 1;
        }
        for (int64_t m = 0; m < ql_lora_plan_module_count(l[i].plan); m++) {
            const ql_lora_module *md = ql_lora_plan_module(l[i].plan, m);
            if (strlen(md->layer) == ll && !strncmp(md->layer, layer, ll)) l[i].m = md;
        }
        if (!l[i].m) {
            fprintf(stderr, "qlinear %s: %s: no module targets layer '", cmd, l[i].path);
            put_name(stderr, layer);
            fprintf(stderr, "' (its modules match %lld other layers)\n", (long long)ql_lora_plan_module_count(l[i].plan));
            return 1;
        }
        const ql_lora_module *md = l[i].m;
        l[i].down = malloc((size_t)(md->rank * md->k) * 4 + 4);
        l[i].up = malloc((size_t)(md->n * md->rank) * 4 + 4);
        if (!l[i].down || !l[i].up) {
            fprintf(stderr, "qlinear %s: out of memory\n", cmd);
            return 1;
        }
        if (ql_lora_module_load(l[i].ck, md, l[i].down, l[i].up) != QL_OK) {
            fprintf(stderr, "qlinear %s: %s\n", cmd, ql_last_error());
            return 1;
        }
        l[i].scale = ql_lora_scale(l[i].strength, md->alpha_value, md->has_alpha, md->rank);
    }
    return 0;
}

/* -------------------------------------------------------------- merge-lora */

static volatile sig_atomic_t interrupted;
static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static int on_progress(void *user, const ql_quantize_progress *p)
{
    double *last = user;
    if (p->current && p->seconds - *last >= (isatty(2) ? 1.0 : 10.0)) {
        *last = p->seconds;
        fprintf(stderr, "%s[%lld/%lld layers] %.0f/%.0f MB%s", isatty(2) ? "\r" : "", (long long)p->layers_done,
                (long long)p->layers_total, (double)p->bytes_done / 1e6, (double)p->bytes_total / 1e6,
                isatty(2) ? "   " : "\n");
    }
    return interrupted ? 1 : 0;
}

static int usage_err(const char *what, const char *usage)
{
    fprintf(stderr, "qlinear merge-lora: %s (usage: qlinear merge-lora %s)\n", what, usage);
    return 2;
}

/* The matched and unmatched keys of each LoRA file, on stdout. */
static int report(const char *base_path, const ql_lora_input *in, int n)
{
    ql_checkpoint *base = NULL;
    if (ql_checkpoint_open(base_path, &base) != QL_OK) {
        fprintf(stderr, "qlinear merge-lora: %s\n", ql_last_error());
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        ql_checkpoint *lc = NULL;
        ql_lora_plan *p = NULL;
        if (ql_checkpoint_open(in[i].path, &lc) != QL_OK || ql_lora_plan_create(base, lc, &p) != QL_OK) {
            fprintf(stderr, "qlinear merge-lora: %s\n", ql_last_error());
            rc = 1;
        } else {
            printf("%s (strength %g): %lld modules matched, %lld tensors unmatched\n", in[i].path, in[i].strength,
                   (long long)ql_lora_plan_module_count(p), (long long)ql_lora_plan_unmatched_count(p));
            for (int64_t m = 0; m < ql_lora_plan_module_count(p); m++) {
                const ql_lora_module *md = ql_lora_plan_module(p, m);
                printf("  matched   ");
                put_name(stdout, md->module);
                printf(" -> ");
                put_name(stdout, md->layer);
                printf(" (%s, rank %lld, alpha %g%s, scale %g)\n", md->quantized ? "int8" : "float", (long long)md->rank,
                       md->alpha_value, md->has_alpha ? "" : " = rank", ql_lora_scale(in[i].strength, md->alpha_value, md->has_alpha, md->rank));
            }
            for (int64_t u = 0; u < ql_lora_plan_unmatched_count(p); u++) {
                printf("  unmatched ");
                put_name(stdout, ql_lora_plan_unmatched(p, u));
                printf("\n");
            }
        }
        ql_lora_plan_destroy(p);
        ql_checkpoint_close(lc);
    }
    ql_checkpoint_close(base);
    fflush(stdout);
    return rc;
}

int ql_cmd_merge_lora(int argc, char **argv)
{
    const char *usage = "BASE LORA... OUT [--strength S] [--stochastic | --nearest] [--threads N] [--seed-prefix P]\n"
                        "       qlinear merge-lora BASE OUT --lora FILE[:S] [--lora FILE[:S]]... [options]";
    const char **pos = calloc((size_t)argc + 1, sizeof *pos);
    char **lora_args = calloc((size_t)argc + 1, sizeof *lora_args);
    ql_lora_input *in = calloc((size_t)argc + 1, sizeof *in);
    char **owned = calloc((size_t)argc + 1, sizeof *owned);
    int npos = 0, nla = 0, nin = 0, rc = 2;
    double strength = 1.0;
    ql_merge_options opt;
    memset(&opt, 0, sizeof opt);
    opt.stochastic = 1;
    if (!pos || !lora_args || !in || !owned) {
        fprintf(stderr, "qlinear merge-lora: out of memory\n");
        rc = 1;
        goto done;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: qlinear merge-lora %s\n", usage);
            rc = 0;
            goto done;
        } else if (!strcmp(a, "--stochastic")) opt.stochastic = 1;
        else if (!strcmp(a, "--nearest")) opt.stochastic = 0;
        else if (!strcmp(a, "--strength") || !strcmp(a, "--lora") || !strcmp(a, "--threads") || !strcmp(a, "--seed-prefix")) {
            if (i + 1 >= argc) { rc = usage_err("option needs a value", usage); goto done; }
            const char *v = argv[++i];
            if (!strcmp(a, "--lora")) lora_args[nla++] = (char *)v;
            else if (!strcmp(a, "--seed-prefix")) opt.seed_prefix = v;
            else {
                char *end;
                errno = 0;
                double x = strtod(v, &end);
                if (errno || *end || end == v || !isfinite(x)) { rc = usage_err("bad number", usage); goto done; }
                if (!strcmp(a, "--strength")) strength = x;
                else if (x < 1 || x > 1024 || x != floor(x)) { rc = usage_err("bad --threads", usage); goto done; }
                else opt.threads = (int)x;
            }
        } else if (a[0] == '-' && a[1]) { rc = usage_err("unknown option", usage); goto done; }
        else pos[npos++] = a;
    }
    if (npos < 2) { rc = usage_err("needs BASE and OUT", usage); goto done; }
    if (npos == 2 && nla == 0) { rc = usage_err("no LoRA given", usage); goto done; }
    const char *base = pos[0], *out = pos[npos - 1];
    for (int i = 1; i < npos - 1; i++) in[nin++] = (ql_lora_input){pos[i], strength};
    for (int i = 0; i < nla; i++) {
        char *p;
        double s;
        if (!ql_cli_lora_arg(lora_args[i], strength, &p, &s)) { rc = 1; goto done; }
        owned[i] = p;
        in[nin++] = (ql_lora_input){p, s};
    }
    rc = 1;
    if (report(base, in, nin)) goto done;
    double last = 0.0;
    opt.progress = on_progress;
    opt.user = &last;
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    ql_merge_result r;
    ql_status st = ql_checkpoint_merge_lora(base, in, nin, out, &opt, &r);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (last > 0 && isatty(2)) fputc('\n', stderr);
    if (st != QL_OK) {
        if (interrupted) fprintf(stderr, "qlinear merge-lora: interrupted; %s was not written\n", out);
        else fprintf(stderr, "qlinear merge-lora: %s\n", ql_last_error());
        rc = interrupted ? 130 : 1;
        goto done;
    }
    fprintf(stderr, "qlinear merge-lora: %lld layers merged (%s rounding), %lld tensors copied, %.1f MB in %.2f s (%.0f MB/s) -> %s\n",
            (long long)r.layers_merged, opt.stochastic ? "stochastic" : "nearest", (long long)r.tensors_copied,
            (double)r.bytes_in / 1e6, r.seconds, r.seconds > 0 ? (double)r.bytes_in / 1e6 / r.seconds : 0.0, out);
    rc = 0;
done:
    for (int i = 0; owned && i < nla; i++) free(owned[i]);
    free(owned);
    free(pos);
    free(lora_args);
    free(in);
    return rc;
}
