/* qlinear bench --device cuda: the W8A8 ConvRot pipeline (and W4A8 / W6A8,
 * decoded once or kept packed) and our int8 GEMM on the GPU, side by side with cuBLASLt bf16, fp16 and int8 (s8·s8→s32, TN)
 * in the same run. Each cuBLASLt shape uses the fastest of its heuristic's
 * top 8 algorithms (64 MB workspace). CUDA events; median of samples; every
 * sample cycles through several input/weight sets larger than twice the L2,
 * so the cache does not flatter; paths are interleaved within each round. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "core/core.h"
#include "cuda/cuda_backend.h"
#include "quant/wxa8.h"
#include "qlinear.h"

enum { C_BF16, C_FP16, C_INT8, C_W8A8, C_GEMM, C_PRO, C_MMA, C_W4A8, C_W4A8P, C_W6A8, C_W6A8P, C_LORA, C_GELU, C_BF16G,
       C_RD8, C_RD4, C_RD6, C_IN_GELU, C_IN_SWIGLU, C_IN_RMS, C_OP_GELU, C_OP_SWIGLU, C_OP_RMS, NPATHS };
static const char *names[NPATHS] = {"cublas-bf16", "cublas-fp16", "cublaslt-int8", "w8a8-convrot", "int8-gemm", "prologue",
                                    "w8a8-sm80", "w4a8", "w4a8-packed", "w6a8", "w6a8-packed", "w8a8-convrot+lora64",
                                    "w8a8-convrot+gelu", "cublas-bf16+gelu", "read-int8", "read-w4a8-packed",
                                    "read-w6a8-packed", "in-gelu_tanh", "in-swiglu", "in-rms_norm", "op-gelu_tanh",
                                    "op-swiglu", "op-rms_norm"};
#define LORA_RANK 64
static const char *notes[NPATHS] = {
    "peer: cuBLASLt bf16 in/out, fp32 accumulate, the dequantized un-rotated weight (the same function in bf16)",
    "peer: cuBLASLt fp16 in/out, fp32 accumulate",
    "peer: cuBLASLt s8*s8->s32 TN, the bare GEMM (no rotation, no quantization, int32 out)",
    "ours: full pipeline, bf16 in -> rotate + quantize (prologue kernel) -> int8 GEMM + scale restore + bias -> bf16",
    "ours: the int8 GEMM alone, s8*s8->s32 (ql_gemm_s8s8s32 on the device)",
    "ours: the prologue kernel alone (bf16 rows -> rotated int8 codes + scales); GB/s counts bytes read + written",
    "ours: w8a8-convrot on the sm_80 mma.sync kernel (QLINEAR_CUDA_GEMM=mma): the sm_80 kernel on Hopper, not an Ampere figure",
    "ours: W4A8 (codebook, g16 e4m3) decoded once at load to the int8 grid, then the w8a8 pipeline",
    "ours: W4A8 (codebook, g16) kept 4-bit: M <= 4 the packed GEMV (decoded in registers), M <= 16 the tensor-core kernel "
    "(B decoded in registers), else decoded each call, then the int8 GEMM",
    "ours: W6A8 (g16 e4m3) decoded once at load, then the w8a8 pipeline",
    "ours: W6A8 kept 6-bit: M <= 4 the packed GEMV, M <= 16 the tensor-core kernel, else decoded each call, then the int8 GEMM",
    "ours: w8a8-convrot with an unmerged rank-64 LoRA (the down GEMM, t requantized, the low-rank product in an epilogue "
    "kernel after the base GEMM); its floor is the base + R/N + R/K of it",
    "ours: w8a8-convrot with the output GELU (exact erf form, bit-identical to the CPU) in the GEMM's epilogue",
    "peer: cuBLASLt bf16 with its own GELU epilogue (CUBLASLT_EPILOGUE_GELU)",
    "floor: one kernel that reads the int8 weight's bytes once and nothing else (what a one-kernel layer costs at least)",
    "floor: the same for the W4A8 packed layer's resident bytes",
    "floor: the same for the W6A8 packed layer's resident bytes",
    "ours: w8a8-convrot with the input activation gelu_tanh fused into its prologue (comfy-kitchen's input_act)",
    "ours: the same with swiglu (x [M, 2K]: gate | up)",
    "ours: the same with rms_norm (a bf16 weight [K], eps 1e-6)",
    "peer: gelu_tanh as its own op (one kernel, bf16 rows read once and written once: the least a separate op costs), "
    "then w8a8-convrot",
    "peer: swiglu as its own op (one kernel; eager's is two), then w8a8-convrot",
    "peer: rms_norm as its own op (one kernel, one block a row), then w8a8-convrot"};
int ql_bench_read_bytes(const void *p, size_t bytes, unsigned *sink, int sms, cudaStream_t s); /* read_floor.cu */
int ql_bench_act_op(int act, const void *x, void *y, const void *w, int64_t m, int64_t k, float eps, int sms,
                    cudaStream_t s); /* act_op.cu */
#define ACT_EPS 1e-6f

typedef struct { int64_t n, k, count; } shape;
static const shape anima[] = {{2048, 2048, 168}, {256, 2048, 84}, {6144, 256, 84},
                              {2048, 1024, 56},  {8192, 2048, 28}, {2048, 8192, 28}};

#define CK(call)                                                                                                     \
    do {                                                                                                             \
        cudaError_t e_ = (call);                                                                                     \
        if (e_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "qlinear bench: %s: %s\n", #call, cudaGetErrorString(e_));                               \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)
#define CKB(call)                                                                                                    \
    do {                                                                                                             \
        cublasStatus_t s_ = (call);                                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                           \
            fprintf(stderr, "qlinear bench: %s: cuBLAS status %d\n", #call, (int)s_);                                \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

static void *dmalloc(size_t b)
{
    void *p = NULL;
    CK(cudaMalloc(&p, b ? b : 16));
    return p;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float gauss(void)
{
    double u = ((double)(next() >> 11) + 0.5) * 0x1.0p-53, v = (double)(next() >> 11) * 0x1.0p-53;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* One cuBLASLt matmul Y[M,N] = X[M,K]·W[N,K]ᵀ in the TN layout with its chosen algorithm. */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    int int8;
} ltmm;

static cublasLtHandle_t lt;
static void *lt_ws;
static const size_t lt_ws_bytes = 64u << 20;

static void lt_run(const ltmm *g, const void *w, const void *x, void *y, cudaStream_t s)
{
    float a = 1, b = 0;
    int32_t ai = 1, bi = 0;
    const void *alpha = g->int8 ? (const void *)&ai : (const void *)&a, *beta = g->int8 ? (const void *)&bi : (const void *)&b;
    CKB(cublasLtMatmul(lt, g->op, alpha, w, g->la, x, g->lb, beta, y, g->lc, y, g->lc, &g->algo, lt_ws, lt_ws_bytes, s));
}

static float event_ms(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

/* Picks the fastest of the heuristic's top 8 on these buffers. */
static int lt_setup(ltmm *g, int kind, int64_t m, int64_t n, int64_t k, const void *w, const void *x, void *y,
                    cudaStream_t s)
{
    cudaDataType_t t = kind == C_BF16 || kind == C_BF16G ? CUDA_R_16BF : kind == C_FP16 ? CUDA_R_16F : CUDA_R_8I;
    cudaDataType_t tc = kind == C_INT8 ? CUDA_R_32I : t;
    g->int8 = kind == C_INT8;
    CKB(cublasLtMatmulDescCreate(&g->op, g->int8 ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                 g->int8 ? CUDA_R_32I : CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CKB(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CKB(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (kind == C_BF16G) {
        const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_GELU;
        CKB(cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    }
    CKB(cublasLtMatrixLayoutCreate(&g->la, t, (uint64_t)k, (uint64_t)n, k));
    CKB(cublasLtMatrixLayoutCreate(&g->lb, t, (uint64_t)k, (uint64_t)m, k));
    CKB(cublasLtMatrixLayoutCreate(&g->lc, tc, (uint64_t)n, (uint64_t)m, n));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_ws_bytes,
                                             sizeof lt_ws_bytes));
    cublasLtMatmulHeuristicResult_t res[8];
    int found = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, g->op, g->la, g->lb, g->lc, g->lc, pref, 8, res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) return 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = INFINITY;
    int best_i = 0;
    for (int i = 0; i < found; i++) {
        g->algo = res[i].algo;
        lt_run(g, w, x, y, s);
        CK(cudaEventRecord(e0, s));
        for (int r = 0; r < 5; r++) lt_run(g, w, x, y, s);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms = event_ms(e0, e1);
        if (ms < best) best = ms, best_i = i;
    }
    g->algo = res[best_i].algo;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 1;
}

static void lt_free(ltmm *g)
{
    cublasLtMatrixLayoutDestroy(g->la);
    cublasLtMatrixLayoutDestroy(g->lb);
    cublasLtMatrixLayoutDestroy(g->lc);
    cublasLtMatmulDescDestroy(g->op);
}

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double ms[NPATHS], host_us[NPATHS];
    double rel_l2;
    double act_rel_l2[3]; /* each fused input activation's output against its op, then the layer */
    char kernel[48];
    size_t wbytes[NPATHS]; /* resident weight bytes (ql_linear_weight_bytes) of the layer paths */
    char wx_kernel[2][96]; /* what the packed w4a8 / w6a8 layers ran */
} shape_result;

/* Packed W4A8 (b = 0, codebook) / W6A8 (b = 1) weights of [n, k], group 16:
 * random codes and scale bytes near 1 (the timing does not depend on the
 * values; ql_wxa8_check accepts them). Host arrays, caller frees. */
static ql_wxa8_weight wx_weight(int b, int64_t n, int64_t k, float *cb, const uint16_t *bias)
{
    const int64_t rb = b ? 3 * k / 4 : k / 2, ng = k / 16;
    uint8_t *q = malloc((size_t)(n * rb)), *sr = malloc((size_t)(n * ng));
    float *sc = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n * rb; i++) q[i] = (uint8_t)next();
    for (int64_t i = 0; i < n * ng; i++) sr[i] = (uint8_t)(0x30 + (next() & 15)); /* 0.5 .. 1.94 */
    for (int64_t i = 0; i < n; i++) sc[i] = 2e-4f * (0.5f + (float)(next() >> 40) * 0x1.0p-24f);
    ql_wxa8_fixed_lut(cb);
    return (ql_wxa8_weight){.n = n, .k = k, .bits = b ? 6 : 4, .q = q, .ldq = rb, .s_rel = sr, .s_channel = sc,
                            .codebook = b ? NULL : cb, .group = 16, .convrot_group = 256, .bias = bias,
                            .bias_dtype = QL_BF16};
}

static double rel_l2_bf16(const uint16_t *a, const uint16_t *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = ql_bf16_to_fp32(a[i]), y = ql_bf16_to_fp32(b[i]);
        num += (x - y) * (x - y), den += y * y;
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int dev_index;    /* the device the bench runs on */
static int use_graphs;   /* --graphs: each sample replays one CUDA graph of the calls */
static cudaStream_t st;  /* every path's stream (a graph needs a capturable one) */

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* The calls captured on `st` since cudaStreamBeginCapture, as a graph ready to replay. */
static cudaGraphExec_t end_capture(void)
{
    cudaGraph_t gr;
    cudaGraphExec_t exec;
    CK(cudaStreamEndCapture(st, &gr));
    CK(cudaGraphInstantiate(&exec, gr, 0));
    cudaGraphDestroy(gr);
    return exec;
}

static void run_shape(ql_context *ctx, int64_t m, int64_t n, int64_t k, int reps, size_t l2, shape_result *out)
{
    const int64_t g = 256;
    ql_cuda_workspace *pro_ws = NULL; /* the bare prologue's workspace */
    /* host data: codes, scales, the equivalent bf16 weight (dequantized, un-rotated), activations */
    int8_t *q = malloc((size_t)(n * k));
    float *sw = malloc((size_t)n * 4), *bias = malloc((size_t)n * 4);
    uint16_t *wb = malloc((size_t)(n * k) * 2), *xb = malloc((size_t)(m * k) * 2), *bb = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)(next() & 0xff);
    for (int64_t i = 0; i < n; i++) sw[i] = 2e-4f * (0.5f + (float)(next() >> 40) * 0x1.0p-24f);
    for (int64_t i = 0; i < n; i++) bb[i] = ql_fp32_to_bf16(0.1f * gauss());
    for (int64_t i = 0; i < n; i++) bias[i] = ql_bf16_to_fp32(bb[i]);
    ql_dequantize(q, n, k, k, sw, n, g, QL_BF16, wb, k);
    const int64_t fresh = (m < 2048 ? m : 2048) * k; /* random rows, then repeated: timing needs no more */
    for (int64_t i = 0; i < m * k; i++) xb[i] = i < fresh ? ql_fp32_to_bf16(gauss()) : xb[i % fresh];
    (void)bias;
    /* W4A8 / W6A8 of the same shape (decoded once: int8 resident; packed: 0.5 / 0.75 byte per weight + scales) */
    float cb[16];
    const ql_wxa8_weight wx[2] = {wx_weight(0, n, k, cb, bb), wx_weight(1, n, k, cb, bb)};
    /* enough sets that one round's data is larger than twice the L2 */
    const size_t set_bytes = (size_t)(m * k) * 9 + (size_t)(n * k) * 3 + (size_t)(m * n) * 6 + (size_t)(n * k) * 33 / 10;
    int sets = (int)((2 * l2 + set_bytes - 1) / set_bytes);
    if (sets < 2) sets = 2;
    if (sets > 16) sets = 16;
    void *dxb[16], *dwb[16], *dxq[16], *dwq[16], *dyb[16], *dyi[16];
    void *dx2[16], *dxa[16]; /* swiglu's [m, 2k] input; the separate ops' activated rows */
    float *dsx[16];
    ql_linear *lin[16], *lin_mma[16], *lin_wx[4][16], *lin_lora[16];
    float *ldown = malloc((size_t)(LORA_RANK * k) * 4), *lup = malloc((size_t)(n * LORA_RANK) * 4);
    for (int64_t i = 0; i < LORA_RANK * k; i++) ldown[i] = (float)(((i * 2654435761u) >> 7) % 2001) * 1e-5f - 0.01f;
    for (int64_t i = 0; i < n * LORA_RANK; i++) lup[i] = (float)(((i * 40503u) >> 3) % 2001) * 1e-5f - 0.01f;
    const ql_lora_desc lora = {LORA_RANK, ldown, QL_F32, k, lup, QL_F32, LORA_RANK, 1.0};
    ql_int8_weight w8 = {n, k, q, k, sw, n, g, bb, QL_BF16};
    ql_linear_desc desc = {.kind = QL_LINEAR_W8A8, .int8 = w8};
    for (int s = 0; s < sets; s++) {
        dxb[s] = dmalloc((size_t)(m * k) * 2), dwb[s] = dmalloc((size_t)(n * k) * 2);
        dxq[s] = dmalloc((size_t)(m * k)), dwq[s] = dmalloc((size_t)(n * k)), dsx[s] = dmalloc((size_t)m * 4);
        dyb[s] = dmalloc((size_t)(m * n) * 2), dyi[s] = dmalloc((size_t)(m * n) * 4);
        dx2[s] = dmalloc((size_t)(m * k) * 4), dxa[s] = dmalloc((size_t)(m * k) * 2);
        CK(cudaMemcpy(dxb[s], xb, (size_t)(m * k) * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy2D(dx2[s], (size_t)k * 4, xb, (size_t)k * 2, (size_t)k * 2, (size_t)m, cudaMemcpyHostToDevice));
        CK(cudaMemcpy2D((char *)dx2[s] + k * 2, (size_t)k * 4, xb, (size_t)k * 2, (size_t)k * 2, (size_t)m,
                        cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwb[s], wb, (size_t)(n * k) * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwq[s], q, (size_t)(n * k), cudaMemcpyHostToDevice));
        /* int8 activations for the bare GEMMs: any codes do */
        CK(cudaMemcpy(dxq[s], q, (size_t)(m * k < n * k ? m * k : n * k), cudaMemcpyHostToDevice));
        const char *was = getenv("QLINEAR_CUDA_GEMM");
        char *saved = was ? strdup(was) : NULL;
        ql_status cs = ql_linear_create(ctx, &desc, &lin[s]);
        setenv("QLINEAR_CUDA_GEMM", "mma", 1); /* read when a layer is created */
        if (cs == QL_OK) cs = ql_linear_create(ctx, &desc, &lin_mma[s]);
        if (saved) setenv("QLINEAR_CUDA_GEMM", saved, 1);
        else unsetenv("QLINEAR_CUDA_GEMM");
        free(saved);
        if (cs == QL_OK) cs = ql_linear_create(ctx, &desc, &lin_lora[s]);
        if (cs == QL_OK) cs = ql_linear_add_lora(lin_lora[s], &lora, NULL);
        for (int i = 0; i < 4 && cs == QL_OK; i++) { /* w4a8, w4a8-packed, w6a8, w6a8-packed */
            ql_linear_desc dw = {.kind = i % 2 ? QL_LINEAR_WXA8_PACKED : QL_LINEAR_W8A8, .wxa8 = wx[i / 2]};
            cs = ql_linear_create(ctx, &dw, &lin_wx[i][s]);
        }
        if (cs != QL_OK) {
            fprintf(stderr, "qlinear bench: %s\n", ql_last_error());
            exit(1);
        }
    }
    ltmm gb, gh, gi, gbg;
    const ql_epilogue gelu_epi = {.activation = QL_ACTIVATION_GELU};
    /* the input activations: a bf16 rms_norm weight near 1, one for every set */
    uint16_t *aw = malloc((size_t)k * 2);
    for (int64_t i = 0; i < k; i++) aw[i] = ql_fp32_to_bf16(1.0f + 0.1f * gauss());
    void *daw = dmalloc((size_t)k * 2);
    CK(cudaMemcpy(daw, aw, (size_t)k * 2, cudaMemcpyHostToDevice));
    free(aw);
    const int in_act[3] = {QL_INPUT_ACT_GELU_TANH, QL_INPUT_ACT_SWIGLU, QL_INPUT_ACT_RMS_NORM};
    ql_epilogue in_epi[3];
    for (int i = 0; i < 3; i++)
        in_epi[i] = (ql_epilogue){.input_act = in_act[i], .input_act_weight = i == 2 ? daw : NULL,
                                  .input_act_weight_dtype = QL_BF16, .input_act_eps = i == 2 ? ACT_EPS : 0.0f};
    /* the floors read as many bytes as each layer keeps resident, from the int8 sets (DRAM, like the layers') */
    const size_t rd_bytes[3] = {ql_linear_weight_bytes(lin[0]), ql_linear_weight_bytes(lin_wx[1][0]),
                                ql_linear_weight_bytes(lin_wx[3][0])};
    unsigned *sink = dmalloc(4);
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_index));
    int have[NPATHS];
    for (int p = 0; p < NPATHS; p++) have[p] = 1;
    have[C_BF16] = lt_setup(&gb, C_BF16, m, n, k, dwb[0], dxb[0], dyb[0], st);
    have[C_BF16G] = lt_setup(&gbg, C_BF16G, m, n, k, dwb[0], dxb[0], dyb[0], st);
    have[C_FP16] = lt_setup(&gh, C_FP16, m, n, k, dwb[0], dxb[0], dyb[0], st);
    have[C_INT8] = lt_setup(&gi, C_INT8, m, n, k, dwq[0], dxq[0], dyi[0], st);
    /* calls per sample: enough to cover all sets and ~2 ms */
    int calls = sets;
    {
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        CK(cudaEventRecord(a, st));
        for (int s = 0; s < sets; s++) ql_linear_forward(lin[s], dxb[s], QL_BF16, m, k, dyb[s], QL_BF16, n, NULL);
        CK(cudaEventRecord(b, st));
        /* the packed layers' decode workspace grows on first use, which a graph capture refuses: one call each first */
        for (int i = 0; i < 4; i++) ql_linear_forward(lin_wx[i][0], dxb[0], QL_BF16, m, k, dyb[0], QL_BF16, n, NULL);
        ql_linear_forward(lin_lora[0], dxb[0], QL_BF16, m, k, dyb[0], QL_BF16, n, NULL); /* so is the LoRA's */
        ql_linear_forward(lin[0], dxb[0], QL_BF16, m, k, dyb[0], QL_BF16, n, &gelu_epi);     /* and the GELU's table */
        for (int i = 0; i < 3; i++) /* and the input activations' (rms_norm's row factors) */
            ql_linear_forward(lin[0], i == 1 ? dx2[0] : dxb[0], QL_BF16, m, i == 1 ? 2 * k : k, dyb[0], QL_BF16, n, &in_epi[i]);
        CK(cudaEventSynchronize(b));
        float per = event_ms(a, b) / sets;
        while (calls * per < 2.0f && calls < 4096) calls += sets;
        cudaEventDestroy(a), cudaEventDestroy(b);
    }
    float *samples[NPATHS], *host[NPATHS];
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int p = 0; p < NPATHS; p++) samples[p] = calloc((size_t)reps, sizeof(float)), host[p] = calloc((size_t)reps, sizeof(float));
    cudaGraphExec_t graph[NPATHS] = {0};
    for (int r = use_graphs ? -2 : -1; r < reps; r++) /* round -1 warms up; -2 captures the graphs */
        for (int p = 0; p < NPATHS; p++) {
            if (!have[p]) continue;
            const int capture = r == -2;
            if (capture) CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
            if (use_graphs && !capture) CK(cudaEventRecord(e0, st));
            const double h0 = now_us();
            if (use_graphs && !capture) CK(cudaGraphLaunch(graph[p], st));
            else {
                if (!capture) CK(cudaEventRecord(e0, st));
                for (int c = 0; c < calls; c++) {
                    int s = c % sets;
                    ql_status qs = QL_OK;
                    switch (p) {
                    case C_BF16: lt_run(&gb, dwb[s], dxb[s], dyb[s], st); break;
                    case C_FP16: lt_run(&gh, dwb[s], dxb[s], dyb[s], st); break;
                    case C_INT8: lt_run(&gi, dwq[s], dxq[s], dyi[s], st); break;
                    case C_W8A8: qs = ql_linear_forward(lin[s], dxb[s], QL_BF16, m, k, dyb[s], QL_BF16, n, NULL); break;
                    case C_GEMM: qs = ql_gemm_s8s8s32(ctx, m, n, k, dxq[s], k, dwq[s], k, dyi[s], n); break;
                    case C_PRO: qs = ql_cuda_quantize_rows(&pro_ws, dev_index, st, dxb[s], QL_BF16, m, k, k, g, dxq[s], k, dsx[s], NULL); break;
                    case C_MMA: qs = ql_linear_forward(lin_mma[s], dxb[s], QL_BF16, m, k, dyb[s], QL_BF16, n, NULL); break;
                    case C_LORA: qs = ql_linear_forward(lin_lora[s], dxb[s], QL_BF16, m, k, dyb[s], QL_BF16, n, NULL); break;
                    case C_GELU: qs = ql_linear_forward(lin[s], dxb[s], QL_BF16, m, k, dyb[s], QL_BF16, n, &gelu_epi); break;
                    case C_BF16G: lt_run(&gbg, dwb[s], dxb[s], dyb[s], st); break;
                    case C_IN_GELU: case C_IN_SWIGLU: case C_IN_RMS: {
                        const int i = p - C_IN_GELU;
                        qs = ql_linear_forward(lin[s], i == 1 ? dx2[s] : dxb[s], QL_BF16, m, i == 1 ? 2 * k : k, dyb[s],
                                               QL_BF16, n, &in_epi[i]);
                        break;
                    }
                    case C_OP_GELU: case C_OP_SWIGLU: case C_OP_RMS: {
                        const int i = p - C_OP_GELU;
                        if (ql_bench_act_op(in_act[i], i == 1 ? dx2[s] : dxb[s], dxa[s], daw, m, k, ACT_EPS, sms, st)) {
                            fprintf(stderr, "qlinear bench: the activation op: %s\n", cudaGetErrorString(cudaGetLastError()));
                            exit(1);
                        }
                        qs = ql_linear_forward(lin[s], dxa[s], QL_BF16, m, k, dyb[s], QL_BF16, n, NULL);
                        break;
                    }
                    case C_RD8: case C_RD4: case C_RD6: {
                        const size_t b = rd_bytes[p - C_RD8] < (size_t)(n * k) ? rd_bytes[p - C_RD8] : (size_t)(n * k);
                        if (ql_bench_read_bytes(dwq[s], b, sink, sms, st)) {
                            fprintf(stderr, "qlinear bench: the read-floor kernel: %s\n", cudaGetErrorString(cudaGetLastError()));
                            exit(1);
                        }
                        break;
                    }
                    default: /* C_W4A8 .. C_W6A8P */
                        qs = ql_linear_forward(lin_wx[p - C_W4A8][s], dxb[s], QL_BF16, m, k, dyb[s], QL_BF16, n, NULL);
                        break;
                    }
                    if (qs != QL_OK) {
                        fprintf(stderr, "qlinear bench: %s\n", ql_last_error());
                        exit(1);
                    }
                }
            }
            const double h1 = now_us(); /* the host's enqueue time, before waiting for the GPU */
            if (capture) {
                graph[p] = end_capture();
                continue;
            }
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            if (r >= 0) samples[p][r] = event_ms(e0, e1) / calls, host[p][r] = (float)((h1 - h0) / calls);
        }
    for (int p = 0; p < NPATHS; p++)
        if (graph[p]) cudaGraphExecDestroy(graph[p]);
    CK(cudaGetLastError());
    for (int p = 0; p < NPATHS; p++) {
        qsort(samples[p], (size_t)reps, sizeof(float), cmpf);
        qsort(host[p], (size_t)reps, sizeof(float), cmpf);
        out->ms[p] = have[p] ? samples[p][reps / 2] : NAN;
        out->host_us[p] = have[p] ? host[p][reps / 2] : NAN;
        free(samples[p]), free(host[p]);
    }
    /* agreement: ours vs cuBLAS bf16 on the same function (set 0) */
    uint16_t *y0 = malloc((size_t)(m * n) * 2), *y1 = malloc((size_t)(m * n) * 2);
    ql_linear_forward(lin[0], dxb[0], QL_BF16, m, k, dyb[0], QL_BF16, n, NULL);
    CK(cudaMemcpy(y0, dyb[0], (size_t)(m * n) * 2, cudaMemcpyDeviceToHost));
    snprintf(out->kernel, sizeof out->kernel, "%s", ql_linear_cuda_kernel(lin[0]));
    for (int p = 0; p < NPATHS; p++) out->wbytes[p] = 0;
    out->wbytes[C_W8A8] = ql_linear_weight_bytes(lin[0]);
    for (int i = 0; i < 4; i++) out->wbytes[C_W4A8 + i] = ql_linear_weight_bytes(lin_wx[i][0]);
    snprintf(out->wx_kernel[0], sizeof out->wx_kernel[0], "%s", ql_linear_cuda_kernel(lin_wx[1][0]));
    snprintf(out->wx_kernel[1], sizeof out->wx_kernel[1], "%s", ql_linear_cuda_kernel(lin_wx[3][0]));
    free(ldown), free(lup);
    /* cuBLAS has no bias: add it on the host to its output */
    lt_run(&gb, dwb[0], dxb[0], dyb[0], st);
    CK(cudaMemcpy(y1, dyb[0], (size_t)(m * n) * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < m * n; i++) y1[i] = ql_fp32_to_bf16(ql_bf16_to_fp32(y1[i]) + ql_bf16_to_fp32(bb[i % n]));
    out->rel_l2 = rel_l2_bf16(y0, y1, (size_t)(m * n));
    /* each fused activation's output against its op's, then the layer (the op's tanhf and expf are
       CUDA's, not the library's: a few values one ulp apart, so a few codes one step apart) */
    for (int i = 0; i < 3; i++) {
        ql_linear_forward(lin[0], i == 1 ? dx2[0] : dxb[0], QL_BF16, m, i == 1 ? 2 * k : k, dyb[0], QL_BF16, n, &in_epi[i]);
        CK(cudaMemcpy(y0, dyb[0], (size_t)(m * n) * 2, cudaMemcpyDeviceToHost));
        if (ql_bench_act_op(in_act[i], i == 1 ? dx2[0] : dxb[0], dxa[0], daw, m, k, ACT_EPS, sms, st)) exit(1);
        ql_linear_forward(lin[0], dxa[0], QL_BF16, m, k, dyb[0], QL_BF16, n, NULL);
        CK(cudaMemcpy(y1, dyb[0], (size_t)(m * n) * 2, cudaMemcpyDeviceToHost));
        out->act_rel_l2[i] = rel_l2_bf16(y0, y1, (size_t)(m * n));
    }
    free(y0), free(y1);
    cudaFree(daw);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(sink);
    ql_cuda_workspace_free(pro_ws);
    if (have[C_BF16]) lt_free(&gb);
    if (have[C_BF16G]) lt_free(&gbg);
    if (have[C_FP16]) lt_free(&gh);
    if (have[C_INT8]) lt_free(&gi);
    for (int s = 0; s < sets; s++) {
        ql_linear_destroy(lin[s]), ql_linear_destroy(lin_mma[s]), ql_linear_destroy(lin_lora[s]);
        for (int i = 0; i < 4; i++) ql_linear_destroy(lin_wx[i][s]);
        cudaFree(dxb[s]), cudaFree(dwb[s]), cudaFree(dxq[s]), cudaFree(dwq[s]), cudaFree(dyb[s]), cudaFree(dyi[s]), cudaFree(dsx[s]);
        cudaFree(dx2[s]), cudaFree(dxa[s]);
    }
    free(q), free(sw), free(bias), free(wb), free(xb), free(bb);
    for (int b = 0; b < 2; b++) free((void *)wx[b].q), free((void *)wx[b].s_rel), free((void *)wx[b].s_channel);
}

/* Layers of an anima block that read one input: with
 * ql_linear_forward_shared the input is rotated and quantized once for the
 * group. count: groups in the profile (one per block). */
typedef struct { const char *name; int64_t k, n[3]; int layers, count; } input_group;
static const input_group anima_groups[] = {{"self-attn q,k,v", 2048, {2048, 2048, 2048}, 3, 28},
                                           {"adaLN modulation x3", 2048, {256, 256, 256}, 3, 28},
                                           {"cross-attn k,v", 1024, {2048, 2048, 0}, 2, 28}};

/* Median ms of the group as separate forwards (each with its prologue) and
 * as one shared forward, interleaved, over sets > 2x L2 like run_shape. */
static void run_group(ql_context *ctx, int64_t m, const input_group *g, int reps, size_t l2, double out[2])
{
    const int64_t k = g->k;
    int64_t wsum = 0;
    for (int i = 0; i < g->layers; i++) wsum += g->n[i];
    const size_t set_bytes = (size_t)(m * k) * 2 + (size_t)(m * wsum) * 2 + (size_t)(wsum * k);
    int sets = (int)((2 * l2 + set_bytes - 1) / set_bytes);
    sets = sets < 2 ? 2 : sets > 16 ? 16 : sets;
    int8_t *q = malloc((size_t)(wsum * k));
    float *sw = malloc((size_t)wsum * 4);
    uint16_t *xb = malloc((size_t)(m * k) * 2);
    for (int64_t i = 0; i < wsum * k; i++) q[i] = (int8_t)(next() & 0xff);
    for (int64_t i = 0; i < wsum; i++) sw[i] = 2e-4f * (0.5f + (float)(next() >> 40) * 0x1.0p-24f);
    for (int64_t i = 0; i < m * k; i++) xb[i] = ql_fp32_to_bf16(gauss());
    void *dx[16], *dy[16][3];
    ql_linear *lin[16][3];
    int64_t ldy[3];
    for (int s = 0; s < sets; s++) {
        dx[s] = dmalloc((size_t)(m * k) * 2);
        CK(cudaMemcpy(dx[s], xb, (size_t)(m * k) * 2, cudaMemcpyHostToDevice));
        int64_t off = 0;
        for (int i = 0; i < g->layers; i++) {
            ql_int8_weight w = {g->n[i], k, q + off * k, k, sw + off, g->n[i], 256, NULL, QL_BF16};
            ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = w};
            if (ql_linear_create(ctx, &d, &lin[s][i]) != QL_OK) {
                fprintf(stderr, "qlinear bench: %s\n", ql_last_error());
                exit(1);
            }
            dy[s][i] = dmalloc((size_t)(m * g->n[i]) * 2), ldy[i] = g->n[i], off += g->n[i];
        }
    }
    float *smp[2] = {calloc((size_t)reps, sizeof(float)), calloc((size_t)reps, sizeof(float))};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int calls = sets; /* per sample: every set, and ~2 ms */
    CK(cudaEventRecord(e0, st));
    for (int s = 0; s < sets; s++) ql_linear_forward_shared(lin[s], g->layers, dx[s], QL_BF16, m, k, dy[s], QL_BF16, ldy, NULL);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    const float per = event_ms(e0, e1) / sets;
    while (calls * per < 2.0f && calls < 4096) calls += sets;
    cudaGraphExec_t graph[2] = {0};
    for (int r = use_graphs ? -2 : -1; r < reps; r++)
        for (int p = 0; p < 2; p++) { /* 0: separate forwards, 1: shared */
            if (r == -2) CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
            else CK(cudaEventRecord(e0, st));
            if (use_graphs && r >= -1) CK(cudaGraphLaunch(graph[p], st));
            else
                for (int c = 0; c < calls; c++) {
                    const int s = c % sets;
                    ql_status qs = QL_OK;
                    if (p) qs = ql_linear_forward_shared(lin[s], g->layers, dx[s], QL_BF16, m, k, dy[s], QL_BF16, ldy, NULL);
                    for (int i = 0; !p && i < g->layers && qs == QL_OK; i++)
                        qs = ql_linear_forward(lin[s][i], dx[s], QL_BF16, m, k, dy[s][i], QL_BF16, ldy[i], NULL);
                    if (qs != QL_OK) {
                        fprintf(stderr, "qlinear bench: %s\n", ql_last_error());
                        exit(1);
                    }
                }
            if (r == -2) {
                graph[p] = end_capture();
                continue;
            }
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            if (r >= 0) smp[p][r] = event_ms(e0, e1) / calls;
        }
    for (int p = 0; p < 2; p++) {
        if (graph[p]) cudaGraphExecDestroy(graph[p]);
        qsort(smp[p], (size_t)reps, sizeof(float), cmpf);
        out[p] = smp[p][reps / 2];
        free(smp[p]);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    for (int s = 0; s < sets; s++) {
        cudaFree(dx[s]);
        for (int i = 0; i < g->layers; i++) ql_linear_destroy(lin[s][i]), cudaFree(dy[s][i]);
    }
    free(q), free(sw), free(xb);
}

int ql_cmd_bench_cuda(int argc, char **argv)
{
    int64_t ms_list[16] = {1024, 4096, 16384, 1};
    int nm = 4, reps = 9, device = 0, peak = 1;
    const char *json_path = NULL;
    shape single[1];
    const shape *shapes = anima;
    int nshapes = 6;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-peak")) { peak = 0; continue; }
        if (!strcmp(a, "--graphs")) { use_graphs = 1; continue; }
        if (!v) { fprintf(stderr, "qlinear bench: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--device")) {
            if (strncmp(v, "cuda", 4) || (v[4] && v[4] != ':')) { fprintf(stderr, "qlinear bench: --device %s is not cpu, cuda or cuda:N\n", v); return 2; }
            device = v[4] ? atoi(v + 5) : 0;
        } else if (!strcmp(a, "--m")) {
            nm = 0;
            char *list = strdup(v), *save = NULL;
            for (char *t = strtok_r(list, ",", &save); t && nm < 16; t = strtok_r(NULL, ",", &save)) {
                long x = strtol(t, NULL, 10);
                if (x < 1 || x > (1 << 20)) { fprintf(stderr, "qlinear bench: --m %s: %s is not in 1..1048576\n", v, t); free(list); return 2; }
                ms_list[nm++] = x;
            }
            free(list);
        } else if (!strcmp(a, "--reps")) {
            reps = atoi(v);
            if (reps < 1 || reps > 64) { fprintf(stderr, "qlinear bench: --reps %s is not in 1..64\n", v); return 2; }
        } else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--shape")) {
            long n = 0, k = 0;
            if (sscanf(v, "%ldx%ld", &n, &k) != 2 || n < 1 || k < 1 || k > 65536) { fprintf(stderr, "qlinear bench: --shape %s is not NxK\n", v); return 2; }
            single[0] = (shape){n, k, 1};
            shapes = single, nshapes = 1;
        } else if (!strcmp(a, "--profile")) {
            if (strcmp(v, "anima")) { fprintf(stderr, "qlinear bench --device cuda: profile '%s' is not available on CUDA (anima)\n", v); return 2; }
        } else { fprintf(stderr, "qlinear bench --device cuda: unknown option '%s'\n", a); return 2; }
    }
    ql_context *ctx;
    if (ql_context_create(&ctx) != QL_OK || ql_context_set_device(ctx, QL_DEVICE_CUDA, device) != QL_OK) {
        fprintf(stderr, "qlinear bench: %s\n", ql_last_error());
        return 1;
    }
    CK(cudaSetDevice(device));
    dev_index = device;
    CK(cudaStreamCreate(&st));
    if (ql_context_set_cuda_stream(ctx, st) != QL_OK) {
        fprintf(stderr, "qlinear bench: %s\n", ql_last_error());
        return 1;
    }
    char dev[160];
    ql_cuda_device_name(device, dev, sizeof dev);
    int l2 = 0;
    CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    int ver = 0;
    cudaRuntimeGetVersion(&ver);
    CKB(cublasLtCreate(&lt));
    lt_ws = dmalloc(lt_ws_bytes);
    printf("qlinear bench --device cuda: %s, CUDA runtime %d.%d, cuBLASLt %zu\n", dev, ver / 1000, (ver % 1000) / 10,
           cublasLtGetVersion());
    printf("median of %d samples; each sample cycles input/weight sets > 2x L2; CUDA events; %s\n", reps,
           use_graphs ? "CUDA graphs: each sample replays one graph of its calls (every path)"
                      : "no graphs (host: the host's enqueue time per call, microseconds)");
    for (int p = 0; p < NPATHS; p++) printf("  %-14s %s\n", names[p], notes[p]);
    FILE *js = json_path ? fopen(json_path, "w") : NULL;
    if (json_path && !js) { fprintf(stderr, "qlinear bench: cannot write %s\n", json_path); return 1; }
    if (js) fprintf(js, "{\"device\": \"%s\", \"reps\": %d, \"graphs\": %s, \"results\": [\n", dev, reps, use_graphs ? "true" : "false");
    int first_js = 1;
    for (int mi = 0; mi < nm; mi++) {
        const int64_t m = ms_list[mi];
        double tot[NPATHS] = {0};
        printf("\nM = %lld\n%-12s %6s | %9s %9s %9s | %9s %9s | %6s %6s %6s | %8s %8s | %s\n", (long long)m, "N x K",
               "count", "bf16 ms", "fp16 ms", "int8 ms", "w8a8 ms", "gemm ms", "w8/bf", "w8/i8", "gm/i8", "gemm TOP",
               "rel-L2", "kernel");
        printf("%-12s %6s   (prologue alone: ms, GB/s read + written, at the end of each line)\n", "", "");
        for (int si = 0; si < nshapes; si++) {
            const shape *sh = &shapes[si];
            shape_result r;
            run_shape(ctx, m, sh->n, sh->k, reps, (size_t)l2, &r);
            char nk[32];
            snprintf(nk, sizeof nk, "%lldx%lld", (long long)sh->n, (long long)sh->k);
            printf("%-12s %6lld | %9.4f %9.4f %9.4f | %9.4f %9.4f | %6.2f %6.2f %6.2f | %8.0f %8.1e | %s | pro %.4f %4.0f", nk,
                   (long long)sh->count, r.ms[C_BF16], r.ms[C_FP16], r.ms[C_INT8], r.ms[C_W8A8], r.ms[C_GEMM],
                   r.ms[C_W8A8] / r.ms[C_BF16], r.ms[C_W8A8] / r.ms[C_INT8], r.ms[C_GEMM] / r.ms[C_INT8],
                   2.0 * m * sh->n * sh->k / (r.ms[C_GEMM] * 1e9), r.rel_l2, r.kernel, r.ms[C_PRO],
                   (double)m * sh->k * 3 / (r.ms[C_PRO] * 1e6));
            printf(" | sm80 %.4f (%.2fx)", r.ms[C_MMA], r.ms[C_MMA] / r.ms[C_W8A8]);
            printf(" | lora64 %.4f (+%.1f%%; floor +%.1f%%)", r.ms[C_LORA], 100.0 * (r.ms[C_LORA] / r.ms[C_W8A8] - 1.0),
                   100.0 * ((double)LORA_RANK / (double)sh->n + (double)LORA_RANK / (double)sh->k));
            printf(" | gelu %.4f (+%.1f%%; cuBLASLt bf16+gelu +%.1f%% over bf16)", r.ms[C_GELU],
                   100.0 * (r.ms[C_GELU] / r.ms[C_W8A8] - 1.0), 100.0 * (r.ms[C_BF16G] / r.ms[C_BF16] - 1.0));
            if (!use_graphs) printf(" | host us w8a8 %.1f bf16 %.1f i8 %.1f", r.host_us[C_W8A8], r.host_us[C_BF16], r.host_us[C_INT8]);
            printf("\n%-12s %6s   input act, fused ms (over w8a8; op + layer, x fused; rel-L2 to it):", "", "");
            for (int i = 0; i < 3; i++)
                printf(" %s %.4f (+%.1f%%; %.4f, %.2fx; %.1e)", names[C_IN_GELU + i] + 3, r.ms[C_IN_GELU + i],
                       100.0 * (r.ms[C_IN_GELU + i] / r.ms[C_W8A8] - 1.0), r.ms[C_OP_GELU + i],
                       r.ms[C_OP_GELU + i] / r.ms[C_IN_GELU + i], r.act_rel_l2[i]);
            printf("\n");
            /* W4A8 / W6A8: time and resident bytes against w8a8-convrot's */
            printf("%-12s %6s   wxa8 ms (x w8a8; MB resident, x int8):", "", "");
            for (int p = C_W4A8; p <= C_W6A8P; p++)
                printf(" %s %.4f (%.2fx; %.1f MB, %.2fx)", names[p], r.ms[p], r.ms[p] / r.ms[C_W8A8], r.wbytes[p] / 1e6,
                       (double)r.wbytes[p] / (double)r.wbytes[C_W8A8]);
            printf(" | %s | %s\n", r.wx_kernel[0], r.wx_kernel[1]);
            printf("%-12s %6s   floor (one kernel reading the resident bytes once), ms: int8 %.4f (w8a8 %.2fx it), "
                   "w4a8-packed %.4f (%.2fx; %.2fx the int8 floor), w6a8-packed %.4f (%.2fx; %.2fx)\n", "", "",
                   r.ms[C_RD8], r.ms[C_W8A8] / r.ms[C_RD8], r.ms[C_RD4], r.ms[C_W4A8P] / r.ms[C_RD4], r.ms[C_RD4] / r.ms[C_RD8],
                   r.ms[C_RD6], r.ms[C_W6A8P] / r.ms[C_RD6], r.ms[C_RD6] / r.ms[C_RD8]);
            fflush(stdout);
            for (int p = 0; p < NPATHS; p++) tot[p] += r.ms[p] * (double)sh->count;
            if (js) {
                fprintf(js, "%s  {\"m\": %lld, \"n\": %lld, \"k\": %lld, \"count\": %lld, \"kernel\": \"%s\", \"rel_l2_vs_cublas_bf16\": %.3e",
                        first_js ? "" : ",\n", (long long)m, (long long)sh->n, (long long)sh->k, (long long)sh->count,
                        r.kernel, r.rel_l2);
                for (int p = 0; p < NPATHS; p++) fprintf(js, ", \"%s_ms\": %.6f", names[p], r.ms[p]);
                for (int p = C_W8A8; p < NPATHS; p++)
                    if (r.wbytes[p]) fprintf(js, ", \"%s_weight_bytes\": %zu", names[p], r.wbytes[p]);
                fprintf(js, ", \"w4a8-packed_kernel\": \"%s\", \"w6a8-packed_kernel\": \"%s\"", r.wx_kernel[0], r.wx_kernel[1]);
                if (!use_graphs)
                    for (int p = 0; p < NPATHS; p++) fprintf(js, ", \"%s_host_us\": %.2f", names[p], r.host_us[p]);
                fprintf(js, "}");
                first_js = 0;
            }
        }
        printf("%-12s %6s | %9.3f %9.3f %9.3f | %9.3f %9.3f | %6.2f %6.2f %6.2f |  (weighted totals, ms; prologue %.3f; "
               "sm80 kernel %.3f = %.2fx w8a8, %.2fx bf16)\n", "total", "",
               tot[C_BF16], tot[C_FP16], tot[C_INT8], tot[C_W8A8], tot[C_GEMM], tot[C_W8A8] / tot[C_BF16],
               tot[C_W8A8] / tot[C_INT8], tot[C_GEMM] / tot[C_INT8], tot[C_PRO], tot[C_MMA], tot[C_MMA] / tot[C_W8A8],
               tot[C_MMA] / tot[C_BF16]);
        printf("%-12s %6s   lora64 total %.3f ms (+%.1f%% over w8a8)\n", "", "", tot[C_LORA], 100.0 * (tot[C_LORA] / tot[C_W8A8] - 1.0));
        printf("%-12s %6s   gelu total %.3f ms (+%.1f%% over w8a8; %.2fx cuBLASLt bf16+gelu's %.3f ms, which is +%.1f%% over bf16)\n",
               "", "", tot[C_GELU], 100.0 * (tot[C_GELU] / tot[C_W8A8] - 1.0), tot[C_GELU] / tot[C_BF16G], tot[C_BF16G],
               100.0 * (tot[C_BF16G] / tot[C_BF16] - 1.0));
        printf("%-12s %6s   input act totals, ms (fused, over w8a8; op + layer, x fused):", "", "");
        for (int i = 0; i < 3; i++)
            printf(" %s %.3f (+%.1f%%; %.3f, %.2fx)", names[C_IN_GELU + i] + 3, tot[C_IN_GELU + i],
                   100.0 * (tot[C_IN_GELU + i] / tot[C_W8A8] - 1.0), tot[C_OP_GELU + i], tot[C_OP_GELU + i] / tot[C_IN_GELU + i]);
        printf("\n");
        printf("%-12s %6s   wxa8 totals, ms (x w8a8):", "", "");
        for (int p = C_W4A8; p <= C_W6A8P; p++) printf(" %s %.3f (%.2fx)", names[p], tot[p], tot[p] / tot[C_W8A8]);
        printf("\n");
        printf("%-12s %6s   floor totals, ms: int8 %.3f (w8a8 %.2fx it), w4a8-packed %.3f (%.2fx the int8 floor; the packed "
               "layer %.2fx it), w6a8-packed %.3f (%.2fx; %.2fx)\n", "", "", tot[C_RD8], tot[C_W8A8] / tot[C_RD8], tot[C_RD4],
               tot[C_RD4] / tot[C_RD8], tot[C_W4A8P] / tot[C_RD4], tot[C_RD6], tot[C_RD6] / tot[C_RD8], tot[C_W6A8P] / tot[C_RD6]);
        if (shapes != anima) continue;
        /* the same layers where a block's layers share their input (ql_linear_forward_shared) */
        double saved = 0;
        for (size_t gi = 0; gi < sizeof anima_groups / sizeof anima_groups[0]; gi++) {
            const input_group *g = &anima_groups[gi];
            double t[2];
            run_group(ctx, m, g, reps, (size_t)l2, t);
            saved += (t[0] - t[1]) * g->count;
            printf("  shared input: %-20s x%d | separate %.4f ms, shared %.4f ms (%.2fx)\n", g->name, g->count, t[0], t[1],
                   t[0] / t[1]);
            if (js)
                fprintf(js, ",\n  {\"m\": %lld, \"group\": \"%s\", \"count\": %d, \"separate_ms\": %.6f, \"shared_ms\": %.6f}",
                        (long long)m, g->name, g->count, t[0], t[1]);
        }
        printf("%-12s %6s | %9s %9s %9s | %9.3f %9s | %6.2f %6.2f %6s |  (w8a8 total with the shared-input groups)\n",
               "total, shared", "", "", "", "", tot[C_W8A8] - saved, "", (tot[C_W8A8] - saved) / tot[C_BF16],
               (tot[C_W8A8] - saved) / tot[C_INT8], "");
    }
    if (peak) {
        shape_result r;
        run_shape(ctx, 8192, 8192, 8192, reps, (size_t)l2, &r);
        const double op = 2.0 * 8192.0 * 8192.0 * 8192.0;
        printf("\n8192^3: int8-gemm %.1f TOP/s (%.3f ms), cuBLASLt int8 %.1f TOP/s, cuBLASLt bf16 %.1f TFLOP/s; w8a8-convrot %.1f TOP/s\n",
               op / (r.ms[C_GEMM] * 1e9), r.ms[C_GEMM], op / (r.ms[C_INT8] * 1e9), op / (r.ms[C_BF16] * 1e9),
               op / (r.ms[C_W8A8] * 1e9));
        if (js) fprintf(js, "%s  {\"m\": 8192, \"n\": 8192, \"k\": 8192, \"count\": 0, \"int8-gemm_ms\": %.6f, \"cublaslt-int8_ms\": %.6f, \"cublas-bf16_ms\": %.6f, \"w8a8-convrot_ms\": %.6f}",
                        first_js ? "" : ",\n", r.ms[C_GEMM], r.ms[C_INT8], r.ms[C_BF16], r.ms[C_W8A8]);
    }
    if (js) {
        fprintf(js, "\n]}\n");
        fclose(js);
    }
    cudaFree(lt_ws);
    cublasLtDestroy(lt);
    ql_context_destroy(ctx);
    cudaStreamDestroy(st);
    return 0;
}
