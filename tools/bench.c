/* qlinear bench: every path of every shape of a profile, side by side with
 * the peers, in one run. Median of repeated runs; ratios to dense fp32; rel
 * L2 error against a float64 reference of the unquantized layer (on a sample
 * of rows). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "core/core.h"
#include "cpu/ops.h"
#include "peak.h"
#include "peers.h"
#include "qlinear.h"

typedef struct { int64_t m, n, k, count; } shape;

typedef struct {
    const char *name;
    int64_t default_m;
    shape shapes[8];
    int nshapes;
} profile;

static const profile profiles[] = {
    {"anima", 1024, {{0, 2048, 2048, 168}, {0, 256, 2048, 84}, {0, 6144, 256, 84}, {0, 2048, 1024, 56},
                     {0, 8192, 2048, 28}, {0, 2048, 8192, 28}}, 6},
    {"qwen3-te", 256, {{0, 2048, 1024, 28}, {0, 1024, 1024, 56}, {0, 1024, 2048, 28}, {0, 3072, 1024, 56},
                        {0, 1024, 3072, 28}}, 5},
    {"large", 0, {{4608, 6144, 6144, 1}, {4608, 16384, 6144, 1}, {4608, 6144, 16384, 1}}, 3},
};

enum {
    P_FP32, P_BF16, P_DEQUANT, P_WONLY, P_W8A8, P_W8A8_CACHED, P_W8A8_LORA, P_IN_GELU, P_IN_SWIGLU, P_IN_RMS, P_OP_GELU,
    P_OP_SWIGLU, P_OP_RMS, P_W4A8, P_W4A8_PACKED, P_W6A8, P_W6A8_PACKED, P_GEMM, P_OPENBLAS, P_ONEDNN_F32, P_ONEDNN_BF16,
    P_ONEDNN_INT8, NPATHS
};
static const char *path_names[NPATHS] = {"fp32", "bf16", "dequant", "weight-only", "w8a8-convrot", "w8a8-convrot-cached", "w8a8-convrot+lora64",
                                         "in-gelu_tanh", "in-swiglu", "in-rms_norm", "op-gelu_tanh", "op-swiglu", "op-rms_norm",
                                         "w4a8", "w4a8-packed", "w6a8", "w6a8-packed", "int8-gemm",
                                         "openblas-fp32", "onednn-fp32", "onednn-bf16", "onednn-int8"};
/* the input activations' paths (asked for by name): ql_input_act codes, in order */
static const int in_acts[3] = {QL_INPUT_ACT_GELU_TANH, QL_INPUT_ACT_SWIGLU, QL_INPUT_ACT_RMS_NORM};
#define BENCH_RMS_EPS 1e-6f
/* the path every "vs" ratio divides (fp32 unless --paths leaves it out) */
static int base_path;

static const char *path_notes[NPATHS] = {
    "ours, dense fp32 (x fp32 -> y fp32, + bias)",
    "ours, dense with bf16 weights (x bf16 -> y bf16, + bias; products summed in fp32)",
    "ours, dequantize the ConvRot weight every call, un-rotate, dense fp32",
    "ours, int8 ConvRot codes resident, decoded in the GEMM; x bf16 rotated, not quantized -> y bf16",
    "ours, full pipeline: rotate + quantize x (bf16) + int8 GEMM + scale restore + bias -> y bf16",
    "ours, the same with x quantized by an earlier call (a prologue-cache hit, as q/k/v share an input): w8a8-convrot less its prologue",
    "ours, the same with one rank-64 LoRA unmerged (down after the prologue, up in the epilogue)",
    "ours, w8a8-convrot with the input activation gelu_tanh in its prologue (comfy-kitchen's input_act)",
    "ours, the same with swiglu (x bf16 [M, 2K]: gate | up)",
    "ours, the same with rms_norm (a bf16 weight [K], eps 1e-6)",
    "ours as the peer: gelu_tanh as its own pass (ql_input_act_apply, the vector rows), then w8a8-convrot",
    "ours as the peer: swiglu as its own pass, then w8a8-convrot",
    "ours as the peer: rms_norm as its own pass, then w8a8-convrot",
    "ours, W4A8 (codebook, g16 e4m3) decoded once at load to the int8 grid, then the w8a8 pipeline",
    "ours, W4A8 (codebook, g16) kept 4-bit, decoded to int8 inside the GEMM per K slice, same pipeline",
    "ours, W6A8 (g16 e4m3, scale search) decoded once at load, then the w8a8 pipeline",
    "ours, W6A8 kept 6-bit, decoded to int8 inside the GEMM per K slice, same pipeline",
    "ours, the int8 GEMM alone (prepacked A and B, int32 out)",
    "peer: OpenBLAS cblas_sgemm (fp32)",
    "peer: oneDNN matmul f32, prepacked weights",
    "peer: oneDNN matmul bf16 in/out, prepacked weights",
    "peer: oneDNN matmul u8 x s8 -> s32, prepacked weights (GEMM alone)"};

typedef struct {
    double ms, gops, rel_l2;
    /* the int8 peer: of `checked` int32 sums on the sampled rows, how many
     * differ from the exact ones (oneDNN without VNNI sums u8 × s8 pairs in
     * saturating int16); -1: not checked */
    int64_t inexact, checked;
    size_t wbytes;
    int ok;
    int same; /* op-*: whose outputs equal the fused path's, bit for bit (1), differ (0), not compared (-1) */
    int dram, copies; /* weights from DRAM: rotated over this many copies */
    char kernel[128]; /* what ran (ours: micro-kernel and path, weight-only both of its kernels; peers: their ISA) */
} result;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* splitmix64 + Box-Muller: reproducible synthetic data */
static uint64_t rng = 0x1234567;
static double gauss(void)
{
    uint64_t z1 = (rng += 0x9e3779b97f4a7c15ull), z2 = (rng += 0x9e3779b97f4a7c15ull);
    z1 = (z1 ^ (z1 >> 30)) * 0xbf58476d1ce4e5b9ull; z1 = (z1 ^ (z1 >> 27)) * 0x94d049bb133111ebull; z1 ^= z1 >> 31;
    z2 = (z2 ^ (z2 >> 30)) * 0xbf58476d1ce4e5b9ull; z2 = (z2 ^ (z2 >> 27)) * 0x94d049bb133111ebull; z2 ^= z2 >> 31;
    double u = ((double)(z1 >> 11) + 0.5) * 0x1.0p-53, v = (double)(z2 >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

typedef struct {
    int64_t m, n, k;
    float *w, *x, *bias;
    uint16_t *xb, *biasb;
    int8_t *q;
    float *sw;
    double *ref; /* float64 reference on the sampled rows */
    /* W4A8 / W6A8 of the same weight (index 0: 4 bits, 1: 6 bits), made on
     * first use: packed codes, s_rel, s_channel; weight rel-L2 vs w */
    uint8_t *wq[2], *wsr[2];
    float *wsc[2], cb[16];
    double wrel[2];
    float *down, *up; /* a rank-64 LoRA [64, K], [N, 64] (scale BENCH_LORA_SCALE) */
    double *ref_lora; /* the reference with it */
    uint16_t *xb2, *actw; /* made on first use: swiglu's x [M, 2K] (xb twice), rms_norm's bf16 weight [K] */
    int64_t rows[16];
    int nrows;
} layer_data;

#define BENCH_LORA_RANK 64
#define BENCH_LORA_SCALE 0.5 /* strength 1, alpha 32 */

static void make_data(layer_data *d, int64_t m, int64_t n, int64_t k)
{
    memset(d, 0, sizeof *d);
    d->m = m; d->n = n; d->k = k;
    d->w = malloc((size_t)(n * k) * 4);
    d->x = malloc((size_t)(m * k) * 4);
    d->xb = malloc((size_t)(m * k) * 2);
    d->bias = malloc((size_t)n * 4);
    d->biasb = malloc((size_t)n * 2);
    d->q = malloc((size_t)(n * k));
    d->sw = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n * k; i++) d->w[i] = (float)(gauss() * 0.02);
    for (int64_t i = 0; i < m * k; i++) d->x[i] = (float)gauss();
    for (int64_t c = 0; c < 8; c++) /* a few large outlier input channels */
        for (int64_t r = 0; r < m; r++) d->x[r * k + (c * 97 + 13) % k] *= 30.0f;
    for (int64_t i = 0; i < m * k; i++) {
        d->xb[i] = ql_fp32_to_bf16(d->x[i]);
        d->x[i] = ql_bf16_to_fp32(d->xb[i]); /* every path sees the same input values */
    }
    for (int64_t i = 0; i < n; i++) {
        d->biasb[i] = ql_fp32_to_bf16((float)(gauss() * 0.1));
        d->bias[i] = ql_bf16_to_fp32(d->biasb[i]);
    }
    ql_quantize_convrot_weight(QL_F32, d->w, n, k, k, 256, d->q, k, d->sw);
    d->nrows = m < 16 ? (int)m : 16;
    d->ref = malloc((size_t)(d->nrows * n) * sizeof(double));
    for (int i = 0; i < d->nrows; i++) {
        d->rows[i] = d->nrows == 1 ? 0 : (int64_t)i * (m - 1) / (d->nrows - 1);
        const float *xr = d->x + d->rows[i] * k;
        for (int64_t j = 0; j < n; j++) {
            double s = d->bias[j];
            const float *wr = d->w + j * k;
            for (int64_t p = 0; p < k; p++) s += (double)xr[p] * wr[p];
            d->ref[i * n + j] = s;
        }
    }
    /* a LoRA whose delta is about a tenth of W (random directions) */
    const int64_t rk = BENCH_LORA_RANK;
    d->down = malloc((size_t)(rk * k) * 4);
    d->up = malloc((size_t)(n * rk) * 4);
    d->ref_lora = malloc((size_t)(d->nrows * n) * sizeof(double));
    for (int64_t i = 0; i < rk * k; i++) d->down[i] = (float)(gauss() / sqrt((double)k));
    for (int64_t i = 0; i < n * rk; i++) d->up[i] = (float)(gauss() * 0.002 * sqrt((double)k / (double)rk) / BENCH_LORA_SCALE);
    for (int i = 0; i < d->nrows; i++) {
        double t[BENCH_LORA_RANK];
        const float *xr = d->x + d->rows[i] * k;
        for (int64_t r = 0; r < rk; r++) {
            t[r] = 0;
            for (int64_t p = 0; p < k; p++) t[r] += (double)xr[p] * d->down[r * k + p];
        }
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t r = 0; r < rk; r++) s += t[r] * d->up[j * rk + r];
            d->ref_lora[i * n + j] = d->ref[i * n + j] + BENCH_LORA_SCALE * s;
        }
    }
}

static void free_data(layer_data *d)
{
    for (int b = 0; b < 2; b++) free(d->wq[b]), free(d->wsr[b]), free(d->wsc[b]);
    free(d->w); free(d->x); free(d->xb); free(d->bias); free(d->biasb); free(d->q); free(d->sw); free(d->ref);
    free(d->down); free(d->up); free(d->ref_lora); free(d->xb2); free(d->actw);
}

/* rel L2 of an output (fp32 / bf16 values; with_bias says whether y includes it) */
static double rel_l2(const layer_data *d, ql_dtype dt, const void *y, int with_bias, int lora)
{
    double num = 0, den = 0;
    for (int i = 0; i < d->nrows; i++)
        for (int64_t j = 0; j < d->n; j++) {
            double r = (lora ? d->ref_lora : d->ref)[i * d->n + j] - (with_bias ? 0.0 : d->bias[j]);
            double v = ql_load_f(dt, y, d->rows[i] * d->n + j);
            num += (v - r) * (v - r);
            den += r * r;
        }
    return sqrt(num / (den > 0 ? den : 1));
}

typedef int (*run_fn)(void *arg);

/* One prepared path of one shape: everything is built before timing starts,
 * so repetitions can be interleaved across paths. */
/* Calls under BENCH_SHORT_MS are timed BENCH_SWEEPS times per round (the
 * paths interleaved each time): a 50-100 us call has a heavy upper tail on
 * this shared VM (a quarter of the samples 1.5-5x the median), so 5 single
 * samples gave medians that moved ±20 % between runs. */
#define BENCH_SWEEPS 7
#define BENCH_SHORT_MS 2.0

typedef struct {
    run_fn fn;
    void *arg;     /* copy 0 */
    void **copies; /* ncopies prepared args, each with its own weight (copies[0] == arg) */
    int ncopies, next;
    void *y;
    ql_dtype ydt;
    int with_bias, has_error; /* whether rel_l2 applies, and whether y includes the bias */
    double t[64 * BENCH_SWEEPS];
    int ok;
} runner;

typedef struct {
    ql_linear *lin;
    const void *x;
    ql_dtype xdt, ydt;
    int64_t m, n, k;
    void *y;
    ql_epilogue *epi; /* NULL, or a prologue cache this run reads (w8a8-convrot-cached), or an input activation */
    int64_t ldx;      /* 0: k */
    void *act_rows;   /* op-*: the activated rows [m, k] (ql_input_act_apply), then the layer without epi */
} lin_run;
static int run_linear(void *a)
{
    lin_run *r = a;
    const int64_t ldx = r->ldx ? r->ldx : r->k;
    if (r->act_rows) {
        if (ql_input_act_apply(r->epi, r->xdt, r->x, r->m, r->k, ldx, r->act_rows, r->k) != QL_OK) return 1;
        return ql_linear_forward(r->lin, r->act_rows, r->xdt, r->m, r->k, r->y, r->ydt, r->n, NULL) != QL_OK;
    }
    return ql_linear_forward(r->lin, r->x, r->xdt, r->m, ldx, r->y, r->ydt, r->n, r->epi) != QL_OK;
}

typedef struct {
    ql_s8_prepared *p;
    int32_t *c;
    int64_t ldc;
} gemm_run;
static int run_gemm(void *a)
{
    gemm_run *g = a;
    return ql_s8_prepared_run(g->p, g->c, g->ldc) != QL_OK;
}

typedef struct {
    peer *p;
    const void *x;
    void *y;
    uint8_t *xu;
    float *wcopy; /* OpenBLAS reads the caller's weight: a copy of its own per rotated copy */
} peer_run_t;
static int run_peer(void *a)
{
    peer_run_t *r = a;
    return peer_run(r->p, r->x, r->y);
}

/* The int8 peer's int32 output on the sampled rows against exact sums of its
 * own operands (u8 activations × the layer's s8 codes); returns how many of
 * *checked sums differ. */
static int64_t int8_peer_mismatches(const layer_data *d, const peer_run_t *r, int64_t *checked)
{
    const int32_t *y = r->y;
    int64_t bad = 0;
    *checked = 0;
    for (int i = 0; i < d->nrows; i++) {
        const int64_t row = d->rows[i];
        for (int64_t j = 0; j < d->n; j++) {
            int64_t exact = 0;
            for (int64_t kk = 0; kk < d->k; kk++) exact += (int64_t)r->xu[row * d->k + kk] * d->q[j * d->k + kk];
            bad += y[row * d->n + j] != exact;
            ++*checked;
        }
    }
    return bad;
}

/* The W4A8 (b = 0) or W6A8 (b = 1) weight of this shape: the library's
 * quantizer (fixed-LUT codebook / scale search), rows spread over threads. */
static ql_wxa8_weight wxa8_weight(const layer_data *cd, int b, int threads)
{
    layer_data *d = (layer_data *)cd; /* a cache filled on first use */
    const int64_t n = d->n, k = d->k, ng = k / 16, rb = b ? 3 * k / 4 : k / 2;
    ql_wxa8_qparams p = {b ? QL_WXA8_6BIT : QL_WXA8_CODEBOOK, 16, 256, d->cb, 1};
    if (!d->wq[b]) {
        d->wq[b] = malloc((size_t)(n * rb));
        d->wsr[b] = malloc((size_t)(n * ng));
        d->wsc[b] = malloc((size_t)n * 4);
        if (!b) ql_wxa8_fit_codebook(QL_F32, d->w, n, k, k, &p, d->cb, NULL);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int64_t r0 = 0; r0 < n; r0 += 64) {
            int64_t rows = n - r0 < 64 ? n - r0 : 64;
            ql_wxa8_quantize(QL_F32, d->w + r0 * k, rows, k, k, &p, d->wq[b] + r0 * rb, rb, d->wsr[b] + r0 * ng,
                             d->wsc[b] + r0, NULL);
        }
    }
    ql_wxa8_weight w = {.n = n, .k = k, .bits = b ? 6 : 4, .q = d->wq[b], .ldq = rb, .s_rel = d->wsr[b],
                        .s_channel = d->wsc[b], .codebook = b ? NULL : d->cb, .group = 16, .convrot_group = 256,
                        .bias = d->biasb, .bias_dtype = QL_BF16};
    if (!d->wrel[b]) {
        float *deq = malloc((size_t)(n * k) * 4);
        double num = 0, den = 0;
        if (deq && ql_wxa8_dequantize(&w, QL_F32, deq, k) == QL_OK)
            for (int64_t i = 0; i < n * k; i++) {
                num += ((double)deq[i] - d->w[i]) * ((double)deq[i] - d->w[i]);
                den += (double)d->w[i] * d->w[i];
            }
        d->wrel[b] = den > 0 ? sqrt(num / den) : NAN;
        free(deq);
    }
    return w;
}

/* Build path p for this shape; 0 if it is unavailable (reason on stderr).
 * copy > 0: one more copy of an already prepared path (its own weight,
 * the same output buffer), left in rn->arg. */
static int prepare(ql_context *ctx, const layer_data *d, int p, runner *rn, int copy, size_t *wbytes, char *kernel,
                   size_t klen)
{
    const int64_t m = d->m, n = d->n, k = d->k;
    if (!copy) {
        memset(rn, 0, sizeof *rn);
        rn->y = calloc((size_t)(m * n), 4);
        if (!rn->y) return 0;
    }
    rn->ydt = QL_F32;
    rn->with_bias = 1;
    rn->has_error = 1;
    if (p == P_W4A8 || p == P_W4A8_PACKED || p == P_W6A8 || p == P_W6A8_PACKED) {
        ql_linear_desc desc = {.kind = p == P_W4A8 || p == P_W6A8 ? QL_LINEAR_W8A8 : QL_LINEAR_WXA8_PACKED, .n = n, .k = k};
        desc.wxa8 = wxa8_weight(d, p == P_W6A8 || p == P_W6A8_PACKED, ql_context_threads(ctx));
        ql_linear *lin = NULL;
        if (ql_linear_create(ctx, &desc, &lin) != QL_OK) {
            fprintf(stderr, "\n  %s: %s\n", path_names[p], ql_last_error());
            return 0;
        }
        rn->ydt = QL_BF16;
        lin_run *r = malloc(sizeof *r);
        *r = (lin_run){lin, d->xb, QL_BF16, QL_BF16, m, n, k, rn->y, NULL, 0, NULL};
        rn->fn = run_linear;
        rn->arg = r;
        *wbytes = ql_linear_weight_bytes(lin);
        ql_linear_describe(lin, m, kernel, klen);
        return 1;
    }
    if (p >= P_IN_GELU && p <= P_OP_RMS) { /* w8a8-convrot with an input activation, fused or its own pass */
        const int a = (p - P_IN_GELU) % 3, op = p >= P_OP_GELU;
        ql_linear_desc desc = {.kind = QL_LINEAR_W8A8, .n = n, .k = k};
        desc.int8 = (ql_int8_weight){n, k, d->q, k, d->sw, n, 256, d->biasb, QL_BF16};
        layer_data *dm = (layer_data *)d; /* the shared inputs, made once per shape */
        if (a == 1 && !dm->xb2 && (dm->xb2 = malloc((size_t)(m * k) * 4)))
            for (int64_t r = 0; r < m; r++) {
                memcpy(dm->xb2 + r * 2 * k, d->xb + r * k, (size_t)k * 2);
                memcpy(dm->xb2 + r * 2 * k + k, d->xb + ((r + 1) % m) * k, (size_t)k * 2);
            }
        if (a == 2 && !dm->actw && (dm->actw = malloc((size_t)k * 2)))
            for (int64_t i = 0; i < k; i++) dm->actw[i] = ql_fp32_to_bf16((float)(1.0 + 0.1 * gauss()));
        ql_linear *lin = NULL;
        lin_run *r = calloc(1, sizeof *r);
        ql_epilogue *epi = calloc(1, sizeof *epi);
        void *rows = op ? malloc((size_t)(m * k) * 2) : NULL;
        const int mem = r && epi && (!op || rows) && (a != 1 || d->xb2) && (a != 2 || d->actw);
        if (!mem || ql_linear_create(ctx, &desc, &lin) != QL_OK) {
            fprintf(stderr, "\n  %s: %s\n", path_names[p], mem ? ql_last_error() : "out of memory");
            free(r), free(epi), free(rows);
            return 0;
        }
        *epi = (ql_epilogue){.input_act = in_acts[a], .input_act_weight = a == 2 ? d->actw : NULL,
                             .input_act_weight_dtype = QL_BF16, .input_act_eps = a == 2 ? BENCH_RMS_EPS : 0.0f};
        *r = (lin_run){lin, a == 1 ? (const void *)d->xb2 : d->xb, QL_BF16, QL_BF16, m, n, k, rn->y, epi, a == 1 ? 2 * k : 0, rows};
        rn->ydt = QL_BF16;
        rn->has_error = 0; /* another function than the reference's; fused and op are compared instead */
        rn->fn = run_linear;
        rn->arg = r;
        *wbytes = ql_linear_weight_bytes(lin);
        ql_linear_describe(lin, m, kernel, klen);
        return 1;
    }
    if (p == P_FP32 || p == P_BF16 || p == P_DEQUANT || p == P_WONLY || p == P_W8A8 || p == P_W8A8_CACHED || p == P_W8A8_LORA) {
        ql_linear_desc desc = {0};
        ql_dtype xdt = QL_F32;
        const void *x = d->x;
        if (p == P_FP32 || p == P_BF16) {
            desc = (ql_linear_desc){.kind = QL_LINEAR_DENSE, .n = n, .k = k, .weight = d->w, .ld_weight = k,
                                    .weight_dtype = QL_F32, .compute_dtype = p == P_BF16 ? QL_BF16 : QL_F32,
                                    .bias = d->bias, .bias_dtype = QL_F32};
            if (p == P_BF16) { xdt = rn->ydt = QL_BF16; x = d->xb; }
        } else {
            desc.kind = p == P_W8A8 || p == P_W8A8_CACHED || p == P_W8A8_LORA ? QL_LINEAR_W8A8 : p == P_WONLY ? QL_LINEAR_WEIGHT_ONLY : QL_LINEAR_DEQUANT;
            desc.int8 = (ql_int8_weight){n, k, d->q, k, d->sw, n, 256, d->biasb, QL_BF16};
            if (p != P_DEQUANT) { xdt = rn->ydt = QL_BF16; x = d->xb; }
        }
        ql_linear *lin = NULL;
        if (ql_linear_create(ctx, &desc, &lin) != QL_OK) {
            fprintf(stderr, "\n  %s: %s\n", path_names[p], ql_last_error());
            return 0;
        }
        const ql_lora_desc ld = {BENCH_LORA_RANK, d->down, QL_F32, k, d->up, QL_F32, BENCH_LORA_RANK, BENCH_LORA_SCALE};
        if (p == P_W8A8_LORA && ql_linear_add_lora(lin, &ld, NULL) != QL_OK) {
            fprintf(stderr, "\n  %s: %s\n", path_names[p], ql_last_error());
            ql_linear_destroy(lin);
            return 0;
        }
        lin_run *r = malloc(sizeof *r);
        *r = (lin_run){lin, x, xdt, rn->ydt, m, n, k, rn->y, NULL, 0, NULL};
        if (p == P_W8A8_CACHED) { /* x never changes: one generation; the first run fills the cache */
            ql_prologue_cache *pc = NULL;
            r->epi = calloc(1, sizeof *r->epi);
            if (!r->epi || ql_prologue_cache_create(&pc) != QL_OK) {
                fprintf(stderr, "\n  %s: %s\n", path_names[p], r->epi ? ql_last_error() : "out of memory");
                free(r->epi);
                free(r);
                ql_linear_destroy(lin);
                return 0;
            }
            r->epi->prologue_cache = pc;
        }
        rn->fn = run_linear;
        rn->arg = r;
        *wbytes = ql_linear_weight_bytes(lin);
        ql_linear_describe(lin, m, kernel, klen);
        return 1;
    }
    if (p == P_GEMM) {
        gemm_run *g = calloc(1, sizeof *g);
        int8_t *xq = malloc((size_t)(m * k));
        float *sx = malloc((size_t)m * 4), *xr = malloc((size_t)(m * k) * 4);
        memcpy(xr, d->x, (size_t)(m * k) * 4);
        ql_rotate(QL_F32, xr, m, k, k, 256);
        ql_quantize_rowwise(QL_F32, xr, m, k, k, xq, k, sx);
        const ql_status st = ql_s8_prepare(ctx, xq, m, d->q, n, k, &g->p);
        free(xq); free(sx); free(xr);
        if (st != QL_OK) return 0;
        g->c = rn->y;
        g->ldc = n;
        snprintf(kernel, klen, "%s", ql_s8_prepared_kernel(g->p));
        rn->fn = run_gemm;
        rn->arg = g;
        rn->has_error = 0;
        *wbytes = ql_s8_prepared_weight_bytes(g->p);
        return 1;
    }
    peer_kind kind = p == P_OPENBLAS ? PEER_OPENBLAS_F32 : p == P_ONEDNN_F32 ? PEER_ONEDNN_F32
                   : p == P_ONEDNN_BF16 ? PEER_ONEDNN_BF16 : PEER_ONEDNN_INT8;
    if (!peer_available(kind)) return 0;
    char err[256] = "";
    float *wcopy = NULL;
    if (copy && kind == PEER_OPENBLAS_F32) {
        wcopy = malloc((size_t)(n * k) * 4);
        if (!wcopy) return 0;
        memcpy(wcopy, d->w, (size_t)(n * k) * 4);
    }
    peer *pp = peer_create(kind, m, n, k, wcopy ? wcopy : d->w, d->q, err, sizeof err);
    if (!pp) {
        fprintf(stderr, "\n  %s: %s\n", path_names[p], err);
        free(wcopy);
        return 0;
    }
    peer_run_t *r = calloc(1, sizeof *r);
    r->wcopy = wcopy;
    r->p = pp;
    r->y = rn->y;
    if (kind == PEER_ONEDNN_INT8) { /* timing only: any u8 activations */
        r->xu = malloc((size_t)(m * k));
        for (int64_t i = 0; i < m * k; i++) r->xu[i] = (uint8_t)(((uint64_t)i * 2654435761u) >> 24);
        r->x = r->xu;
        rn->has_error = 0;
    } else r->x = kind == PEER_ONEDNN_BF16 ? (const void *)d->xb : (const void *)d->x;
    rn->ydt = kind == PEER_ONEDNN_BF16 ? QL_BF16 : QL_F32;
    rn->with_bias = 0;
    rn->fn = run_peer;
    rn->arg = r;
    *wbytes = peer_weight_bytes(pp);
    snprintf(kernel, klen, "%s", peer_isa(kind));
    return 1;
}

static void release_arg(const runner *rn, void *arg)
{
    if (rn->fn == run_linear) {
        lin_run *r = arg;
        ql_linear_destroy(r->lin);
        if (r->epi) ql_prologue_cache_destroy(r->epi->prologue_cache);
        free(r->epi);
        free(r->act_rows);
    } else if (rn->fn == run_gemm) {
        gemm_run *g = arg;
        ql_s8_prepared_free(g->p);
    } else {
        peer_run_t *r = arg;
        peer_destroy(r->p);
        free(r->xu);
        free(r->wcopy);
    }
    free(arg);
}

static void release(int p, runner *rn)
{
    (void)p;
    if (rn->copies) {
        for (int c = 0; c < rn->ncopies; c++) release_arg(rn, rn->copies[c]);
        free(rn->copies);
    } else if (rn->arg) release_arg(rn, rn->arg);
    free(rn->y);
}

/* Where the timed calls read their weights from. */
typedef enum { WEIGHTS_AUTO, WEIGHTS_DRAM, WEIGHTS_CACHE } weights_mode;
static const char *weights_names[] = {"auto", "dram", "cache"};
#define BENCH_AUTO_DRAM_M 64  /* auto: from DRAM up to this M (the weight-streaming sizes), from cache above */
#define BENCH_DRAM_FACTOR 2   /* the copies of a weight total at least this many LLCs */
#define BENCH_MAX_COPIES 1024
static size_t bench_llc;      /* bytes of the last-level cache (0: unknown, then 32 MiB is assumed) */

static int weights_from_dram(weights_mode w, int64_t m)
{
    return w == WEIGHTS_DRAM || (w == WEIGHTS_AUTO && m <= BENCH_AUTO_DRAM_M);
}

/* Copies of a weight of `bytes` that together exceed BENCH_DRAM_FACTOR LLCs,
 * so a rotation over them finds none in any cache (one, where the weight
 * alone is that large: memory stays at about copies × bytes). */
static int dram_copies(size_t bytes)
{
    const size_t llc = bench_llc ? bench_llc : (size_t)32 << 20, want = BENCH_DRAM_FACTOR * llc;
    if (bytes >= want) return 1;
    size_t c = bytes ? (want + bytes - 1) / bytes + 1 : 2;
    return c > BENCH_MAX_COPIES ? BENCH_MAX_COPIES : (int)c;
}

/* All wanted paths of one shape: build them, run each once (warm-up, and
 * the output the error is measured on), then `reps` rounds in which every
 * path runs once, so a slow spell of this shared machine hits all paths
 * alike; report the median per path. Each round also samples the int8
 * dot-product peak (*peak: its median, 0 where the ISA has none). */
static void bench_shape(ql_context *ctx, const layer_data *d, const int *want, int reps, int dram, result *res,
                        double *peak, double *bw, int *bw_copies, int *nsamples)
{
    double peaks[64], bws[64 * BENCH_SWEEPS];
    /* the read-bandwidth probe: a buffer the size of the int8 weight, read
     * once per sweep like every path's weight (so from the same level: with
     * weights from DRAM, rotating over as many copies as w8a8's weight) */
    const size_t bw_bytes = ((size_t)(d->n * d->k) + 4095) & ~(size_t)4095;
    const int bwc = dram ? dram_copies(bw_bytes) : 1;
    *bw_copies = bwc;
    char *bwbuf = ql_aligned_alloc(bw_bytes * (size_t)bwc);
    if (bwbuf) memset(bwbuf, 1, bw_bytes * (size_t)bwc);
    int bw_next = 0;
    const ql_isa isa = ql_context_isa(ctx);
    const double ops = 2.0 * (double)d->m * (double)d->n * (double)d->k;
    runner rn[NPATHS];
    if (reps > 64) reps = 64;
    double slowest = 0.0; /* the slowest path's first call, ms */
    for (int p = 0; p < NPATHS; p++) {
        res[p].ok = 0;
        rn[p].ok = 0;
        rn[p].arg = NULL;
        rn[p].y = NULL;
        if (!want[p]) continue;
        fprintf(stderr, "\r  preparing %-14s N=%-5lld K=%-5lld M=%-5lld   ", path_names[p], (long long)d->n, (long long)d->k, (long long)d->m);
        if (!prepare(ctx, d, p, &rn[p], 0, &res[p].wbytes, res[p].kernel, sizeof res[p].kernel)) continue;
        const double t0 = now_ms();
        rn[p].ok = rn[p].fn(rn[p].arg) == 0;
        const double dt = now_ms() - t0;
        if (dt > slowest) slowest = dt;
        res[p].rel_l2 = rn[p].ok && rn[p].has_error ? rel_l2(d, rn[p].ydt, rn[p].y, rn[p].with_bias, p == P_W8A8_LORA) : NAN;
        res[p].inexact = res[p].checked = -1;
        res[p].same = -1;
        if (rn[p].ok && p >= P_OP_GELU && p <= P_OP_RMS && rn[p - 3].ok)
            res[p].same = !memcmp(rn[p].y, rn[p - 3].y, (size_t)(d->m * d->n) * 2);
        if (rn[p].ok && p == P_ONEDNN_INT8) res[p].inexact = int8_peer_mismatches(d, rn[p].arg, &res[p].checked);
        /* weights from DRAM: more copies of the path, each with its own weight */
        const int want_copies = dram ? dram_copies(res[p].wbytes) : 1;
        rn[p].copies = malloc(sizeof(void *) * (size_t)want_copies);
        rn[p].ncopies = 0;
        if (rn[p].copies) rn[p].copies[rn[p].ncopies++] = rn[p].arg;
        for (int c = 1; rn[p].ok && rn[p].copies && c < want_copies; c++) {
            fprintf(stderr, "\r  preparing %-14s N=%-5lld K=%-5lld M=%-5lld copy %d/%d  ", path_names[p], (long long)d->n,
                    (long long)d->k, (long long)d->m, c + 1, want_copies);
            size_t wb = 0;
            char kn[64];
            if (!prepare(ctx, d, p, &rn[p], c, &wb, kn, sizeof kn)) break;
            rn[p].copies[rn[p].ncopies++] = rn[p].arg;
            rn[p].ok = rn[p].fn(rn[p].arg) == 0; /* each copy's first call (lazy set-up) outside the timing */
        }
        rn[p].arg = rn[p].copies ? rn[p].copies[0] : rn[p].arg;
        res[p].copies = rn[p].copies ? rn[p].ncopies : 1;
        res[p].dram = dram;
    }
    const int sweeps = slowest < BENCH_SHORT_MS ? BENCH_SWEEPS : 1, samples = reps * sweeps;
    *nsamples = samples;
    for (int r = 0; r < reps; r++) {
        fprintf(stderr, "\r  timing N=%-5lld K=%-5lld M=%-5lld round %d/%d        ", (long long)d->n, (long long)d->k, (long long)d->m, r + 1, reps);
        for (int s = 0; s < sweeps; s++) {
            for (int p = 0; p < NPATHS; p++) {
                if (!rn[p].ok) continue;
                void *arg = rn[p].copies ? rn[p].copies[rn[p].next] : rn[p].arg;
                if (rn[p].copies) rn[p].next = (rn[p].next + 1) % rn[p].ncopies;
                double t0 = now_ms();
                rn[p].ok = rn[p].fn(arg) == 0;
                rn[p].t[r * sweeps + s] = now_ms() - t0;
            }
            /* the probe in every sweep, so its buffer is as warm as the weights */
            bws[r * sweeps + s] = bwbuf ? ql_bench_read_gbs(bwbuf + bw_bytes * (size_t)bw_next, bw_bytes, ql_context_threads(ctx)) : 0.0;
            bw_next = (bw_next + 1) % bwc;
        }
        peaks[r] = ql_bench_int8_peak_gops(isa, ql_context_threads(ctx), 200000);
    }
    ql_aligned_free(bwbuf);
    qsort(peaks, (size_t)reps, sizeof(double), cmp_double);
    *peak = reps % 2 ? peaks[reps / 2] : 0.5 * (peaks[reps / 2 - 1] + peaks[reps / 2]);
    qsort(bws, (size_t)samples, sizeof(double), cmp_double);
    *bw = samples % 2 ? bws[samples / 2] : 0.5 * (bws[samples / 2 - 1] + bws[samples / 2]);
    for (int p = 0; p < NPATHS; p++) {
        if (rn[p].ok) {
            qsort(rn[p].t, (size_t)samples, sizeof(double), cmp_double);
            res[p].ms = samples % 2 ? rn[p].t[samples / 2] : 0.5 * (rn[p].t[samples / 2 - 1] + rn[p].t[samples / 2]);
            res[p].gops = ops / (res[p].ms * 1e6);
            res[p].ok = 1;
        }
        if (want[p]) release(p, &rn[p]);
    }
    fprintf(stderr, "\r%78s\r", "");
}

static void cpu_name(char *buf, size_t len)
{
    snprintf(buf, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                snprintf(buf, len, "%s", c + 2);
                buf[strcspn(buf, "\n")] = 0;
            }
            break;
        }
    fclose(f);
}

static void usage(void)
{
    fprintf(stderr, "usage: qlinear bench [--profile anima|qwen3-te|large | --shape NxK] [--m N[,N...]] [--threads N] "
                    "[--paths LIST] [--reps N] [--weights auto|dram|cache] [--json FILE]\n  paths:");
    for (int p = 0; p < NPATHS; p++) fprintf(stderr, " %s", path_names[p]);
    fprintf(stderr, "\n");
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* OpenBLAS 0.3.21 (Debian 12) does not recognize newer CPUs and falls back
 * to its slowest kernels (core "Prescott"); a user would set
 * OPENBLAS_CORETYPE, so the bench does it for a fair comparison, before the
 * library initializes: by re-executing itself once with it set. */
static void openblas_coretype(char **argv)
{
    if (getenv("OPENBLAS_CORETYPE") || getenv("QL_BENCH_REEXEC") || !peer_available(PEER_OPENBLAS_F32)) return;
    if (!strstr(peer_info(PEER_OPENBLAS_F32), "core Prescott")) return;
    /* a forced AVX2-class ISA (QLINEAR_ISA) gets OpenBLAS's AVX2 core too */
    const char *forced = getenv("QLINEAR_ISA");
    const int avx2_only = forced && (!strcmp(forced, "avx2") || !strcmp(forced, "avxvnni"));
    const char *core = ql_isa_supported(QL_ISA_AVX512VNNI) && !avx2_only ? "SkylakeX"
                     : ql_isa_supported(QL_ISA_AVX2)                     ? "Haswell"
                                                                         : NULL;
    if (!core) return;
    setenv("OPENBLAS_CORETYPE", core, 1);
    setenv("QL_BENCH_REEXEC", "1", 1);
    fflush(NULL);
    execv("/proc/self/exe", argv - 1); /* argv[-1] is "qlinear" */
}

/* The command line of `qlinear bench` (CPU). */
typedef struct bench_opts {
    const profile *prof;
    profile single; /* --shape NxK: one layer, count 1 */
    long threads, reps;
    int64_t mlist[16];
    int nm; /* --m list; none: each shape's own M (one entry 0) */
    const char *json_path;
    int want[NPATHS];
    weights_mode weights;
} bench_opts;

static int parse_shape(const char *v, profile *single)
{
    long n = 0, k = 0;
    const char *x = strchr(v, 'x');
    char nbuf[32];
    if (x && (size_t)(x - v) < sizeof nbuf) {
        memcpy(nbuf, v, (size_t)(x - v));
        nbuf[x - v] = 0;
    }
    if (!x || (size_t)(x - v) >= sizeof nbuf || !parse_int(nbuf, 1, 1 << 20, &n) || !parse_int(x + 1, 1, 65536, &k)) {
        fprintf(stderr, "qlinear bench: --shape %s is not NxK (N in 1..1048576, K in 1..65536)\n", v);
        return 0;
    }
    single->shapes[0].n = n;
    single->shapes[0].k = k;
    return 1;
}

static int parse_mlist(const char *v, bench_opts *o)
{
    char *list = strdup(v), *save = NULL;
    o->nm = 0;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        long mv;
        if (o->nm == 16 || !parse_int(t, 1, 1 << 20, &mv)) {
            fprintf(stderr, "qlinear bench: --m %s is not a list of at most 16 values in 1..1048576\n", v);
            free(list);
            return 0;
        }
        o->mlist[o->nm++] = mv;
    }
    free(list);
    if (!o->nm) fprintf(stderr, "qlinear bench: --m needs a value\n");
    return o->nm > 0;
}

static int parse_paths(const char *v, int *want)
{
    for (int p = 0; p < NPATHS; p++) want[p] = 0;
    char *list = strdup(v), *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int p = 0; p < NPATHS; p++)
            if (!strcmp(t, path_names[p])) want[p] = found = 1;
        if (!found) {
            fprintf(stderr, "qlinear bench: unknown path '%s'\n", t);
            usage();
            free(list);
            return 0;
        }
    }
    free(list);
    return 1;
}

/* -1: go on; otherwise the exit status (0 after --help, 2 for a bad option). */
static int parse_opts(int argc, char **argv, bench_opts *o)
{
    o->prof = &profiles[0];
    o->single = (profile){"shape", 1024, {{0, 0, 0, 1}}, 1};
    o->threads = -1;
    o->reps = 7;
    o->nm = 0;
    o->json_path = NULL;
    o->weights = WEIGHTS_AUTO;
    for (int p = 0; p < NPATHS; p++) /* the diagnostics and the activations: asked for by name */
        o->want[p] = p != P_W8A8_CACHED && !(p >= P_IN_GELU && p <= P_OP_RMS);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        if (!v) { fprintf(stderr, "qlinear bench: %s needs a value\n", a); usage(); return 2; }
        i++;
        if (!strcmp(a, "--profile")) {
            o->prof = NULL;
            for (size_t j = 0; j < sizeof profiles / sizeof profiles[0]; j++)
                if (!strcmp(v, profiles[j].name)) o->prof = &profiles[j];
            if (!o->prof) { fprintf(stderr, "qlinear bench: unknown profile '%s' (anima, qwen3-te, large)\n", v); return 2; }
        } else if (!strcmp(a, "--shape")) {
            if (!parse_shape(v, &o->single)) return 2;
            o->prof = &o->single;
        } else if (!strcmp(a, "--m")) {
            if (!parse_mlist(v, o)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_int(v, 1, 1024, &o->threads)) { fprintf(stderr, "qlinear bench: --threads %s is not in 1..1024\n", v); return 2; }
        } else if (!strcmp(a, "--reps")) {
            if (!parse_int(v, 1, 64, &o->reps)) { fprintf(stderr, "qlinear bench: --reps %s is not in 1..64\n", v); return 2; }
        } else if (!strcmp(a, "--json")) o->json_path = v;
        else if (!strcmp(a, "--weights")) {
            int found = 0;
            for (int w = 0; w < 3; w++)
                if (!strcmp(v, weights_names[w])) o->weights = (weights_mode)w, found = 1;
            if (!found) { fprintf(stderr, "qlinear bench: --weights %s is not auto, dram or cache\n", v); return 2; }
        }
        else if (!strcmp(a, "--device")) continue; /* "cpu": this bench */
        else if (!strcmp(a, "--paths")) {
            if (!parse_paths(v, o->want)) return 2;
        } else { fprintf(stderr, "qlinear bench: unknown option '%s'\n", a); usage(); return 2; }
    }
    /* the baseline every ratio refers to: fp32, or with --paths not naming
     * it the first path named (a thread-scaling run at 1 thread need not
     * time fp32) */
    base_path = P_FP32;
    if (!o->want[P_FP32]) {
        int any = 0;
        for (int p = 0; p < NPATHS && !any; p++)
            if (o->want[p]) base_path = p, any = 1;
        if (!any) o->want[P_FP32] = 1;
    }
    if (!o->nm) o->mlist[o->nm++] = 0;
    return -1;
}

static void print_header(const bench_opts *o, ql_context *ctx, int nt, const char *cpu)
{
    printf("qlinear bench — profile %s, threads %d, ISA %s, median of %ld interleaved rounds\n", o->prof->name, nt,
           ql_isa_name(ql_context_isa(ctx)), o->reps);
    printf("machine: %s\n", cpu);
    for (int i = QL_ISA_GENERIC; strcmp(ql_isa_name((ql_isa)i), "unknown"); i++) { /* why a kernel table of this build is not used */
        const char *why = ql_isa_refusal((ql_isa)i);
        if (*why && !strstr(why, "another architecture")) printf("ISA %s refused: %s\n", ql_isa_name((ql_isa)i), why);
    }
    if (getenv("QL_BENCH_REEXEC"))
        printf("note: OPENBLAS_CORETYPE=%s set by qlinear bench (this OpenBLAS fell back to core Prescott on this CPU)\n",
               getenv("OPENBLAS_CORETYPE"));
    printf("peers: %s; %s\n", peer_available(PEER_OPENBLAS_F32) ? peer_info(PEER_OPENBLAS_F32) : "OpenBLAS absent",
           peer_available(PEER_ONEDNN_F32) ? peer_info(PEER_ONEDNN_F32) : "oneDNN absent");
    if (peer_available(PEER_ONEDNN_F32))
        printf("peer ISAs: %s; %s%s\n", peer_isa(PEER_OPENBLAS_F32), peer_isa(PEER_ONEDNN_F32),
               getenv("ONEDNN_MAX_CPU_ISA") ? " (ONEDNN_MAX_CPU_ISA set)" : "");
    printf("data: W ~ N(0, 0.02²) fp32 quantized INT8 ConvRot G=256; X ~ N(0,1) with 8 input channels ×30, bf16 values\n");
    printf("rel_l2: vs a float64 reference of the unquantized layer (+ bias), on %d sampled rows; for onednn-int8,\n"
           "whether its int32 sums on those rows equal the exact sums of its operands (INEXACT: some differ, as where\n"
           "oneDNN lacks VNNI and sums u8 x s8 pairs in saturating int16)\n\n", 16);
    for (int p = 0; p < NPATHS; p++)
        if (o->want[p]) printf("  %-19s %s\n", path_names[p], path_notes[p]);
    const size_t llc = bench_llc ? bench_llc : (size_t)32 << 20;
    printf("\nweights (--weights %s): ", weights_names[o->weights]);
    if (o->weights == WEIGHTS_CACHE) printf("every path calls one weight, which stays in the caches as far as it fits");
    else
        printf("%s\neach path rotates over copies of its weight (each call the next copy) totalling > %d x the\n"
               "%.0f MB last-level cache (%s), so every timed call reads its weight from DRAM%s",
               o->weights == WEIGHTS_DRAM ? "from DRAM:" : "from DRAM for M <= 64 (weight-streaming sizes), from cache above:",
               BENCH_DRAM_FACTOR, (double)llc / (1 << 20), bench_llc ? "sysfs or CPUID" : "assumed",
               o->weights == WEIGHTS_AUTO ? "; larger M reuse one\nweight (compute-bound: 'cache')" : "");
    printf("\nread bandwidth (M <= 64): a STREAM-like read of a buffer the size of the layer's int8 weight, on the same\n"
           "threads, once per sweep like every path's weight (so from the same level: the same rotation over copies);\n"
           "for each path, its weight bytes / time (GB/s) and the share of that bandwidth (%%bw). kernel: the micro-kernel\n"
           "and path that ran.\n");
}

/* Everything measured, per M of the list (first index) and shape of the profile. */
typedef struct bench_results {
    result (*all)[8][NPATHS];
    double (*peak)[8], (*bw)[8];
    int (*bwc)[8]; /* the probe's copies (1: weights from cache) */
    double (*totals)[NPATHS];
    int64_t (*ms_used)[8];
    double (*wrel)[8][2]; /* weight rel-L2 of W4A8 / W6A8 (0: not made) */
} bench_results;

static int results_alloc(bench_results *R, int nm)
{
    R->all = calloc((size_t)nm, sizeof *R->all);
    R->peak = calloc((size_t)nm, sizeof *R->peak);
    R->bw = calloc((size_t)nm, sizeof *R->bw);
    R->bwc = calloc((size_t)nm, sizeof *R->bwc);
    R->totals = calloc((size_t)nm, sizeof *R->totals);
    R->ms_used = calloc((size_t)nm, sizeof *R->ms_used);
    R->wrel = calloc((size_t)nm, sizeof *R->wrel);
    return R->all && R->peak && R->bw && R->bwc && R->totals && R->ms_used && R->wrel;
}

static void results_free(bench_results *R)
{
    free(R->all); free(R->peak); free(R->bw); free(R->bwc); free(R->totals); free(R->ms_used); free(R->wrel);
}

/* A path of the profile measured on every shape. */
static int path_complete(const bench_results *R, const profile *prof, int mi, int p)
{
    int complete = 1;
    for (int s = 0; s < prof->nshapes; s++) complete &= R->all[mi][s][p].ok;
    return complete;
}

/* One shape's rows (every path measured) and its notes. */
static void print_shape(const bench_results *R, int mi, int s, const shape *sh, int64_t m, int nsamples, long reps)
{
    char nk[32];
    snprintf(nk, sizeof nk, "%lldx%lld", (long long)sh->n, (long long)sh->k);
    const result *row = R->all[mi][s];
    for (int p = 0; p < NPATHS; p++) {
        const result *r = &row[p];
        if (!r->ok) continue;
        char rel[16] = "-", gbs[16] = "", frac[16] = "";
        if (!isnan(r->rel_l2)) snprintf(rel, sizeof rel, "%.5f", r->rel_l2);
        else if (r->checked > 0) snprintf(rel, sizeof rel, "%s", r->inexact ? "INEXACT" : "exact");
        if (m <= 64) {
            const double g = (double)r->wbytes / (r->ms * 1e6);
            snprintf(gbs, sizeof gbs, "%.1f", g);
            if (R->bw[mi][s] > 0) snprintf(frac, sizeof frac, "%.0f%%", 100.0 * g / R->bw[mi][s]);
        }
        printf("%-11s %6lld %5lld  %-19s %10.3f %9.1f %7.2fx %9s %10.1f %7s %5s  %s\n", p == 0 ? nk : "", (long long)m,
               (long long)sh->count, path_names[p], r->ms, r->gops, row[base_path].ms / r->ms, rel, (double)r->wbytes / 1e6,
               gbs, frac, r->kernel);
    }
    if (nsamples > reps)
        printf("%-11s %6s %5s  short calls: median of %d samples (%d sweeps of every path per round)\n", "", "", "", nsamples,
               nsamples / (int)reps);
    if (row[P_W8A8].ok && row[P_W8A8_LORA].ok)
        printf("%-11s %6s %5s  rank-64 LoRA unmerged: %+.1f%% time over w8a8-convrot\n", "", "", "",
               100.0 * (row[P_W8A8_LORA].ms / row[P_W8A8].ms - 1.0));
    for (int a = 0; a < 3; a++)
        if (row[P_W8A8].ok && row[P_IN_GELU + a].ok) {
            printf("%-11s %6s %5s  input activation %s fused: %+.1f%% time over w8a8-convrot", "", "", "",
                   path_names[P_IN_GELU + a] + 3, 100.0 * (row[P_IN_GELU + a].ms / row[P_W8A8].ms - 1.0));
            if (row[P_OP_GELU + a].ok)
                printf("; its own pass, then the layer: %.2fx the fused time (outputs %s)", row[P_OP_GELU + a].ms / row[P_IN_GELU + a].ms,
                       row[P_OP_GELU + a].same == 1 ? "bit-identical" : row[P_OP_GELU + a].same == 0 ? "DIFFER" : "not compared");
            printf("\n");
        }
    if (row[P_W8A8].ok && row[P_W8A8_CACHED].ok) { /* x bf16 read once, the codes written once */
        const double pro = row[P_W8A8].ms - row[P_W8A8_CACHED].ms, bytes = (double)m * (double)sh->k * 3.0;
        printf("%-11s %6s %5s  prologue (w8a8-convrot less -cached): %.4f ms", "", "", "", pro);
        if (pro > 0) printf(", %.1f GB/s of x read and codes written once", bytes / pro / 1e6);
        printf("\n");
    }
    if (R->wrel[mi][s][0] > 0 || R->wrel[mi][s][1] > 0)
        printf("%-11s %6s %5s  weight rel-L2 (dequantized vs the fp32 weight): w4a8 %.5f, w6a8 %.5f\n", "", "", "",
               R->wrel[mi][s][0], R->wrel[mi][s][1]);
    if (m <= 64 && R->bw[mi][s] > 0)
        printf("%-11s %6s %5s  read bandwidth %.1f GB/s (%.1f MB buffer%s, median of the same rounds)\n", "", "", "",
               R->bw[mi][s], (double)(sh->n * sh->k) / 1e6, row[P_FP32].dram ? " x copies, from DRAM" : "");
    if (row[P_FP32].dram)
        printf("%-11s %6s %5s  weights from DRAM: copies per path %d (fp32) .. %d; the probe %d\n", "", "", "", row[P_FP32].copies,
               row[P_W4A8_PACKED].ok ? row[P_W4A8_PACKED].copies : row[P_W8A8].copies, R->bwc[mi][s]);
    if (R->peak[mi][s] > 0) {
        /* AMX's loop runs on tiles of random bytes (peak.c) */
        const bool amx = (row[P_GEMM].ok && strstr(row[P_GEMM].kernel, "__amx")) || (row[P_W8A8].ok && strstr(row[P_W8A8].kernel, "__amx"));
        printf("%-11s %6s %5s  int8 peak %.0f GOP/s (dot-product loop%s, median of the same rounds):", "", "", "", R->peak[mi][s],
               amx ? ", TDPBSSD on random tiles" : "");
        const int int8_paths[] = {P_W8A8, P_GEMM, P_ONEDNN_INT8};
        for (int i = 0; i < 3; i++)
            if (row[int8_paths[i]].ok)
                printf(" %s %.0f%%", path_names[int8_paths[i]], 100.0 * row[int8_paths[i]].gops / R->peak[mi][s]);
        printf("\n");
    }
    fflush(stdout);
}

static void print_totals(const bench_results *R, const bench_opts *o, int mi)
{
    const profile *prof = o->prof;
    printf("\nweighted totals (Σ ms × count = one pass through every layer once):\n");
    if (o->mlist[mi] > 0) printf("  M = %lld\n", (long long)o->mlist[mi]);
    const int peers[] = {P_ONEDNN_INT8, P_ONEDNN_BF16, P_ONEDNN_F32};
    for (int p = 0; p < NPATHS; p++) {
        if (!path_complete(R, prof, mi, p)) continue;
        printf("  %-19s %10.1f ms   %6.2fx vs %s", path_names[p], R->totals[mi][p],
               R->totals[mi][base_path] / R->totals[mi][p], path_names[base_path]);
        for (int i = 0; i < 3; i++)
            if (R->all[mi][0][peers[i]].ok && R->totals[mi][peers[i]] > 0)
                printf("   %5.2fx %s", R->totals[mi][p] / R->totals[mi][peers[i]], path_names[peers[i]]);
        printf("\n");
    }
    int lora_total = 1;
    for (int s = 0; s < prof->nshapes; s++) lora_total &= R->all[mi][s][P_W8A8].ok && R->all[mi][s][P_W8A8_LORA].ok;
    if (lora_total)
        printf("  rank-64 LoRA unmerged: %+.1f%% weighted time over w8a8-convrot\n",
               100.0 * (R->totals[mi][P_W8A8_LORA] / R->totals[mi][P_W8A8] - 1.0));
    for (int a = 0; a < 3; a++)
        if (path_complete(R, prof, mi, P_W8A8) && path_complete(R, prof, mi, P_IN_GELU + a)) {
            printf("  input activation %s fused: %+.1f%% weighted time over w8a8-convrot", path_names[P_IN_GELU + a] + 3,
                   100.0 * (R->totals[mi][P_IN_GELU + a] / R->totals[mi][P_W8A8] - 1.0));
            if (path_complete(R, prof, mi, P_OP_GELU + a))
                printf("; its own pass, then the layer: %.2fx the fused time", R->totals[mi][P_OP_GELU + a] / R->totals[mi][P_IN_GELU + a]);
            printf("\n");
        }
    fflush(stdout);
}

/* Every shape of the profile at M = o->mlist[mi] (0: the shape's own). */
static void run_m(ql_context *ctx, const bench_opts *o, bench_results *R, int mi)
{
    const profile *prof = o->prof;
    printf("\n%-11s %6s %5s  %-19s %10s %9s %8s %9s %10s %7s %5s  %s\n", "N x K", "M", "count", "path", "ms", "GOP/s",
           base_path == P_FP32 ? "vs fp32" : "vs base", "rel_l2", "weight MB", "GB/s", "%bw", "kernel");
    for (int s = 0; s < prof->nshapes; s++) {
        const shape *sh = &prof->shapes[s];
        const int64_t m = o->mlist[mi] > 0 ? o->mlist[mi] : sh->m ? sh->m : prof->default_m;
        R->ms_used[mi][s] = m;
        layer_data d;
        fprintf(stderr, "\r  generating N=%lld K=%lld ...", (long long)sh->n, (long long)sh->k);
        make_data(&d, m, sh->n, sh->k);
        int nsamples = 0;
        bench_shape(ctx, &d, o->want, (int)o->reps, weights_from_dram(o->weights, m), R->all[mi][s], &R->peak[mi][s],
                    &R->bw[mi][s], &R->bwc[mi][s], &nsamples);
        for (int b = 0; b < 2; b++) R->wrel[mi][s][b] = d.wrel[b];
        free_data(&d);
        for (int p = 0; p < NPATHS; p++)
            if (R->all[mi][s][p].ok) R->totals[mi][p] += R->all[mi][s][p].ms * (double)sh->count;
        print_shape(R, mi, s, sh, m, nsamples, o->reps);
    }
    print_totals(R, o, mi);
}

static void json_totals(FILE *f, const bench_results *R, const profile *prof, int mi)
{
    int first = 1;
    for (int p = 0; p < NPATHS; p++) {
        if (!path_complete(R, prof, mi, p)) continue;
        fprintf(f, "%s\"%s\": %.6f", first ? "" : ", ", path_names[p], R->totals[mi][p]);
        first = 0;
    }
}

/* The records and totals as JSON, written atomically (a temporary file, then a rename). */
static int write_json(const bench_opts *o, const bench_results *R, const char *cpu, ql_context *ctx, int nt)
{
    const profile *prof = o->prof;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", o->json_path);
    FILE *f = fopen(tmp, "w");
    if (!f) { fprintf(stderr, "qlinear bench: cannot write %s\n", tmp); return 0; }
    fprintf(f, "{\n  \"machine\": {\"cpu\": \"%s\", \"isa\": \"%s\", \"llc_bytes\": %zu},\n", cpu,
            ql_isa_name(ql_context_isa(ctx)), bench_llc);
    fprintf(f, "  \"weights\": {\"mode\": \"%s\", \"dram_factor_llc\": %d, \"auto_dram_max_m\": %d},\n",
            weights_names[o->weights], BENCH_DRAM_FACTOR, BENCH_AUTO_DRAM_M);
    fprintf(f, "  \"profile\": \"%s\",\n  \"m\": %lld,\n  \"threads\": %d,\n  \"reps\": %ld,\n  \"records\": [\n", prof->name,
            (long long)(o->mlist[0] > 0 ? o->mlist[0] : prof->default_m), nt, o->reps);
    int first = 1;
    for (int mi = 0; mi < o->nm; mi++)
        for (int s = 0; s < prof->nshapes; s++)
            for (int p = 0; p < NPATHS; p++) {
                const result *r = &R->all[mi][s][p];
                if (!r->ok) continue;
                fprintf(f, "%s    {\"n\": %lld, \"k\": %lld, \"m\": %lld, \"count\": %lld, \"path\": \"%s\", \"kernel\": \"%s\", "
                           "\"ms\": %.6f, \"gops\": %.3f, \"int8_peak_gops\": %.3f, \"read_gbs\": %.3f, \"weight_bytes\": %zu, "
                           "\"weights_from\": \"%s\", \"copies\": %d, \"read_copies\": %d, \"rel_l2\": ",
                        first ? "" : ",\n", (long long)prof->shapes[s].n, (long long)prof->shapes[s].k,
                        (long long)R->ms_used[mi][s], (long long)prof->shapes[s].count, path_names[p], r->kernel, r->ms,
                        r->gops, R->peak[mi][s], R->bw[mi][s], r->wbytes, r->dram ? "dram" : "cache", r->copies,
                        R->bwc[mi][s]);
                if (isnan(r->rel_l2)) fprintf(f, "null");
                else fprintf(f, "%.8f", r->rel_l2);
                if (r->checked > 0)
                    fprintf(f, ", \"int32_checked\": %lld, \"int32_inexact\": %lld", (long long)r->checked,
                            (long long)r->inexact);
                const int wb = p == P_W4A8 || p == P_W4A8_PACKED ? 0 : p == P_W6A8 || p == P_W6A8_PACKED ? 1 : -1;
                if (wb >= 0) fprintf(f, ", \"weight_rel_l2\": %.8f", R->wrel[mi][s][wb]);
                if (r->same >= 0) fprintf(f, ", \"same_as_fused\": %s", r->same ? "true" : "false");
                fprintf(f, "}");
                first = 0;
            }
    /* "totals": the first M (as before); "totals_by_m": every M of --m */
    fprintf(f, "\n  ],\n  \"totals_by_m\": {");
    for (int mi = 0; mi < o->nm; mi++) {
        fprintf(f, "%s\"%lld\": {", mi ? ", " : "", (long long)(o->mlist[mi] > 0 ? o->mlist[mi] : prof->default_m));
        json_totals(f, R, prof, mi);
        fprintf(f, "}");
    }
    fprintf(f, "},\n  \"totals\": {");
    json_totals(f, R, prof, 0);
    fprintf(f, "}\n}\n");
    if (fclose(f) != 0 || rename(tmp, o->json_path) != 0) {
        fprintf(stderr, "qlinear bench: cannot write %s\n", o->json_path);
        remove(tmp);
        return 0;
    }
    return 1;
}

int ql_cmd_bench(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--device") && strcmp(argv[i + 1], "cpu")) {
#ifdef QL_HAVE_CUDA_BENCH
            return ql_cmd_bench_cuda(argc, argv);
#else
            fprintf(stderr, "qlinear bench: --device %s: this qlinear was built without CUDA (nvcc not found)\n", argv[i + 1]);
            return 1;
#endif
        }
    openblas_coretype(argv);
    bench_opts o;
    const int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;

    ql_context *ctx;
    if (ql_context_create(&ctx) != QL_OK) { fprintf(stderr, "qlinear bench: %s\n", ql_last_error()); return 1; }
    if (o.threads > 0) ql_context_set_threads(ctx, (int)o.threads);
    const int nt = ql_context_threads(ctx);
    peer_set_threads(nt);
    bench_llc = ql_bench_llc_bytes(NULL);
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    print_header(&o, ctx, nt, cpu);
    bench_results R;
    if (!results_alloc(&R, o.nm)) { fprintf(stderr, "qlinear bench: out of memory\n"); return 1; }
    for (int mi = 0; mi < o.nm; mi++) run_m(ctx, &o, &R, mi);
    const int ok = !o.json_path || write_json(&o, &R, cpu, ctx, nt);
    results_free(&R);
    ql_context_destroy(ctx);
    return ok ? 0 : 1;
}
