/* LoRA files and merging: the stochastic-rounding stream against
 * hand-computed pcg-hash values and CRC-32 of known keys; merges (nearest and
 * stochastic) against an in-test recomputation of the documented arithmetic,
 * code for code, and against float64 within the quantization step; kohya
 * and PEFT names give byte-identical merges; strength 0 leaves the file's
 * tensors as they were; untouched tensors are copied byte for byte; the
 * unmerged path, the merged path and float64 agree within the documented
 * bounds; hostile LoRA files fail with one message naming file and tensor,
 * and the command (argv[1] = path to qlinear) writes nothing then.
 * Usage: test_merge [EMULATOR [OPTIONS]] PATH/TO/qlinear (a cross build's tool runs
 * through its emulator). */
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qlinear.h"
#include "testutil.h"

static char tmpdir[256];
static const char *qlinear;
static char **cmd; /* the command line that runs qlinear (argv + 1) */

static char *tp(const char *name)
{
    static char buf[8][512];
    static int i;
    i = (i + 1) % 8;
    snprintf(buf[i], sizeof buf[i], "%s/%s", tmpdir, name);
    return buf[i];
}

/* ---- writing test files */

typedef struct tensor {
    const char *name;
    ql_st_dtype dt;
    int ndim;
    int64_t shape[2];
    const void *data;
} tensor;

static size_t nbytes(const tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return (size_t)n * (size_t)(ql_st_dtype_bits(t->dt) / 8);
}

static void write_st(const char *path, const tensor *t, int n, const char *mk, const char *mv)
{
    ql_tensor_spec specs[64] = {{0}};
    for (int i = 0; i < n; i++) specs[i] = (ql_tensor_spec){t[i].name, t[i].dt, t[i].ndim, t[i].shape};
    ql_st_writer *w = NULL;
    const char *keys[1] = {mk}, *vals[1] = {mv};
    CHECK_OK(ql_st_writer_open(path, specs, n, keys, vals, mk ? 1 : 0, NULL, &w));
    for (int i = 0; w && i < n; i++) CHECK_OK(ql_st_writer_write(w, i, 0, t[i].data, nbytes(&t[i])));
    if (w) CHECK_OK(ql_st_writer_finish(w));
}

/* ---- the base checkpoint: three int8 layers that LoRAs target (ConvRot,
 * row-wise, tensor-wise), one float layer, one untouched int8 layer */

#define NL 5
static const char *lname[NL] = {"model.diffusion_model.blocks.0.attn.q", "model.diffusion_model.blocks.0.mlp.fc1",
                                "model.diffusion_model.blocks.1.proj", "model.diffusion_model.final.linear",
                                "model.diffusion_model.blocks.1.other"};
static const char *lpath[NL] = {"blocks.0.attn.q", "blocks.0.mlp.fc1", "blocks.1.proj", "final.linear", "blocks.1.other"};
static const int64_t ln[NL] = {24, 40, 16, 8, 8}, lk[NL] = {64, 48, 32, 32, 32}, lgroup[NL] = {16, 0, 0, 0, 0};
static const int lkind[NL] = {0, 0, 1, 2, 0}; /* 0 row-wise int8, 1 tensor-wise int8, 2 float bf16 */
static int8_t *bq[NL];
static float *bs[NL];
static uint16_t *bw16, *bbias;
static float *norm;
#define RK0 8
#define RK1 3
#define RK3 5
static const int64_t lrank[NL] = {RK0, RK1, 1, RK3, 0};
static float *ldown[NL], *lup[NL];
static const float lalpha[NL] = {4.0f, 0.0f /* none */, 2.0f, 5.0f, 0};

static void make_base(const char *path)
{
    tensor t[32];
    int n = 0;
    static char names[NL][3][128];
    static const char *cq_conv = "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 16}";
    static const char *cq_plain = "{\"format\": \"int8_tensorwise\"}";
    for (int l = 0; l < NL; l++) {
        const int64_t N = ln[l], K = lk[l];
        snprintf(names[l][0], 128, "%s.weight", lname[l]);
        snprintf(names[l][1], 128, "%s.weight_scale", lname[l]);
        snprintf(names[l][2], 128, "%s.comfy_quant", lname[l]);
        if (lkind[l] == 2) {
            bw16 = malloc((size_t)(N * K) * 2);
            tu_fill_gauss(QL_BF16, bw16, N * K, 0.05);
            t[n++] = (tensor){names[l][0], QL_ST_BF16, 2, {N, K}, bw16};
            continue;
        }
        /* quantize random float weights so codes and scales are realistic */
        float *w = malloc((size_t)(N * K) * 4);
        tu_fill_gauss(QL_F32, w, N * K, 0.05);
        bq[l] = malloc((size_t)(N * K));
        bs[l] = malloc((size_t)N * 4);
        if (lgroup[l]) CHECK_OK(ql_quantize_convrot_weight(QL_F32, w, N, K, K, lgroup[l], bq[l], K, bs[l]));
        else if (lkind[l] == 1) CHECK_OK(ql_quantize_tensorwise(QL_F32, w, N, K, K, bq[l], K, bs[l]));
        else CHECK_OK(ql_quantize_rowwise(QL_F32, w, N, K, K, bq[l], K, bs[l]));
        free(w);
        t[n++] = (tensor){names[l][0], QL_ST_I8, 2, {N, K}, bq[l]};
        if (lkind[l] == 1) t[n++] = (tensor){names[l][1], QL_ST_F32, 0, {0, 0}, bs[l]};
        else if (l == 1) t[n++] = (tensor){names[l][1], QL_ST_F32, 1, {N, 0}, bs[l]};
        else t[n++] = (tensor){names[l][1], QL_ST_F32, 2, {N, 1}, bs[l]};
        const char *cq = lgroup[l] ? cq_conv : cq_plain;
        t[n++] = (tensor){names[l][2], QL_ST_U8, 1, {(int64_t)strlen(cq), 0}, cq};
    }
    bbias = malloc(24 * 2);
    tu_fill_gauss(QL_BF16, bbias, 24, 0.1);
    t[n++] = (tensor){"model.diffusion_model.blocks.0.attn.q.bias", QL_ST_BF16, 1, {24, 0}, bbias};
    norm = malloc(64 * 4);
    tu_fill_gauss(QL_F32, norm, 64, 1.0);
    t[n++] = (tensor){"model.diffusion_model.blocks.0.norm.weight", QL_ST_F32, 1, {64, 0}, norm};
    write_st(path, t, n, "format", "pt");
}

static void make_lora_data(void)
{
    for (int l = 0; l < NL; l++) {
        if (!lrank[l]) continue;
        ldown[l] = malloc((size_t)(lrank[l] * lk[l]) * 4);
        lup[l] = malloc((size_t)(ln[l] * lrank[l]) * 4);
        tu_fill_gauss(QL_F32, ldown[l], lrank[l] * lk[l], 0.2);
        tu_fill_gauss(QL_F32, lup[l], ln[l] * lrank[l], 0.03);
    }
}

/* kohya (lora_unet_..., with a prefix on the LoRA side for one module) or
 * PEFT (lora_A/lora_B, "transformer." prefix) */
static void make_lora(const char *path, int peft, int extra_unmatched)
{
    static char names[NL][3][160];
    static float alpha_store[NL];
    tensor t[32];
    int n = 0;
    for (int l = 0; l < NL; l++) {
        if (!lrank[l]) continue;
        char mod[128];
        if (peft) snprintf(mod, sizeof mod, "%s%s", l == 2 ? "diffusion_model." : "transformer.", lpath[l]);
        else {
            snprintf(mod, sizeof mod, "lora_unet_%s%s", l == 2 ? "diffusion_model_" : "", lpath[l]);
            for (char *p = mod + 10; *p; p++)
                if (*p == '.') *p = '_';
        }
        snprintf(names[l][0], 160, "%s.%s", mod, peft ? "lora_A.weight" : "lora_down.weight");
        snprintf(names[l][1], 160, "%s.%s", mod, peft ? "lora_B.weight" : "lora_up.weight");
        snprintf(names[l][2], 160, "%s.alpha", mod);
        t[n++] = (tensor){names[l][0], QL_ST_F32, 2, {lrank[l], lk[l]}, ldown[l]};
        t[n++] = (tensor){names[l][1], QL_ST_F32, 2, {ln[l], lrank[l]}, lup[l]};
        alpha_store[l] = lalpha[l];
        if (lalpha[l] != 0.0f) t[n++] = (tensor){names[l][2], QL_ST_F32, 0, {0, 0}, &alpha_store[l]};
    }
    static float junk[4] = {1, 2, 3, 4};
    if (extra_unmatched) {
        t[n++] = (tensor){"lora_te_text_model_encoder_layers_0_q.lora_down.weight", QL_ST_F32, 2, {2, 2}, junk};
        t[n++] = (tensor){"lora_te_text_model_encoder_layers_0_q.lora_up.weight", QL_ST_F32, 2, {2, 2}, junk};
        t[n++] = (tensor){"blocks.7.missing.lora_A.weight", QL_ST_F32, 2, {1, 4}, junk};
        t[n++] = (tensor){"some.other.tensor", QL_ST_F32, 1, {4, 0}, junk};
    }
    write_st(path, t, n, "ss_network_dim", "8");
}

/* ---- an independent model of the stochastic quantizer */

static uint32_t model_pcg(uint32_t x)
{
    uint64_t state = ((uint64_t)x * 747796405u + 2891336453u) & 0xFFFFFFFFu;
    uint64_t word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737u) & 0xFFFFFFFFu;
    return (uint32_t)((word >> 22) ^ word);
}
static double model_noise(int64_t idx, uint64_t seed)
{
    uint64_t key = (uint64_t)idx + seed;
    return ldexp((double)(model_pcg((uint32_t)(key & 0xFFFFFFFFu) ^ (uint32_t)(key >> 32)) >> 8), -24);
}
static int8_t model_sr_code(float v, float a, int64_t idx, uint64_t seed)
{
    float s = (float)((double)fminf(a, FLT_MAX) * (double)(1.0f / 127.0f)); /* one fp32 rounding */
    if (s < 1e-30f) s = 1e-30f;
    float y = (float)((double)v / (double)s);
    double q = seed ? floor((double)(float)((double)y + model_noise(idx, seed))) : nearbyint((double)y);
    return (int8_t)(q > 127 ? 127 : q < -128 ? -128 : q);
}

static uint32_t table_crc(const unsigned char *s, size_t n)
{
    uint32_t t[256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[i] = c;
    }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = t[(c ^ s[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static void test_stream(void)
{
    /* pcg_hash values computed by hand (mod 2^32 arithmetic) */
    static const uint32_t in[] = {0, 1, 2, 0xdeadbeef, 0xffffffff, 12345};
    static const uint32_t out[] = {0x07bb2fe2, 0xa8beea3c, 0x7a7ecc88, 0x67299972, 0xe62a4902, 0xf45ead0e};
    for (int i = 0; i < 6; i++)
        CHECK(ql_pcg_hash(in[i]) == out[i], "pcg_hash(%#x) = %#x, expected %#x", in[i], ql_pcg_hash(in[i]), out[i]);
    CHECK(ql_crc32_key("123456789") == 0xCBF43926u, "CRC-32 check value: %#x", ql_crc32_key("123456789"));
    CHECK(ql_crc32_key("") == 0, "CRC-32 of the empty key");
    const char *key = "diffusion_model.blocks.0.attn.q.weight";
    CHECK(ql_crc32_key(key) == 0x2ef740aau && ql_crc32_key(key) == table_crc((const unsigned char *)key, strlen(key)),
          "CRC-32 of %s: %#x", key, ql_crc32_key(key));
    CHECK(ql_crc32_key("\xc3\xa9") == 0x0bd4b551u, "CRC-32 over code points (U+00E9): %#x", ql_crc32_key("\xc3\xa9"));
    /* the noise folds idx + seed to 32 bits: check across the 2^32 boundary */
    const int64_t idxs[] = {0, 1, 4095, (1ll << 32) - 5, (1ll << 32) + 3, 123456789012ll};
    const uint64_t seeds[] = {1, 0x2ef740aau, 0xFFFFFFFFu};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            CHECK((double)ql_sr_noise(idxs[i], seeds[j]) == model_noise(idxs[i], seeds[j]), "noise(%lld, %llu)",
                  (long long)idxs[i], (unsigned long long)seeds[j]);
    /* the quantizer against the model, random rows incl. exact code steps */
    const int64_t rows = 7, k = 300;
    float *x = malloc((size_t)(rows * k) * 4), *s = malloc((size_t)rows * 4);
    int8_t *q = malloc((size_t)(rows * k));
    tu_fill_gauss(QL_F32, x, rows * k, 3.0);
    for (int64_t i = 0; i < k; i += 7) x[k + i] = (float)(i % 50) * (x[k] / 127.0f);
    const uint64_t seed = tu_range(1, 0xFFFFFFFFll);
    CHECK_OK(ql_quantize_rowwise_sr(x, rows, k, k, 1000, seed, q, k, s));
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        float a = 0;
        for (int64_t j = 0; j < k; j++) a = fmaxf(a, fabsf(x[r * k + j]));
        for (int64_t j = 0; j < k; j++) bad += q[r * k + j] != model_sr_code(x[r * k + j], a, 1000 + r * k + j, seed);
    }
    CHECK(bad == 0, "stochastic codes: %lld of %lld differ from the model", (long long)bad, (long long)(rows * k));
    /* the same where idx + seed crosses 2^32 inside a row (the folded key wraps) */
    const int64_t idx1 = (int64_t)((1ull << 32) - seed) - 157;
    CHECK_OK(ql_quantize_rowwise_sr(x, rows, k, k, idx1, seed, q, k, s));
    bad = 0;
    for (int64_t r = 0; r < rows; r++) {
        float a = 0;
        for (int64_t j = 0; j < k; j++) a = fmaxf(a, fabsf(x[r * k + j]));
        for (int64_t j = 0; j < k; j++) bad += q[r * k + j] != model_sr_code(x[r * k + j], a, idx1 + r * k + j, seed);
    }
    CHECK(bad == 0, "stochastic codes across 2^32: %lld differ from the model", (long long)bad);
    /* unbiased: v = 0.3 s rounds up 30% of the time */
    float *v = malloc(20000 * 4);
    int8_t *qv = malloc(20000);
    for (int i = 0; i < 20000; i++) v[i] = i == 0 ? 127.0f : 0.3f;
    float sv;
    CHECK_OK(ql_quantize_rowwise_sr(v, 1, 20000, 20000, 0, seed, qv, 20000, &sv));
    double mean = 0;
    for (int i = 1; i < 20000; i++) mean += qv[i];
    mean /= 19999;
    CHECK(fabs(mean - 0.3) < 0.02, "stochastic rounding of 0.3 averages %.4f", mean);
    free(x); free(s); free(q); free(v); free(qv);
}

/* ---- merged weights recomputed in the test */

static const void *tdata(const ql_checkpoint *c, const char *name, ql_tensor_info *ti)
{
    int64_t i = ql_checkpoint_find(c, name);
    CHECK(i >= 0, "tensor %s missing", name);
    if (i < 0) return NULL;
    ql_checkpoint_tensor(c, i, ti);
    return ti->data;
}

/* merged fp32 weight of layer l (un-rotated), the documented arithmetic */
static float *expected_merged(int l, double strength)
{
    const int64_t N = ln[l], K = lk[l], R = lrank[l];
    float *w = malloc((size_t)(N * K) * 4);
    if (lkind[l] == 2)
        for (int64_t i = 0; i < N * K; i++) w[i] = ql_bf16_to_fp32(bw16[i]);
    else
        CHECK_OK(ql_dequantize(bq[l], N, K, K, bs[l], lkind[l] == 1 ? 1 : N, lgroup[l], QL_F32, w, K));
    const float c = (float)(strength * ((lalpha[l] != 0.0f ? lalpha[l] : (double)R) / (double)R));
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < K; j++) {
            float acc = 0.0f;
            for (int64_t r = 0; r < R; r++) {
                float p = lup[l][n * R + r] * ldown[l][r * K + j];
                acc = acc + p;
            }
            float d = c * acc;
            w[n * K + j] = w[n * K + j] + d;
        }
    return w;
}

static void check_merged(const char *out, int stochastic, double strength, const char *what)
{
    ql_checkpoint *c = NULL, *b = NULL;
    CHECK_OK(ql_checkpoint_open(out, &c));
    CHECK_OK(ql_checkpoint_open(tp("base.safetensors"), &b));
    if (!c || !b) return;
    CHECK(ql_checkpoint_tensor_count(c) == ql_checkpoint_tensor_count(b), "%s: tensor count", what);
    const char *mv = ql_checkpoint_metadata_get(c, "format");
    CHECK(mv && !strcmp(mv, "pt"), "%s: __metadata__ kept", what);
    /* untouched tensors byte for byte */
    for (int64_t i = 0; i < ql_checkpoint_tensor_count(b); i++) {
        ql_tensor_info bt, ot;
        ql_checkpoint_tensor(b, i, &bt);
        int touched = 0;
        for (int l = 0; l < NL; l++) {
            char w1[160], w2[160];
            snprintf(w1, sizeof w1, "%s.weight", lname[l]);
            snprintf(w2, sizeof w2, "%s.weight_scale", lname[l]);
            touched |= lrank[l] && strength != 0.0 && (!strcmp(bt.name, w1) || !strcmp(bt.name, w2));
        }
        const void *od = tdata(c, bt.name, &ot);
        if (!od) continue;
        CHECK(ot.dtype == bt.dtype && ot.ndim == bt.ndim && ot.bytes == bt.bytes, "%s: %s changed its dtype or shape", what,
              bt.name);
        if (!touched)
            CHECK(ot.bytes == bt.bytes && !memcmp(od, bt.data, (size_t)bt.bytes), "%s: untouched %s not copied byte for byte",
                  what, bt.name);
    }
    if (strength == 0.0) goto out;
    /* touched layers: the codes and scales of the documented arithmetic */
    for (int l = 0; l < NL; l++) {
        if (!lrank[l]) continue;
        const int64_t N = ln[l], K = lk[l];
        float *w = expected_merged(l, strength);
        char nm[160];
        ql_tensor_info ti;
        snprintf(nm, sizeof nm, "%s.weight", lname[l]);
        const void *od = tdata(c, nm, &ti);
        if (lkind[l] == 2) {
            int64_t bad = 0;
            for (int64_t i = 0; i < N * K; i++) {
                uint16_t h;
                memcpy(&h, (const char *)od + 2 * i, 2);
                bad += h != ql_fp32_to_bf16(w[i]);
            }
            CHECK(bad == 0, "%s: float layer %s: %lld values differ", what, lname[l], (long long)bad);
            free(w);
            continue;
        }
        int8_t *q = malloc((size_t)(N * K));
        float *s = malloc((size_t)N * 4);
        char key[200];
        snprintf(key, sizeof key, "diffusion_model.%s.weight", lpath[l]);
        const uint64_t seed = ql_crc32_key(key);
        if (!stochastic) {
            if (lgroup[l]) CHECK_OK(ql_quantize_convrot_weight(QL_F32, w, N, K, K, lgroup[l], q, K, s));
            else if (lkind[l] == 1) CHECK_OK(ql_quantize_tensorwise(QL_F32, w, N, K, K, q, K, s));
            else CHECK_OK(ql_quantize_rowwise(QL_F32, w, N, K, K, q, K, s));
        } else {
            if (lgroup[l]) CHECK_OK(ql_rotate(QL_F32, w, N, K, K, lgroup[l]));
            float ga = 0;
            for (int64_t i = 0; i < N * K; i++) ga = fmaxf(ga, fabsf(w[i]));
            for (int64_t n = 0; n < N; n++) {
                float a = 0;
                for (int64_t j = 0; j < K; j++) a = fmaxf(a, fabsf(w[n * K + j]));
                if (lkind[l] == 1) a = ga;
                for (int64_t j = 0; j < K; j++) q[n * K + j] = model_sr_code(w[n * K + j], a, n * K + j, seed);
                float sc = (float)((double)fminf(a, FLT_MAX) * (double)(1.0f / 127.0f));
                s[n] = sc < 1e-30f ? 1e-30f : sc;
            }
        }
        int64_t bad = 0;
        for (int64_t i = 0; i < N * K; i++) bad += ((const int8_t *)od)[i] != q[i];
        snprintf(nm, sizeof nm, "%s.weight_scale", lname[l]);
        const float *os = tdata(c, nm, &ti);
        int64_t bads = 0;
        for (int64_t i = 0; os && i < (lkind[l] == 1 ? 1 : N); i++) {
            float v;
            memcpy(&v, os + i, 4);
            bads += memcmp(&v, &s[i], 4) != 0;
        }
        CHECK(bad == 0 && bads == 0, "%s: layer %s: %lld codes and %lld scales differ from the documented arithmetic",
              what, lname[l], (long long)bad, (long long)bads);
        /* against float64: |dequantized - (W + Δ)| within one step (two for
         * stochastic) of the new scale, per element */
        float *dq = malloc((size_t)(N * K) * 4);
        float *sc = malloc((size_t)N * 4);
        for (int64_t i = 0; os && i < (lkind[l] == 1 ? 1 : N); i++) memcpy(&sc[i], os + i, 4);
        CHECK_OK(ql_dequantize(od, N, K, K, sc, lkind[l] == 1 ? 1 : N, lgroup[l], QL_F32, dq, K));
        double worst = 0;
        /* the merged weight (fp32 documented arithmetic, un-rotated) is
         * within fp32 rounding of float64; the output within its step */
        float *wm = expected_merged(l, strength);
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < K; j++) {
                const double step = sc[lkind[l] == 1 ? 0 : n] * (lgroup[l] ? sqrt((double)lgroup[l]) : 1.0);
                worst = fmax(worst, fabs((double)dq[n * K + j] - wm[n * K + j]) / step);
            }
        CHECK(worst <= (stochastic ? 1.0 : 0.5) + 1e-3, "%s: layer %s: merged weight off by %.3f steps", what, lname[l],
              worst);
        free(wm); free(dq); free(sc);
        free(q); free(s); free(w);
    }
out:
    ql_checkpoint_close(c);
    ql_checkpoint_close(b);
}

static int files_equal(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int eq = fa && fb;
    while (eq) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) eq = 0;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return eq;
}

static void test_merge(void)
{
    make_base(tp("base.safetensors"));
    make_lora_data();
    make_lora(tp("kohya.safetensors"), 0, 1);
    make_lora(tp("peft.safetensors"), 1, 0);
    ql_merge_options opt = {1, NULL, 2, NULL, NULL};
    ql_merge_result r;
    for (int sr = 0; sr < 2; sr++) {
        opt.stochastic = sr;
        static char kp[512], pp[512];
        snprintf(kp, sizeof kp, "%s", tp("kohya.safetensors"));
        snprintf(pp, sizeof pp, "%s", tp("peft.safetensors"));
        ql_lora_input k = {kp, 0.75}, p = {pp, 0.75};
        CHECK_OK(ql_checkpoint_merge_lora(tp("base.safetensors"), &k, 1, tp("mk.safetensors"), &opt, &r));
        CHECK(r.layers_merged == 4, "layers merged: %lld", (long long)r.layers_merged);
        CHECK_OK(ql_checkpoint_merge_lora(tp("base.safetensors"), &p, 1, tp("mp.safetensors"), &opt, &r));
        CHECK(files_equal(tp("mk.safetensors"), tp("mp.safetensors")), "%s: kohya and PEFT merges differ",
              sr ? "stochastic" : "nearest");
        check_merged(tp("mk.safetensors"), sr, 0.75, sr ? "stochastic merge" : "nearest merge");
        /* thread count does not matter */
        opt.threads = 1;
        CHECK_OK(ql_checkpoint_merge_lora(tp("base.safetensors"), &p, 1, tp("m1.safetensors"), &opt, &r));
        opt.threads = 2;
        CHECK(files_equal(tp("m1.safetensors"), tp("mp.safetensors")), "1 and 2 threads differ");
    }
    /* strength 0 changes nothing */
    ql_lora_input z = {tp("kohya.safetensors"), 0.0};
    CHECK_OK(ql_checkpoint_merge_lora(tp("base.safetensors"), &z, 1, tp("m0.safetensors"), &opt, &r));
    check_merged(tp("m0.safetensors"), 1, 0.0, "strength 0");
    /* never over an input */
    CHECK(ql_checkpoint_merge_lora(tp("base.safetensors"), &z, 1, tp("kohya.safetensors"), &opt, &r) != QL_OK &&
              strstr(ql_last_error(), "input"),
          "writing over the LoRA: %s", ql_last_error());
    CHECK(ql_checkpoint_merge_lora(tp("base.safetensors"), &z, 1, tp("base.safetensors"), &opt, &r) != QL_OK,
          "writing over the base");
    /* the plan lists the unmatched tensors */
    ql_checkpoint *b = NULL, *lc = NULL;
    ql_lora_plan *plan = NULL;
    CHECK_OK(ql_checkpoint_open(tp("base.safetensors"), &b));
    CHECK_OK(ql_checkpoint_open(tp("kohya.safetensors"), &lc));
    CHECK_OK(ql_lora_plan_create(b, lc, &plan));
    CHECK(ql_lora_plan_module_count(plan) == 4 && ql_lora_plan_unmatched_count(plan) == 4, "plan: %lld matched, %lld unmatched",
          (long long)ql_lora_plan_module_count(plan), (long long)ql_lora_plan_unmatched_count(plan));
    ql_lora_plan_destroy(plan);
    ql_checkpoint_close(lc);
    ql_checkpoint_close(b);
}

/* ---- unmerged vs merged vs float64 on the ConvRot layer */

static void test_paths_vs_float64(void)
{
    ql_checkpoint *b = NULL, *m = NULL;
    CHECK_OK(ql_checkpoint_open(tp("base.safetensors"), &b));
    ql_merge_options opt = {0, NULL, 2, NULL, NULL};
    ql_lora_input in = {tp("peft.safetensors"), 1.0};
    ql_merge_result r;
    for (int sr = 0; sr < 2; sr++) {
        opt.stochastic = sr;
        CHECK_OK(ql_checkpoint_merge_lora(tp("base.safetensors"), &in, 1, tp("mf.safetensors"), &opt, &r));
        CHECK_OK(ql_checkpoint_open(tp("mf.safetensors"), &m));
        ql_context *ctx = NULL;
        CHECK_OK(ql_context_create(&ctx));
        for (int l = 0; l < 3; l++) {
            const int64_t N = ln[l], K = lk[l], R = lrank[l], M = 64;
            float *x = malloc((size_t)(M * K) * 4), *yu = malloc((size_t)(M * N) * 4), *ym = malloc((size_t)(M * N) * 4);
            tu_fill_gauss(QL_F32, x, M * K, 1.0);
            ql_linear *lu = NULL, *lm = NULL;
            CHECK_OK(ql_linear_from_checkpoint(ctx, b, lname[l], QL_LINEAR_W8A8, &lu));
            CHECK_OK(ql_linear_from_checkpoint(ctx, m, lname[l], QL_LINEAR_W8A8, &lm));
            const double scale = ql_lora_scale(1.0, lalpha[l], lalpha[l] != 0.0f, R);
            ql_lora_desc d = {R, ldown[l], QL_F32, K, lup[l], QL_F32, R, scale};
            CHECK_OK(ql_linear_add_lora(lu, &d, NULL));
            CHECK_OK(ql_linear_forward(lu, x, QL_F32, M, K, yu, QL_F32, N, NULL));
            CHECK_OK(ql_linear_forward(lm, x, QL_F32, M, K, ym, QL_F32, N, NULL));
            /* float64 of x·(W + scale·up·down)ᵀ + bias, W the stored (dequantized) base */
            float *w = malloc((size_t)(N * K) * 4);
            CHECK_OK(ql_dequantize(bq[l], N, K, K, bs[l], lkind[l] == 1 ? 1 : N, lgroup[l], QL_F32, w, K));
            double eu = 0, em = 0, nrm = 0, nl = 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t n = 0; n < N; n++) {
                    double y = l == 0 ? ql_bf16_to_fp32(ql_fp32_to_bf16(ql_bf16_to_fp32(bbias[n]))) : 0.0, lo = 0;
                    for (int64_t j = 0; j < K; j++) {
                        double dd = 0;
                        for (int64_t q = 0; q < R; q++) dd += (double)lup[l][n * R + q] * ldown[l][q * K + j];
                        y += (double)x[i * K + j] * ((double)w[n * K + j] + scale * dd);
                        lo += (double)x[i * K + j] * scale * dd;
                    }
                    eu += (yu[i * N + n] - y) * (yu[i * N + n] - y);
                    em += (ym[i * N + n] - y) * (ym[i * N + n] - y);
                    nrm += y * y;
                    nl += lo * lo;
                }
            eu = sqrt(eu / nrm);
            em = sqrt(em / nrm);
            printf("  %s layer %s: rel L2 vs float64: unmerged %.5f, merged (%s) %.5f; LoRA term %.2f of the output\n",
                   l == 0 ? "ConvRot" : l == 1 ? "row-wise" : "tensor-wise", lpath[l], eu, sr ? "stochastic" : "nearest", em,
                   sqrt(nl / nrm));
            /* documented bounds: both within 2% here (int8 activations: ~0.8%) */
            CHECK(eu < 0.02 && em < 0.02, "layer %s: unmerged %.4f / merged %.4f rel L2 vs float64", lpath[l], eu, em);
            ql_linear_destroy(lu);
            ql_linear_destroy(lm);
            free(x); free(yu); free(ym); free(w);
        }
        ql_context_destroy(ctx);
        ql_checkpoint_close(m);
        m = NULL;
    }
    ql_checkpoint_close(b);
}

/* ---- hostile LoRA files: the library's message, and the command's */

typedef struct run_result {
    int code;
    char err[2048], out[8192];
} run_result;

static run_result run(const char *const *args)
{
    run_result r;
    memset(&r, 0, sizeof r);
    char op[600], ep[600];
    snprintf(op, sizeof op, "%s/run.out", tmpdir);
    snprintf(ep, sizeof ep, "%s/run.err", tmpdir);
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(op, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fo, 1);
        dup2(fe, 2);
        const char *argv[40];
        int n = 0;
        for (int i = 0; cmd[i] && n < 16; i++) argv[n++] = cmd[i];
        for (int i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
        argv[n] = NULL;
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    FILE *f = fopen(ep, "r");
    if (f) { size_t n = fread(r.err, 1, sizeof r.err - 1, f); r.err[n] = 0; fclose(f); }
    f = fopen(op, "r");
    if (f) { size_t n = fread(r.out, 1, sizeof r.out - 1, f); r.out[n] = 0; fclose(f); }
    return r;
}

static int lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void hostile(const char *label, const tensor *t, int n, const char *want1, const char *want2)
{
    write_st(tp("bad.safetensors"), t, n, NULL, NULL);
    ql_checkpoint *b = NULL, *lc = NULL;
    ql_lora_plan *p = NULL;
    CHECK_OK(ql_checkpoint_open(tp("base.safetensors"), &b));
    CHECK_OK(ql_checkpoint_open(tp("bad.safetensors"), &lc));
    ql_status st = b && lc ? ql_lora_plan_create(b, lc, &p) : QL_OK;
    CHECK(st != QL_OK && strstr(ql_last_error(), "bad.safetensors") && strstr(ql_last_error(), want1) &&
              (!want2 || strstr(ql_last_error(), want2)),
          "%s: %s", label, st == QL_OK ? "accepted" : ql_last_error());
    ql_lora_plan_destroy(p);
    ql_checkpoint_close(lc);
    ql_checkpoint_close(b);
    if (!qlinear) return;
    unlink(tp("out.safetensors"));
    const char *a1[] = {"merge-lora", tp("base.safetensors"), tp("bad.safetensors"), tp("out.safetensors"), NULL};
    run_result r = run(a1);
    struct stat sb;
    CHECK(r.code == 1 && lines(r.err) == 1 && strstr(r.err, "bad.safetensors") && strstr(r.err, want1) &&
              stat(tp("out.safetensors"), &sb) != 0,
          "merge-lora %s: exit %d, stderr: %s", label, r.code, r.err);
    const char *a2[] = {"forward", tp("base.safetensors"), lname[0], tp("x.safetensors"), tp("out.safetensors"), "--lora",
                        tp("bad.safetensors"), NULL};
    r = run(a2);
    CHECK(r.code == 1 && lines(r.err) == 1 && strstr(r.err, "bad.safetensors") && stat(tp("out.safetensors"), &sb) != 0,
          "forward --lora %s: exit %d, stderr: %s", label, r.code, r.err);
}

static void test_hostile(void)
{
    static float d8[8 * 64], u24[24 * 8], u24b[24 * 7], d8k[8 * 63], u23[23 * 8], alpha2[2] = {1, 2}, anan = NAN;
    static float one = 4.0f;
    const char *D = "lora_unet_blocks_0_attn_q.lora_down.weight", *U = "lora_unet_blocks_0_attn_q.lora_up.weight",
               *A = "lora_unet_blocks_0_attn_q.alpha";
    tu_fill_gauss(QL_F32, d8, 8 * 64, 0.1);
    tu_fill_gauss(QL_F32, u24, 24 * 8, 0.1);
    tensor ranks[] = {{D, QL_ST_F32, 2, {8, 64}, d8}, {U, QL_ST_F32, 2, {24, 7}, u24b}};
    hostile("mismatched ranks", ranks, 2, "ranks differ", U);
    tensor kbad[] = {{D, QL_ST_F32, 2, {8, 63}, d8k}, {U, QL_ST_F32, 2, {24, 8}, u24}};
    hostile("down K", kbad, 2, "K = 63", D);
    tensor nbad[] = {{D, QL_ST_F32, 2, {8, 64}, d8}, {U, QL_ST_F32, 2, {23, 8}, u23}};
    hostile("up N", nbad, 2, "N = 23", U);
    tensor noup[] = {{D, QL_ST_F32, 2, {8, 64}, d8}, {A, QL_ST_F32, 0, {0, 0}, &one}};
    hostile("missing up", noup, 2, "no up", "lora_unet_blocks_0_attn_q");
    tensor nodown[] = {{U, QL_ST_F32, 2, {24, 8}, u24}};
    hostile("missing down", nodown, 1, "no down", "lora_unet_blocks_0_attn_q");
    tensor avec[] = {{D, QL_ST_F32, 2, {8, 64}, d8}, {U, QL_ST_F32, 2, {24, 8}, u24}, {A, QL_ST_F32, 1, {2, 0}, alpha2}};
    hostile("non-scalar alpha", avec, 3, "scalar", A);
    tensor anon[] = {{D, QL_ST_F32, 2, {8, 64}, d8}, {U, QL_ST_F32, 2, {24, 8}, u24}, {A, QL_ST_F32, 0, {0, 0}, &anan}};
    hostile("NaN alpha", anon, 3, "not finite", A);
    tensor none[] = {{"lora_unet_nowhere.lora_down.weight", QL_ST_F32, 2, {8, 64}, d8},
                     {"lora_unet_nowhere.lora_up.weight", QL_ST_F32, 2, {24, 8}, u24}};
    hostile("matches nothing", none, 2, "matches a layer", NULL);
    tensor twice[] = {{D, QL_ST_F32, 2, {8, 64}, d8}, {U, QL_ST_F32, 2, {24, 8}, u24},
                      {"blocks.0.attn.q.lora_A.weight", QL_ST_F32, 2, {8, 64}, d8},
                      {"blocks.0.attn.q.lora_B.weight", QL_ST_F32, 2, {24, 8}, u24}};
    hostile("two modules, one layer", twice, 4, "both target", "blocks.0.attn.q");
    tensor conv[] = {{D, QL_ST_I8, 2, {8, 64}, d8}, {U, QL_ST_F32, 2, {24, 8}, u24}};
    hostile("int8 LoRA matrix", conv, 2, "dtype I8", D);
    /* a kohya name two layers answer to: a.b_c and a_b.c */
    {
        static int8_t q[4 * 4];
        static float s[4] = {1, 1, 1, 1};
        static const char *cq = "{\"format\": \"int8_tensorwise\"}";
        tensor bt[] = {{"a.b_c.weight", QL_ST_I8, 2, {4, 4}, q}, {"a.b_c.weight_scale", QL_ST_F32, 2, {4, 1}, s},
                       {"a.b_c.comfy_quant", QL_ST_U8, 1, {(int64_t)strlen(cq), 0}, cq},
                       {"a_b.c.weight", QL_ST_I8, 2, {4, 4}, q}, {"a_b.c.weight_scale", QL_ST_F32, 2, {4, 1}, s},
                       {"a_b.c.comfy_quant", QL_ST_U8, 1, {(int64_t)strlen(cq), 0}, cq}};
        write_st(tp("amb_base.safetensors"), bt, 6, NULL, NULL);
        tensor lt[] = {{"lora_unet_a_b_c.lora_down.weight", QL_ST_F32, 2, {2, 4}, d8},
                       {"lora_unet_a_b_c.lora_up.weight", QL_ST_F32, 2, {4, 2}, u24}};
        write_st(tp("amb.safetensors"), lt, 2, NULL, NULL);
        ql_checkpoint *b = NULL, *lc = NULL;
        ql_lora_plan *p = NULL;
        CHECK_OK(ql_checkpoint_open(tp("amb_base.safetensors"), &b));
        CHECK_OK(ql_checkpoint_open(tp("amb.safetensors"), &lc));
        ql_status st = ql_lora_plan_create(b, lc, &p);
        CHECK(st != QL_OK && strstr(ql_last_error(), "ambiguous") && strstr(ql_last_error(), "'a.b_c'") &&
                  strstr(ql_last_error(), "'a_b.c'"),
              "ambiguous module: %s", st == QL_OK ? "accepted" : ql_last_error());
        ql_lora_plan_destroy(p);
        ql_checkpoint_close(lc);
        ql_checkpoint_close(b);
    }
}

/* ---- the command: both syntaxes, the report, forward --lora */

static float *x;
static void make_input(void)
{
    x = malloc(5 * 64 * 4);
    tu_fill_gauss(QL_F32, x, 5 * 64, 1.0);
    tensor xt[] = {{"x", QL_ST_F32, 2, {5, 64}, x}};
    write_st(tp("x.safetensors"), xt, 1, NULL, NULL);
}

static void test_cli(void)
{
    if (!qlinear) return;
    const char *a1[] = {"merge-lora", tp("base.safetensors"), tp("kohya.safetensors"), tp("c1.safetensors"), "--strength",
                        "0.75", NULL};
    run_result r = run(a1);
    CHECK(r.code == 0, "merge-lora positional: exit %d: %s", r.code, r.err);
    CHECK(strstr(r.out, "4 modules matched, 4 tensors unmatched") &&
              strstr(r.out, "matched   lora_unet_blocks_0_attn_q -> model.diffusion_model.blocks.0.attn.q") &&
              strstr(r.out, "unmatched lora_te_text_model_encoder_layers_0_q.lora_down.weight") &&
              strstr(r.out, "unmatched some.other.tensor") && strstr(r.err, "MB/s"),
          "merge-lora report:\n%s%s", r.out, r.err);
    const char *a2[] = {"merge-lora", tp("base.safetensors"), tp("c2.safetensors"), "--lora",
                        tp("peft.safetensors:0.75"), NULL};
    r = run(a2);
    CHECK(r.code == 0 && files_equal(tp("c1.safetensors"), tp("mk.safetensors")) &&
              files_equal(tp("c2.safetensors"), tp("c1.safetensors")),
          "merge-lora --lora FILE:S: exit %d, same bytes as the library and the other syntax: %s", r.code, r.err);
    const char *a3[] = {"merge-lora", tp("base.safetensors"), tp("kohya.safetensors"), tp("base.safetensors"), NULL};
    r = run(a3);
    CHECK(r.code == 1 && lines(r.err) == 1, "merge-lora over its input: exit %d: %s", r.code, r.err);
    const char *a4[] = {"merge-lora", tp("base.safetensors"), tp("c3.safetensors"), NULL};
    r = run(a4);
    CHECK(r.code == 2, "merge-lora without a LoRA: exit %d", r.code);
    /* forward --lora: kohya and PEFT give the same bytes, and equal the library's unmerged path */
    const char *f1[] = {"forward", tp("base.safetensors"), lname[0], tp("x.safetensors"), tp("yk.safetensors"), "--lora",
                        tp("kohya.safetensors:0.5"), NULL};
    r = run(f1);
    CHECK(r.code == 0, "forward --lora kohya: exit %d: %s", r.code, r.err);
    const char *f2[] = {"forward", tp("base.safetensors"), lname[0], tp("x.safetensors"), tp("yp.safetensors"), "--lora",
                        tp("peft.safetensors:0.5"), NULL};
    r = run(f2);
    CHECK(r.code == 0 && files_equal(tp("yk.safetensors"), tp("yp.safetensors")), "forward --lora: kohya vs PEFT: %s",
          r.err);
    const char *f3[] = {"forward", tp("base.safetensors"), lname[0], tp("x.safetensors"), tp("y0.safetensors"), NULL};
    r = run(f3);
    CHECK(r.code == 0 && !files_equal(tp("y0.safetensors"), tp("yk.safetensors")), "forward without --lora differs");
    const char *f4[] = {"forward", tp("base.safetensors"), lname[0], tp("x.safetensors"), tp("yz.safetensors"), "--lora",
                        tp("kohya.safetensors:0"), NULL};
    r = run(f4);
    CHECK(r.code == 0 && files_equal(tp("y0.safetensors"), tp("yz.safetensors")), "forward --lora FILE:0 is the identity");
    /* the library's result */
    ql_checkpoint *b = NULL, *y = NULL;
    ql_context *ctx = NULL;
    ql_linear *lin = NULL;
    CHECK_OK(ql_checkpoint_open(tp("base.safetensors"), &b));
    CHECK_OK(ql_context_create(&ctx));
    CHECK_OK(ql_linear_from_checkpoint(ctx, b, lname[0], QL_LINEAR_W8A8, &lin));
    ql_lora_desc d = {RK0, ldown[0], QL_F32, 64, lup[0], QL_F32, RK0, ql_lora_scale(0.5, lalpha[0], 1, RK0)};
    CHECK_OK(ql_linear_add_lora(lin, &d, NULL));
    float yl[5 * 24];
    CHECK_OK(ql_linear_forward(lin, x, QL_F32, 5, 64, yl, QL_F32, 24, NULL));
    CHECK_OK(ql_checkpoint_open(tp("yk.safetensors"), &y));
    ql_tensor_info ti;
    const void *yd = y ? tdata(y, "y", &ti) : NULL;
    CHECK(yd && ti.bytes == sizeof yl && !memcmp(yd, yl, sizeof yl), "forward --lora differs from ql_linear_add_lora");
    /* a float layer: the LoRA merged into an fp32 copy */
    const char *f5[] = {"forward", tp("base.safetensors"), lname[3], tp("x8.safetensors"), tp("yf.safetensors"), "--lora",
                        tp("kohya.safetensors"), NULL};
    float x8[3 * 32];
    tu_fill_gauss(QL_F32, x8, 96, 1.0);
    tensor xt8[] = {{"x", QL_ST_F32, 2, {3, 32}, x8}};
    write_st(tp("x8.safetensors"), xt8, 1, NULL, NULL);
    r = run(f5);
    CHECK(r.code == 0, "forward --lora on a float layer: %s", r.err);
    const char *f6[] = {"forward", tp("base.safetensors"), lname[4], tp("x8.safetensors"), tp("yo.safetensors"), "--lora",
                        tp("kohya.safetensors"), NULL};
    r = run(f6);
    CHECK(r.code == 1 && lines(r.err) == 1 && strstr(r.err, "no module targets layer"), "forward --lora, untargeted layer: %s",
          r.err);
    ql_linear_destroy(lin);
    ql_context_destroy(ctx);
    ql_checkpoint_close(b);
    ql_checkpoint_close(y);
}

int main(int argc, char **argv)
{
    tu_init("test_merge");
    qlinear = argc > 1 ? argv[1] : NULL;
    cmd = argv + 1;
    snprintf(tmpdir, sizeof tmpdir, "%s/ql_merge_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_stream();
    test_merge();
    make_input();
    test_paths_vs_float64();
    test_hostile();
    test_cli();
    int rc = tu_finish();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (rc == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
