/* Checkpoint module tests: the reader's rules on hostile files, the writer's
 * exact bytes (against files written by the reference Python writer), layer
 * discovery, and the quantize -> open -> linear round trip against the
 * reference quantizers and the reference int8_linear. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"
#include "test_format_cases.h"
#include "testutil.h"

static char *tmp;

static char *tpath(const char *name) { return fc_path(tmp, name); }

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Entries in the temp dir other than the given names (leftover temp files). */
static int count_entries(void)
{
    int n = 0;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", tmp);
    FILE *f = popen(cmd, "r");
    if (f) {
        if (fscanf(f, "%d", &n) != 1) n = -1;
        pclose(f);
    }
    return n;
}

/* ------------------------------------------------------------ hostile */

static void test_hostile(void)
{
    printf("hostile files (%d cases):\n", hc_count());
    for (int i = 0; i < hc_count(); i++) {
        const hostile_case *hc = hc_get(i);
        size_t size;
        unsigned char *b = hc_build(i, &size);
        CHECK(b != NULL, "case %s: no builder", hc->id);
        if (!b) continue;
        char name[128];
        snprintf(name, sizeof name, "%s.safetensors", hc->id);
        const char *path = tpath(name);
        CHECK(write_file(path, b, size) == 0, "write %s", path);
        ql_checkpoint *c = (ql_checkpoint *)1;
        ql_status st = ql_checkpoint_open(path, &c);
        const char *msg = ql_last_error();
        printf("  %-26s %s\n", hc->id, msg);
        CHECK(st == hc->status, "case %s: status %s, expected %s (%s)", hc->id, ql_status_string(st),
              ql_status_string(hc->status), msg);
        CHECK(c == NULL, "case %s: output not NULL on failure", hc->id);
        CHECK(strncmp(msg, path, strlen(path)) == 0, "case %s: message does not start with the path: %s", hc->id, msg);
        CHECK(strstr(msg, hc->expect) != NULL, "case %s: message '%s' lacks '%s'", hc->id, msg, hc->expect);
        CHECK(strchr(msg, '\n') == NULL, "case %s: message has a newline", hc->id);
        if (st == QL_OK) ql_checkpoint_close(c);
        /* The same image from memory: same verdict. */
        ql_checkpoint *m = NULL;
        ql_status sm = ql_checkpoint_open_memory(size ? b : NULL, size, hc->id, &m);
        CHECK(sm == hc->status && strstr(ql_last_error(), hc->expect), "case %s from memory: %s", hc->id,
              ql_last_error());
        if (sm == QL_OK) ql_checkpoint_close(m);
        free(b);
    }
    /* Not a file at all. */
    ql_checkpoint *c;
    CHECK(ql_checkpoint_open(tmp, &c) == QL_ERR_IO && strstr(ql_last_error(), "is a directory"), "directory: %s",
          ql_last_error());
    CHECK(ql_checkpoint_open(tpath("missing.safetensors"), &c) == QL_ERR_IO &&
              strstr(ql_last_error(), "cannot open: No such file"),
          "missing: %s", ql_last_error());
    const char *fifo = tpath("fifo.safetensors");
    if (mkfifo(fifo, 0600) == 0) {
        CHECK(ql_checkpoint_open(fifo, &c) == QL_ERR_IO && strstr(ql_last_error(), "is not a regular file"),
              "fifo: %s", ql_last_error());
        unlink(fifo);
    }
    /* Names with control characters stay on one line in messages. */
    size_t size;
    unsigned char *b = raw_file((raw_tensor[]){{"bad\\nname\\u0001", "F17", "[1]", 4, NULL}}, 1, NULL, &size);
    CHECK(ql_checkpoint_open_memory(b, size, "mem", &c) == QL_ERR_FORMAT &&
              strstr(ql_last_error(), "tensor 'bad\\x0aname\\x01': unknown dtype 'F17'"),
          "escaped name: %s", ql_last_error());
    free(b);
}

/* Valid corner cases the reader must accept. */
static void test_valid_corners(void)
{
    size_t size;
    ql_checkpoint *c = NULL;
    /* Empty header object, no data. */
    unsigned char *b = raw_file(NULL, 0, NULL, &size);
    CHECK_OK(ql_checkpoint_open_memory(b, size, "empty-object", &c));
    CHECK(c && ql_checkpoint_tensor_count(c) == 0 && ql_checkpoint_layer_count(c) == 0, "empty object");
    ql_checkpoint_close(c);
    free(b);
    /* 0-d, zero-size (anywhere at the boundary), every dtype name, F4 pair. */
    raw_tensor t[] = {
        {"scalar", "F32", "[]", 4, NULL},         {"zero_a", "F16", "[0,3]", 0, NULL},
        {"bytes", "U8", "[3]", 3, NULL},          {"zero_b", "I64", "[5,0]", 0, NULL},
        {"f4", "F4", "[2]", 1, NULL},             {"f6", "F6_E2M3", "[4]", 3, NULL},
        {"e8m0", "F8_E8M0", "[1]", 1, NULL},      {"fnuz", "F8_E4M3FNUZ", "[1]", 1, NULL},
        {"fnuz2", "F8_E5M2FNUZ", "[1]", 1, NULL}, {"c64", "C64", "[1]", 8, NULL},
        {"b", "BOOL", "[1]", 1, NULL},            {"u64", "U64", "[1]", 8, NULL},
        {"e4m3", "F8_E4M3", "[1]", 1, NULL},      {"e5m2", "F8_E5M2", "[1]", 1, NULL},
    };
    int nt = (int)(sizeof t / sizeof t[0]);
    b = raw_file(t, nt, "{\"format\":\"pt\",\"k\\\"2\":\"v\\nx\"}", &size);
    CHECK_OK(ql_checkpoint_open_memory(b, size, "corners", &c));
    if (c) {
        CHECK(ql_checkpoint_tensor_count(c) == nt, "tensor count %lld", (long long)ql_checkpoint_tensor_count(c));
        ql_tensor_info ti;
        CHECK_OK(ql_checkpoint_tensor(c, 0, &ti));
        CHECK(!strcmp(ti.name, "scalar") && ti.ndim == 0 && ti.numel == 1 && ti.bytes == 4, "scalar info");
        int64_t z = ql_checkpoint_find(c, "zero_b");
        CHECK(z == 3, "find zero_b = %lld", (long long)z);
        CHECK(ql_checkpoint_find(c, "nope") == -1, "find missing");
        CHECK(ql_checkpoint_metadata_count(c) == 2, "metadata count");
        const char *v = ql_checkpoint_metadata_get(c, "k\"2");
        CHECK(v && !strcmp(v, "v\nx"), "metadata escape");
        CHECK(ql_checkpoint_tensor(c, nt, &ti) == QL_ERR_INVALID_ARGUMENT, "index out of range");
        ql_checkpoint_close(c);
    }
    free(b);
    /* An unaligned header length (data not 8-aligned) is legal. */
    raw_tensor u[] = {{"a", "F32", "[2]", 8, NULL}};
    b = raw_file(u, 1, NULL, &size);
    /* rebuild with one extra space not padded to 8 */
    size_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | b[i];
    unsigned char *b2 = malloc(size + 1);
    memcpy(b2, b, 8 + hl);
    b2[8 + hl] = ' ';
    memcpy(b2 + 9 + hl, b + 8 + hl, size - 8 - hl);
    hl++;
    for (int i = 0; i < 8; i++) b2[i] = (unsigned char)(hl >> (8 * i));
    CHECK_OK(ql_checkpoint_open_memory(b2, size + 1, "odd-header", &c));
    ql_checkpoint_close(c);
    free(b);
    free(b2);
}

/* --------------------------------------------------------------- writer */

static void test_writer_bytes(void)
{
    /* What the reference writer (safetensors' serialize) produces for these
     * tensors: dtype descending (F32 > BF16 > I8), then name; compact JSON;
     * __metadata__ first; spaces to a multiple of 8. */
    const char *expect_header =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"c\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]},"
        "\"a\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[12,15]}}";
    int64_t s2[] = {2}, s12[] = {1, 2}, s3[] = {3};
    ql_tensor_spec specs[] = {{"a", QL_ST_I8, 1, s3}, {"b", QL_ST_F32, 1, s2}, {"c", QL_ST_BF16, 2, s12}};
    unsigned char da[3], db[8], dc[4];
    for (int i = 0; i < 3; i++) da[i] = (unsigned char)tu_next();
    for (int i = 0; i < 8; i++) db[i] = (unsigned char)tu_next();
    for (int i = 0; i < 4; i++) dc[i] = (unsigned char)tu_next();
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    const char *out = tpath("w1.safetensors");
    ql_st_writer *w;
    CHECK_OK(ql_st_writer_open(out, specs, 3, mk, mv, 1, NULL, &w));
    CHECK(!file_exists(out), "output appears before finish");
    CHECK_OK(ql_st_writer_write(w, 2, 2, dc + 2, 2)); /* any order, pieces */
    CHECK_OK(ql_st_writer_write(w, 0, 0, da, 3));
    CHECK_OK(ql_st_writer_write(w, 1, 0, db, 8));
    CHECK_OK(ql_st_writer_write(w, 2, 0, dc, 2));
    CHECK(ql_st_writer_write(w, 0, 2, da, 2) == QL_ERR_INVALID_ARGUMENT, "write past a tensor's end");
    CHECK_OK(ql_st_writer_finish(w));
    size_t hl = strlen(expect_header), padded = (hl + 7) / 8 * 8;
    size_t size;
    unsigned char *f = read_file(out, &size);
    CHECK(f && size == 8 + padded + 15, "file size %zu, expected %zu", size, 8 + padded + 15);
    if (f && size == 8 + padded + 15) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = (n << 8) | f[i];
        CHECK(n == padded, "header length %llu", (unsigned long long)n);
        CHECK(!memcmp(f + 8, expect_header, hl), "header bytes: %.*s", (int)padded, f + 8);
        int spaces = 1;
        for (size_t i = hl; i < padded; i++) spaces &= f[8 + i] == ' ';
        CHECK(spaces, "padding is spaces");
        const unsigned char *d = f + 8 + padded;
        CHECK(!memcmp(d, db, 8) && !memcmp(d + 8, dc, 4) && !memcmp(d + 12, da, 3), "data layout");
    }
    free(f);
    /* Reading it back. */
    ql_checkpoint *c;
    CHECK_OK(ql_checkpoint_open(out, &c));
    if (c) {
        ql_tensor_info t;
        int64_t i = ql_checkpoint_find(c, "c");
        CHECK(i >= 0 && ql_checkpoint_tensor(c, i, &t) == QL_OK && t.dtype == QL_ST_BF16 && t.ndim == 2 &&
                  t.shape[1] == 2 && !memcmp(t.data, dc, 4),
              "read back c");
        ql_checkpoint_close(c);
    }

    /* Escapes: JSON-special and non-ASCII names survive the round trip. */
    const char *names[] = {"quote\"back\\slash", "tab\tnl\ncr\rctl\x01", "caf\xc3\xa9.\xe2\x82\xac.weight", "/slash"};
    int64_t s1[] = {1};
    ql_tensor_spec sp[4];
    for (int i = 0; i < 4; i++) sp[i] = (ql_tensor_spec){names[i], QL_ST_U8, 1, s1};
    const char *mk2[] = {"k\x7f", "\xf0\x9f\x98\x80"}, *mv2[] = {"\"v\"", "\\"};
    CHECK_OK(ql_st_writer_open(out, sp, 4, mk2, mv2, 2, NULL, &w));
    for (int i = 0; i < 4; i++) CHECK_OK(ql_st_writer_write(w, i, 0, "x", 1));
    CHECK_OK(ql_st_writer_finish(w));
    f = read_file(out, &size);
    CHECK(f && strstr((char *)f + 8, "\"tab\\tnl\\ncr\\rctl\\u0001\"") && strstr((char *)f + 8, "\"quote\\\"back\\\\slash\"") &&
              strstr((char *)f + 8, "\"/slash\""),
          "escapes as serde_json writes them");
    free(f);
    CHECK_OK(ql_checkpoint_open(out, &c));
    if (c) {
        for (int i = 0; i < 4; i++) CHECK(ql_checkpoint_find(c, names[i]) >= 0, "name %d round trip", i);
        CHECK(ql_checkpoint_metadata_get(c, "k\x7f") && !strcmp(ql_checkpoint_metadata_get(c, "k\x7f"), "\"v\""),
              "metadata round trip");
        ql_checkpoint_close(c);
    }
}

static void test_writer_atomic(void)
{
    int64_t s4[] = {4};
    ql_tensor_spec sp[] = {{"x", QL_ST_F32, 1, s4}};
    const char *out = tpath("atomic.safetensors");
    float v[4] = {1, 2, 3, 4};
    int before = count_entries();
    /* An existing destination survives an aborted or incomplete write. */
    CHECK(write_file(out, "original", 8) == 0, "write original");
    ql_st_writer *w;
    CHECK_OK(ql_st_writer_open(out, sp, 1, NULL, NULL, 0, NULL, &w));
    CHECK(count_entries() == before + 2, "temp file next to the destination");
    CHECK_OK(ql_st_writer_write(w, 0, 0, v, 8));
    ql_st_writer_abort(w);
    size_t size;
    unsigned char *f = read_file(out, &size);
    CHECK(f && size == 8 && !memcmp(f, "original", 8), "aborted write left the destination alone");
    free(f);
    CHECK(count_entries() == before + 1, "abort removed the temp file");
    CHECK_OK(ql_st_writer_open(out, sp, 1, NULL, NULL, 0, NULL, &w));
    CHECK_OK(ql_st_writer_write(w, 0, 0, v, 8));
    ql_status st = ql_st_writer_finish(w);
    CHECK(st == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "tensor 'x': 8 of its 16 bytes were written"),
          "incomplete: %s", ql_last_error());
    f = read_file(out, &size);
    CHECK(f && size == 8, "incomplete write left the destination alone");
    free(f);
    CHECK(count_entries() == before + 1, "failed finish removed the temp file");
    /* Success replaces it. */
    CHECK_OK(ql_st_writer_open(out, sp, 1, NULL, NULL, 0, NULL, &w));
    CHECK_OK(ql_st_writer_write(w, 0, 0, v, 16));
    CHECK_OK(ql_st_writer_finish(w));
    ql_checkpoint *c;
    CHECK_OK(ql_checkpoint_open(out, &c));
    ql_checkpoint_close(c);
    /* Never over the protected input: same path, a symlink, a hard link. */
    CHECK(ql_st_writer_open(out, sp, 1, NULL, NULL, 0, out, &w) == QL_ERR_INVALID_ARGUMENT &&
              strstr(ql_last_error(), "refusing to overwrite the input file"),
          "protect: %s", ql_last_error());
    const char *sl = tpath("symlink.safetensors"), *hl = tpath("hardlink.safetensors");
    CHECK(symlink(out, sl) == 0 && link(out, hl) == 0, "links");
    CHECK(ql_st_writer_open(sl, sp, 1, NULL, NULL, 0, out, &w) == QL_ERR_INVALID_ARGUMENT, "protect via symlink");
    CHECK(ql_st_writer_open(hl, sp, 1, NULL, NULL, 0, out, &w) == QL_ERR_INVALID_ARGUMENT, "protect via hard link");
    unlink(sl);
    unlink(hl);
    /* Bad specs. */
    ql_tensor_spec dup[] = {{"x", QL_ST_F32, 1, s4}, {"x", QL_ST_U8, 1, s4}};
    CHECK(ql_st_writer_open(out, dup, 2, NULL, NULL, 0, NULL, &w) == QL_ERR_INVALID_ARGUMENT &&
              strstr(ql_last_error(), "listed twice"),
          "duplicate names: %s", ql_last_error());
    ql_tensor_spec meta[] = {{"__metadata__", QL_ST_F32, 1, s4}};
    CHECK(ql_st_writer_open(out, meta, 1, NULL, NULL, 0, NULL, &w) == QL_ERR_INVALID_ARGUMENT, "__metadata__ name");
    ql_tensor_spec bad[] = {{"b\xff", QL_ST_F32, 1, s4}};
    CHECK(ql_st_writer_open(out, bad, 1, NULL, NULL, 0, NULL, &w) == QL_ERR_INVALID_ARGUMENT, "non-UTF-8 name");
    int64_t s3[] = {3};
    ql_tensor_spec f4[] = {{"f4", QL_ST_F4, 1, s3}};
    CHECK(ql_st_writer_open(out, f4, 1, NULL, NULL, 0, NULL, &w) == QL_ERR_INVALID_ARGUMENT, "12-bit tensor");
    CHECK(ql_st_writer_open(tpath("no/such/dir/x.safetensors"), sp, 1, NULL, NULL, 0, NULL, &w) == QL_ERR_IO &&
              strstr(ql_last_error(), "cannot create a temporary file"),
          "missing folder: %s", ql_last_error());
    CHECK(ql_st_writer_open(tmp, sp, 1, NULL, NULL, 0, NULL, &w) == QL_ERR_INVALID_ARGUMENT &&
              strstr(ql_last_error(), "is a directory"),
          "destination is a folder: %s", ql_last_error());
    CHECK(count_entries() == before + 1, "nothing left behind");
    unlink(out);
}

/* Rewriting a file written by the reference Python writer (shared/golden)
 * must give the same bytes. */
static void test_writer_vs_reference(void)
{
    const char *dir = getenv("QL_SHARED_DIR");
    char path[1024];
    const char *files[] = {"d_0.safetensors", "a_0.safetensors"};
    int found = 0;
    for (int fi = 0; fi < 2; fi++) {
        const char *roots[] = {dir, "../shared", "../../shared"};
        ql_checkpoint *c = NULL;
        for (int r = 0; r < 3 && !c; r++) {
            if (!roots[r]) continue;
            snprintf(path, sizeof path, "%s/golden/%s", roots[r], files[fi]);
            if (file_exists(path) && ql_checkpoint_open(path, &c) != QL_OK) {
                CHECK(0, "reference file %s: %s", path, ql_last_error());
                c = NULL;
            }
        }
        if (!c) continue;
        found++;
        int64_t n = ql_checkpoint_tensor_count(c), nm = ql_checkpoint_metadata_count(c);
        ql_tensor_spec *sp = calloc((size_t)n, sizeof *sp);
        const char **mk = calloc((size_t)nm + 1, sizeof *mk), **mv = calloc((size_t)nm + 1, sizeof *mv);
        for (int64_t i = 0; i < n; i++) {
            ql_tensor_info t;
            ql_checkpoint_tensor(c, i, &t);
            sp[i] = (ql_tensor_spec){t.name, t.dtype, t.ndim, t.shape};
        }
        for (int64_t i = 0; i < nm; i++) ql_checkpoint_metadata(c, i, &mk[i], &mv[i]);
        const char *out = tpath("rewrite.safetensors");
        ql_st_writer *w;
        CHECK_OK(ql_st_writer_open(out, sp, n, mk, mv, nm, path, &w));
        for (int64_t i = 0; i < n && w; i++) {
            ql_tensor_info t;
            ql_checkpoint_tensor(c, i, &t);
            CHECK_OK(ql_st_writer_write(w, i, 0, t.data, (size_t)t.bytes));
        }
        if (w) CHECK_OK(ql_st_writer_finish(w));
        size_t s1, s2;
        unsigned char *a = read_file(path, &s1), *b = read_file(out, &s2);
        CHECK(a && b && s1 == s2 && !memcmp(a, b, s1), "%s: rewrite differs from the reference writer's bytes",
              files[fi]);
        printf("reference writer: %s (%lld tensors, %zu bytes) rewritten byte for byte: %s\n", files[fi],
               (long long)n, s1, a && b && s1 == s2 && !memcmp(a, b, s1) ? "yes" : "NO");
        free(a);
        free(b);
        free(sp);
        free(mk);
        free(mv);
        unlink(out);
        ql_checkpoint_close(c);
    }
    if (!found) printf("reference writer: shared/golden not found (set QL_SHARED_DIR); skipped\n");
}

/* --------------------------------------------------------------- layers */

static ql_checkpoint *open_raw(const raw_tensor *t, int n, const char *meta, unsigned char **keep)
{
    size_t size;
    *keep = raw_file(t, n, meta, &size);
    ql_checkpoint *c = NULL;
    if (ql_checkpoint_open_memory(*keep, size, "layers", &c) != QL_OK) {
        CHECK(0, "open: %s", ql_last_error());
        return NULL;
    }
    return c;
}

static void test_layers(void)
{
    int8_t wq[4 * 256];
    for (int i = 0; i < 4 * 256; i++) wq[i] = (int8_t)tu_next();
    float sc[4] = {0.01f, 0.02f, 0.03f, 0.04f};
    uint16_t bias[4] = {0x3f80, 0x4000, 0xbf80, 0};
    struct {
        const char *cq, *sshape;
        int convrot;
        int64_t group, n_scale;
    } cfg[] = {
        {"{\"format\": \"int8_tensorwise\"}", "[]", 0, 0, 1},
        {"{\"format\": \"int8_tensorwise\", \"convrot\": true}", "[4,1]", 1, 256, 4},
        {"{\"format\": \"int8_tensorwise\", \"params\": {\"convrot\": true, \"convrot_groupsize\": 64}}", "[4]", 1, 64, 4},
        {"{\"format\": \"int8_tensorwise\", \"convrot_groupsize\": 16, \"params\": {\"convrot\": true, \"convrot_groupsize\": 64}}",
         "[1]", 1, 16, 1},
        {"{\"format\": \"int8_tensorwise\", \"convrot\": false, \"convrot_groupsize\": 100}", "[4,1]", 0, 0, 4},
    };
    for (int i = 0; i < 5; i++) {
        int64_t ns = cfg[i].n_scale;
        raw_tensor t[] = {{"m.l.comfy_quant", "U8", NULL, strlen(cfg[i].cq), cfg[i].cq},
                          {"m.l.weight", "I8", "[4,256]", sizeof wq, wq},
                          {"m.l.weight_scale", "F32", cfg[i].sshape, (uint64_t)(4 * ns), sc},
                          {"m.l.bias", "BF16", "[4]", 8, bias}};
        char shape[32];
        snprintf(shape, sizeof shape, "[%zu]", strlen(cfg[i].cq));
        t[0].shape = shape;
        unsigned char *keep;
        ql_checkpoint *c = open_raw(t, 4, NULL, &keep);
        if (c) {
            ql_layer_info l;
            CHECK(ql_checkpoint_layer_count(c) == 1 && ql_checkpoint_layer(c, 0, &l) == QL_OK, "cfg %d: one layer", i);
            CHECK(!strcmp(l.prefix, "m.l") && !strcmp(l.format, "int8_tensorwise") && l.convrot == cfg[i].convrot &&
                      l.convrot_group == cfg[i].group && l.n == 4 && l.k == 256 && l.n_scale == ns && l.supported &&
                      l.source == QL_LAYER_FROM_TENSOR && l.bias == 3 && l.weight == 1 && l.weight_scale == 2 &&
                      l.comfy_quant == 0 && !strcmp(l.config_json, cfg[i].cq),
                  "cfg %d: layer info (convrot %d group %lld n_scale %lld)", i, l.convrot, (long long)l.convrot_group,
                  (long long)l.n_scale);
            CHECK(ql_checkpoint_find_layer(c, "m.l") == 0 && ql_checkpoint_find_layer(c, "m") == -1, "find layer");
            ql_linear_desc d;
            CHECK_OK(ql_checkpoint_linear_desc(c, "m.l.weight", QL_LINEAR_W8A8, &d));
            CHECK(d.kind == QL_LINEAR_W8A8 && d.int8.n == 4 && d.int8.k == 256 && d.int8.ldq == 256 &&
                      d.int8.n_scale == ns && d.int8.convrot_group == cfg[i].group && d.int8.bias_dtype == QL_BF16 &&
                      !memcmp(d.int8.q, wq, sizeof wq) && !memcmp(d.int8.scale, sc, (size_t)(4 * ns)) &&
                      !memcmp(d.int8.bias, bias, 8) && ((uintptr_t)d.int8.scale % 4) == 0 &&
                      ((uintptr_t)d.int8.bias % 2) == 0,
                  "cfg %d: linear desc", i);
            CHECK(ql_checkpoint_linear_desc(c, "m.l", QL_LINEAR_DENSE, &d) == QL_ERR_INVALID_ARGUMENT, "int8 as dense");
            ql_checkpoint_close(c);
        }
        free(keep);
    }
    /* Declared in __metadata__ only; and in both places, consistently. */
    const char *qm = "{\"_quantization_metadata\":\"{\\\"format_version\\\": \\\"1.0\\\", \\\"layers\\\": "
                     "{\\\"l\\\": {\\\"format\\\": \\\"int8_tensorwise\\\", \\\"convrot\\\": true, "
                     "\\\"convrot_groupsize\\\": 256}}}\"}";
    raw_tensor t[] = {{"l.weight", "I8", "[4,256]", sizeof wq, wq}, {"l.weight_scale", "F32", "[4,1]", 16, sc}};
    unsigned char *keep;
    ql_checkpoint *c = open_raw(t, 2, qm, &keep);
    if (c) {
        ql_layer_info l;
        CHECK(ql_checkpoint_layer_count(c) == 1 && ql_checkpoint_layer(c, 0, &l) == QL_OK &&
                  l.source == QL_LAYER_FROM_METADATA && l.convrot && l.convrot_group == 256 && l.comfy_quant == -1 &&
                  l.bias == -1,
              "metadata-declared layer");
        ql_checkpoint_close(c);
    }
    free(keep);
    const char *cq = "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 256}";
    raw_tensor t2[] = {{"l.comfy_quant", "U8", "[72]", 72, cq},
                       {"l.weight", "I8", "[4,256]", sizeof wq, wq},
                       {"l.weight_scale", "F32", "[4,1]", 16, sc}};
    c = open_raw(t2, 3, qm, &keep);
    if (c) {
        ql_layer_info l;
        CHECK(ql_checkpoint_layer_count(c) == 1 && ql_checkpoint_layer(c, 0, &l) == QL_OK &&
                  l.source == QL_LAYER_FROM_BOTH,
              "layer declared twice, consistently");
        ql_checkpoint_close(c);
    }
    free(keep);
    /* Formats qlinear lists but cannot run; and a float layer. */
    const char *cq8 = "{\"format\": \"float8_e4m3fn\"}";
    const char *cq4 = "{\"format\": \"convrot_w4a4\", \"convrot_groupsize\": 256}     "; /* 56 bytes */
    float wf[4 * 8];
    for (int i = 0; i < 32; i++) wf[i] = (float)tu_gauss();
    raw_tensor t3[] = {{"f8.comfy_quant", "U8", "[27]", 27, cq8},
                       {"f8.weight", "F8_E4M3", "[4,8]", 32, NULL},
                       {"w4.comfy_quant", "U8", "[56]", 56, cq4},
                       {"w4.weight", "I8", "[4,128]", 512, NULL},
                       {"w4.weight_scale", "F32", "[4]", 16, NULL},
                       {"odd", "U8", "[1]", 1, NULL}, /* leaves the next tensor unaligned */
                       {"dense.weight", "F32", "[4,8]", 128, wf}};
    c = open_raw(t3, 7, NULL, &keep);
    if (c) {
        ql_layer_info l;
        int64_t i8 = ql_checkpoint_find_layer(c, "f8"), i4 = ql_checkpoint_find_layer(c, "w4");
        CHECK(ql_checkpoint_layer_count(c) == 2 && i8 >= 0 && i4 >= 0, "two listed layers");
        ql_checkpoint_layer(c, i8, &l);
        CHECK(!l.supported && l.unsupported_reason && l.n == 4 && l.k == 8, "fp8 layer listed, unsupported");
        ql_checkpoint_layer(c, i4, &l);
        CHECK(!l.supported && l.n == 4 && l.k == 256 && l.convrot_group == 256, "convrot_w4a4 layer listed");
        ql_linear_desc d;
        CHECK(ql_checkpoint_linear_desc(c, "w4", QL_LINEAR_W8A8, &d) == QL_ERR_UNSUPPORTED, "w4a4 not runnable: %s",
              ql_last_error());
        CHECK_OK(ql_checkpoint_linear_desc(c, "dense", QL_LINEAR_DENSE, &d));
        CHECK(d.kind == QL_LINEAR_DENSE && d.n == 4 && d.k == 8 && d.weight_dtype == QL_F32 &&
                  ((uintptr_t)d.weight % 4) == 0 && !memcmp(d.weight, wf, sizeof wf),
              "dense desc from an unaligned tensor (aligned copy)");
        CHECK(ql_checkpoint_linear_desc(c, "dense", QL_LINEAR_W8A8, &d) == QL_ERR_INVALID_ARGUMENT, "dense as w8a8");
        CHECK(ql_checkpoint_linear_desc(c, "nothing", QL_LINEAR_DENSE, &d) == QL_ERR_INVALID_ARGUMENT, "no such layer");
        ql_checkpoint_close(c);
    }
    free(keep);
    /* A packed format's weight [0, 2^63 - 1] (found reading layers.c for fuzz_layers: 2·K
     * overflowed): listed, K unknown. */
    const char *cqnv = "{\"format\": \"nvfp4\"}";
    raw_tensor t4[] = {{"nv.comfy_quant", "U8", "[19]", 19, cqnv}, {"nv.weight", "I8", "[0,9223372036854775807]", 0, NULL}};
    c = open_raw(t4, 2, NULL, &keep);
    if (c) {
        ql_layer_info l;
        CHECK(ql_checkpoint_layer_count(c) == 1 && ql_checkpoint_layer(c, 0, &l) == QL_OK && !l.supported && l.n == 0 &&
                  l.k == 0,
              "nvfp4 [0, 2^63 - 1]: listed, shape unknown (n %lld, k %lld)", (long long)l.n, (long long)l.k);
        ql_checkpoint_close(c);
    }
    free(keep);
    /* Exact comfy_quant bytes, as Python's json.dumps writes them. */
    char buf[128];
    size_t n = ql_comfy_quant_json(QL_QUANT_INT8_CONVROT, 256, buf, sizeof buf);
    CHECK(n == 72 && !strcmp(buf, "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 256}"),
          "convrot comfy_quant bytes (%zu): %s", n, buf);
    n = ql_comfy_quant_json(QL_QUANT_INT8, 0, buf, sizeof buf);
    CHECK(n == 29 && !strcmp(buf, "{\"format\": \"int8_tensorwise\"}"), "int8 comfy_quant bytes: %s", buf);
}

/* ------------------------------------------------------ quantize round trip */

typedef struct gen_tensor {
    const char *name;
    ql_dtype dt;       /* float tensors */
    ql_st_dtype st;    /* the file dtype */
    int ndim;
    int64_t shape[2];
    int quant_int8, quant_convrot; /* expected selection by the default rule */
    void *data;
    uint64_t bytes;
} gen_tensor;

static void gen_fill(gen_tensor *g)
{
    int64_t numel = 1;
    for (int d = 0; d < g->ndim; d++) numel *= g->shape[d];
    g->bytes = (uint64_t)numel * (uint64_t)(ql_st_dtype_bits(g->st) / 8);
    g->data = malloc(g->bytes ? (size_t)g->bytes : 1);
    if (g->st == QL_ST_F32 || g->st == QL_ST_F16 || g->st == QL_ST_BF16) {
        /* Gaussian rows with a few outlier columns, never all zeros. */
        tu_fill_gauss(g->dt, g->data, numel, 0.02);
        for (int64_t i = 0; i < numel; i += 97) ql_store_f(g->dt, g->data, i, ql_load_f(g->dt, g->data, i) * 40.0f);
    } else {
        for (uint64_t i = 0; i < g->bytes; i++) ((unsigned char *)g->data)[i] = (unsigned char)tu_next();
    }
}

static void write_model(const char *path, gen_tensor *g, int n, int with_meta)
{
    ql_tensor_spec *sp = calloc((size_t)n, sizeof *sp);
    for (int i = 0; i < n; i++) sp[i] = (ql_tensor_spec){g[i].name, g[i].st, g[i].ndim, g[i].shape};
    const char *mk[] = {"format", "modelspec.title"}, *mv[] = {"pt", "test model \xe2\x9c\x93"};
    ql_st_writer *w;
    CHECK_OK(ql_st_writer_open(path, sp, n, mk, mv, with_meta ? 2 : 0, NULL, &w));
    for (int i = 0; i < n && w; i++) CHECK_OK(ql_st_writer_write(w, i, 0, g[i].data, (size_t)g[i].bytes));
    if (w) CHECK_OK(ql_st_writer_finish(w));
    free(sp);
}

/* Check one quantized layer against the reference quantizer and the
 * reference int8_linear. */
static void check_layer(ql_context *ctx, ql_checkpoint *c, const gen_tensor *g, const gen_tensor *bias, int64_t group)
{
    const int64_t n = g->shape[0], k = g->shape[1];
    size_t plen = strlen(g->name) - 7;
    char prefix[256], name[300];
    snprintf(prefix, sizeof prefix, "%.*s", (int)plen, g->name);
    ql_tensor_info w, s, q;
    int64_t iw = ql_checkpoint_find(c, g->name);
    snprintf(name, sizeof name, "%s.weight_scale", prefix);
    int64_t is = ql_checkpoint_find(c, name);
    snprintf(name, sizeof name, "%s.comfy_quant", prefix);
    int64_t iq = ql_checkpoint_find(c, name);
    if (iw < 0 || is < 0 || iq < 0) {
        CHECK(0, "%s: quantized tensors missing", prefix);
        return;
    }
    ql_checkpoint_tensor(c, iw, &w);
    ql_checkpoint_tensor(c, is, &s);
    ql_checkpoint_tensor(c, iq, &q);
    CHECK(w.dtype == QL_ST_I8 && w.ndim == 2 && w.shape[0] == n && w.shape[1] == k, "%s: weight I8 [N, K]", prefix);
    CHECK(s.dtype == QL_ST_F32 && s.ndim == 2 && s.shape[0] == n && s.shape[1] == 1, "%s: weight_scale F32 [N, 1]",
          prefix);
    char cq[128];
    size_t cl = ql_comfy_quant_json(group ? QL_QUANT_INT8_CONVROT : QL_QUANT_INT8, group, cq, sizeof cq);
    CHECK(q.dtype == QL_ST_U8 && q.ndim == 1 && q.bytes == cl && !memcmp(q.data, cq, cl), "%s: comfy_quant bytes",
          prefix);
    /* Reference codes and scales from the original tensor. */
    int8_t *rq = malloc((size_t)(n * k));
    float *rs = malloc((size_t)n * sizeof(float));
    ql_status st = group ? ql_quantize_convrot_weight(g->dt, g->data, n, k, k, group, rq, k, rs)
                         : ql_quantize_rowwise(g->dt, g->data, n, k, k, rq, k, rs);
    CHECK(st == QL_OK, "reference quantizer: %s", ql_last_error());
    CHECK(!memcmp(w.data, rq, (size_t)(n * k)), "%s: codes differ from the reference quantizer", prefix);
    CHECK(!memcmp(s.data, rs, (size_t)n * 4), "%s: scales differ from the reference quantizer", prefix);
    int nonzero = 0;
    for (int64_t i = 0; i < n * k && !nonzero; i++) nonzero = rq[i] != 0;
    CHECK(nonzero, "%s: codes are not all zero", prefix);
    /* Layer discovery and the linear. */
    int64_t li = ql_checkpoint_find_layer(c, prefix);
    ql_layer_info l;
    CHECK(li >= 0 && ql_checkpoint_layer(c, li, &l) == QL_OK && l.n == n && l.k == k && l.n_scale == n &&
              l.convrot == (group > 0) && l.convrot_group == group && l.supported,
          "%s: layer info", prefix);
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_from_checkpoint(ctx, c, prefix, QL_LINEAR_W8A8, &lin));
    if (!lin) goto out;
    const int64_t m = 3;
    ql_dtype xdts[2] = {QL_BF16, QL_F32};
    for (int xi = 0; xi < 2; xi++) {
        ql_dtype xdt = xdts[xi];
        void *x = malloc((size_t)(m * k) * 4);
        tu_fill_gauss(xdt, x, m * k, 1.0);
        size_t ys = (size_t)(m * n) * ql_dtype_size(xdt);
        void *y = malloc(ys), *yr = malloc(ys);
        ql_int8_weight rw = {n, k, w.data, k, rs, n, group, NULL, QL_F32};
        if (bias) {
            rw.bias = bias->data;
            rw.bias_dtype = bias->dt;
        }
        CHECK_OK(ql_linear_forward(lin, x, xdt, m, k, y, xdt, n, NULL));
        CHECK_OK(ql_int8_linear_ref(&rw, x, xdt, m, k, yr, xdt, n, NULL));
        CHECK(!memcmp(y, yr, ys), "%s: linear (x %s) differs from the reference int8_linear", prefix,
              ql_dtype_name(xdt));
        free(x);
        free(y);
        free(yr);
    }
    ql_linear_destroy(lin);
out:
    free(rq);
    free(rs);
}

static void test_quantize_roundtrip(void)
{
    /* Every shape of the anima profile, plus odd ones. */
    gen_tensor g[] = {
        {"blocks.0.attn.qkv.weight", QL_F32, QL_ST_F32, 2, {2048, 2048}, 1, 1, 0, 0},
        {"blocks.0.attn.qkv.bias", QL_F32, QL_ST_F32, 1, {2048, 0}, 0, 0, 0, 0},
        {"blocks.0.adaln.1.weight", QL_F16, QL_ST_F16, 2, {256, 2048}, 1, 1, 0, 0},
        {"blocks.0.adaln.2.weight", QL_F32, QL_ST_F32, 2, {6144, 256}, 1, 1, 0, 0},
        {"blocks.0.cross.k.weight", QL_BF16, QL_ST_BF16, 2, {2048, 1024}, 1, 1, 0, 0},
        {"blocks.0.cross.k.bias", QL_BF16, QL_ST_BF16, 1, {2048, 0}, 0, 0, 0, 0},
        {"blocks.0.mlp.fc1.weight", QL_BF16, QL_ST_BF16, 2, {8192, 2048}, 1, 1, 0, 0},
        {"blocks.0.mlp.fc2.weight", QL_BF16, QL_ST_BF16, 2, {2048, 8192}, 1, 1, 0, 0},
        {"odd.one_row.weight", QL_F32, QL_ST_F32, 2, {1, 256}, 1, 1, 0, 0},
        {"odd.three.weight", QL_F16, QL_ST_F16, 2, {3, 768}, 1, 1, 0, 0},
        {"odd.k100.weight", QL_F32, QL_ST_F32, 2, {5, 100}, 1, 0, 0, 0},
        {"odd.k64.weight", QL_BF16, QL_ST_BF16, 2, {7, 64}, 1, 0, 0, 0},
        {"embed_tokens.weight", QL_F32, QL_ST_F32, 2, {50, 256}, 0, 0, 0, 0},
        {"blocks.0.norm1.weight", QL_F32, QL_ST_F32, 1, {256, 0}, 0, 0, 0, 0},
        {"blocks.0.ln_2.weight", QL_F32, QL_ST_F32, 2, {4, 256}, 0, 0, 0, 0},
        {"logit_scale", QL_F32, QL_ST_F32, 0, {0, 0}, 0, 0, 0, 0},
        {"position_ids", QL_F32, QL_ST_I64, 2, {1, 77}, 0, 0, 0, 0},
        {"odd_bytes", QL_F32, QL_ST_U8, 1, {7, 0}, 0, 0, 0, 0},
        {"weight", QL_F32, QL_ST_F32, 2, {4, 256}, 0, 0, 0, 0}, /* no prefix */
        {"odd.f64.weight", QL_F32, QL_ST_F64, 2, {2, 256}, 0, 0, 0, 0},
    };
    const int ng = (int)(sizeof g / sizeof g[0]);
    for (int i = 0; i < ng; i++) gen_fill(&g[i]);
    const char *in = tpath("float.safetensors");
    write_model(in, g, ng, 1);
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    for (int pass = 0; pass < 2; pass++) {
        int64_t group = pass ? 256 : 0;
        const char *out = tpath(pass ? "convrot.safetensors" : "int8.safetensors");
        ql_quantize_options opt = {pass ? QL_QUANT_INT8_CONVROT : QL_QUANT_INT8, 0, NULL, NULL, 2, NULL, NULL, 0};
        ql_quantize_result r;
        CHECK_OK(ql_checkpoint_quantize(in, out, &opt, &r));
        int expect_layers = 0;
        for (int i = 0; i < ng; i++) expect_layers += pass ? g[i].quant_convrot : g[i].quant_int8;
        CHECK(r.layers_quantized == expect_layers, "pass %d: %lld layers quantized, expected %d", pass,
              (long long)r.layers_quantized, expect_layers);
        printf("quantize %s: %lld layers, %lld copied, %.1f MB in %.2f s\n", pass ? "int8-convrot" : "int8",
               (long long)r.layers_quantized, (long long)r.tensors_copied, (double)r.bytes_in / 1e6, r.seconds);
        ql_checkpoint *c = NULL;
        CHECK_OK(ql_checkpoint_open(out, &c));
        if (!c) continue;
        CHECK(ql_checkpoint_layer_count(c) == expect_layers, "pass %d: layers found %lld", pass,
              (long long)ql_checkpoint_layer_count(c));
        CHECK(ql_checkpoint_tensor_count(c) == ng + 2 * expect_layers, "pass %d: tensor count", pass);
        CHECK(ql_checkpoint_metadata_count(c) == 2 &&
                  !strcmp(ql_checkpoint_metadata_get(c, "modelspec.title"), "test model \xe2\x9c\x93"),
              "metadata kept");
        for (int i = 0; i < ng; i++) {
            int quant = pass ? g[i].quant_convrot : g[i].quant_int8;
            if (quant) {
                const gen_tensor *bias = NULL;
                char bname[300];
                snprintf(bname, sizeof bname, "%.*s.bias", (int)(strlen(g[i].name) - 7), g[i].name);
                for (int j = 0; j < ng; j++)
                    if (!strcmp(g[j].name, bname)) bias = &g[j];
                check_layer(ctx, c, &g[i], bias, group);
                continue;
            }
            /* Copied byte for byte, same dtype and shape. */
            ql_tensor_info t;
            int64_t ti = ql_checkpoint_find(c, g[i].name);
            CHECK(ti >= 0 && ql_checkpoint_tensor(c, ti, &t) == QL_OK && t.dtype == g[i].st && t.ndim == g[i].ndim &&
                      t.bytes == g[i].bytes && !memcmp(t.data, g[i].data, (size_t)g[i].bytes),
                  "pass %d: %s copied unchanged", pass, g[i].name);
        }
        /* A float layer of the output runs as DENSE. */
        ql_linear *lin = NULL;
        CHECK_OK(ql_linear_from_checkpoint(ctx, c, "embed_tokens", QL_LINEAR_DENSE, &lin));
        ql_linear_destroy(lin);
        ql_checkpoint_close(c);
    }

    /* --include / --exclude (POSIX extended regex on tensor names). */
    const char *out = tpath("sel.safetensors");
    ql_quantize_options opt = {QL_QUANT_INT8, 0, "^blocks\\.0\\.(attn|mlp)\\.", "fc2", 1, NULL, NULL, 0};
    ql_quantize_result r;
    CHECK_OK(ql_checkpoint_quantize(in, out, &opt, &r));
    ql_checkpoint *c = NULL;
    CHECK_OK(ql_checkpoint_open(out, &c));
    CHECK(c && ql_checkpoint_layer_count(c) == 2 && ql_checkpoint_find_layer(c, "blocks.0.attn.qkv") >= 0 &&
              ql_checkpoint_find_layer(c, "blocks.0.mlp.fc1") >= 0,
          "include/exclude selection");
    ql_checkpoint_close(c);
    opt.include = "embed";
    opt.exclude = NULL;
    CHECK_OK(ql_checkpoint_quantize(in, out, &opt, &r));
    CHECK(r.layers_quantized == 1, "--include overrides the embedding rule");
    opt.include = "([unclosed";
    CHECK(ql_checkpoint_quantize(in, out, &opt, &r) == QL_ERR_INVALID_ARGUMENT &&
              strstr(ql_last_error(), "include regex"),
          "bad regex: %s", ql_last_error());
    opt.include = NULL;
    /* Never over the input. */
    CHECK(ql_checkpoint_quantize(in, in, &opt, &r) == QL_ERR_INVALID_ARGUMENT &&
              strstr(ql_last_error(), "refusing to overwrite the input file"),
          "in == out: %s", ql_last_error());
    opt.target = QL_QUANT_INT8_CONVROT;
    opt.group = 100;
    CHECK(ql_checkpoint_quantize(in, out, &opt, &r) == QL_ERR_UNSUPPORTED, "group 100");
    unlink(out);
    /* Group 64 also selects K = 64 (but not K = 100). */
    opt.group = 64;
    CHECK_OK(ql_checkpoint_quantize(in, out, &opt, &r));
    CHECK_OK(ql_checkpoint_open(out, &c));
    if (c) {
        check_layer(ctx, c, &g[11], NULL, 64);
        CHECK(ql_checkpoint_find_layer(c, "odd.k100") < 0, "K = 100 not quantized with group 64");
        ql_checkpoint_close(c);
    }
    unlink(out);

    /* A NaN weight: refused, nothing written, no temp file left. */
    int before = count_entries();
    gen_tensor bad[] = {{"l.weight", QL_F32, QL_ST_F32, 2, {8, 256}, 1, 1, 0, 0}};
    gen_fill(&bad[0]);
    ((float *)bad[0].data)[3 * 256 + 17] = NAN;
    const char *bin = tpath("nan.safetensors");
    write_model(bin, bad, 1, 0);
    opt = (ql_quantize_options){QL_QUANT_INT8_CONVROT, 0, NULL, NULL, 2, NULL, NULL, 0};
    CHECK(ql_checkpoint_quantize(bin, out, &opt, &r) == QL_ERR_NONFINITE &&
              strstr(ql_last_error(), "tensor 'l.weight': row 3 holds (or rotates to) NaN or Inf"),
          "NaN: %s", ql_last_error());
    CHECK(!file_exists(out) && count_entries() == before + 1, "NaN: nothing left behind");
    unlink(bin);
    free(bad[0].data);

    for (int i = 0; i < ng; i++) free(g[i].data);
    ql_context_destroy(ctx);
    unlink(in);
}

static int cancel_cb(void *user, const ql_quantize_progress *p)
{
    int *calls = user;
    (*calls)++;
    return p->bytes_done > 0;
}

static void test_quantize_cancel_and_unaligned(void)
{
    /* Data not aligned for its dtype: a 1-byte tensor in front of it. */
    float w[16 * 256];
    tu_fill_gauss(QL_F32, w, 16 * 256, 0.05);
    raw_tensor t[] = {{"pad", "U8", "[1]", 1, NULL}, {"l.weight", "F32", "[16,256]", sizeof w, w}};
    size_t size;
    unsigned char *b = raw_file(t, 2, NULL, &size);
    const char *in = tpath("unaligned.safetensors"), *out = tpath("unaligned.q.safetensors");
    CHECK(write_file(in, b, size) == 0, "write");
    free(b);
    int calls = 0;
    ql_quantize_options opt = {QL_QUANT_INT8_CONVROT, 0, NULL, NULL, 2, NULL, NULL, 0};
    ql_quantize_result r;
    CHECK_OK(ql_checkpoint_quantize(in, out, &opt, &r));
    ql_checkpoint *c = NULL;
    CHECK_OK(ql_checkpoint_open(out, &c));
    if (c) {
        int8_t rq[16 * 256];
        float rs[16];
        ql_quantize_convrot_weight(QL_F32, w, 16, 256, 256, 256, rq, 256, rs);
        ql_tensor_info ti;
        ql_checkpoint_tensor(c, ql_checkpoint_find(c, "l.weight"), &ti);
        CHECK(!memcmp(ti.data, rq, sizeof rq), "unaligned input: codes equal the reference");
        ql_checkpoint_tensor(c, ql_checkpoint_find(c, "l.weight_scale"), &ti);
        CHECK(!memcmp(ti.data, rs, sizeof rs), "unaligned input: scales equal the reference");
        ql_checkpoint_close(c);
    }
    unlink(out);
    int before = count_entries();
    opt.progress = cancel_cb;
    opt.user = &calls;
    /* The first report comes after the first piece of work. */
    ql_status st = ql_checkpoint_quantize(in, out, &opt, &r);
    CHECK(st == QL_ERR_IO && strstr(ql_last_error(), "cancelled"), "cancel: %s", ql_last_error());
    CHECK(calls == 1, "progress called once (%d)", calls);
    CHECK(!file_exists(out) && count_entries() == before, "cancel left nothing");
    unlink(out);
    unlink(in);
}

int main(void)
{
    tu_init("test_format");
    tmp = make_temp_dir("ql_test_format");
    if (!tmp) {
        printf("cannot create a temp dir: %s\n", strerror(errno));
        return 1;
    }
    test_hostile();
    test_valid_corners();
    test_writer_bytes();
    test_writer_atomic();
    test_writer_vs_reference();
    test_layers();
    test_quantize_roundtrip();
    test_quantize_cancel_and_unaligned();
    rm_tree(tmp);
    free(tmp);
    return tu_finish();
}
