/* The qlinear command on checkpoint files: every hostile file gives exactly
 * one error line and exit 1 (never a crash or hang); usage errors exit 2;
 * quantize -> inspect -> forward works end to end and forward matches the
 * reference int8_linear. Usage: test_format_cli [EMULATOR [OPTIONS]] PATH/TO/qlinear
 * (a cross build's qlinear runs through its emulator: no binfmt_misc here). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qlinear.h"
#include "test_format_cases.h"
#include "quant/wxa8.h"
#include "testutil.h"

static char **cmd; /* the command line that runs qlinear (argv + 1) */
static char *tmp;

static char *tpath(const char *name) { return fc_path(tmp, name); }

typedef struct run_result {
    int code; /* exit code; -1 crash (signal), -2 hang */
    char *out, *err;
    size_t out_len, err_len;
} run_result;

static void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
}

/* Run qlinear with args (NULL-terminated), 60 s limit. */
static run_result run(const char *const *args)
{
    run_result r = {0, NULL, NULL, 0, 0};
    static char outp[600], errp[600];
    snprintf(outp, sizeof outp, "%s/run.stdout", tmp);
    snprintf(errp, sizeof errp, "%s/run.stderr", tmp);
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fo, 1);
        dup2(fe, 2);
        const char *argv[32];
        int n = 0;
        for (int i = 0; cmd[i] && n < 16; i++) argv[n++] = cmd[i];
        for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    struct timespec ts = {0, 10 * 1000 * 1000};
    int waited = 0;
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (++waited > 6000) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            r.code = -2;
            break;
        }
        nanosleep(&ts, NULL);
    }
    if (r.code != -2) r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = (char *)read_file(outp, &r.out_len);
    r.err = (char *)read_file(errp, &r.err_len);
    if (r.out) r.out = realloc(r.out, r.out_len + 1), r.out[r.out_len] = 0;
    if (r.err) r.err = realloc(r.err, r.err_len + 1), r.err[r.err_len] = 0;
    return r;
}

static int one_line(const run_result *r)
{
    return r->err && r->err_len > 0 && r->err[r->err_len - 1] == '\n' && memchr(r->err, '\n', r->err_len - 1) == NULL;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void test_hostile_cli(void)
{
    printf("qlinear inspect on hostile files:\n");
    for (int i = 0; i < hc_count(); i++) {
        const hostile_case *hc = hc_get(i);
        size_t size;
        unsigned char *b = hc_build(i, &size);
        char name[128];
        snprintf(name, sizeof name, "%s.safetensors", hc->id);
        const char *path = tpath(name);
        write_file(path, b, size);
        free(b);
        /* The library's message for this file. */
        ql_checkpoint *c = NULL;
        ql_checkpoint_open(path, &c);
        ql_checkpoint_close(c);
        char expect[700];
        snprintf(expect, sizeof expect, "qlinear inspect: %s\n", ql_last_error());

        run_result r = run((const char *[]){"inspect", path, NULL});
        printf("  exit %d: %s", r.code, r.err ? r.err : "(no stderr)\n");
        CHECK(r.code == 1, "%s: inspect exit %d (expected 1)", hc->id, r.code);
        CHECK(one_line(&r), "%s: stderr is not exactly one line: [%s]", hc->id, r.err ? r.err : "");
        CHECK(r.err && !strcmp(r.err, expect), "%s: stderr [%s] expected [%s]", hc->id, r.err ? r.err : "", expect);
        CHECK(r.out_len == 0, "%s: inspect printed to stdout on failure", hc->id);
        run_free(&r);

        const char *out = tpath("hostile.out.safetensors");
        r = run((const char *[]){"quantize", path, out, "--format", "int8", NULL});
        CHECK(r.code == 1 && one_line(&r) && !strncmp(r.err, "qlinear quantize: ", 18), "%s: quantize exit %d [%s]",
              hc->id, r.code, r.err ? r.err : "");
        CHECK(!file_exists(out), "%s: quantize left an output", hc->id);
        run_free(&r);
        unlink(path);
    }
    run_result r = run((const char *[]){"inspect", tpath("does-not-exist.safetensors"), NULL});
    CHECK(r.code == 1 && one_line(&r) && strstr(r.err, "cannot open: No such file or directory"), "missing file: %s",
          r.err ? r.err : "");
    printf("  exit %d: %s", r.code, r.err ? r.err : "");
    run_free(&r);
    r = run((const char *[]){"inspect", tmp, NULL});
    CHECK(r.code == 1 && one_line(&r) && strstr(r.err, "is a directory"), "directory: %s", r.err ? r.err : "");
    printf("  exit %d: %s", r.code, r.err ? r.err : "");
    run_free(&r);
}

static void test_usage(void)
{
    const char *const *cases[] = {
        (const char *[]){"inspect", NULL},
        (const char *[]){"inspect", "a", "b", NULL},
        (const char *[]){"inspect", "a", "--frobnicate", NULL},
        (const char *[]){"quantize", "a", "b", NULL},
        (const char *[]){"quantize", "a", "b", "--format", "int4", NULL},
        (const char *[]){"quantize", "a", "b", "--format", "int8", "--group", "256", NULL},
        (const char *[]){"quantize", "a", "b", "--format", "int8-convrot", "--group", "x", NULL},
        (const char *[]){"quantize", "a", "--format", NULL},
        (const char *[]){"forward", "a", "b", "c", NULL},
        (const char *[]){"forward", "a", "b", "c", "d", "--out-dtype", "fp64", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_result r = run(cases[i]);
        CHECK(r.code == 2 && one_line(&r), "usage case %zu: exit %d [%s]", i, r.code, r.err ? r.err : "");
        run_free(&r);
    }
}

static void fill(ql_dtype dt, void *p, int64_t n) { tu_fill_gauss(dt, p, n, 0.03); }

static void write_tensors(const char *path, const ql_tensor_spec *sp, const void *const *data, int n)
{
    ql_st_writer *w;
    CHECK(ql_st_writer_open(path, sp, n, NULL, NULL, 0, NULL, &w) == QL_OK, "writer: %s", ql_last_error());
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)ql_st_writer_tensor_bytes(w, i);
        CHECK(ql_st_writer_write(w, i, 0, data[i], bytes) == QL_OK, "write: %s", ql_last_error());
    }
    CHECK(ql_st_writer_finish(w) == QL_OK, "finish: %s", ql_last_error());
}

static void test_end_to_end(void)
{
    /* A small float model: two linears (one with a bf16 bias), a norm, an
     * embedding, and an orphan I8 weight for the inspect warning. */
    const int64_t N = 96, K = 512, V = 40, M = 5;
    float *w1 = malloc((size_t)(N * K) * 4);
    uint16_t *w2 = malloc((size_t)(N * K) * 2), *b1 = malloc((size_t)N * 2);
    float *emb = malloc((size_t)(V * K) * 4), *norm = malloc((size_t)K * 4);
    fill(QL_F32, w1, N * K);
    fill(QL_BF16, w2, N * K);
    fill(QL_BF16, b1, N);
    fill(QL_F32, emb, V * K);
    fill(QL_F32, norm, K);
    int8_t orphan[16];
    for (int i = 0; i < 16; i++) orphan[i] = (int8_t)tu_next();
    int64_t snk[] = {N, K}, sn[] = {N}, svk[] = {V, K}, sk[] = {K}, s44[] = {4, 4};
    ql_tensor_spec sp[] = {{"net.a.weight", QL_ST_F32, 2, snk},     {"net.a.bias", QL_ST_BF16, 1, sn},
                           {"net.b.weight", QL_ST_BF16, 2, snk},    {"net.embed.weight", QL_ST_F32, 2, svk},
                           {"net.norm.weight", QL_ST_F32, 1, sk},   {"stray.weight", QL_ST_I8, 2, s44}};
    const void *data[] = {w1, b1, w2, emb, norm, orphan};
    const char *in = tpath("model.safetensors"), *q = tpath("model.int8cr.safetensors");
    write_tensors(in, sp, data, 6);

    run_result r = run((const char *[]){"quantize", in, q, "--format", "int8-convrot", "--group", "256", NULL});
    CHECK(r.code == 0, "quantize exit %d [%s]", r.code, r.err ? r.err : "");
    CHECK(r.err && strstr(r.err, "2 layers quantized, 4 tensors copied"), "quantize summary [%s]", r.err ? r.err : "");
    printf("%s", r.err ? r.err : "");
    run_free(&r);
    r = run((const char *[]){"quantize", in, in, "--format", "int8", NULL});
    CHECK(r.code == 1 && one_line(&r) && strstr(r.err, "refusing to overwrite the input file"), "in == out [%s]",
          r.err ? r.err : "");
    run_free(&r);

    r = run((const char *[]){"inspect", q, NULL});
    CHECK(r.code == 0 && r.err_len == 0, "inspect exit %d [%s]", r.code, r.err ? r.err : "");
    CHECK(r.out && strstr(r.out, "net.a  int8_tensorwise convrot 256  N=96 K=512  weight I8 [96, 512]  scale F32 [96, 1]  bias BF16 [96]"),
          "inspect layer line:\n%s", r.out ? r.out : "");
    CHECK(r.out && strstr(r.out, "stray.weight' is I8 but its layer has no comfy_quant"), "inspect warning");
    CHECK(r.out && strstr(r.out, "the same model in bf16"), "inspect bf16 total");
    if (r.out) printf("--- qlinear inspect ---\n%s-----------------------\n", r.out);
    run_free(&r);
    r = run((const char *[]){"inspect", "--json", q, NULL});
    json_error_t je;
    json_t *j = r.out ? json_loads(r.out, 0, &je) : NULL;
    CHECK(r.code == 0 && j, "inspect --json parses (%s)", j ? "" : je.text);
    if (j) {
        json_t *layers = json_object_get(j, "layers");
        CHECK(json_array_size(layers) == 2, "json: 2 layers");
        json_t *l0 = json_array_get(layers, 0);
        CHECK(!strcmp(json_string_value(json_object_get(l0, "config")),
                      "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 256}"),
              "json: config bytes");
        CHECK(json_array_size(json_object_get(j, "tensors")) == 10, "json: 10 tensors");
        CHECK(json_array_size(json_object_get(j, "warnings")) == 1, "json: one warning");
        json_decref(j);
    }
    run_free(&r);

    /* forward: against the reference int8_linear on the file's codes. */
    uint16_t *x = malloc((size_t)(M * K) * 2);
    tu_fill_gauss(QL_BF16, x, M * K, 1.0);
    int64_t smk[] = {M, K};
    const char *xin = tpath("x.safetensors"), *yout = tpath("y.safetensors");
    write_tensors(xin, (ql_tensor_spec[]){{"x", QL_ST_BF16, 2, smk}}, (const void *[]){x}, 1);
    ql_checkpoint *c = NULL;
    CHECK(ql_checkpoint_open(q, &c) == QL_OK, "open quantized: %s", ql_last_error());
    struct {
        const char *layer, *opt1, *opt2;
        ql_dtype ydt;
        int bias;
    } fw[] = {{"net.a", NULL, NULL, QL_BF16, 1},
              {"net.a.weight", "--no-bias", NULL, QL_BF16, 0},
              {"net.a", "--out-dtype", "fp32", QL_F32, 1},
              {"net.b", "--out-dtype", "fp16", QL_F16, 0}};
    for (int t = 0; t < 4 && c; t++) {
        const char *args[12] = {"forward", q, fw[t].layer, xin, yout, fw[t].opt1, fw[t].opt2, NULL};
        r = run(args);
        CHECK(r.code == 0, "forward %s exit %d [%s]", fw[t].layer, r.code, r.err ? r.err : "");
        run_free(&r);
        ql_linear_desc d;
        CHECK(ql_checkpoint_linear_desc(c, fw[t].layer, QL_LINEAR_W8A8, &d) == QL_OK, "desc");
        if (!fw[t].bias) d.int8.bias = NULL;
        size_t ys = (size_t)(M * N) * ql_dtype_size(fw[t].ydt);
        void *yr = malloc(ys);
        CHECK(ql_int8_linear_ref(&d.int8, x, QL_BF16, M, K, yr, fw[t].ydt, N, NULL) == QL_OK, "ref");
        ql_checkpoint *yc = NULL;
        CHECK(ql_checkpoint_open(yout, &yc) == QL_OK, "open y: %s", ql_last_error());
        ql_tensor_info yt;
        int64_t yi = yc ? ql_checkpoint_find(yc, "y") : -1;
        CHECK(yi >= 0 && ql_checkpoint_tensor(yc, yi, &yt) == QL_OK && yt.dtype == ql_st_dtype_from_ql(fw[t].ydt) &&
                  yt.ndim == 2 && yt.shape[0] == M && yt.shape[1] == N && yt.bytes == ys && !memcmp(yt.data, yr, ys),
              "forward %s %s: y equals the reference int8_linear", fw[t].layer, fw[t].opt1 ? fw[t].opt1 : "");
        ql_checkpoint_close(yc);
        free(yr);
    }
    ql_checkpoint_close(c);
    /* A float layer runs dense: compare with a double-precision product. */
    r = run((const char *[]){"forward", q, "net.embed", xin, yout, "--out-dtype", "fp32", NULL});
    CHECK(r.code == 0, "forward dense exit %d [%s]", r.code, r.err ? r.err : "");
    run_free(&r);
    ql_checkpoint *yc = NULL;
    if (ql_checkpoint_open(yout, &yc) == QL_OK) {
        ql_tensor_info yt;
        ql_checkpoint_tensor(yc, 0, &yt);
        double worst = 0;
        for (int64_t i = 0; i < M && yt.shape[1] == V; i++)
            for (int64_t o = 0; o < V; o++) {
                double acc = 0, mag = 0;
                for (int64_t p = 0; p < K; p++) {
                    double t = (double)ql_bf16_to_fp32(x[i * K + p]) * emb[o * K + p];
                    acc += t;
                    mag += fabs(t);
                }
                float got;
                memcpy(&got, (const char *)yt.data + 4 * (i * V + o), 4);
                double e = fabs(got - acc) / (mag + 1e-30);
                if (e > worst) worst = e;
            }
        CHECK(yt.shape[1] == V && worst < 1e-5, "dense forward relative error %g", worst);
        ql_checkpoint_close(yc);
    }
    /* Errors: one line, exit 1. */
    const char *const *bad[] = {
        (const char *[]){"forward", q, "net.nothing", xin, yout, NULL},
        (const char *[]){"forward", q, "net.a", xin, yout, "--input", "nope", NULL},
        (const char *[]){"forward", q, "net.b", xin, yout, "--bias", NULL},
        (const char *[]){"forward", q, "net.a", q, yout, NULL},
        (const char *[]){"forward", q, "net.a", xin, q, NULL},
    };
    for (size_t t = 0; t < sizeof bad / sizeof bad[0]; t++) {
        r = run(bad[t]);
        CHECK(r.code == 1 && one_line(&r) && !strncmp(r.err, "qlinear forward: ", 17), "forward error %zu: exit %d [%s]",
              t, r.code, r.err ? r.err : "");
        printf("  exit %d: %s", r.code, r.err ? r.err : "");
        run_free(&r);
    }
    /* K mismatch. */
    int64_t s3[] = {M, 256};
    write_tensors(xin, (ql_tensor_spec[]){{"x", QL_ST_BF16, 2, s3}}, (const void *[]){x}, 1);
    r = run((const char *[]){"forward", q, "net.a", xin, yout, NULL});
    CHECK(r.code == 1 && one_line(&r) && strstr(r.err, "input has K = 256 but layer 'net.a' has K = 512"),
          "K mismatch [%s]", r.err ? r.err : "");
    printf("  exit %d: %s", r.code, r.err ? r.err : "");
    run_free(&r);
    free(w1);
    free(w2);
    free(b1);
    free(emb);
    free(norm);
    free(x);
}

/* W4A8 / W6A8: quantize -> inspect -> forward (both strategies), against the
 * library's quantizer and the reference int8 linear on the decoded grid. */
static void test_wxa8_end_to_end(void)
{
    const int64_t N = 40, K = 512, M = 3;
    float *w1 = malloc((size_t)(N * K) * 4);
    uint16_t *w2 = malloc((size_t)(N * K) * 2), *x = malloc((size_t)(M * K) * 2);
    fill(QL_F32, w1, N * K);
    fill(QL_BF16, w2, N * K);
    tu_fill_gauss(QL_BF16, x, M * K, 1.0);
    int64_t snk[] = {N, K}, smk[] = {M, K};
    const char *in = tpath("wx.safetensors"), *xin = tpath("wx_x.safetensors");
    write_tensors(in, (ql_tensor_spec[]){{"m.a.weight", QL_ST_F32, 2, snk}, {"m.b.weight", QL_ST_BF16, 2, snk}},
                  (const void *[]){w1, w2}, 2);
    write_tensors(xin, (ql_tensor_spec[]){{"x", QL_ST_BF16, 2, smk}}, (const void *[]){x}, 1);
    const struct { const char *fmt, *gs, *json, *kind; ql_wxa8_mode mode; int64_t g; } cases[] = {
        {"w4a8", "16", "{\"format\": \"asym_w4a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 256}", "codebook", QL_WXA8_CODEBOOK, 16},
        {"w4a8-uniform", "32", "{\"format\": \"asym_w4a8_int8\", \"group_size\": 32, \"convrot_groupsize\": 256}", "uniform", QL_WXA8_UNIFORM, 32},
        {"w6a8", "16", "{\"format\": \"w6a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 256}", "uniform", QL_WXA8_6BIT, 16},
    };
    for (int ci = 0; ci < 3; ci++) {
        const char *q = tpath("wx.q.safetensors");
        run_result r = run((const char *[]){"quantize", in, q, "--format", cases[ci].fmt, "--group-size", cases[ci].gs, NULL});
        CHECK(r.code == 0 && r.err && strstr(r.err, "2 layers quantized"), "%s: quantize exit %d [%s]", cases[ci].fmt, r.code,
              r.err ? r.err : "");
        run_free(&r);
        const int bits = cases[ci].mode == QL_WXA8_6BIT ? 6 : 4;
        r = run((const char *[]){"inspect", q, NULL});
        char line[160];
        snprintf(line, sizeof line, "%d-bit %s group %s convrot 256 s_rel F8_E4M3  N=40 K=512  weight I8 [40, %d]", bits,
                 cases[ci].kind, cases[ci].gs, bits == 6 ? 384 : 256);
        CHECK(r.code == 0 && r.out && strstr(r.out, line), "%s: inspect shows [%s]:\n%s", cases[ci].fmt, line, r.out ? r.out : "");
        run_free(&r);
        ql_checkpoint *c = NULL;
        CHECK(ql_checkpoint_open(q, &c) == QL_OK, "%s: open: %s", cases[ci].fmt, ql_last_error());
        if (!c) continue;
        for (int li = 0; li < 2; li++) {
            const char *layer = li ? "m.b" : "m.a";
            ql_layer_info l;
            ql_checkpoint_layer(c, ql_checkpoint_find_layer(c, layer), &l);
            ql_tensor_info cq, wt, sr, sc;
            ql_checkpoint_tensor(c, l.comfy_quant, &cq);
            CHECK(cq.bytes == strlen(cases[ci].json) && !memcmp(cq.data, cases[ci].json, cq.bytes), "%s: comfy_quant bytes",
                  cases[ci].fmt);
            ql_checkpoint_tensor(c, l.weight, &wt);
            ql_checkpoint_tensor(c, l.s_rel, &sr);
            ql_checkpoint_tensor(c, l.s_channel, &sc);
            /* the file holds exactly the library quantizer's bytes */
            float cb[16];
            ql_wxa8_qparams p = {cases[ci].mode, cases[ci].g, 256, NULL, 1};
            const void *src = li ? (const void *)w2 : (const void *)w1;
            const ql_dtype sdt = li ? QL_BF16 : QL_F32;
            if (cases[ci].mode == QL_WXA8_CODEBOOK) {
                CHECK_OK(ql_wxa8_fit_codebook(sdt, src, N, K, K, &p, cb, NULL));
                p.codebook = cb;
                ql_tensor_info cbt;
                CHECK(l.codebook >= 0 && ql_checkpoint_tensor(c, l.codebook, &cbt) == QL_OK && !memcmp(cbt.data, cb, 64),
                      "%s: codebook tensor", cases[ci].fmt);
            } else CHECK(l.codebook < 0, "%s: no codebook tensor", cases[ci].fmt);
            const int64_t rb = bits == 6 ? 3 * K / 4 : K / 2, ng = K / cases[ci].g;
            uint8_t *qq = malloc((size_t)(N * rb)), *ss = malloc((size_t)(N * ng));
            float *ch = malloc((size_t)N * 4);
            CHECK_OK(ql_wxa8_quantize(sdt, src, N, K, K, &p, qq, rb, ss, ch, NULL));
            CHECK(wt.bytes == (uint64_t)(N * rb) && !memcmp(wt.data, qq, wt.bytes) && !memcmp(sr.data, ss, sr.bytes) &&
                      !memcmp(sc.data, ch, sc.bytes),
                  "%s %s: codes, s_rel and s_channel are the quantizer's", cases[ci].fmt, layer);
            /* forward, both strategies, against the reference on the decoded grid */
            ql_wxa8_weight w = {.n = N, .k = K, .bits = bits, .q = qq, .ldq = rb, .s_rel = ss, .s_channel = ch,
                                .codebook = p.codebook, .group = cases[ci].g, .convrot_group = 256};
            int8_t *grid = malloc((size_t)(N * K));
            CHECK_OK(ql_wxa8_decode(&w, grid, K));
            ql_int8_weight iw = {N, K, grid, K, ch, N, 256, NULL, QL_F32};
            uint16_t *yref = malloc((size_t)(M * N) * 2);
            CHECK_OK(ql_int8_linear_ref(&iw, x, QL_BF16, M, K, yref, QL_BF16, N, NULL));
            for (int packed = 0; packed < 2; packed++) {
                const char *yout = tpath("wx_y.safetensors");
                r = run((const char *[]){"forward", q, layer, xin, yout, packed ? "--packed" : NULL, NULL});
                CHECK(r.code == 0, "%s forward%s exit %d [%s]", cases[ci].fmt, packed ? " --packed" : "", r.code, r.err ? r.err : "");
                run_free(&r);
                ql_checkpoint *yc = NULL;
                ql_tensor_info yt;
                int ok = ql_checkpoint_open(yout, &yc) == QL_OK && ql_checkpoint_tensor(yc, 0, &yt) == QL_OK &&
                         yt.dtype == QL_ST_BF16 && yt.bytes == (uint64_t)(M * N * 2) && !memcmp(yt.data, yref, yt.bytes);
                CHECK(ok, "%s %s forward%s: bit-identical to the reference on the decoded grid", cases[ci].fmt, layer,
                      packed ? " --packed" : "");
                ql_checkpoint_close(yc);
            }
            free(qq), free(ss), free(ch), free(grid), free(yref);
        }
        ql_checkpoint_close(c);
        unlink(q);
    }
    /* bad options: one line, exit 1 or 2, nothing written */
    const char *q = tpath("wx.bad.safetensors");
    run_result r = run((const char *[]){"quantize", in, q, "--format", "w6a8", "--group-size", "8", NULL});
    CHECK(r.code == 1 && one_line(&r) && strstr(r.err, "multiple of 16") && !file_exists(q), "w6a8 group 8 [%s]",
          r.err ? r.err : "");
    run_free(&r);
    r = run((const char *[]){"quantize", in, q, "--format", "w4a8", "--group-size", "12", NULL});
    CHECK(r.code == 1 && one_line(&r) && !file_exists(q), "w4a8 group 12 [%s]", r.err ? r.err : "");
    run_free(&r);
    r = run((const char *[]){"quantize", in, q, "--format", "int8", "--group-size", "16", NULL});
    CHECK(r.code == 2 && one_line(&r) && !file_exists(q), "--group-size with int8 [%s]", r.err ? r.err : "");
    run_free(&r);
    free(w1), free(w2), free(x);
}

int main(int argc, char **argv)
{
    tu_init("test_format_cli");
    if (argc < 2) {
        printf("usage: test_format_cli [EMULATOR [OPTIONS]] PATH/TO/qlinear\n");
        return 2;
    }
    cmd = argv + 1;
    tmp = make_temp_dir("ql_test_format_cli");
    if (!tmp) return 1;
    test_hostile_cli();
    test_usage();
    test_end_to_end();
    test_wxa8_end_to_end();
    rm_tree(tmp);
    free(tmp);
    return tu_finish();
}
