/* Writes the seed corpora of the fuzz targets, one folder each:
 *   DIR/checkpoint  fuzz_checkpoint: valid files from the qlinear writer
 *                   (float tensors, a quantized int8 layer, a ConvRot layer
 *                   with a bias, __metadata__, _quantization_metadata, odd
 *                   dtypes) and a few near-misses;
 *   DIR/layers      fuzz_layers: the same, plus real layers from the
 *                   library's quantizers (ql_checkpoint_quantize for int8,
 *                   ConvRot, W4A8 codebook and uniform, W6A8;
 *                   ql_wxa8_quantize_ex for asymmetric W4A8 with a
 *                   correction and W6A8 with fp32 s_rel), every other known
 *                   format, _quantization_metadata layers (alone and
 *                   alongside a comfy_quant tensor), configurations one
 *                   key away from valid;
 *   DIR/lora        fuzz_lora: LoRA files for its fixed base (lora_base.h)
 *                   in kohya and PEFT names, every prefix, F32/F16/BF16
 *                   matrices, F32/BF16/F64 alphas, unmatched tensors, the
 *                   ambiguous kohya name, mixed conventions, rank 0, two
 *                   modules for one layer, a file that is its own base, and
 *                   the base itself.
 * Usage: fuzz_make_seeds DIR */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"
#include "lora_base.h"
#include "qlinear.h"

static int put(const char *dir, const char *name, const ql_tensor_spec *sp, const void *const *data, int n,
               const char *const *mk, const char *const *mv, int nm)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ql_st_writer *w;
    if (ql_st_writer_open(path, sp, n, mk, mv, nm, NULL, &w) != QL_OK) goto fail;
    for (int i = 0; i < n; i++)
        if (ql_st_writer_write(w, i, 0, data[i], (size_t)ql_st_writer_tensor_bytes(w, i)) != QL_OK) {
            ql_st_writer_abort(w);
            goto fail;
        }
    if (ql_st_writer_finish(w) != QL_OK) goto fail;
    return 0;
fail:
    fprintf(stderr, "fuzz_make_seeds: %s\n", ql_last_error());
    return 1;
}

static int put_raw(const char *dir, const char *name, const char *header, size_t data_len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    uint64_t n = strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)((n >> (8 * i)) & 0xff), f);
    fputs(header, f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i * 37 + 11) & 0xff, f);
    return fclose(f) != 0;
}

/* fuzz_checkpoint's seeds (fuzz_layers starts from them too). */
static int checkpoint_seeds(const char *dir)
{
    int rc = 0;
    float f[64];
    int8_t q[4 * 16];
    float s[4] = {0.01f, 0.02f, 0.5f, 1.0f};
    uint16_t b[4] = {0x3f80, 0x4000, 0xc000, 0};
    for (int i = 0; i < 64; i++) {
        f[i] = (float)(i - 32) / 7.0f;
        q[i] = (int8_t)(i * 5 - 100);
    }
    int64_t s2[] = {2}, s44[] = {4, 16}, s41[] = {4, 1}, s4[] = {4}, s0[] = {0};
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    /* floats + metadata */
    rc |= put(dir, "float.safetensors",
              (ql_tensor_spec[]){{"a.weight", QL_ST_F32, 2, s44}, {"a.bias", QL_ST_BF16, 1, s4}, {"e", QL_ST_F16, 1, s0}},
              (const void *[]){f, b, f}, 3, mk, mv, 1);
    /* plain int8 layer */
    const char *cq = "{\"format\": \"int8_tensorwise\"}";
    int64_t scq[] = {(int64_t)strlen(cq)};
    rc |= put(dir, "int8.safetensors",
              (ql_tensor_spec[]){{"l.weight", QL_ST_I8, 2, s44}, {"l.weight_scale", QL_ST_F32, 2, s41},
                                 {"l.comfy_quant", QL_ST_U8, 1, scq}},
              (const void *[]){q, s, cq}, 3, NULL, NULL, 0);
    /* ConvRot layer (group 16) with a bias, params-nested */
    const char *cq2 = "{\"format\": \"int8_tensorwise\", \"params\": {\"convrot\": true, \"convrot_groupsize\": 16}}";
    int64_t scq2[] = {(int64_t)strlen(cq2)};
    rc |= put(dir, "convrot.safetensors",
              (ql_tensor_spec[]){{"m.l.weight", QL_ST_I8, 2, s44}, {"m.l.weight_scale", QL_ST_F32, 1, s4},
                                 {"m.l.bias", QL_ST_BF16, 1, s4}, {"m.l.comfy_quant", QL_ST_U8, 1, scq2}},
              (const void *[]){q, s, b, cq2}, 4, NULL, NULL, 0);
    /* _quantization_metadata declaration */
    const char *qk[] = {"_quantization_metadata"};
    const char *qv[] = {"{\"format_version\": \"1.0\", \"layers\": {\"l\": {\"format\": \"int8_tensorwise\", "
                        "\"convrot\": true, \"convrot_groupsize\": 16}}}"};
    rc |= put(dir, "qmeta.safetensors",
              (ql_tensor_spec[]){{"l.weight", QL_ST_I8, 2, s44}, {"l.weight_scale", QL_ST_F32, 0, NULL}},
              (const void *[]){q, s}, 2, qk, qv, 1);
    /* other formats and dtypes */
    const char *cq3 = "{\"format\": \"asym_w4a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 256}";
    int64_t scq3[] = {(int64_t)strlen(cq3)}, s8[] = {2, 2};
    rc |= put(dir, "others.safetensors",
              (ql_tensor_spec[]){{"w.weight", QL_ST_I8, 2, s44}, {"w.comfy_quant", QL_ST_U8, 1, scq3},
                                 {"x", QL_ST_F8_E4M3, 1, s2}, {"y", QL_ST_F4, 1, s2}, {"z", QL_ST_C64, 2, s8},
                                 {"u", QL_ST_U64, 1, s2}},
              (const void *[]){q, cq3, q, q, f, f}, 6, NULL, NULL, 0);
    /* W4A8 (codebook) and W6A8 layers, K = 32, group 16, ConvRot 16 */
    const char *cq4 = "{\"format\": \"asym_w4a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 16}";
    const char *cq6 = "{\"format\": \"w6a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 16}";
    uint8_t srel[8] = {0x38, 0x01, 0x7E, 0x40, 0x30, 0x07, 0x50, 0x20}, wq[96];
    for (int i = 0; i < 96; i++) wq[i] = (uint8_t)(i * 29 + 7);
    int64_t scq4[] = {(int64_t)strlen(cq4)}, scq6[] = {(int64_t)strlen(cq6)}, sw4[] = {4, 16}, sw6[] = {4, 24},
            sr[] = {4, 2}, s16[] = {16};
    rc |= put(dir, "w4a8.safetensors",
              (ql_tensor_spec[]){{"w.weight", QL_ST_I8, 2, sw4}, {"w.weight_s_rel", QL_ST_F8_E4M3, 2, sr},
                                 {"w.weight_s_channel", QL_ST_F32, 1, s4}, {"w.weight_codebook", QL_ST_F32, 1, s16},
                                 {"w.comfy_quant", QL_ST_U8, 1, scq4}},
              (const void *[]){wq, srel, s, f, cq4}, 5, NULL, NULL, 0);
    rc |= put(dir, "w6a8.safetensors",
              (ql_tensor_spec[]){{"w.weight", QL_ST_I8, 2, sw6}, {"w.weight_s_rel", QL_ST_U8, 2, sr},
                                 {"w.weight_s_channel", QL_ST_F32, 1, s4}, {"w.bias", QL_ST_BF16, 1, s4},
                                 {"w.comfy_quant", QL_ST_U8, 1, scq6}},
              (const void *[]){wq, srel, s, b, cq6}, 5, NULL, NULL, 0);
    /* near-misses */
    rc |= put_raw(dir, "hole.safetensors",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
                  24);
    rc |= put_raw(dir, "meta.safetensors", "{\"__metadata__\":{\"k\":\"v\",\"n\":1}}", 0);
    rc |= put_raw(dir, "empty.safetensors", "{}", 0);
    return rc;
}

/* ------------------------------------------------------------ helpers */

typedef struct seed_tensor {
    const char *name;
    ql_st_dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
} seed_tensor;

static int put_t(const char *dir, const char *name, const seed_tensor *t, int n, const char *const *mk,
                 const char *const *mv, int nm)
{
    ql_tensor_spec sp[64];
    const void *data[64];
    for (int i = 0; i < n; i++) {
        sp[i] = (ql_tensor_spec){t[i].name, t[i].dtype, t[i].ndim, t[i].shape};
        data[i] = t[i].data;
    }
    return put(dir, name, sp, data, n, mk, mv, nm);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float gauss(void) /* Irwin–Hall, good enough for seeds */
{
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)(rng >> 40) / (float)(1 << 24);
    }
    return (s - 2.0f) * 1.7f;
}

static void fill(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = scale * gauss();
}

static void to_halfs(ql_dtype dt, const float *x, uint16_t *h, int64_t n)
{
    for (int64_t i = 0; i < n; i++) ql_store_f(dt, h, i, x[i]);
}

static char *sub(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    mkdir(p, 0755);
    return p;
}

/* ------------------------------------------------------------ layers */

#define LN 8
#define LK 64

/* A float model: two linears with biases, a norm and an embedding. */
static int float_model(const char *path_dir, const char *name)
{
    static float w0[LN * LK], w1[2 * LN * LK], b0[2 * LN], norm[LK], emb[4 * LK];
    static uint16_t w0h[LN * LK], b0h[LN];
    fill(w0, LN * LK, 0.05f), fill(w1, 2 * LN * LK, 0.05f), fill(b0, 2 * LN, 0.1f), fill(norm, LK, 1.0f);
    fill(emb, 4 * LK, 1.0f);
    to_halfs(QL_BF16, w0, w0h, LN * LK), to_halfs(QL_BF16, b0, b0h, LN);
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    seed_tensor t[] = {{"blocks.0.attn.q.weight", QL_ST_BF16, 2, {LN, LK}, w0h},
                       {"blocks.0.attn.q.bias", QL_ST_BF16, 1, {LN}, b0h},
                       {"blocks.0.mlp.fc1.weight", QL_ST_F32, 2, {2 * LN, LK}, w1},
                       {"blocks.0.mlp.fc1.bias", QL_ST_F32, 1, {2 * LN}, b0},
                       {"blocks.0.norm.weight", QL_ST_F32, 1, {LK}, norm},
                       {"emb.weight", QL_ST_F32, 2, {4, LK}, emb}};
    return put_t(path_dir, name, t, 6, mk, mv, 1);
}

/* A W4A8/W6A8 layer from ql_wxa8_quantize_ex (the modes ql_checkpoint_quantize does not write). */
static int wxa8_file(const char *dir, const char *name, ql_wxa8_mode mode, int64_t group, int64_t crg, int s_rel_f32,
                     ql_st_dtype corr_dt, int sch_2d)
{
    static float w[LN * LK], sch[LN], corr[LN * LK], corr_t[LN * LK], cb[16], bias[LN];
    static uint8_t q[LN * LK], srel[4 * LN * LK];
    static uint16_t corr_h[LN * LK];
    fill(w, LN * LK, 0.05f), fill(bias, LN, 0.1f);
    const int bits = mode == QL_WXA8_6BIT ? 6 : 4;
    const int64_t ng = LK / group, width = bits == 6 ? 3 * LK / 4 : LK / 2;
    ql_wxa8_qparams p = {mode, group, crg, NULL, 0};
    if (mode == QL_WXA8_CODEBOOK) {
        if (ql_wxa8_fit_codebook(QL_F32, w, LN, LK, LK, &p, cb, NULL) != QL_OK) goto fail;
        p.codebook = cb;
    }
    ql_wxa8_qoptions o = {s_rel_f32, 0, 0, 0};
    if (ql_wxa8_quantize_ex(QL_F32, w, LN, LK, LK, &p, &o, q, width, srel, sch, mode == QL_WXA8_ASYM ? corr : NULL) !=
        QL_OK)
        goto fail;
    char cq[256];
    snprintf(cq, sizeof cq, "{\"format\": \"%s\", \"group_size\": %lld, \"convrot_groupsize\": %lld}",
             bits == 6 ? "w6a8_int8" : "asym_w4a8_int8", (long long)group, (long long)crg);
    seed_tensor t[8];
    int n = 0;
    t[n++] = (seed_tensor){"m.l.weight", QL_ST_I8, 2, {LN, width}, q};
    t[n++] = (seed_tensor){"m.l.weight_s_rel", s_rel_f32 ? QL_ST_F32 : QL_ST_F8_E4M3, 2, {LN, ng}, srel};
    t[n++] = sch_2d ? (seed_tensor){"m.l.weight_s_channel", QL_ST_F32, 2, {LN, 1}, sch}
                    : (seed_tensor){"m.l.weight_s_channel", QL_ST_F32, 1, {LN}, sch};
    t[n++] = (seed_tensor){"m.l.bias", QL_ST_F32, 1, {LN}, bias};
    t[n++] = (seed_tensor){"m.l.comfy_quant", QL_ST_U8, 1, {(int64_t)strlen(cq)}, cq};
    if (mode == QL_WXA8_CODEBOOK) t[n++] = (seed_tensor){"m.l.weight_codebook", QL_ST_F32, 1, {16}, cb};
    if (mode == QL_WXA8_ASYM) { /* stored transposed [K/group, N], in the weight's dtype */
        for (int64_t r = 0; r < LN; r++)
            for (int64_t g = 0; g < ng; g++) corr_t[g * LN + r] = corr[r * ng + g];
        if (corr_dt != QL_ST_F32) to_halfs(corr_dt == QL_ST_BF16 ? QL_BF16 : QL_F16, corr_t, corr_h, ng * LN);
        t[n++] = (seed_tensor){"m.l.weight_correction", corr_dt, 2, {ng, LN}, corr_dt == QL_ST_F32 ? (void *)corr_t : corr_h};
    }
    return put_t(dir, name, t, n, NULL, NULL, 0);
fail:
    fprintf(stderr, "fuzz_make_seeds: %s: %s\n", name, ql_last_error());
    return 1;
}

/* Every known format, from tensors and from _quantization_metadata. */
static int formats_file(const char *dir)
{
    static uint8_t b[4096];
    static float s[16];
    for (int i = 0; i < 4096; i++) b[i] = (uint8_t)(i * 131 + 7);
    for (int i = 0; i < 16; i++) s[i] = 0.01f * (float)(i + 1);
    static const char *cq[] = {
        "{\"format\": \"float8_e4m3fn\"}",
        "{\"format\": \"float8_e5m2\", \"full_precision_matrix_mult\": true}",
        "{\"format\": \"nvfp4\", \"group_size\": 16}",
        "{\"format\": \"mxfp8\"}",
        "{\"format\": \"convrot_w4a4\", \"params\": {\"linear_dtype\": \"int4\", \"convrot_groupsize\": 16}}",
        "{\"format\": \"awq_w4a16\", \"group_size\": 64}",
        "{\"format\": \"int8_tensorwise\", \"params\": {\"convrot\": true, \"convrot_groupsize\": 16}}",
    };
    static const char *nm[] = {"f8a", "f8b", "nv", "mx", "cr", "awq", "both"};
    static char names[7][2][32];
    seed_tensor t[32];
    int n = 0;
    for (int i = 0; i < 7; i++) {
        snprintf(names[i][0], 32, "%s.weight", nm[i]);
        snprintf(names[i][1], 32, "%s.comfy_quant", nm[i]);
        ql_st_dtype wd = i < 2 ? (i ? QL_ST_F8_E5M2 : QL_ST_F8_E4M3) : QL_ST_I8;
        t[n++] = (seed_tensor){names[i][0], wd, 2, {4, 16}, b};
        t[n++] = (seed_tensor){names[i][1], QL_ST_U8, 1, {(int64_t)strlen(cq[i])}, cq[i]};
    }
    t[n++] = (seed_tensor){"both.weight_scale", QL_ST_F32, 1, {4}, s};
    t[n++] = (seed_tensor){"meta.weight", QL_ST_I8, 2, {4, 16}, b};
    t[n++] = (seed_tensor){"meta.weight_scale", QL_ST_F32, 1, {1}, s};
    t[n++] = (seed_tensor){"metaw.weight", QL_ST_I8, 2, {4, 16}, b};
    t[n++] = (seed_tensor){"metaw.weight_s_rel", QL_ST_U8, 2, {4, 2}, b};
    t[n++] = (seed_tensor){"metaw.weight_s_channel", QL_ST_F32, 1, {4}, s};
    t[n++] = (seed_tensor){"metaw.weight_correction", QL_ST_BF16, 2, {2, 4}, b};
    const char *mk[] = {"_quantization_metadata", "format"};
    const char *mv[] = {"{\"format_version\": \"1.0\", \"layers\": {"
                        "\"both\": {\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 16}, "
                        "\"meta\": {\"format\": \"int8_tensorwise\"}, "
                        "\"metaw\": {\"format\": \"asym_w4a8_int8\", \"params\": {\"group_size\": 16}, "
                        "\"convrot_groupsize\": 16}, "
                        "\"ghost\": {\"format\": \"nvfp4\"}}}",
                        "pt"};
    return put_t(dir, "formats.safetensors", t, n, mk, mv, 2);
}

/* Configurations one key away from valid (each refused on its own). */
static int config_seeds(const char *dir)
{
    static const char *cq[] = {
        "{\"format\": \"int8_tensorwise\", \"params\": 5}",
        "{\"format\": \"float8_e4m3fn\", \"full_precision_matrix_mult\": \"yes\"}",
        "{\"format\": \"convrot_w4a4\", \"linear_dtype\": 3}",
        "{\"format\": \"asym_w4a8_int8\", \"group_size\": 2097152, \"convrot_groupsize\": 16}",
        "{\"format\": \"asym_w4a8_int8\", \"group_size\": 4, \"convrot_groupsize\": 4}",
    };
    static int8_t q[4 * 16];
    static uint8_t srel[4 * 3];
    static float sc[4] = {0.1f, 0.2f, 0.3f, 0.4f};
    memset(srel, 0x38, sizeof srel);
    int rc = 0;
    for (int i = 0; i < 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "config%d.safetensors", i);
        seed_tensor t[] = {{"c.weight", QL_ST_I8, 2, {4, i == 4 ? 6 : 16}, q},
                           {"c.weight_scale", QL_ST_F32, 1, {4}, sc},
                           {"c.weight_s_rel", QL_ST_F8_E4M3, 2, {4, 3}, srel},
                           {"c.weight_s_channel", QL_ST_F32, 1, {4}, sc},
                           {"c.comfy_quant", QL_ST_U8, 1, {(int64_t)strlen(cq[i])}, cq[i]}};
        rc |= put_t(dir, name, t, 5, NULL, NULL, 0);
    }
    return rc;
}

static int layer_seeds(const char *dir)
{
    int rc = checkpoint_seeds(dir) | config_seeds(dir);
    rc |= float_model(dir, "float_model.safetensors");
    /* ql_checkpoint_quantize on that model, every target */
    char in[1024], out[1024];
    snprintf(in, sizeof in, "%s/float_model.safetensors", dir);
    static const struct {
        ql_quant_target target;
        int64_t group, group_size;
        const char *name;
    } q[] = {{QL_QUANT_INT8, 0, 0, "q_int8.safetensors"},
             {QL_QUANT_INT8_CONVROT, 16, 0, "q_convrot.safetensors"},
             {QL_QUANT_W4A8, 16, 16, "q_w4a8.safetensors"},
             {QL_QUANT_W4A8_UNIFORM, 64, 8, "q_w4a8_uniform.safetensors"},
             {QL_QUANT_W6A8, 16, 32, "q_w6a8.safetensors"}};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        snprintf(out, sizeof out, "%s/%s", dir, q[i].name);
        ql_quantize_options o = {0};
        o.target = q[i].target;
        o.group = q[i].group;
        o.group_size = q[i].group_size;
        o.threads = 1;
        o.include = "^blocks"; /* both linears (norm is 1-D, so never selected) */
        if (ql_checkpoint_quantize(in, out, &o, NULL) != QL_OK) {
            fprintf(stderr, "fuzz_make_seeds: %s: %s\n", q[i].name, ql_last_error());
            rc = 1;
        }
    }
    rc |= wxa8_file(dir, "w4a8_asym_f32corr.safetensors", QL_WXA8_ASYM, 16, 16, 0, QL_ST_F32, 0);
    rc |= wxa8_file(dir, "w4a8_asym_f16corr.safetensors", QL_WXA8_ASYM, 32, 64, 1, QL_ST_F16, 1);
    rc |= wxa8_file(dir, "w4a8_uniform_g4.safetensors", QL_WXA8_UNIFORM, 4, 4, 0, QL_ST_F32, 0);
    rc |= wxa8_file(dir, "w4a8_codebook.safetensors", QL_WXA8_CODEBOOK, 16, 16, 0, QL_ST_F32, 1);
    rc |= wxa8_file(dir, "w6a8_f32srel.safetensors", QL_WXA8_6BIT, 32, 64, 1, QL_ST_F32, 1);
    rc |= formats_file(dir);
    return rc;
}

/* ------------------------------------------------------------ LoRA */

#define LR 2 /* rank */

static int lora_seeds(const char *dir)
{
    int rc = 0;
    static float down[FZ_N_BASE][LR * 64], up[FZ_N_BASE][64 * LR];
    static uint16_t down_h[FZ_N_BASE][LR * 64], up_h[FZ_N_BASE][64 * LR];
    static char names[4][FZ_N_BASE][3][160];
    static const float alpha = 1.5f;
    static const double alpha64 = 3.0;
    static const uint16_t alpha_bf = 0x4000; /* 2.0 */
    for (int l = 0; l < FZ_N_BASE; l++) {
        fill(down[l], LR * 64, 0.1f), fill(up[l], 64 * LR, 0.1f);
        to_halfs(l % 2 ? QL_F16 : QL_BF16, down[l], down_h[l], LR * 64);
        to_halfs(l % 2 ? QL_F16 : QL_BF16, up[l], up_h[l], 64 * LR);
    }
    /* scheme 0: kohya, the base's path; 1: kohya with the base's own prefix;
     * 2: PEFT, the path; 3: PEFT, "diffusion_model." + path */
    for (int scheme = 0; scheme < 4; scheme++) {
        seed_tensor t[64];
        int n = 0;
        for (int l = 0; l < FZ_N_BASE; l++) {
            const fz_base_layer *b = &fz_base_layers[l];
            if (b->kind == FZ_FP8 || b->kind == FZ_NOT_LINEAR || b->path[0] == 'a') continue;
            char mod[128];
            if (scheme < 2) {
                snprintf(mod, sizeof mod, "lora_unet_%s", scheme ? b->prefix : b->path);
                for (char *c = mod + 10; *c; c++)
                    if (*c == '.') *c = '_';
            } else {
                snprintf(mod, sizeof mod, "%s%s", scheme == 3 ? "diffusion_model." : "", b->path);
            }
            snprintf(names[scheme][l][0], 160, "%s.%s", mod, scheme < 2 ? "lora_down.weight" : "lora_A.weight");
            snprintf(names[scheme][l][1], 160, "%s.%s", mod, scheme < 2 ? "lora_up.weight" : "lora_B.weight");
            snprintf(names[scheme][l][2], 160, "%s.alpha", mod);
            int half = (l + scheme) % 3;
            ql_st_dtype dt = half == 0 ? QL_ST_F32 : l % 2 ? QL_ST_F16 : QL_ST_BF16;
            t[n++] = (seed_tensor){names[scheme][l][0], dt, 2, {LR, b->k}, half ? (void *)down_h[l] : down[l]};
            t[n++] = (seed_tensor){names[scheme][l][1], dt, 2, {b->n, LR}, half ? (void *)up_h[l] : up[l]};
            if ((l + scheme) % 4 == 0) t[n++] = (seed_tensor){names[scheme][l][2], QL_ST_F32, 0, {0}, &alpha};
            else if ((l + scheme) % 4 == 1) t[n++] = (seed_tensor){names[scheme][l][2], QL_ST_BF16, 1, {1}, &alpha_bf};
            else if ((l + scheme) % 4 == 2) t[n++] = (seed_tensor){names[scheme][l][2], QL_ST_F64, 0, {0}, &alpha64};
        }
        if (scheme == 2) { /* tensors that match nothing */
            t[n++] = (seed_tensor){"text_encoder.x.lora_A.weight", QL_ST_F32, 2, {LR, 4}, down[0]};
            t[n++] = (seed_tensor){"lora_te_x.lora_up.weight", QL_ST_F32, 2, {4, LR}, up[0]};
            t[n++] = (seed_tensor){"scale", QL_ST_F32, 0, {0}, &alpha};
        }
        char name[64];
        snprintf(name, sizeof name, "lora_%s%d.safetensors", scheme < 2 ? "kohya" : "peft", scheme % 2);
        const char *mk[] = {"ss_network_dim"}, *mv[] = {"2"};
        rc |= put_t(dir, name, t, n, mk, mv, scheme == 0);
    }
    /* the kohya name both a.b_c and a_b.c answer to; the PEFT names are not ambiguous */
    seed_tensor amb[] = {{"lora_unet_a_b_c.lora_down.weight", QL_ST_F32, 2, {LR, 4}, down[0]},
                         {"lora_unet_a_b_c.lora_up.weight", QL_ST_F32, 2, {4, LR}, up[0]}};
    rc |= put_t(dir, "lora_ambiguous.safetensors", amb, 2, NULL, NULL, 0);
    seed_tensor peft_ab[] = {{"a.b_c.lora_A.weight", QL_ST_F32, 2, {LR, 4}, down[0]},
                             {"a.b_c.lora_B.weight", QL_ST_F32, 2, {4, LR}, up[0]},
                             {"a_b.c.lora_A.weight", QL_ST_F16, 2, {1, 4}, down_h[1]},
                             {"a_b.c.lora_B.weight", QL_ST_F16, 2, {4, 1}, up_h[1]}};
    rc |= put_t(dir, "lora_peft_ab.safetensors", peft_ab, 4, NULL, NULL, 0);
    /* rank 0 */
    seed_tensor rank0[] = {{"lora_unet_blocks_0_attn_q.lora_down.weight", QL_ST_F32, 2, {0, 16}, down[0]},
                           {"lora_unet_blocks_0_attn_q.lora_up.weight", QL_ST_F32, 2, {8, 0}, up[0]}};
    rc |= put_t(dir, "lora_rank0.safetensors", rank0, 2, NULL, NULL, 0);
    /* mixed conventions for one module (unmatched), beside a PEFT module */
    seed_tensor mixed[] = {{"lora_unet_blocks_0_attn_q.lora_down.weight", QL_ST_F32, 2, {LR, 16}, down[0]},
                           {"lora_unet_blocks_0_attn_q.lora_B.weight", QL_ST_F32, 2, {8, LR}, up[0]},
                           {"blocks.0.attn.q.lora_A.weight", QL_ST_F32, 2, {LR, 16}, down[0]},
                           {"blocks.0.attn.q.lora_B.weight", QL_ST_F32, 2, {8, LR}, up[0]}};
    rc |= put_t(dir, "lora_mixed.safetensors", mixed, 4, NULL, NULL, 0);
    /* two modules (kohya and PEFT) for one layer */
    seed_tensor twice[] = {{"lora_unet_blocks_0_attn_q.lora_down.weight", QL_ST_F32, 2, {LR, 16}, down[0]},
                           {"lora_unet_blocks_0_attn_q.lora_up.weight", QL_ST_F32, 2, {8, LR}, up[0]},
                           {"blocks.0.attn.q.lora_A.weight", QL_ST_F32, 2, {LR, 16}, down[0]},
                           {"blocks.0.attn.q.lora_B.weight", QL_ST_F32, 2, {8, LR}, up[0]}};
    rc |= put_t(dir, "lora_twice.safetensors", twice, 4, NULL, NULL, 0);
    /* a file that is its own base: an int8 layer, a float layer and their LoRAs */
    static int8_t q[8 * 16];
    static float s[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    const char *cq = "{\"format\": \"int8_tensorwise\"}";
    seed_tensor self[] = {{"x.y.weight", QL_ST_I8, 2, {8, 16}, q},
                          {"x.y.weight_scale", QL_ST_F32, 1, {8}, s},
                          {"x.y.comfy_quant", QL_ST_U8, 1, {(int64_t)strlen(cq)}, cq},
                          {"lora_unet_x_y.lora_down.weight", QL_ST_F32, 2, {LR, 16}, down[0]},
                          {"lora_unet_x_y.lora_up.weight", QL_ST_F32, 2, {8, LR}, up[0]},
                          {"lora_unet_x_y.alpha", QL_ST_F32, 0, {0}, &alpha},
                          {"transformer.f.weight", QL_ST_F32, 2, {4, 4}, down[1]},
                          {"f.lora_A.weight", QL_ST_F32, 2, {1, 4}, down[2]},
                          {"f.lora_B.weight", QL_ST_F32, 2, {4, 1}, up[2]}};
    rc |= put_t(dir, "lora_self.safetensors", self, 9, NULL, NULL, 0);
    /* the base itself */
    size_t bn = 0;
    unsigned char *bimg = fz_lora_base(&bn);
    char path[1024];
    snprintf(path, sizeof path, "%s/base.safetensors", dir);
    FILE *f = fopen(path, "wb");
    rc |= !f || fwrite(bimg, 1, bn, f) != bn;
    if (f) rc |= fclose(f) != 0;
    free(bimg);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
        return 2;
    }
    mkdir(argv[1], 0755);
    char *c = sub(argv[1], "checkpoint"), *l = sub(argv[1], "layers"), *r = sub(argv[1], "lora");
    int rc = checkpoint_seeds(c) | layer_seeds(l) | lora_seeds(r);
    free(c), free(l), free(r);
    return rc;
}
