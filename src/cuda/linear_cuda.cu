/* Host side of the CUDA backend: device checks, weight upload, the
 * activation workspace, kernel choice, and status codes with messages. */
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <new>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "cuda_internal.h"
#include "wxa8_cuda.h"

extern "C" ql_status ql_fail(ql_status status, const char *fmt, ...);
extern "C" void ql_gelu_bf16_lut_fill(uint16_t *lut); /* quant/epilogue.c */
extern "C" const uint16_t *ql_act_table16(int code, ql_dtype dt); /* quant/act_table.c */

using namespace qlc;

struct ql_cuda_workspace {
    int device = -1;
    int8_t *q = nullptr;
    float *sx = nullptr;
    size_t q_bytes = 0, rows = 0;
    float *rms = nullptr; /* rms_norm's row factors (input_act), made on first use */
    size_t rms_rows = 0;
    uint16_t *gelu_lut = nullptr; /* the output GELU's bf16 table (ql_gelu_bf16_bits), made on first use */
    /* the input activations' 16-bit tables (the CPU's ql_act_table16: gelu_tanh, swiglu's silu; bf16, fp16) */
    uint16_t *act_tab[4] = {nullptr, nullptr, nullptr, nullptr};
    std::mutex lock; /* one call's prologue + GEMM are queued as a unit */
    /* TMA descriptor of the codes for the last (m, k, tile) (encoding one costs microseconds of host time) */
    CUtensorMap amap;
    int64_t amap_m = -1, amap_k = -1;
    int amap_tile = -1;
    /* the same for the LoRA down projection's GEMM (its own tile) */
    CUtensorMap lamap;
    int64_t lamap_m = -1, lamap_k = -1;
    int lamap_tile = -1;
    /* the prologue's launch shape for the last K of the bare prologue (layers keep their own) */
    PrologueFit fit;
    int64_t fit_k = -1;
    /* the prologue whose codes q and sx hold (0: none, or no longer known) and its stream */
    uint64_t token = 0;
    void *token_stream = nullptr;
    /* W4A8/W6A8: the decoded weight of the packed layer the GEMM reads (M > 8);
     * asymmetric layers: the raw accumulators and the activation's group sums */
    int8_t *wdec = nullptr;
    int32_t *acc = nullptr;
    float *gsum = nullptr;
    size_t wdec_bytes = 0, acc_bytes = 0, gsum_bytes = 0;
    /* unmerged LoRA: t [m, rp] int32 and the down kernel's counters per
     * row block (both zeros between calls), t's codes [m, rp] and st [m]
     * (acc holds the base GEMM's sums where the epilogue is not fused) */
    int32_t *lt = nullptr;
    int *lcount = nullptr;
    int8_t *ltq = nullptr;
    float *lst = nullptr;
    size_t lt_bytes = 0, lcount_bytes = 0, ltq_bytes = 0, lst_bytes = 0;
};

namespace {
std::atomic<uint64_t> prologue_tokens{0}; /* unique over every workspace */
}

struct ql_cuda_linear {
    int device;
    int64_t n, k, kp; /* kp: row pitch of the codes, k rounded up to 16 */
    int64_t group;
    int8_t *w;
    float *sw;
    int sw_per_row;
    float *bias;
    /* W4A8/W6A8 kept packed (bits 4 or 6; w is NULL): the codes, scale bytes
     * and table in pbuf (pbytes), decoded per forward into the workspace's
     * wdec (M > 8) or inside the GEMV */
    int bits;
    PackedW pw;
    uint8_t *pbuf;
    size_t pbytes;
    const int8_t *bmap_base; /* the B the bmap entries describe (the layer's w, or the workspace's wdec) */
    /* asymmetric: fp32 [k/corr_group, n] */
    float *corr;
    int64_t corr_group;
    /* unmerged LoRAs (lora_rt > 0), rank padded to lora_rp (a multiple of
     * 32): D over (rank, kp) in the prologue's code order and U over (N
     * padded to 256, rank), both in mma fragment order (lora_frag_order); su [n] */
    uint2 *lora_d, *lora_u;
    float *lora_su;
    int8_t *lora_dw; /* D again, row-major [rp, kp]: B of the down projection on the Hopper GEMM */
    CUtensorMap lora_bmap[QLC_SM90_TILES];
    bool lora_bmap_ok[QLC_SM90_TILES];
    double lora_e2;
    int64_t lora_rt, lora_rp;
    void *lora_set; /* the backend's host-side set (backend_cuda.c) */
    bool sm90;   /* Hopper kernels usable on this device */
    int sms;
    int pairs;   /* two-block clusters resident at once (the multicast kernels) */
    int force;   /* QLINEAR_CUDA_GEMM: 0 auto, 1 sm90, 2 mma, 3 gemv */
    int force_tile; /* QLINEAR_CUDA_TILE: -1 auto, else a Hopper tile (sm90_tile) */
    int force_roww; /* QLINEAR_CUDA_ROWW: 0 auto, else the prologue's warps per row (1, 2, 4) */
    int prologue_form; /* QLINEAR_CUDA_PROLOGUE: PROLOGUE_AUTO / EXACT / MMA */
    bool fuse_row; /* QLINEAR_CUDA_FUSE (auto | off): at M = 1 the GEMV may quantize the row itself (gemv_row_g256_ok) */
    int force_split; /* QLINEAR_CUDA_SPLIT (auto | 1 | 2 | 4): warps a column of that GEMV (gemv_row_split) */
    int packed_mma;  /* QLINEAR_CUDA_PACKED_MMA: 0 auto (QLC_PACKED_MMA_MIN_M .. 16 rows), 1 off, 2 on (1 .. 16 rows) */
    char kernel[96];
    PrologueFit fit; /* the prologue's launch shape at this K, on this device */
    CUtensorMap bmap[QLC_SM90_TILES]; /* the weight's TMA descriptor per Hopper tile, made on first use */
    bool bmap_ok[QLC_SM90_TILES];
};

namespace {

ql_status cuda_fail(const char *fn, const char *what, cudaError_t e)
{
    ql_status st = e == cudaErrorMemoryAllocation ? QL_ERR_OUT_OF_MEMORY : QL_ERR_UNSUPPORTED;
    if (e == cudaErrorInvalidValue || e == cudaErrorInvalidDevicePointer) st = QL_ERR_INVALID_ARGUMENT;
    return ql_fail(st, "%s: %s failed: %s (%s)", fn, what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define QLC_CUDA(fn, what, call)                                                                                     \
    do {                                                                                                              \
        cudaError_t e_ = (call);                                                                                      \
        if (e_ != cudaSuccess) return cuda_fail(fn, what, e_);                                                        \
    } while (0)

/* Restores the caller's current device on every return path. */
struct DeviceScope {
    int prev = -1;
    explicit DeviceScope(int d)
    {
        if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
        if (prev != d) cudaSetDevice(d);
    }
    ~DeviceScope()
    {
        int cur;
        if (prev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev) cudaSetDevice(prev);
    }
};

/* A pointer the kernels may read or write on `device`. */
ql_status check_device_ptr(const char *fn, const char *name, const void *p, int device)
{
    if (!p) return QL_OK;
    cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s is not a CUDA pointer (%s)", fn, name, cudaGetErrorString(e));
    }
    if (a.type == cudaMemoryTypeManaged) return QL_OK;
    if (a.type != cudaMemoryTypeDevice)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s is %s memory; the layer runs on CUDA device %d and needs a device pointer",
                       fn, name, a.type == cudaMemoryTypeHost ? "pinned host" : "host", device);
    if (a.device != device)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s lives on CUDA device %d; the layer runs on CUDA device %d", fn,
                       name, a.device, device);
    return QL_OK;
}

int env_choice(const char *name, const char *const *values, int count)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    for (int i = 0; i < count; i++)
        if (!strcmp(v, values[i])) return i;
    return 0;
}

/* Tile for the Hopper kernel (sm90_tile indices), from the H200 sweeps
 * in gpu.sh: K <= 256 (two stages at most: output-bound) 64x128 four blocks
 * per SM once the grid fills the SMs (6144x256: -5% at M = 4096, -11% at
 * 16384 against the next); 128x128 two blocks per SM when the grid fills the
 * SMs at least 1.5 times; else 128x128 with a 6-deep ring, one block per SM;
 * else 64x128 with an 8-deep ring (more blocks for short N). */
int pick_tile(int64_t m, int64_t n, int64_t k, int sms)
{
    /* the persistent 128 x 256 kernel wherever it fills every SM once: its
     * TMA-store epilogue overlaps the next tile (measured best on every anima
     * shape at M >= 4096, K = 256 included) — except K <= 256 with fewer
     * than two tiles per SM, where a tile is all epilogue and there is no
     * next tile to hide it behind (6144x256 at M = 1024: 14.2 µs, against
     * 12.8 µs for 64x128 four blocks per SM). Its multicast variant (pairs
     * of blocks sharing B, BK 64 x 6 stages: tile 9) measured 1-2 % faster
     * than tile 6 on the anima totals at M = 4096 and 16384 and 6 % at
     * 8192^3, in the same run. Where K <= 2048 the main loop of a tile is
     * short and its epilogue shows: there the ping-pong kernel (tile 10)
     * hides one warpgroup's epilogue under the other's main loop (M = 16384,
     * same run: 8192x2048 12 % faster, 6144x256 5 %, 2048x2048 2 %; at
     * K = 8192 7 % slower: 128 x 128 tiles move more bytes per MAC). */
    const int64_t tiles256 = ((m + 127) / 128) * ((n + 255) / 256);
    if (tiles256 >= sms && (k > 256 || tiles256 >= 2 * (int64_t)sms)) return k <= 2048 ? 10 : 9;
    const int64_t ctas = ((m + 127) / 128) * ((n + 127) / 128);
    if (k <= 256 && ctas >= sms) return 5;
    if (ctas * 2 >= (int64_t)sms * 3) return 1;
    if (ctas * 2 >= (int64_t)sms) return 3;
    return 4;
}

int dtype_code(ql_dtype dt) { return (int)dt; } /* DT_* are the ql_dtype values */

} // namespace

/* QLINEAR_CUDA_ACT (README): the form of gelu_tanh / swiglu in the prologue */
int qlc::act_form(void)
{
    static const char *const forms[] = {"auto", "ahead", "table", "computed"};
    static const int form = env_choice("QLINEAR_CUDA_ACT", forms, 4);
    return form;
}

extern "C" ql_status ql_cuda_check_device(const char *fn, int index)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: no usable CUDA device (%s)", fn, cudaGetErrorString(e));
    }
    if (count == 0) return ql_fail(QL_ERR_UNSUPPORTED, "%s: no CUDA device", fn);
    if (index < 0 || index >= count)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: CUDA device %d does not exist (%d present)", fn, index, count);
    cudaDeviceProp prop;
    QLC_CUDA(fn, "cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, index));
    if (prop.major < 8)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: CUDA device %d (%s) has compute capability %d.%d; qlinear needs 8.0 or newer",
                       fn, index, prop.name, prop.major, prop.minor);
    return QL_OK;
}

extern "C" ql_status ql_cuda_device_name(int index, char *buf, size_t len)
{
    const char *fn = "ql_cuda_device_name";
    if (!buf || len == 0) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: buf is NULL or empty", fn);
    ql_status st = ql_cuda_check_device(fn, index);
    if (st != QL_OK) return st;
    cudaDeviceProp prop;
    QLC_CUDA(fn, "cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, index));
    snprintf(buf, len, "%s (sm_%d%d, %d SMs, %.0f MB L2)", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
             prop.l2CacheSize / 1048576.0);
    return QL_OK;
}

extern "C" int ql_cuda_device_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

extern "C" void ql_cuda_workspace_free(ql_cuda_workspace *ws)
{
    if (!ws) return;
    if (ws->device >= 0) {
        DeviceScope ds(ws->device);
        cudaFree(ws->q);
        cudaFree(ws->sx);
        cudaFree(ws->rms);
        cudaFree(ws->gelu_lut);
        for (uint16_t *t : ws->act_tab) cudaFree(t);
        cudaFree(ws->wdec);
        cudaFree(ws->acc);
        cudaFree(ws->gsum);
        cudaFree(ws->lt);
        cudaFree(ws->lcount);
        cudaFree(ws->ltq);
        cudaFree(ws->lst);
    }
    delete ws;
}

extern "C" void ql_cuda_linear_destroy(ql_cuda_linear *l)
{
    if (!l) return;
    DeviceScope ds(l->device);
    cudaFree(l->w);
    cudaFree(l->sw);
    cudaFree(l->bias);
    cudaFree(l->pbuf);
    cudaFree(l->corr);
    cudaFree(l->lora_d);
    cudaFree(l->lora_u);
    cudaFree(l->lora_su);
    cudaFree(l->lora_dw);
    free(l);
}

namespace {

/* One row of k codes in the prologue's order (perm: value i + 16·t of each
 * group of 256 at 16·i + t; else as they are). */
void stage_codes(int8_t *dst, const int8_t *row, int64_t k, bool perm)
{
    if (!perm) {
        memcpy(dst, row, (size_t)k);
        return;
    }
    for (int64_t g = 0; g < k; g += 256)
        for (int i = 0; i < 16; i++)
            for (int t = 0; t < 16; t++) dst[g + 16 * i + t] = row[g + i + 16 * t];
}

/* A layer's common part: device checks, launch overrides, scales and bias
 * uploaded, the launch shapes at this K prepared. The weight comes after. */
ql_status linear_begin(const char *fn, int device, int64_t n, int64_t k, int64_t group, const float *scale,
                       int64_t n_scale, const float *bias_f32, ql_cuda_linear **out)
{
    *out = nullptr;
    ql_status st = ql_cuda_check_device(fn, device);
    if (st != QL_OK) return st;
    if (quantize_rows_smem(k) == 0)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: K = %lld is too long for the CUDA prologue (a row must fit in shared memory)",
                       fn, (long long)k);
    ql_cuda_linear *l = (ql_cuda_linear *)calloc(1, sizeof *l);
    if (!l) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    l->device = device;
    l->n = n, l->k = k, l->kp = (k + 15) / 16 * 16, l->group = group;
    l->sw_per_row = n_scale != 1;
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, device);
    l->sm90 = prop.major == 9;
    l->sms = prop.multiProcessorCount;
    static const char *const gemms[] = {"auto", "sm90", "mma", "gemv"};
    l->force = env_choice("QLINEAR_CUDA_GEMM", gemms, 4);
    const char *tile = getenv("QLINEAR_CUDA_TILE");
    l->force_tile = tile && *tile ? atoi(tile) % QLC_SM90_TILES : -1;
    static const char *const rowws[] = {"auto", "1", "2", "4"};
    l->force_roww = (1 << env_choice("QLINEAR_CUDA_ROWW", rowws, 4)) >> 1;
    l->prologue_form = prologue_form_from_env();
    static const char *const fuses[] = {"auto", "off"};
    l->fuse_row = env_choice("QLINEAR_CUDA_FUSE", fuses, 2) == 0;
    static const char *const splits[] = {"auto", "1", "2", "4"};
    l->force_split = (1 << env_choice("QLINEAR_CUDA_SPLIT", splits, 4)) >> 1;
    static const char *const pmmas[] = {"auto", "off", "on"};
    l->packed_mma = env_choice("QLINEAR_CUDA_PACKED_MMA", pmmas, 3);
    snprintf(l->kernel, sizeof l->kernel, "none");
    cudaError_t e = cudaMalloc(&l->sw, (size_t)n_scale * sizeof(float) + 4);
    if (e == cudaSuccess) e = cudaMemcpy(l->sw, scale, (size_t)n_scale * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess && bias_f32) {
        e = cudaMalloc(&l->bias, (size_t)n * sizeof(float) + 4);
        if (e == cudaSuccess) e = cudaMemcpy(l->bias, bias_f32, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    }
    if (e == cudaSuccess) e = prepare_quantize_rows(k, &l->fit);
    if (e == cudaSuccess && l->sm90) e = prepare_s8_gemm_sm90(&l->pairs);
    if (e != cudaSuccess) {
        ql_cuda_linear_destroy(l);
        return cuda_fail(fn, "uploading the layer", e);
    }
    *out = l;
    return QL_OK;
}

} // namespace

extern "C" ql_status ql_cuda_linear_create(int device, const ql_int8_weight *w, const float *bias_f32,
                                           ql_cuda_linear **out)
{
    const char *fn = "ql_linear_create";
    *out = nullptr;
    ql_cuda_linear *l = nullptr;
    ql_status st = ql_cuda_check_device(fn, device);
    if (st != QL_OK) return st;
    DeviceScope ds(device);
    if ((st = linear_begin(fn, device, w->n, w->k, w->convrot_group, w->scale, w->n_scale, bias_f32, &l)) != QL_OK)
        return st;

    /* The codes, each row padded with zeros to the 16-byte pitch TMA wants. */
    std::vector<int8_t> host;
    const int8_t *src = w->q;
    int64_t ld = w->ldq;
    const bool perm = codes_permuted(l->k, l->group, l->kp);
    if (perm || l->kp != w->k || w->ldq != l->kp) {
        try {
            host.assign((size_t)(l->n * l->kp), 0);
        } catch (const std::bad_alloc &) {
            ql_cuda_linear_destroy(l);
            return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot stage a %lld x %lld weight", fn, (long long)w->n,
                           (long long)((w->k + 15) / 16 * 16));
        }
        for (int64_t r = 0; r < l->n; r++) stage_codes(&host[(size_t)(r * l->kp)], w->q + r * w->ldq, l->k, perm);
        src = host.data(), ld = l->kp;
    }
    cudaError_t e = cudaMalloc(&l->w, (size_t)(l->n * l->kp > 0 ? l->n * l->kp : 16));
    if (e == cudaSuccess && l->n > 0) e = cudaMemcpy(l->w, src, (size_t)(l->n * ld), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        ql_cuda_linear_destroy(l);
        return cuda_fail(fn, "uploading the weight", e);
    }
    l->bmap_base = l->w;
    *out = l;
    return QL_OK;
}

extern "C" ql_status ql_cuda_linear_create_packed(int device, const ql_cuda_packed_desc *d, const float *bias_f32,
                                                  ql_cuda_linear **out)
{
    const char *fn = "ql_linear_create";
    *out = nullptr;
    ql_status st = ql_cuda_check_device(fn, device);
    if (st != QL_OK) return st;
    if ((d->bits != 4 && d->bits != 6) || (d->gs != 4 && d->gs != 8 && d->gs != 16) || d->k % (d->bits == 6 ? 32 : 16) ||
        d->ldn % 16 || d->lds % 16 || (d->bits == 6 && (d->ldh % 16 || d->gs != 16)))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: bad packed W%dA8 layout (internal)", fn, d->bits);
    DeviceScope ds(device);
    ql_cuda_linear *l = nullptr;
    if ((st = linear_begin(fn, device, d->n, d->k, d->convrot_group, d->s_channel, d->n, bias_f32, &l)) != QL_OK) return st;
    const size_t nib = (size_t)(d->n * d->ldn), hi = d->bits == 6 ? (size_t)(d->n * d->ldh) : 0, sb = (size_t)(d->n * d->lds),
                 tab = d->bits == 6 ? 256 * 2 : 256 * 16;
    l->bits = d->bits;
    l->pbytes = nib + hi + sb + tab;
    cudaError_t e = cudaMalloc(&l->pbuf, l->pbytes + 16);
    uint8_t *p = l->pbuf;
    if (e == cudaSuccess) e = cudaMemcpy(p, d->table, tab, cudaMemcpyHostToDevice); /* 16-byte rows first: aligned */
    if (e == cudaSuccess && nib) e = cudaMemcpy(p + tab, d->nib, nib, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && hi) e = cudaMemcpy(p + tab + nib, d->hi, hi, cudaMemcpyHostToDevice);
    if (e == cudaSuccess && sb) e = cudaMemcpy(p + tab + nib + hi, d->sb, sb, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        ql_cuda_linear_destroy(l);
        return cuda_fail(fn, "uploading the packed weight", e);
    }
    l->pw = PackedW{d->bits, d->gs, d->n, d->k, p + tab, d->ldn, hi ? p + tab + nib : nullptr, d->ldh,
                    p + tab + nib + hi, d->lds, p};
    *out = l;
    return QL_OK;
}

extern "C" ql_status ql_cuda_linear_set_correction(ql_cuda_linear *l, const float *corr, int64_t group)
{
    const char *fn = "ql_linear_create";
    DeviceScope ds(l->device);
    const size_t bytes = (size_t)(l->k / group * l->n) * sizeof(float);
    cudaFree(l->corr);
    l->corr = nullptr;
    QLC_CUDA(fn, "uploading the correction", cudaMalloc(&l->corr, bytes + 4));
    QLC_CUDA(fn, "uploading the correction", cudaMemcpy(l->corr, corr, bytes, cudaMemcpyHostToDevice));
    l->corr_group = group;
    return QL_OK;
}

extern "C" ql_status ql_cuda_linear_lora_ok(const ql_cuda_linear *l)
{
    if (l->bits || l->corr)
        return ql_fail(QL_ERR_UNSUPPORTED,
                       "ql_linear_add_lora: unmerged LoRAs on CUDA take W8A8 layers with an int8 weight; this one is %s",
                       l->corr ? "asymmetric W4A8" : "a packed W4A8/W6A8 layer");
    return QL_OK;
}

extern "C" ql_status ql_cuda_linear_set_lora(ql_cuda_linear *l, int64_t rtot, const int8_t *dq, const int8_t *uq,
                                             const float *su, double e2)
{
    const char *fn = "ql_linear_add_lora";
    ql_status st = ql_cuda_linear_lora_ok(l);
    if (st != QL_OK) return st;
    DeviceScope ds(l->device);
    /* cudaFree waits for queued forwards that still read the old codes */
    cudaFree(l->lora_d), cudaFree(l->lora_u), cudaFree(l->lora_su), cudaFree(l->lora_dw);
    l->lora_d = l->lora_u = nullptr, l->lora_su = nullptr, l->lora_dw = nullptr, l->lora_rt = l->lora_rp = 0;
    for (int t = 0; t < QLC_SM90_TILES; t++) l->lora_bmap_ok[t] = false;
    if (rtot <= 0) return QL_OK;
    const int64_t rp = (rtot + 31) / 32 * 32, np = (l->n + 255) / 256 * 256; /* N: the widest Hopper tile */
    std::vector<int8_t> d;
    std::vector<uint8_t> df, uf;
    try {
        d.assign((size_t)(rp * l->kp), 0); /* rows past rtot stay zeros: the down GEMM's B */
        df.assign((size_t)(rp * ((l->kp + 31) / 32 * 32)), 0);
        uf.assign((size_t)(np * rp), 0);
    } catch (const std::bad_alloc &) {
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot stage the LoRA codes (rank %lld)", fn, (long long)rtot);
    }
    const bool perm = codes_permuted(l->k, l->group, l->kp);
    for (int64_t r = 0; r < rtot; r++) stage_codes(&d[(size_t)(r * l->kp)], dq + r * l->k, l->k, perm);
    lora_frag_order(d.data(), l->kp, rtot, l->kp, rp, false, df.data());
    lora_frag_order(uq, rtot, l->n, rtot, np, true, uf.data());
    cudaError_t e = cudaMalloc(&l->lora_d, df.size());
    if (e == cudaSuccess) e = cudaMalloc(&l->lora_u, uf.size());
    if (e == cudaSuccess) e = cudaMalloc(&l->lora_su, (size_t)l->n * sizeof(float) + 4);
    if (e == cudaSuccess && l->sm90) e = cudaMalloc(&l->lora_dw, d.size()); /* read by the Hopper GEMM only */
    if (e == cudaSuccess && l->sm90) e = cudaMemcpy(l->lora_dw, d.data(), d.size(), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(l->lora_d, df.data(), df.size(), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(l->lora_u, uf.data(), uf.size(), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(l->lora_su, su, (size_t)l->n * sizeof(float), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(l->lora_d), cudaFree(l->lora_u), cudaFree(l->lora_su), cudaFree(l->lora_dw);
        l->lora_d = l->lora_u = nullptr, l->lora_su = nullptr, l->lora_dw = nullptr;
        return cuda_fail(fn, "uploading the LoRA codes", e);
    }
    l->lora_rt = rtot, l->lora_rp = rp, l->lora_e2 = e2;
    return QL_OK;
}

extern "C" int64_t ql_cuda_linear_n(const ql_cuda_linear *l) { return l->n; }
extern "C" void **ql_cuda_linear_lora_slot(ql_cuda_linear *l) { return &l->lora_set; }

extern "C" size_t ql_cuda_linear_weight_bytes(const ql_cuda_linear *l)
{
    const size_t corr = l->corr ? (size_t)(l->k / l->corr_group * l->n) * 4 : 0;
    return (l->bits ? l->pbytes : (size_t)(l->n * l->kp)) + (size_t)(l->sw_per_row ? l->n : 1) * 4 + corr;
}

extern "C" const char *ql_cuda_linear_kernel(const ql_cuda_linear *l) { return l ? l->kernel : ""; }

namespace {

/* Descriptor caches of a call (NULL: none; the maps are made for this call). */
struct MapCache {
    CUtensorMap *amap;
    int64_t *amap_m, *amap_k;
    int *amap_tile;
    CUtensorMap *bmap;
    bool *bmap_ok;
};

/* Runs C = A·Bᵀ with epilogue p: the GEMV for few rows, the Hopper kernel
 * where it can run, else the portable tensor-core kernel. */
/* Which GEMM run_gemm runs: 1 Hopper, 2 mma.sync, 3 GEMV. */
int gemm_use(int force, bool sm90, const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t m, int64_t n,
             int64_t k)
{
    const bool aligned = (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && lda % 16 == 0 && ldb % 16 == 0;
    const bool gemv_ok = aligned && k % 16 == 0 && m <= QLC_GEMV_MAX_M;
    const bool sm90_ok = sm90 && aligned && m <= INT32_MAX && n <= INT32_MAX;
    int use = force;
    if ((use == 1 && !sm90_ok) || (use == 3 && !gemv_ok)) use = 0;
    if (k == 0) use = 2; /* no K slices: the tile loop never runs, the epilogue sees zeros */
    if (use == 0) use = gemv_ok && !(sm90_ok && m > QLC_GEMV_AUTO_MAX_M_SM90) ? 3 : sm90_ok ? 1 : 2;
    return use;
}

cudaError_t run_gemm(int force, int force_tile, int force_split, bool sm90, int sms, int pairs, const int8_t *a, int64_t lda,
                     const int8_t *b, int64_t ldb, int64_t m, int64_t n, int64_t k, const EpiParams &p,
                     cudaStream_t stream, bool pdl, char *name, size_t name_len, const MapCache *cache)
{
    const int use = gemm_use(force, sm90, a, lda, b, ldb, m, n, k);
    if (use == 3) {
        const int split = gemv_split(n, k, 0, sms, force_split);
        snprintf(name, name_len, "gemv dp4a, %d warp%s a column", split, split > 1 ? "s" : "");
        return launch_s8_gemv(a, lda, b, ldb, m, n, k, split, p, stream, pdl && sm90); /* PDL is Hopper's */
    }
    if (use == 1) {
        int t = force_tile >= 0 ? force_tile : pick_tile(m, n, k, sms);
        /* With a LoRA term in the epilogue the ping-pong, 128 x 256 x 8-stage
         * and several-blocks-per-SM kernels run out of registers and spill
         * (ptxas -v): the nearest kernel that does not (the multicast
         * persistent one; 128 x 128, one block per SM). */
        if (p.lks && force_tile < 0) t = t == 10 ? 9 : (t == 0 || t == 1 || t == 2 || t == 5) ? 3 : t;
        CUtensorMap ma_local, mb_local;
        CUtensorMap *ma = &ma_local, *mb = &mb_local;
        if (cache) {
            ma = cache->amap;
            if (*cache->amap_m != m || *cache->amap_k != k || *cache->amap_tile != t) {
                if (!make_sm90_maps(t, a, lda, m, b, ldb, n, k, ma, nullptr)) return cudaErrorInvalidValue;
                *cache->amap_m = m, *cache->amap_k = k, *cache->amap_tile = t;
            }
            mb = &cache->bmap[t];
            if (!cache->bmap_ok[t]) {
                if (!make_sm90_maps(t, a, lda, m, b, ldb, n, k, nullptr, mb)) return cudaErrorInvalidValue;
                cache->bmap_ok[t] = true;
            }
        } else if (!make_sm90_maps(t, a, lda, m, b, ldb, n, k, ma, mb)) return cudaErrorInvalidValue;
        char per_sm[8] = "";
        const Sm90Tile ts = sm90_tile(t);
        if (ts.ctas_per_sm > 1) snprintf(per_sm, sizeof per_sm, " x%d/SM", ts.ctas_per_sm);
        snprintf(name, name_len, "sm90 wgmma %dx%d k%d%s%s%s%s", ts.bm, ts.bn, ts.bk, per_sm,
                 ts.persistent ? " persistent" : "", ts.pingpong ? " ping-pong" : "",
                 ts.cluster > 1 ? " 2x1 multicast" : "");
        /* a layer (cache) prepared every tile when it was created */
        return launch_s8_gemm_sm90(t, *ma, *mb, m, n, k, p, stream, pdl, sms, pairs, cache == nullptr);
    }
    snprintf(name, name_len, "mma.sync 128x128");
    return launch_s8_gemm_mma(a, lda, b, ldb, m, n, k, p, stream);
}

} // namespace

namespace {
/* The context's workspace, made on first use on `device`. */
ql_status workspace_on(const char *fn, ql_cuda_workspace **wsp, int device, ql_cuda_workspace **out)
{
    if (!*wsp) {
        *wsp = new (std::nothrow) ql_cuda_workspace;
        if (!*wsp) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        (*wsp)->device = device;
    }
    if ((*wsp)->device != device)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: the context's workspace is on CUDA device %d, the layer on %d", fn,
                       (*wsp)->device, device);
    *out = *wsp;
    return QL_OK;
}

bool capturing(cudaStream_t s)
{
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &cap) == cudaSuccess && cap != cudaStreamCaptureStatusNone;
}

/* Layer li's epilogue parameters for output y (its scales, bias,
 * residual; with a LoRA, the operands the down kernel leaves in ws). */
EpiParams layer_epi(const ql_cuda_linear *li, const ql_epilogue *epi, void *y, int64_t ldy, ql_dtype ydt,
                    const ql_cuda_workspace *ws)
{
    const size_t es = ql_dtype_size(ydt);
    EpiParams p = {};
    p.y = y, p.ldy = ldy, p.ydt = dtype_code(ydt);
    p.sx = ws->sx, p.sw = li->sw, p.sw_per_row = li->sw_per_row, p.bias = epi && epi->bias ? epi->bias : li->bias;
    if (epi && epi->residual) p.res = epi->residual, p.ldr = epi->ld_residual, p.rs = epi->residual_scale;
    p.vec2 = (uintptr_t)y % (2 * es) == 0 && ldy % 2 == 0;
    p.act = epi && epi->activation == QL_ACTIVATION_GELU, p.gelu_lut = ws->gelu_lut;
    if (li->lora_rt)
        p.ltq = ws->ltq, p.lst = ws->lst, p.luf = li->lora_u, p.lsu = li->lora_su, p.lks = (int)(li->lora_rp / 32);
    return p;
}

/* Whether layer li's GEMM adds its LoRA term itself: the GEMV (any
 * output), or the Hopper GEMM's bf16 epilogue; else the LoRA epilogue
 * kernel reads the GEMM's raw accumulators. */
bool lora_fuses(const ql_cuda_linear *li, const EpiParams &p, const int8_t *q, int64_t m)
{
    const int use = li->bits ? 0 : gemm_use(li->force, li->sm90, q, li->kp, li->w, li->kp, m, li->n, li->k);
    return use == 3 || (use == 1 && sm90_fuses_lora(p, li->n));
}

ql_status refuse_growth_in_capture(const char *fn, int64_t m)
{
    return ql_fail(QL_ERR_INVALID_ARGUMENT,
                   "%s: M = %lld needs a larger activation workspace, which cannot be allocated while the stream "
                   "is being captured into a CUDA graph: run one forward at the largest M before capturing",
                   fn, (long long)m);
}

/* The input activation of epi (NULL or input_act 0: none) for the prologue,
 * its weight a pointer on `device` (k > 0). The rest of its terms were
 * checked with the forward's arguments (ql_check_forward_args). */
ql_status input_act_of(const char *fn, const ql_epilogue *epi, int device, int64_t k, InputAct *a)
{
    *a = InputAct{QL_INPUT_ACT_NONE, nullptr, DT_F32, 0.0f, nullptr, nullptr};
    if (!epi || epi->input_act == QL_INPUT_ACT_NONE) return QL_OK;
    if (epi->input_act < 0 || epi->input_act >= QLC_INPUT_ACTS)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown input_act %d (0 none, 1 gelu_tanh, 2 swiglu, 3 rms_norm)",
                       fn, epi->input_act);
    a->code = epi->input_act;
    if (a->code != QL_INPUT_ACT_RMS_NORM) return QL_OK;
    const ql_dtype wdt = epi->input_act_weight_dtype;
    if (wdt != QL_F32 && wdt != QL_F16 && wdt != QL_BF16)
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: input_act_weight dtype %d is not supported (fp32, fp16 or bf16)", fn,
                       (int)wdt);
    if (k > 0 && !epi->input_act_weight)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: input_act rms_norm needs input_act_weight ([K] values)", fn);
    ql_status st = check_device_ptr(fn, "input_act_weight", epi->input_act_weight, device);
    if (st != QL_OK) return st;
    a->w = epi->input_act_weight, a->wdt = dtype_code(wdt), a->eps = epi->input_act_eps;
    return QL_OK;
}

/* rms_norm's row factors: the workspace's buffer grown to m rows. */
ql_status reserve_rms(const char *fn, ql_cuda_workspace *ws, int64_t m, cudaStream_t s)
{
    if ((size_t)m <= ws->rms_rows) return QL_OK;
    if (capturing(s)) return refuse_growth_in_capture(fn, m);
    cudaFree(ws->rms); /* waits for queued work that may still read it */
    ws->rms = nullptr, ws->rms_rows = 0;
    QLC_CUDA(fn, "allocating the rms_norm row factors", cudaMalloc(&ws->rms, (size_t)m * sizeof(float)));
    ws->rms_rows = (size_t)m;
    return QL_OK;
}

/* The output GELU's bf16 table on the workspace's device (8 KB, once). */
ql_status reserve_gelu(const char *fn, ql_cuda_workspace *ws, cudaStream_t s)
{
    if (ws->gelu_lut) return QL_OK;
    if (capturing(s))
        return ql_fail(QL_ERR_INVALID_ARGUMENT,
                       "%s: the output GELU's table is made on its first use, which cannot happen while the stream "
                       "is being captured into a CUDA graph: run one forward with the GELU before capturing", fn);
    uint16_t host[QL_GELU_LUT_SIZE];
    ql_gelu_bf16_lut_fill(host);
    QLC_CUDA(fn, "allocating the GELU table", cudaMalloc(&ws->gelu_lut, sizeof host));
    const cudaError_t e = cudaMemcpy(ws->gelu_lut, host, sizeof host, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(ws->gelu_lut);
        ws->gelu_lut = nullptr;
        QLC_CUDA(fn, "uploading the GELU table", e);
    }
    return QL_OK;
}

/* The 16-bit table of act's function for rows of xdt on the workspace's
 * device (128 KiB, uploaded on first use), or NULL where there is none (fp32
 * rows, rms_norm), or it cannot be made now (no memory; the stream being
 * captured): the prologue then computes the same bits.
 * QLINEAR_CUDA_ACT=computed: never a table (a hook to measure the two forms). */
const uint16_t *act_table_for(ql_cuda_workspace *ws, int code, ql_dtype xdt, cudaStream_t s)
{
    if ((code != QL_INPUT_ACT_GELU_TANH && code != QL_INPUT_ACT_SWIGLU) || (xdt != QL_BF16 && xdt != QL_F16) ||
        act_form() == QLC_ACT_COMPUTED)
        return nullptr;
    const int t = (code == QL_INPUT_ACT_SWIGLU) * 2 + (xdt == QL_F16);
    if (ws->act_tab[t] || capturing(s)) return ws->act_tab[t];
    const uint16_t *host = ql_act_table16(code, xdt);
    if (!host) return nullptr;
    const size_t bytes = (size_t)65536 * sizeof(uint16_t);
    uint16_t *d = nullptr;
    if (cudaMalloc(&d, bytes) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    if (cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(d);
        return nullptr;
    }
    return ws->act_tab[t] = d;
}

/* A workspace buffer grown to `need` bytes (its contents are not kept). */
ql_status grow(const char *fn, cudaStream_t s, void **buf, size_t *have, size_t need, const char *what)
{
    if (need <= *have) return QL_OK;
    if (capturing(s))
        return ql_fail(QL_ERR_INVALID_ARGUMENT,
                       "%s: this call needs a larger %s, which cannot be allocated while the stream is being captured "
                       "into a CUDA graph: run one forward of every layer at the largest M before capturing",
                       fn, what);
    cudaFree(*buf); /* waits for queued work that may still read it */
    *buf = nullptr, *have = 0;
    QLC_CUDA(fn, what, cudaMalloc(buf, need));
    *have = need;
    return QL_OK;
}

/* grow, for buffers that must hold zeros (the kernels that use them leave them so) */
ql_status grow_zeroed(const char *fn, cudaStream_t s, void **buf, size_t *have, size_t need, const char *what)
{
    if (need <= *have) return QL_OK;
    const ql_status st = grow(fn, s, buf, have, need, what);
    if (st != QL_OK) return st;
    QLC_CUDA(fn, what, cudaMemset(*buf, 0, need));
    return QL_OK;
}

/* A packed layer's forward of m rows on the tensor-core kernel that decodes
 * B in registers (launch_wxa8_mma16): from QLC_PACKED_MMA_MIN_M rows by default. */
bool packed_mma(const ql_cuda_linear *l, int64_t m)
{
    if (l->force != 0 || m > QLC_PACKED_MMA_MAX_M || l->packed_mma == 1) return false;
    return l->packed_mma == 2 || m >= QLC_PACKED_MMA_MIN_M;
}

/* A packed layer's forward of m rows on the packed GEMV (dp4a, decoded in registers). */
bool packed_gemv(const ql_cuda_linear *l, int64_t m)
{
    return m <= QLC_GEMV_MAX_M && (l->force == 0 || l->force == 3) && !packed_mma(l, m);
}

/* Neither: decoded into the workspace each call, then the int8 GEMM. */
bool packed_decodes(const ql_cuda_linear *l, int64_t m) { return l->bits && !packed_gemv(l, m) && !packed_mma(l, m); }

int64_t acc_pitch(int64_t n) { return (n + 3) / 4 * 4; }

/* Whether layer l's forward of m rows runs as one GEMV that quantizes the
 * row itself: an int8 layer whose GEMM is the GEMV, or a symmetric packed
 * layer whose forward is the packed GEMV; nothing the prologue or GEMV
 * would add (no input activation, LoRA or correction); one row
 * (gemv_row_g256_ok); and y apart from x (each block reads all of x while
 * others write their columns of y). */
bool row_fuses(const ql_cuda_linear *l, const void *x, ql_dtype xdt, int64_t m, const InputAct &act, const void *y,
               ql_dtype ydt, const ql_cuda_workspace *ws)
{
    if (!l->fuse_row || l->corr || l->lora_rt || act.code != QL_INPUT_ACT_NONE) return false;
    if (l->bits ? !packed_gemv(l, m) : gemm_use(l->force, l->sm90, ws->q, l->kp, l->w, l->kp, m, l->n, l->k) != 3)
        return false;
    if (!gemv_row_g256_ok(dtype_code(xdt), x, m, l->n, l->k, l->group, l->sms)) return false;
    const uintptr_t x0 = (uintptr_t)x, x1 = x0 + (uintptr_t)(l->k * (int64_t)ql_dtype_size(xdt));
    const uintptr_t y0 = (uintptr_t)y, y1 = y0 + (uintptr_t)(l->n * (int64_t)ql_dtype_size(ydt));
    return y1 <= x0 || x1 <= y0;
}
} // namespace

extern "C" ql_status ql_cuda_linear_forward(ql_cuda_linear *const *ls, int count, ql_cuda_workspace **wsp, void *stream,
                                            const void *x, ql_dtype xdt, int64_t m, int64_t ldx, void *const *ys,
                                            ql_dtype ydt, const int64_t *ldys, const ql_epilogue *const *epis,
                                            uint64_t *token)
{
    const char *fn = count > 1 ? "ql_linear_forward_shared" : "ql_linear_forward"; /* the caller's name */
    ql_cuda_linear *l = ls[0]; /* the input's layer: every layer shares its K and group (checked by the caller) */
    ql_status st;
    if ((st = check_device_ptr(fn, "x", x, l->device)) != QL_OK) return st;
    for (int i = 0; i < count; i++) {
        const ql_epilogue *epi = epis ? epis[i] : nullptr;
        if (ls[i]->device != l->device)
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: layer %d is on CUDA device %d, layer 0 on %d", fn, i,
                           ls[i]->device, l->device);
        if ((st = check_device_ptr(fn, "y", ys[i], l->device)) != QL_OK) return st;
        /* a per-call bias: n fp32 values on the layer's device (checked like every operand) */
        if (epi && epi->bias && (st = check_device_ptr(fn, "bias", epi->bias, l->device)) != QL_OK) return st;
        if (epi && epi->residual) {
            if ((st = check_device_ptr(fn, "residual", epi->residual, l->device)) != QL_OK) return st;
            if ((st = check_device_ptr(fn, "residual_scale", epi->residual_scale, l->device)) != QL_OK) return st;
        }
        /* one prologue for every layer: one input activation (the backend runs layers with different ones apart) */
        const ql_epilogue *e0 = epis ? epis[0] : nullptr;
        const int a0 = e0 ? e0->input_act : 0, ai = epi ? epi->input_act : 0;
        if (ai != a0 || (ai == QL_INPUT_ACT_RMS_NORM &&
                         (epi->input_act_weight != e0->input_act_weight ||
                          epi->input_act_weight_dtype != e0->input_act_weight_dtype ||
                          memcmp(&epi->input_act_eps, &e0->input_act_eps, sizeof(float)) != 0)))
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: layer %d's input activation differs from layer 0's (one prologue)",
                           fn, i);
    }
    InputAct act;
    if ((st = input_act_of(fn, epis ? epis[0] : nullptr, l->device, l->k, &act)) != QL_OK) return st;
    ql_cuda_workspace *ws;
    if ((st = workspace_on(fn, wsp, l->device, &ws)) != QL_OK) return st;
    DeviceScope ds(l->device);
    std::lock_guard<std::mutex> guard(ws->lock);
    const size_t q_bytes = (size_t)(m * l->kp);
    cudaStream_t s = (cudaStream_t)stream;
    if (q_bytes > ws->q_bytes || (size_t)m > ws->rows) {
        if (capturing(s)) return refuse_growth_in_capture(fn, m);
        /* Grown once per larger M; cudaFree waits for queued work that may still read the old one. */
        cudaFree(ws->q), cudaFree(ws->sx);
        ws->q = nullptr, ws->sx = nullptr, ws->q_bytes = ws->rows = 0;
        ws->amap_m = ws->lamap_m = -1; /* the descriptors named the old buffer */
        size_t qb = q_bytes > ws->q_bytes ? q_bytes : ws->q_bytes;
        QLC_CUDA(fn, "allocating the activation workspace", cudaMalloc(&ws->q, qb));
        QLC_CUDA(fn, "allocating the activation workspace", cudaMalloc(&ws->sx, (size_t)m * sizeof(float)));
        ws->q_bytes = qb, ws->rows = (size_t)m;
        ws->token = 0; /* the codes are gone */
    }
    for (int i = 0; epis && i < count; i++)
        if (epis[i] && epis[i]->activation == QL_ACTIVATION_GELU && (st = reserve_gelu(fn, ws, s)) != QL_OK) return st;
    /* the decoded weight of a packed layer and an asymmetric layer's buffers */
    for (int i = 0; i < count; i++) {
        const ql_cuda_linear *li = ls[i];
        if (packed_decodes(li, m) &&
            (st = grow(fn, s, (void **)&ws->wdec, &ws->wdec_bytes, (size_t)(li->n * li->kp), "decoded-weight workspace")) !=
                QL_OK)
            return st;
        /* the int32 accumulators only for a LoRA term its GEMM does not add itself */
        const bool lora_acc = li->lora_rt && !lora_fuses(li, layer_epi(li, epis ? epis[i] : nullptr, ys[i], ldys[i], ydt, ws), ws->q, m);
        if (li->lora_rt &&
            ((lora_acc && (st = grow(fn, s, (void **)&ws->acc, &ws->acc_bytes, (size_t)(m * acc_pitch(li->n)) * 4,
                                     "accumulator workspace (LoRA)")) != QL_OK) ||
             (st = grow_zeroed(fn, s, (void **)&ws->lt, &ws->lt_bytes, (size_t)(m * li->lora_rp) * 4, "LoRA workspace")) !=
                 QL_OK ||
             (st = grow_zeroed(fn, s, (void **)&ws->lcount, &ws->lcount_bytes, (size_t)lora_row_blocks(m) * sizeof(int),
                               "LoRA workspace")) != QL_OK ||
             (st = grow(fn, s, (void **)&ws->ltq, &ws->ltq_bytes, (size_t)(m * li->lora_rp), "LoRA workspace")) != QL_OK ||
             (st = grow(fn, s, (void **)&ws->lst, &ws->lst_bytes, (size_t)m * 4, "LoRA workspace")) != QL_OK))
            return st;
        if (li->corr &&
            ((st = grow(fn, s, (void **)&ws->acc, &ws->acc_bytes, (size_t)(m * acc_pitch(li->n)) * 4,
                        "accumulator workspace (asymmetric layer)")) != QL_OK ||
             (st = grow(fn, s, (void **)&ws->gsum, &ws->gsum_bytes, (size_t)(m * (li->k / li->corr_group)) * 4,
                        "group-sum workspace (asymmetric layer)")) != QL_OK))
            return st;
    }
    /* One prologue for every layer; each GEMM is a programmatic dependent
     * launch of the kernel before it, and waits for it: the codes are
     * complete before any GEMM reads them, and the next call's prologue
     * waits for the last GEMM before it overwrites them. */
    /* a prologue cache's hit: this workspace still holds that input's codes, queued on this stream */
    const bool reuse = token && *token && *token == ws->token && ws->token_stream == stream;
    bool fuse = !reuse;
    for (int i = 0; fuse && i < count; i++) fuse = row_fuses(ls[i], x, xdt, m, act, ys[i], ydt, ws);
    if (fuse) {
        /* a kernel per layer: its GEMV quantizes the row itself (each the same codes, left where the prologue
         * kernel would leave them) */
        ws->token = 0;
        for (int i = 0; i < count; i++) {
            ql_cuda_linear *li = ls[i];
            const EpiParams p = layer_epi(li, epis ? epis[i] : nullptr, ys[i], ldys[i], ydt, ws);
            const int split = gemv_row_split(dtype_code(xdt), li->n, li->k, li->bits, li->sms, li->force_split);
            if (li->bits) {
                QLC_CUDA(fn, "the packed GEMV kernel", launch_wxa8_gemv_row(x, dtype_code(xdt), li->pw, split, p, ws->q,
                                                                           ws->sx, li->sms, s, li->fit.pdl));
                snprintf(li->kernel, sizeof li->kernel, "wxa8 gemv %d-bit dp4a, row quantized in each block, %d warp%s a column",
                         li->bits, split, split > 1 ? "s" : "");
            } else {
                QLC_CUDA(fn, "the GEMV kernel", launch_s8_gemv_row(x, dtype_code(xdt), li->k, li->w, li->n, split, p, ws->q,
                                                                    ws->sx, li->sms, s, li->fit.pdl));
                snprintf(li->kernel, sizeof li->kernel, "gemv dp4a, row quantized in each block, %d warp%s a column", split,
                         split > 1 ? "s" : "");
            }
        }
        ws->token = ++prologue_tokens, ws->token_stream = stream;
        if (token) *token = ws->token;
        return QL_OK;
    }
    if (!reuse) {
        if (act.code == QL_INPUT_ACT_RMS_NORM) {
            if ((st = reserve_rms(fn, ws, m, s)) != QL_OK) return st;
            act.rms = ws->rms;
        }
        act.tab = act_table_for(ws, act.code, xdt, s);
        ws->token = 0; /* overwritten from here on, whatever happens */
        QLC_CUDA(fn, "the prologue kernel",
                 launch_quantize_rows(x, dtype_code(xdt), ldx, m, l->k, l->group, act, ws->q, l->kp, ws->sx,
                                      l->force_roww, l->prologue_form, l->fit, s));
        ws->token = ++prologue_tokens, ws->token_stream = stream;
    }
    if (token) *token = ws->token;
    const bool perm = codes_permuted(l->k, l->group, l->kp); /* the order the prologue wrote */
    for (int i = 0; i < count; i++) {
        ql_cuda_linear *li = ls[i];
        EpiParams p = layer_epi(li, epis ? epis[i] : nullptr, ys[i], ldys[i], ydt, ws);
        const int64_t ldacc = acc_pitch(li->n);
        /* An unmerged LoRA: t's codes first; then the GEMV or the Hopper
         * GEMM adds the LoRA term in its epilogue, or the LoRA epilogue
         * kernel reads the GEMM's raw accumulators. */
        const bool lora_fused = li->lora_rt && lora_fuses(li, p, ws->q, m);
        if (li->lora_rt) {
            /* t = x_q·Dᵀ: on the Hopper GEMM (raw int32 into t, then the
             * requantization) wherever it would run a GEMM of that shape
             * and the portable kernels are not forced; else the down
             * kernel (the rows the GEMV takes, and off Hopper) */
            const bool portable = li->force == 2 || li->force == 3;
            if (!portable && li->lora_dw && gemm_use(0, li->sm90, ws->q, li->kp, li->lora_dw, li->kp, m, li->lora_rp, li->k) == 1) {
                EpiParams pt = {};
                pt.y = ws->lt, pt.ldy = li->lora_rp, pt.ydt = DT_I32, pt.vec2 = 1;
                const MapCache lcache = {&ws->lamap, &ws->lamap_m, &ws->lamap_k, &ws->lamap_tile, li->lora_bmap,
                                         li->lora_bmap_ok};
                char down[64];
                QLC_CUDA(fn, "the LoRA down GEMM",
                         run_gemm(1, li->force_tile, li->force_split, li->sm90, li->sms, li->pairs, ws->q, li->kp, li->lora_dw, li->kp, m,
                                  li->lora_rp, li->k, pt, s, true, down, sizeof down, &lcache));
                QLC_CUDA(fn, "the LoRA requantization kernel",
                         launch_lora_requant(ws->lt, m, li->lora_rp, ws->sx, li->lora_e2, ws->ltq, ws->lst, s));
            } else
                QLC_CUDA(fn, "the LoRA down kernel",
                         launch_lora_down(ws->q, li->kp, li->lora_d, m, li->lora_rp, li->kp, ws->lt, ws->lcount, ws->sx,
                                          li->lora_e2, ws->ltq, ws->lst, li->sms, s));
        }
        /* an asymmetric layer's GEMM (or an unfused LoRA's) leaves its raw accumulators; an epilogue kernel follows */
        EpiParams pg = p;
        if (li->corr || (li->lora_rt && !lora_fused)) {
            pg = EpiParams{};
            pg.y = ws->acc, pg.ldy = ldacc, pg.ydt = DT_I32, pg.sx = ws->sx, pg.sw = li->sw, pg.sw_per_row = li->sw_per_row;
            pg.vec2 = 1;
        }
        char name[80];
        if (li->bits && packed_gemv(li, m)) {
            const int split = gemv_split(li->n, li->kp, li->bits, li->sms, li->force_split);
            QLC_CUDA(fn, "the packed GEMV kernel", launch_wxa8_gemv(ws->q, li->kp, li->pw, perm, m, split, pg, s, li->sm90));
            snprintf(name, sizeof name, "wxa8 gemv %d-bit dp4a, %d warp%s a column", li->bits, split, split > 1 ? "s" : "");
        } else if (li->bits && packed_mma(li, m)) {
            const int tiles = wxa8_mma16_tiles(li->n, li->sms);
            QLC_CUDA(fn, "the packed mma kernel", launch_wxa8_mma16(ws->q, li->kp, li->pw, perm, m, tiles, pg, s, li->sm90));
            snprintf(name, sizeof name, "wxa8 mma16 %d-bit, B decoded in registers, %d columns a block", li->bits, 8 * tiles);
        } else {
            const int8_t *b = li->w;
            if (li->bits) {
                /* an ordinary launch: it waits for the GEMM still reading the buffer; so does the
                 * GEMM after it (its producer loads B before waiting on a programmatic launch) */
                QLC_CUDA(fn, "the W4A8/W6A8 decode kernel", launch_wxa8_decode(li->pw, perm, ws->wdec, li->kp, s));
                b = ws->wdec;
            }
            if (li->bmap_base != b) { /* the workspace's decoded weight moved (it grew) */
                for (int t = 0; t < QLC_SM90_TILES; t++) li->bmap_ok[t] = false;
                li->bmap_base = b;
            }
            const MapCache cache = {&ws->amap, &ws->amap_m, &ws->amap_k, &ws->amap_tile, li->bmap, li->bmap_ok};
            char gemm[64];
            QLC_CUDA(fn, "the GEMM kernel",
                     run_gemm(li->force, li->force_tile, li->force_split, li->sm90, li->sms, li->pairs, ws->q, li->kp, b, li->kp, m, li->n,
                              li->k, pg, s, !li->bits, gemm, sizeof gemm, &cache));
            if (li->bits) snprintf(name, sizeof name, "wxa8 decode %d-bit + %s", li->bits, gemm);
            else snprintf(name, sizeof name, "%s", gemm);
        }
        if (li->corr) {
            QLC_CUDA(fn, "the group-sum kernel",
                     launch_group_sums(ws->q, li->kp, m, li->k, li->corr_group, perm, ws->gsum, s));
            QLC_CUDA(fn, "the corrected epilogue kernel",
                     launch_corr_epilogue(ws->acc, ldacc, ws->gsum, li->corr, m, li->n, li->k / li->corr_group, p, s));
            snprintf(li->kernel, sizeof li->kernel, "%s + correction", name);
        } else if (li->lora_rt) {
            if (!lora_fused)
                QLC_CUDA(fn, "the LoRA epilogue kernel", launch_lora_epilogue(ws->acc, ldacc, m, li->n, p, s));
            snprintf(li->kernel, sizeof li->kernel, "%s + LoRA rank %lld%s", name, (long long)li->lora_rt,
                     lora_fused ? " (fused)" : "");
        } else snprintf(li->kernel, sizeof li->kernel, "%s", name);
    }
    return QL_OK;
}

extern "C" int ql_cuda_codes_permuted(int64_t k, int64_t group) { return codes_permuted(k, group, (k + 15) / 16 * 16); }

extern "C" ql_status ql_cuda_linear_decoded_weight(const ql_cuda_linear *l, int8_t *out, int64_t ldo)
{
    const char *fn = "ql_cuda_linear_decoded_weight";
    if (!l || !out || ldo < l->k) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: no layer, no output or ldo < K", fn);
    if (l->n == 0 || l->k == 0) return QL_OK;
    DeviceScope ds(l->device);
    const int8_t *d = l->w;
    int8_t *tmp = nullptr;
    if (l->bits) {
        QLC_CUDA(fn, "cudaMalloc", cudaMalloc(&tmp, (size_t)(l->n * l->kp)));
        cudaError_t e = cudaMemset(tmp, 0x55, (size_t)(l->n * l->kp)); /* poison: unwritten bytes show */
        if (e == cudaSuccess) e = launch_wxa8_decode(l->pw, codes_permuted(l->k, l->group, l->kp), tmp, l->kp, nullptr);
        if (e == cudaSuccess) e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            cudaFree(tmp);
            return cuda_fail(fn, "the decode kernel", e);
        }
        d = tmp;
    }
    const cudaError_t e = cudaMemcpy2D(out, (size_t)ldo, d, (size_t)l->kp, (size_t)l->k, (size_t)l->n, cudaMemcpyDeviceToHost);
    cudaFree(tmp);
    if (e != cudaSuccess) return cuda_fail(fn, "copying the weight back", e);
    return QL_OK;
}

extern "C" void ql_cuda_linear_dims(const ql_cuda_linear *l, int64_t *k, int64_t *group)
{
    *k = l->k, *group = l->group;
}

extern "C" int ql_cuda_sm90_tile_count(void) { return QLC_SM90_TILES; }

extern "C" ql_status ql_cuda_quantize_rows(ql_cuda_workspace **wsp, int device, void *stream, const void *x,
                                           ql_dtype xdt, int64_t m, int64_t k, int64_t ldx, int64_t group, int8_t *q,
                                           int64_t ldq, float *sx, const ql_epilogue *epi)
{
    const char *fn = "ql_cuda_quantize_rows";
    ql_status st = ql_cuda_check_device(fn, device);
    if (st != QL_OK) return st;
    if ((st = check_device_ptr(fn, "x", x, device)) != QL_OK) return st;
    if ((st = check_device_ptr(fn, "q", q, device)) != QL_OK) return st;
    if ((st = check_device_ptr(fn, "sx", sx, device)) != QL_OK) return st;
    InputAct act;
    if ((st = input_act_of(fn, epi, device, k, &act)) != QL_OK) return st;
    if (act.code == QL_INPUT_ACT_SWIGLU && m > 1 && ldx < 2 * k)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: x row stride %lld is smaller than 2K = %lld (swiglu)", fn,
                       (long long)ldx, (long long)(2 * k));
    if (m == 0) return QL_OK;
    DeviceScope ds(device);
    ql_cuda_workspace *ws;
    if ((st = workspace_on(fn, wsp, device, &ws)) != QL_OK) return st;
    std::lock_guard<std::mutex> guard(ws->lock);
    if (ws->fit_k != k) {
        QLC_CUDA(fn, "preparing the prologue", prepare_quantize_rows(k, &ws->fit));
        ws->fit_k = k;
    }
    if (act.code == QL_INPUT_ACT_RMS_NORM) {
        if ((st = reserve_rms(fn, ws, m, (cudaStream_t)stream)) != QL_OK) return st;
        act.rms = ws->rms;
    }
    act.tab = act_table_for(ws, act.code, xdt, (cudaStream_t)stream);
    QLC_CUDA(fn, "the prologue kernel",
             launch_quantize_rows(x, dtype_code(xdt), ldx, m, k, group, act, q, ldq, sx, 0, prologue_form_from_env(),
                                  ws->fit, (cudaStream_t)stream));
    return QL_OK;
}

extern "C" ql_status ql_cuda_gemm_s8s8s32(int device, void *stream, int64_t m, int64_t n, int64_t k, const int8_t *a,
                                          int64_t lda, const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc)
{
    const char *fn = "ql_gemm_s8s8s32";
    ql_status st = ql_cuda_check_device(fn, device);
    if (st != QL_OK) return st;
    if ((st = check_device_ptr(fn, "a", a, device)) != QL_OK) return st;
    if ((st = check_device_ptr(fn, "b", b, device)) != QL_OK) return st;
    if ((st = check_device_ptr(fn, "c", c, device)) != QL_OK) return st;
    if (m == 0 || n == 0) return QL_OK;
    DeviceScope ds(device);
    int major = 0, sms = 0;
    QLC_CUDA(fn, "cudaDeviceGetAttribute", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    QLC_CUDA(fn, "cudaDeviceGetAttribute", cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    static const char *const gemms[] = {"auto", "sm90", "mma", "gemv"}, *const splits[] = {"auto", "1", "2", "4"};
    const char *tile = getenv("QLINEAR_CUDA_TILE");
    EpiParams p = {};
    p.y = c, p.ldy = ldc, p.ydt = DT_I32;
    p.vec2 = (uintptr_t)c % 8 == 0 && ldc % 2 == 0;
    char name[48];
    QLC_CUDA(fn, "the GEMM kernel",
             run_gemm(env_choice("QLINEAR_CUDA_GEMM", gemms, 4), tile && *tile ? atoi(tile) % QLC_SM90_TILES : -1,
                      (1 << env_choice("QLINEAR_CUDA_SPLIT", splits, 4)) >> 1, major == 9, sms, 0, a, lda, b, ldb, m, n, k, p, (cudaStream_t)stream,
                      false, name, sizeof name, nullptr));
    return QL_OK;
}
