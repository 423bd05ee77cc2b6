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

/* ---- W4A8 / W6A8: merge + requantize into the stored layout */

typedef struct wcase {
    const char *path; /* module path (the layer is model.diffusion_model.<path>) */
    ql_wxa8_mode mode;
    int64_t n, k, group, cgroup;
    int srel_f32, zero_row;
    int64_t rank;
} wcase;

/* lanes: 20 groups (16 + 4), group 4 / 8 / 32, fp32 s_rel, one row, rank 1 and 17, a zero row */
static const wcase wc[] = {
    {"w.cb", QL_WXA8_CODEBOOK, 24, 320, 16, 64, 0, 1, 8},  {"w.cb8", QL_WXA8_CODEBOOK, 7, 64, 8, 16, 1, 0, 3},
    {"w.uni", QL_WXA8_UNIFORM, 9, 48, 4, 16, 0, 0, 2},     {"w.asym", QL_WXA8_ASYM, 10, 64, 32, 16, 0, 0, 17},
    {"w.w6", QL_WXA8_6BIT, 12, 96, 32, 16, 0, 1, 5},       {"w.w6f", QL_WXA8_6BIT, 1, 64, 16, 64, 1, 0, 1},
    {"w.big", QL_WXA8_CODEBOOK, 64, 256, 16, 256, 0, 0, 16}, {"w.big6", QL_WXA8_6BIT, 64, 256, 16, 256, 0, 0, 16},
};
#define NW ((int)(sizeof wc / sizeof wc[0]))

typedef struct wdata {
    uint8_t *q;
    void *srel;
    float *sch, cb[16], *down, *up, alpha;
    uint16_t *corr; /* bf16 [ng, n] */
} wdata;
static wdata wd[NW];

static int64_t w_rb(const wcase *c) { return c->mode == QL_WXA8_6BIT ? c->k / 2 + c->k / 4 : c->k / 2; }
static int w_bits(const wcase *c) { return c->mode == QL_WXA8_6BIT ? 6 : 4; }

/* a base holding every case (the LoRA may cover all of them, or one) */
static void make_wxa8_base(const char *path, int bad_codebook, int asym_codebook)
{
    tensor t[8 * NW];
    int nt = 0;
    static char names[NW][6][128], cq[NW][128];
    for (int i = 0; i < NW; i++) {
        const wcase *c = &wc[i];
        wdata *d = &wd[i];
        const int64_t N = c->n, K = c->k, ng = K / c->group, rb = w_rb(c);
        float *w = malloc((size_t)(N * K) * 4);
        tu_fill_gauss(QL_F32, w, N * K, 0.05);
        if (c->zero_row) memset(w + K, 0, (size_t)K * 4);
        for (int j = 0; j < 16; j++) { /* a stored codebook that is not the fixed LUT (ascending, not symmetric) */
            const float x = ((float)j - 7.4f) / 7.6f;
            d->cb[j] = x * (0.55f + 0.45f * fabsf(x));
        }
        free(d->q), free(d->srel), free(d->sch), free(d->corr);
        d->q = malloc((size_t)(N * rb));
        d->srel = malloc((size_t)(N * ng) * 4);
        d->sch = malloc((size_t)N * 4);
        float *corr = malloc((size_t)(N * ng) * 4);
        const ql_wxa8_qparams p = {c->mode, c->group, c->cgroup, d->cb, 1};
        const ql_wxa8_qoptions o = {c->srel_f32, 0, 0, 0};
        CHECK_OK(ql_wxa8_quantize_ex(QL_F32, w, N, K, K, &p, &o, d->q, rb, d->srel, d->sch, corr));
        d->corr = NULL;
        if (c->mode == QL_WXA8_ASYM) {
            d->corr = malloc((size_t)(N * ng) * 2);
            for (int64_t r = 0; r < N; r++)
                for (int64_t g = 0; g < ng; g++) d->corr[g * N + r] = ql_fp32_to_bf16(corr[r * ng + g]);
        }
        free(corr);
        free(w);
        const char *fmt = c->mode == QL_WXA8_6BIT ? "w6a8_int8" : "asym_w4a8_int8";
        snprintf(cq[i], 128, "{\"format\": \"%s\", \"group_size\": %lld, \"convrot_groupsize\": %lld}", fmt,
                 (long long)c->group, (long long)c->cgroup);
        const char *suf[6] = {"weight", "weight_s_rel", "weight_s_channel", "weight_codebook", "weight_correction", "comfy_quant"};
        for (int s = 0; s < 6; s++) snprintf(names[i][s], 128, "model.diffusion_model.%s.%s", c->path, suf[s]);
        t[nt++] = (tensor){names[i][0], QL_ST_I8, 2, {N, rb}, d->q};
        t[nt++] = (tensor){names[i][1], c->srel_f32 ? QL_ST_F32 : QL_ST_F8_E4M3, 2, {N, ng}, d->srel};
        t[nt++] = (tensor){names[i][2], QL_ST_F32, 1, {N, 0}, d->sch};
        if (c->mode == QL_WXA8_CODEBOOK || (asym_codebook && c->mode == QL_WXA8_ASYM)) {
            static float badcb[16];
            if (bad_codebook && i == 0) {
                memcpy(badcb, d->cb, 64);
                float x = badcb[3];
                badcb[3] = badcb[4], badcb[4] = x;
            }
            t[nt++] = (tensor){names[i][3], QL_ST_F32, 1, {16, 0}, bad_codebook && i == 0 ? badcb : d->cb};
        }
        if (d->corr) t[nt++] = (tensor){names[i][4], QL_ST_BF16, 2, {ng, N}, d->corr};
        t[nt++] = (tensor){names[i][5], QL_ST_U8, 1, {(int64_t)strlen(cq[i]), 0}, cq[i]};
    }
    write_st(path, t, nt, "format", "pt");
}

/* fresh LoRA matrices for every case (a zero up row where the base has a zero row) */
static void draw_wxa8_lora(double up_sigma, double scale_up)
{
    for (int i = 0; i < NW; i++) {
        const wcase *c = &wc[i];
        wdata *d = &wd[i];
        if (!d->down) {
            d->down = malloc((size_t)(c->rank * c->k) * 4);
            d->up = malloc((size_t)(c->n * c->rank) * 4);
        }
        tu_fill_gauss(QL_F32, d->down, c->rank * c->k, 0.2);
        tu_fill_gauss(QL_F32, d->up, c->n * c->rank, up_sigma);
        for (int64_t e = 0; e < c->n * c->rank; e++) d->up[e] *= (float)scale_up;
        if (c->zero_row) memset(d->up + c->rank, 0, (size_t)c->rank * 4); /* row 1 stays exactly 0 */
        d->alpha = (float)c->rank / 2;
    }
}

/* kohya (lora_unet_...) or PEFT (lora_A / lora_B) names for the same matrices; only case `only` if >= 0 */
static void make_wxa8_lora(const char *path, int peft, int only)
{
    tensor t[3 * NW];
    int nt = 0;
    static char names[NW][3][160];
    for (int i = 0; i < NW; i++) {
        const wcase *c = &wc[i];
        wdata *d = &wd[i];
        if (only >= 0 && i != only) continue;
        char mod[128];
        snprintf(mod, sizeof mod, peft ? "transformer.%s" : "lora_unet_%s", c->path);
        if (!peft)
            for (char *p = mod; *p; p++) *p = *p == '.' ? '_' : *p;
        snprintf(names[i][0], 160, "%s.%s", mod, peft ? "lora_A.weight" : "lora_down.weight");
        snprintf(names[i][1], 160, "%s.%s", mod, peft ? "lora_B.weight" : "lora_up.weight");
        snprintf(names[i][2], 160, "%s.alpha", mod);
        t[nt++] = (tensor){names[i][0], QL_ST_F32, 2, {c->rank, c->k}, d->down};
        t[nt++] = (tensor){names[i][1], QL_ST_F32, 2, {c->n, c->rank}, d->up};
        t[nt++] = (tensor){names[i][2], QL_ST_F32, 0, {0, 0}, &d->alpha};
    }
    write_st(path, t, nt, NULL, NULL);
}

static ql_wxa8_weight wview(const wcase *c, const uint8_t *q, const void *srel, const float *sch, const float *cb,
                            const uint16_t *corr)
{
    return (ql_wxa8_weight){.n = c->n, .k = c->k, .bits = w_bits(c), .q = q, .ldq = w_rb(c), .s_rel = srel,
                            .s_rel_f32 = c->srel_f32, .s_channel = sch,
                            .codebook = c->mode == QL_WXA8_CODEBOOK ? cb : NULL, .correction = corr,
                            .correction_dtype = QL_BF16, .group = c->group, .convrot_group = c->cgroup};
}

/* the documented fp32 arithmetic: dequantize (un-rotated in fp32), + fp32(strength·alpha/R)·(up·down) in rank order */
static float *w_expected_merged(int i, double strength)
{
    const wcase *c = &wc[i];
    const wdata *d = &wd[i];
    const int64_t N = c->n, K = c->k, R = c->rank;
    float *w = malloc((size_t)(N * K) * 4);
    ql_wxa8_weight v = wview(c, d->q, d->srel, d->sch, d->cb, d->corr);
    CHECK_OK(ql_wxa8_dequantize(&v, QL_F32, w, K));
    const float cf = (float)(strength * (double)d->alpha / (double)R);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < K; j++) {
            float acc = 0.0f;
            for (int64_t r = 0; r < R; r++) acc = acc + d->up[n * R + r] * d->down[r * K + j];
            w[n * K + j] = w[n * K + j] + cf * acc;
        }
    return w;
}

/* float64: the un-rotated weight a layer's stored data means, by an explicit Hadamard matrix */
static double h4d(int64_t i, int64_t j, int64_t g)
{
    static const int h4[4][4] = {{1, 1, 1, -1}, {1, 1, -1, 1}, {1, -1, 1, 1}, {-1, 1, 1, 1}};
    double v = 1.0 / sqrt((double)g);
    for (int64_t s = 1; s < g; s *= 4) v *= h4[(i / s) % 4][(j / s) % 4];
    return v;
}
static double *w_decode64(const wcase *c, const uint8_t *q, const void *srel, const float *sch, const float *cb,
                          const uint16_t *corr)
{
    const int64_t N = c->n, K = c->k, ng = K / c->group, G = c->cgroup;
    double *rot = malloc((size_t)(N * K) * 8), *w = calloc((size_t)(N * K), 8);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < K; j++) {
            const uint8_t *row = q + n * w_rb(c);
            int code = (j & 1) ? row[j / 2] >> 4 : row[j / 2] & 15;
            if (w_bits(c) == 6) code |= ((row[K / 2 + j / 4] >> (2 * (j % 4))) & 3) << 4;
            const double val = w_bits(c) == 6 ? code - 32 : c->mode == QL_WXA8_CODEBOOK ? cb[code] : code - 8;
            const int64_t gi = n * ng + j / c->group;
            float s;
            if (c->srel_f32) memcpy(&s, (const float *)srel + gi, 4);
            else s = ql_e4m3_to_fp32(((const uint8_t *)srel)[gi]);
            double gr = nearbyint((double)(float)(val * s)); /* the fp32 product, then to nearest even */
            gr = gr > 127 ? 127 : gr < -127 ? -127 : gr;
            rot[n * K + j] = gr * sch[n] + (corr ? (double)ql_bf16_to_fp32(corr[(j / c->group) * N + n]) : 0.0);
        }
    for (int64_t n = 0; n < N; n++)
        for (int64_t g0 = 0; g0 < K; g0 += G)
            for (int64_t a = 0; a < G; a++)
                for (int64_t b = 0; b < G; b++) w[n * K + g0 + a] += rot[n * K + g0 + b] * h4d(b, a, G);
    free(rot);
    return w;
}

/* The uniform / asymmetric group step of a rotated group (and its minimum). */
static float w_model_group_step(const wcase *c, const float *grp, float *mn_out)
{
    float mx = -INFINITY, mn = INFINITY, am = 0;
    for (int64_t e = 0; e < c->group; e++) mx = fmaxf(mx, grp[e]), mn = fminf(mn, grp[e]), am = fmaxf(am, fabsf(grp[e]));
    const float gs = c->mode == QL_WXA8_UNIFORM ? am / 7.0f : (mx - mn) / 15.0f;
    *mn_out = mn;
    return gs > 1e-8f ? gs : 1e-8f;
}

/* An independent model of the final assignment (FORMATS §5.2 / §5.6 with the
 * pcg-hash noise): codes of the rotated merged weight wr, given the output
 * scales (codebook / 6-bit) or recomputing the group scale (uniform / asym). */
static int w_model_code(const wcase *c, const float *cb, const float *wr, int64_t n, int64_t j, float srel, float sch,
                        uint64_t seed)
{
    const int64_t K = c->k, g0 = j - j % c->group;
    const float w = wr[n * K + j];
    const double u = seed ? model_noise(n * K + j, seed) : 0.0;
    if (c->mode == QL_WXA8_UNIFORM || c->mode == QL_WXA8_ASYM) {
        float mn;
        const float gs = w_model_group_step(c, wr + n * K + g0, &mn);
        const float x = c->mode == QL_WXA8_UNIFORM ? w / gs : (w - mn) / gs;
        double v = seed ? floor((double)(float)((double)x + u)) : nearbyint((double)x);
        if (c->mode == QL_WXA8_UNIFORM) return (int)(v < -8 ? -8 : v > 7 ? 7 : v) + 8;
        return (int)(v < 0 ? 0 : v > 15 ? 15 : v);
    }
    const int nl = c->mode == QL_WXA8_6BIT ? 63 : 16;
    float lv[63];
    for (int i = 0; i < nl; i++) {
        double gr = nearbyint((double)(float)((double)(nl == 63 ? i - 31 : cb[i]) * srel));
        lv[i] = (float)(gr > 127 ? 127 : gr < -127 ? -127 : gr);
    }
    const float t = w / sch;
    int pos = 0;
    while (pos < nl && lv[pos] < t) pos++;
    int idx;
    if (seed) {
        int lo = pos - 1 < 0 ? 0 : pos - 1 > nl - 2 ? nl - 2 : pos - 1;
        const float thr = (float)((double)(float)(u * (double)(lv[lo + 1] - lv[lo])) + (double)lv[lo]);
        idx = lo + (t > thr);
    } else {
        const int a = pos - 1 < 0 ? 0 : pos - 1, b = pos > nl - 1 ? nl - 1 : pos;
        idx = fabsf(t - lv[b]) < fabsf(t - lv[a]) ? b : a;
    }
    return nl == 63 ? idx + 1 : idx;
}

/* The farther of the two values a stochastic assignment of element (n, j) can
 * take (the bracketing levels of w_model_code), as a distance from wr: a
 * deterministic bound on that element's error in the rotated domain. */
static double w_model_maxdist(const wcase *c, const float *cb, const float *wr, int64_t n, int64_t j, float srel, float sch)
{
    const int64_t K = c->k, g0 = j - j % c->group;
    const float w = wr[n * K + j];
    if (c->mode == QL_WXA8_UNIFORM || c->mode == QL_WXA8_ASYM) {
        float mn;
        const float gs = w_model_group_step(c, wr + n * K + g0, &mn);
        const double x = c->mode == QL_WXA8_UNIFORM ? (double)w / gs : ((double)w - mn) / gs;
        const double lo = c->mode == QL_WXA8_UNIFORM ? -8 : 0, hi = c->mode == QL_WXA8_UNIFORM ? 7 : 15;
        const double a = fmin(fmax(floor(x), lo), hi), b = fmin(fmax(floor(x) + 1, lo), hi);
        return fmax(fabs(x - a), fabs(x - b)) * gs;
    }
    const int nl = c->mode == QL_WXA8_6BIT ? 63 : 16;
    float lv[63];
    for (int i = 0; i < nl; i++) {
        double gr = nearbyint((double)(float)((double)(nl == 63 ? i - 31 : cb[i]) * srel));
        lv[i] = (float)(gr > 127 ? 127 : gr < -127 ? -127 : gr);
    }
    const double t = (double)w / sch;
    int pos = 0;
    while (pos < nl && lv[pos] < t) pos++;
    const int lo = pos - 1 < 0 ? 0 : pos - 1 > nl - 2 ? nl - 2 : pos - 1;
    return fmax(fabs(t - lv[lo]), fabs(t - lv[lo + 1])) * fabs((double)sch);
}

static double rel_l2(const double *a, const double *ref, int64_t n)
{
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) e += (a[i] - ref[i]) * (a[i] - ref[i]), r += ref[i] * ref[i];
    return sqrt(e / (r > 0 ? r : 1));
}

static const void *w_tensor(const ql_checkpoint *c, int i, const char *suffix, ql_tensor_info *ti)
{
    char nm[200];
    snprintf(nm, sizeof nm, "model.diffusion_model.%s.%s", wc[i].path, suffix);
    return tdata(c, nm, ti);
}

/* Checks one merged file against the documented arithmetic, the model and float64. */
static void check_wxa8_merged(const char *out, int stochastic, double strength, const char *what, const char *nearest_out)
{
    ql_checkpoint *m = NULL, *nm = NULL;
    CHECK_OK(ql_checkpoint_open(out, &m));
    if (nearest_out) CHECK_OK(ql_checkpoint_open(nearest_out, &nm));
    if (!m) return;
    for (int i = 0; i < NW; i++) {
        const wcase *c = &wc[i];
        const wdata *d = &wd[i];
        const int64_t N = c->n, K = c->k, ng = K / c->group, rb = w_rb(c);
        ql_tensor_info tq, ts, tc, tr;
        const uint8_t *oq = w_tensor(m, i, "weight", &tq);
        const void *osr = w_tensor(m, i, "weight_s_rel", &ts);
        const float *osc = w_tensor(m, i, "weight_s_channel", &tc);
        const uint16_t *ocorr = c->mode == QL_WXA8_ASYM ? w_tensor(m, i, "weight_correction", &tr) : NULL;
        if (!oq || !osr || !osc) continue;
        char key[200];
        snprintf(key, sizeof key, "diffusion_model.%s.weight", c->path);
        const uint64_t seed = stochastic ? ql_crc32_key(key) : 0;
        /* (1) the documented arithmetic through the public quantizer: same bytes */
        float *w = w_expected_merged(i, strength);
        uint8_t *q = malloc((size_t)(N * rb));
        void *sr = malloc((size_t)(N * ng) * 4);
        float *sc = malloc((size_t)N * 4), *corr = malloc((size_t)(N * ng) * 4);
        const ql_wxa8_qparams p = {c->mode, c->group, c->cgroup, d->cb, 0};
        const ql_wxa8_qoptions o = {c->srel_f32, seed, 0, QL_SR_CUDA_PCG};
        CHECK_OK(ql_wxa8_quantize_ex(QL_F32, w, N, K, K, &p, &o, q, rb, sr, sc, corr));
        int same = !memcmp(oq, q, (size_t)(N * rb)) && !memcmp(osr, sr, (size_t)(N * ng) * (c->srel_f32 ? 4 : 1)) &&
                   !memcmp(osc, sc, (size_t)N * 4);
        for (int64_t r = 0; ocorr && r < N; r++)
            for (int64_t g = 0; g < ng; g++) same &= ocorr[g * N + r] == ql_fp32_to_bf16(corr[r * ng + g]);
        CHECK(same, "%s: layer %s: the merge differs from dequantize + fp32 delta + ql_wxa8_quantize_ex", what, c->path);
        /* (2) every code against the model of the final assignment, on the merged weight rotated */
        float *wr = malloc((size_t)(N * K) * 4);
        memcpy(wr, w, (size_t)(N * K) * 4);
        CHECK_OK(ql_rotate(QL_F32, wr, N, K, K, c->cgroup));
        int64_t bad = 0;
        double md2 = 0; /* Σ (the farther bracketing value's distance)² */
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < K; j++) {
                const int64_t gi = n * ng + j / c->group;
                float s;
                if (c->srel_f32) memcpy(&s, (const float *)osr + gi, 4);
                else s = ql_e4m3_to_fp32(((const uint8_t *)osr)[gi]);
                const uint8_t *row = oq + n * rb;
                int code = (j & 1) ? row[j / 2] >> 4 : row[j / 2] & 15;
                if (w_bits(c) == 6) code |= ((row[K / 2 + j / 4] >> (2 * (j % 4))) & 3) << 4;
                bad += code != w_model_code(c, d->cb, wr, n, j, s, osc[n], seed);
                const double md = w_model_maxdist(c, d->cb, wr, n, j, s, osc[n]);
                md2 += md * md;
            }
        CHECK(bad == 0, "%s: layer %s: %lld of %lld codes differ from the model of the %s assignment", what, c->path,
              (long long)bad, (long long)(N * K), stochastic ? "stochastic" : "nearest");
        /* (3) stochastic rounding leaves the scales of the nearest mode */
        if (nm) {
            ql_tensor_info a, b;
            const void *ns = w_tensor(nm, i, "weight_s_rel", &a);
            const void *nc = w_tensor(nm, i, "weight_s_channel", &b);
            CHECK(ns && nc && !memcmp(ns, osr, (size_t)a.bytes) && !memcmp(nc, osc, (size_t)b.bytes),
                  "%s: layer %s: the scales differ from the nearest merge's", what, c->path);
        }
        /* (4) float64: merged output vs W + Δ, against a fresh quantization of the same float64 weight */
        double *base64 = w_decode64(c, d->q, d->srel, d->sch, d->cb, d->corr);
        const double cf = strength * (double)d->alpha / (double)c->rank;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < K; j++) {
                double dd = 0;
                for (int64_t r = 0; r < c->rank; r++) dd += (double)d->up[n * c->rank + r] * d->down[r * K + j];
                base64[n * K + j] += cf * dd;
            }
        float *w32 = malloc((size_t)(N * K) * 4);
        for (int64_t e = 0; e < N * K; e++) w32[e] = (float)base64[e];
        const ql_wxa8_qoptions o2 = {c->srel_f32, 0, 0, 0};
        CHECK_OK(ql_wxa8_quantize_ex(QL_F32, w32, N, K, K, &p, &o2, q, rb, sr, sc, corr));
        uint16_t *fc = ocorr ? malloc((size_t)(N * ng) * 2) : NULL;
        for (int64_t r = 0; fc && r < N; r++)
            for (int64_t g = 0; g < ng; g++) fc[g * N + r] = ql_fp32_to_bf16(corr[r * ng + g]);
        double *fresh = w_decode64(c, q, sr, sc, d->cb, fc), *got = w_decode64(c, oq, osr, osc, d->cb, ocorr);
        const double ef = rel_l2(fresh, base64, N * K), eg = rel_l2(got, base64, N * K);
        if (c->n * c->k >= 4096)
            printf("  %s %-6s rel-L2 vs float64: merged %.5f, fresh quantization of W + delta %.5f\n", what, c->path, eg, ef);
        /* stochastic rounding: ~1.4x the nearest error on large layers. Small
         * ones scatter (weights within ε of a level: nearest errs by ε, the
         * stochastic choice by up to the step), so there the bound is the
         * deterministic one: every element within the farther bracketing
         * value (H orthonormal: the same L2 in both domains). */
        double wn = 0;
        for (int64_t e = 0; e < N * K; e++) wn += base64[e] * base64[e];
        const double gb = sqrt(md2 / (wn > 0 ? wn : 1));
        if (stochastic && N * K < 4096)
            CHECK(eg <= gb * 1.001 + 1e-6, "%s: layer %s: rel-L2 %.5f vs float64 above the bracketing bound %.5f", what, c->path,
                  eg, gb);
        else
            CHECK(eg <= (stochastic ? 1.6 : 1.01) * ef + 1e-6, "%s: layer %s: rel-L2 %.5f vs float64 (fresh: %.5f)", what, c->path,
                  eg, ef);
        if (c->zero_row) {
            double z = 0;
            for (int64_t j = 0; j < K; j++) z = fmax(z, fabs(got[K + j]));
            CHECK(z == 0.0, "%s: layer %s: the zero row decodes to %g, not 0", what, c->path, z);
        }
        free(fresh), free(got), free(fc), free(w32), free(base64);
        free(wr), free(w), free(q), free(sr), free(sc), free(corr);
    }
    ql_checkpoint_close(m);
    ql_checkpoint_close(nm);
}

/* <merged - base, Δ> / <Δ, Δ> over the layer: 1 when a small delta survives on average */
static double w_delta_kept(const char *out, int i, double strength)
{
    ql_checkpoint *m = NULL;
    CHECK_OK(ql_checkpoint_open(out, &m));
    if (!m) return 0;
    const wcase *c = &wc[i];
    const wdata *d = &wd[i];
    ql_tensor_info a, b, e, f;
    const void *oq = w_tensor(m, i, "weight", &a), *osr = w_tensor(m, i, "weight_s_rel", &b);
    const float *osc = w_tensor(m, i, "weight_s_channel", &e);
    const uint16_t *oc = c->mode == QL_WXA8_ASYM ? w_tensor(m, i, "weight_correction", &f) : NULL;
    double *got = w_decode64(c, oq, osr, osc, d->cb, oc), *base = w_decode64(c, d->q, d->srel, d->sch, d->cb, d->corr);
    double num = 0, den = 0;
    const double cf = strength * (double)d->alpha / (double)c->rank;
    for (int64_t n = 0; n < c->n; n++)
        for (int64_t j = 0; j < c->k; j++) {
            double dd = 0;
            for (int64_t r = 0; r < c->rank; r++) dd += (double)d->up[n * c->rank + r] * d->down[r * c->k + j];
            num += (got[n * c->k + j] - base[n * c->k + j]) * cf * dd;
            den += cf * dd * cf * dd;
        }
    free(got), free(base);
    ql_checkpoint_close(m);
    return num / den;
}

static int same_tensors(const char *a, const char *b)
{
    ql_checkpoint *x = NULL, *y = NULL;
    CHECK_OK(ql_checkpoint_open(a, &x));
    CHECK_OK(ql_checkpoint_open(b, &y));
    int eq = x && y && ql_checkpoint_tensor_count(x) == ql_checkpoint_tensor_count(y);
    for (int64_t i = 0; eq && i < ql_checkpoint_tensor_count(x); i++) {
        ql_tensor_info p, q;
        ql_checkpoint_tensor(x, i, &p);
        const void *qd = tdata(y, p.name, &q);
        eq = qd && p.bytes == q.bytes && !memcmp(p.data, qd, (size_t)p.bytes);
    }
    ql_checkpoint_close(x);
    ql_checkpoint_close(y);
    return eq;
}

/* a merge the library and the command must refuse: message names the file and want; nothing written */
static void w_refused(const char *label, const char *base, const char *lora, const char *strength, const char *file,
                      const char *want)
{
    ql_merge_options opt = {1, NULL, 2, NULL, NULL};
    ql_lora_input in = {lora, atof(strength)};
    unlink(tp("wout.safetensors"));
    ql_status st = ql_checkpoint_merge_lora(base, &in, 1, tp("wout.safetensors"), &opt, NULL);
    struct stat sb;
    CHECK(st != QL_OK && strstr(ql_last_error(), file) && strstr(ql_last_error(), want) && stat(tp("wout.safetensors"), &sb) != 0,
          "%s: %s", label, st == QL_OK ? "accepted" : ql_last_error());
    if (!qlinear) return;
    const char *a[] = {"merge-lora", base, lora, tp("wout.safetensors"), "--strength", strength, NULL};
    run_result r = run(a);
    CHECK(r.code == 1 && lines(r.err) == 1 && strstr(r.err, file) && strstr(r.err, want) && stat(tp("wout.safetensors"), &sb) != 0,
          "merge-lora %s: exit %d, stderr: %s", label, r.code, r.err);
}

static void test_merge_wxa8(void)
{
    make_wxa8_base(tp("wbase.safetensors"), 0, 0);
    draw_wxa8_lora(0.03, 1.0);
    make_wxa8_lora(tp("wk.safetensors"), 0, -1);
    make_wxa8_lora(tp("wp.safetensors"), 1, -1);
    ql_merge_options opt = {1, NULL, 2, NULL, NULL};
    ql_merge_result r;
    static char kp[512], pp[512];
    snprintf(kp, sizeof kp, "%s", tp("wk.safetensors"));
    snprintf(pp, sizeof pp, "%s", tp("wp.safetensors"));
    for (int sr = 0; sr < 2; sr++) {
        opt.stochastic = sr;
        opt.threads = 2;
        ql_lora_input k = {kp, 0.8}, p = {pp, 0.8};
        const char *out = tp(sr ? "wm_sr.safetensors" : "wm_nr.safetensors");
        CHECK_OK(ql_checkpoint_merge_lora(tp("wbase.safetensors"), &k, 1, out, &opt, &r));
        CHECK(r.layers_merged == NW, "W4A8/W6A8 layers merged: %lld", (long long)r.layers_merged);
        CHECK_OK(ql_checkpoint_merge_lora(tp("wbase.safetensors"), &p, 1, tp("wm_p.safetensors"), &opt, &r));
        CHECK(files_equal(out, tp("wm_p.safetensors")), "W4A8/W6A8 %s: kohya and PEFT merges differ", sr ? "stochastic" : "nearest");
        opt.threads = 1;
        CHECK_OK(ql_checkpoint_merge_lora(tp("wbase.safetensors"), &p, 1, tp("wm_1.safetensors"), &opt, &r));
        CHECK(files_equal(out, tp("wm_1.safetensors")), "W4A8/W6A8 %s: 1 and 2 threads differ", sr ? "stochastic" : "nearest");
    }
    check_wxa8_merged(tp("wm_nr.safetensors"), 0, 0.8, "nearest   ", NULL);
    check_wxa8_merged(tp("wm_sr.safetensors"), 1, 0.8, "stochastic", tp("wm_nr.safetensors"));
    if (qlinear) { /* the command: stochastic by default, the library's bytes */
        const char *a[] = {"merge-lora", tp("wbase.safetensors"), tp("wk.safetensors"), tp("wc.safetensors"), "--strength", "0.8", NULL};
        run_result rr = run(a);
        CHECK(rr.code == 0 && files_equal(tp("wc.safetensors"), tp("wm_sr.safetensors")) &&
                  strstr(rr.out, "matched   lora_unet_w_cb -> model.diffusion_model.w.cb"),
              "merge-lora on W4A8/W6A8: exit %d: %s%s", rr.code, rr.out, rr.err);
    }
    /* strength 0: every tensor as it was */
    ql_lora_input z = {kp, 0.0};
    opt.threads = 2;
    CHECK_OK(ql_checkpoint_merge_lora(tp("wbase.safetensors"), &z, 1, tp("wm_0.safetensors"), &opt, &r));
    CHECK(same_tensors(tp("wm_0.safetensors"), tp("wbase.safetensors")), "W4A8/W6A8 strength 0 changed a tensor");
    /* a delta well below the quantization step survives stochastic rounding on average, not nearest */
    draw_wxa8_lora(0.03, 0.02);
    make_wxa8_lora(tp("wsmall.safetensors"), 0, -1);
    ql_lora_input sm = {tp("wsmall.safetensors"), 1.0};
    for (int sr = 0; sr < 2; sr++) {
        opt.stochastic = sr;
        CHECK_OK(ql_checkpoint_merge_lora(tp("wbase.safetensors"), &sm, 1, tp("wm_s.safetensors"), &opt, &r));
        for (int i = 0; i < NW; i++) {
            if (wc[i].n * wc[i].k < 16384) continue;
            const double kept = w_delta_kept(tp("wm_s.safetensors"), i, 1.0);
            printf("  small delta (well below one step), layer %s: %s rounding keeps %.3f of it\n", wc[i].path,
                   sr ? "stochastic" : "nearest", kept);
            /* unbiased, not exact: 0.93-1.29 seen over seeds (seed 97633820466: 1.285 on w.big), the
             * spread ~0.08; nearest keeps 0.0-0.1 on W4A8. The code assignment itself is checked
             * exactly against the in-test model above. */
            if (sr) CHECK(kept > 0.6 && kept < 1.4, "layer %s: stochastic rounding kept %.3f of a small delta", wc[i].path, kept);
        }
    }
    /* bad input: one line naming the file and the tensor / layer, nothing written */
    make_wxa8_base(tp("wbadcb.safetensors"), 1, 0);
    w_refused("non-ascending codebook", tp("wbadcb.safetensors"), kp, "1", "wbadcb.safetensors", "w.cb.weight_codebook");
    make_wxa8_base(tp("wasymcb.safetensors"), 0, 1);
    w_refused("correction and codebook", tp("wasymcb.safetensors"), kp, "1", "wasymcb.safetensors", "w.asym.weight_codebook");
    draw_wxa8_lora(0.03, 1e37);
    make_wxa8_lora(tp("whuge.safetensors"), 0, 3);
    w_refused("merged weight overflows", tp("wbase.safetensors"), tp("whuge.safetensors"), "1e10", "wbase.safetensors", "w.asym");
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
    test_merge_wxa8();
    int rc = tu_finish();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (rc == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
