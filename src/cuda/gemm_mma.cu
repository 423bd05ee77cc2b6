/* The portable int8 GEMMs of the CUDA backend, with the fused epilogue:
 * a tensor-core kernel on mma.sync m16n8k32 (sm_80 and newer; any K, pitch
 * or alignment) and a GEMV-like kernel for a few rows, where the weight
 * stream is the whole cost. */
#include "common.cuh"
#include "cuda_internal.h"
#include "rotate_g256.cuh"

namespace qlc {
namespace {

constexpr int MB = 128, NB = 128, KB = 64; /* block tile; K slice in bytes */
constexpr int PITCH = KB + 16;             /* shared-memory row pitch: no bank conflicts on fragment loads */
constexpr int MMA_THREADS = 256;           /* 8 warps: 2 (M) × 4 (N), each 64 × 32 */

/* 16 bytes of row `r`, columns k0..k0+15, zero outside [0, rows) × [0, k). */
__device__ __forceinline__ uint4 load_chunk(const int8_t *base, int64_t ld, int64_t rows, int64_t k, int64_t r,
                                            int64_t k0, bool vec)
{
    if (r >= rows) return make_uint4(0, 0, 0, 0);
    const int8_t *p = base + r * ld + k0;
    if (vec && k0 + 16 <= k) return *(const uint4 *)p;
    uint4 u;
    int8_t *b = (int8_t *)&u;
#pragma unroll
    for (int i = 0; i < 16; i++) b[i] = k0 + i < k ? p[i] : 0;
    return u;
}

__global__ void __launch_bounds__(MMA_THREADS) s8_gemm_mma_kernel(const int8_t *a, int64_t lda, const int8_t *b,
                                                                   int64_t ldb, int64_t m, int64_t n, int64_t k,
                                                                   bool vec, EpiParams p)
{
    __shared__ __align__(16) int8_t as[MB * PITCH];
    __shared__ __align__(16) int8_t bs[NB * PITCH];
    pdl_trigger(); /* the next layer's prologue may launch (it waits for this grid) */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp / 4, wn = warp % 4; /* warp tile: rows 64·wm.., columns 32·wn.. */
    const int grp = lane / 4, tig = lane % 4;
    const int64_t m0 = (int64_t)blockIdx.y * MB, n0 = (int64_t)blockIdx.x * NB;
    int32_t acc[4][4][4] = {};

    for (int64_t k0 = 0; k0 < k; k0 += KB) {
        /* 128 rows × 64 bytes = 512 chunks of 16 bytes per operand: 2 per thread. */
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int ch = tid + i * MMA_THREADS, r = ch / 4, kc = (ch % 4) * 16;
            *(uint4 *)(as + r * PITCH + kc) = load_chunk(a, lda, m, k, m0 + r, k0 + kc, vec);
            *(uint4 *)(bs + r * PITCH + kc) = load_chunk(b, ldb, n, k, n0 + r, k0 + kc, vec);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KB; kk += 32) {
            uint32_t af[4][4], bf[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int8_t *r0 = as + (wm * 64 + i * 16 + grp) * PITCH + kk + tig * 4;
                af[i][0] = *(const uint32_t *)r0;
                af[i][1] = *(const uint32_t *)(r0 + 8 * PITCH);
                af[i][2] = *(const uint32_t *)(r0 + 16);
                af[i][3] = *(const uint32_t *)(r0 + 8 * PITCH + 16);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int8_t *c0 = bs + (wn * 32 + j * 8 + grp) * PITCH + kk + tig * 4;
                bf[j][0] = *(const uint32_t *)c0;
                bf[j][1] = *(const uint32_t *)(c0 + 16);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) mma_s8(acc[i][j], af[i], bf[j]);
        }
        __syncthreads();
    }
    /* C fragment: c0,c1 at (grp, 2·tig + {0,1}), c2,c3 at (grp + 8, same). */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r0 = m0 + wm * 64 + i * 16 + grp, r1 = r0 + 8;
        /* raw int32 output (the bare GEMM) has no scales */
    const bool scaled = p.ydt != DT_I32;
    const float sx0 = scaled && r0 < m ? p.sx[r0] : 0.f, sx1 = scaled && r1 < m ? p.sx[r1] : 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t col = n0 + wn * 32 + j * 8 + 2 * tig;
            if (col >= n) continue;
            if (r0 < m) epi_store2(p, r0, col, n, acc[i][j][0], acc[i][j][1], sx0);
            if (r1 < m) epi_store2(p, r1, col, n, acc[i][j][2], acc[i][j][3], sx1);
        }
    }
}

constexpr int GEMV_WARPS = 8;

/* The GEMV's end with an unmerged LoRA: l = t_q·U_qᵀ for the warp's column
 * by dp4a, lane i taking word i of the rank (U's fragment order holds a
 * column's 32 bytes of each k32 step together: 4 entries of two words, the
 * second word 16 bytes on), both sums reduced over the warp, lane r storing
 * row r through lora_value and the generic epilogue. */
template <int MR> __device__ __forceinline__ void gemv_lora(int32_t (&acc)[MR], const EpiParams &p, int lane, int64_t col)
{
    int32_t l[MR] = {};
    const uint32_t *uw = (const uint32_t *)(p.luf + (col / 8) * p.lks * 32);
    const int64_t rp = 32 * p.lks;
    for (int i = lane; i < 8 * p.lks; i += 32) {
        const int s = i / 8, t = i % 8 / 2, half = i % 2;
        const uint32_t u = uw[2 * (s * 32 + (col % 8) * 4 + t) + half];
        const int64_t off = 32 * s + 16 * half + 4 * t;
#pragma unroll
        for (int r = 0; r < MR; r++) l[r] = __dp4a(*(const int32_t *)(p.ltq + r * rp + off), (int32_t)u, l[r]);
    }
#pragma unroll
    for (int r = 0; r < MR; r++)
        for (int o = 16; o; o >>= 1) {
            acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], o);
        }
#pragma unroll
    for (int r = 0; r < MR; r++)
        if (lane == r) {
            const float sxw = __fmul_rn(p.sx[r], p.sw[p.sw_per_row ? col : 0]);
            store_one(p, r, col, epi_after(p, lora_value(acc[r], sxw, l[r], p.lst[r], p.lsu[col]), r, col), 0);
        }
}

template <int MR>
__global__ void __launch_bounds__(GEMV_WARPS * 32) s8_gemv_kernel(const int8_t *a, int64_t lda, const int8_t *b,
                                                                   int64_t ldb, int64_t n, int64_t k, int split, EpiParams p)
{
    __shared__ int32_t red[2 * MR * GEMV_WARPS];
    pdl_trigger(); /* the next layer's prologue may launch (it waits for this grid) */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, part = warp % split;
    const int64_t col = (int64_t)blockIdx.x * (GEMV_WARPS / split) + warp / split;
    const bool active = col < n;
    const int8_t *w = b + (active ? col : 0) * ldb;
    /* launched while the prologue still runs: the weight row on its way into L2, then wait for the codes */
    if (active) prefetch_row_l2(w, k, lane, part, split);
    pdl_wait();
    int32_t acc[MR] = {};
    if (active) {
        /* k is a multiple of 16 here (the pitch pads with zeros). */
        rounds4<int64_t>((int64_t)(part * 32 + lane) * 16, k, 32 * 16 * split, [&](int64_t k0) {
            const int4 wv = __ldg((const int4 *)(w + k0));
#pragma unroll
            for (int r = 0; r < MR; r++) {
                const int4 xv = __ldg((const int4 *)(a + r * lda + k0));
                acc[r] = __dp4a(xv.x, wv.x, acc[r]);
                acc[r] = __dp4a(xv.y, wv.y, acc[r]);
                acc[r] = __dp4a(xv.z, wv.z, acc[r]);
                acc[r] = __dp4a(xv.w, wv.w, acc[r]);
            }
        });
    }
    if (!gemv_split_reduce<GEMV_WARPS, MR>(acc, split, red, 0) || !active) return;
    if (p.lks) { /* an unmerged LoRA's term (the rows' t codes ready): see gemv_lora */
        gemv_lora<MR>(acc, p, lane, col);
        return;
    }
    gemv_finish<MR>(acc, p, lane, col);
}

/* The GEMV for one row at G = 256 that quantizes the row itself: each
 * block rotates and quantizes x into shared memory (the prologue kernel's
 * arithmetic, rotate_g256.cuh: the same codes and scale), then its warps run
 * s8_gemv_kernel's loop on it over as many columns as the grid leaves them
 * (one wave of blocks, so each SM rotates the row once or twice), one to
 * four warps a column (gemv_split_columns: a 2048-column layer alone fills
 * half a wave with one warp a column, too few loads in flight). One kernel per layer instead of a prologue kernel and a GEMV:
 * at M = 1 both are latency, not bytes. A half-warp rotates one group; the
 * row's absmax needs every group first, so each rotating half-warp keeps its
 * groups' rounded values in registers (up to HOLD groups: K <= 8192 for
 * 16-bit dtypes, 4096 for fp32) and beyond that rotates them a second time
 * to quantize them. Block 0 also writes the codes and scale to q and sx,
 * where the prologue kernel would have (a later call may reuse them through
 * the prologue cache). With 2..4 rows the same scheme measured slower than
 * the two kernels under CUDA graphs (MEASUREMENTS §29), so it serves M = 1. */
template <int DT>
__global__ void __launch_bounds__(GEMV_ROW_WARPS * 32, 2) s8_gemv_row_g256_kernel(const char *x, int k, const int8_t *b,
                                                                            int64_t n, int split, EpiParams p,
                                                                            int8_t *q, float *sx)
{
    __shared__ __align__(16) int8_t xs[QLC_GEMV_ROW_MAX_K]; /* the row's codes, the prologue's order */
    __shared__ __align__(16) RowScratch<GEMV_ROW_ROT_WARPS> sc;
    __shared__ int32_t red[2 * GEMV_ROW_WARPS];
    pdl_trigger(); /* the next layer's prologue may launch (it waits for this grid) */
    const int lane = threadIdx.x % 32;
    /* the first weight row on its way into L2 while the kernel before finishes */
    const int warp = threadIdx.x / 32;
    const int64_t col0 = (int64_t)blockIdx.x * (GEMV_ROW_WARPS / split) + warp / split;
    if (col0 < n) prefetch_row_l2(b + col0 * k, k, lane, warp % split, split);
    pdl_wait(); /* x is the previous kernel's output; q and sx may still be read by it */
    /* the codes where the prologue kernel stores them (value i + 16·t of a group at 16·i + t); block 0 also
     * into q */
    quantize_row_g256<DT, GEMV_ROW_ROT_WARPS>(x, k, sc, [&](int g, int i, uint4 c) {
        *(uint4 *)(xs + g * 256 + 16 * i) = c;
        if (blockIdx.x == 0) *(uint4 *)(q + g * 256 + 16 * i) = c;
    });
    if (blockIdx.x == 0 && threadIdx.x == 0) *sx = sc.sx;
    EpiParams pp = p;
    pp.sx = &sc.sx; /* the row's scale, NaN for a bad row */
    gemv_split_columns<GEMV_ROW_WARPS>(n, split, pp, red, [&](int64_t col, int part) {
        const int8_t *w = b + col * k;
        int32_t acc = 0;
        rounds4((part * 32 + lane) * 16, k, 32 * 16 * split, [&](int k0) {
            const int4 wv = __ldg((const int4 *)(w + k0)), xv = *(const int4 *)(xs + k0);
            acc = __dp4a(xv.x, wv.x, acc);
            acc = __dp4a(xv.y, wv.y, acc);
            acc = __dp4a(xv.z, wv.z, acc);
            acc = __dp4a(xv.w, wv.w, acc);
        });
        return acc;
    });
}

} // namespace

cudaError_t launch_s8_gemm_mma(const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t m, int64_t n,
                               int64_t k, const EpiParams &p, cudaStream_t stream)
{
    const bool vec = (uintptr_t)a % 16 == 0 && (uintptr_t)b % 16 == 0 && lda % 16 == 0 && ldb % 16 == 0;
    dim3 grid((unsigned)((n + NB - 1) / NB), (unsigned)((m + MB - 1) / MB));
    s8_gemm_mma_kernel<<<grid, MMA_THREADS, 0, stream>>>(a, lda, b, ldb, m, n, k, vec, p);
    return cudaGetLastError();
}

int gemv_split(int64_t n, int64_t k, int bits, int sms, int force)
{
    const int64_t step = bits ? 1024 : 512; /* K one warp's loop covers a round */
    if (force) return force;
    for (int s = 4; s > 1; s /= 2)
        if (k >= 4 * s * step && n * s <= 32 * (int64_t)(sms > 0 ? sms : 1)) return s;
    return 1;
}

cudaError_t launch_s8_gemv(const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t m, int64_t n,
                           int64_t k, int split, const EpiParams &p, cudaStream_t stream, bool pdl)
{
    if (split != 1 && split != 2 && split != 4) return cudaErrorInvalidValue;
    cudaLaunchAttribute attr[1];
    const int64_t cpb = GEMV_WARPS / split;
    cudaLaunchConfig_t cfg =
        launch_config(dim3((unsigned)((n + cpb - 1) / cpb)), dim3(GEMV_WARPS * 32), 0, stream, pdl, attr);
    const int64_t kp = (k + 15) / 16 * 16;
    cudaError_t e = cudaSuccess;
    switch (m) {
#define QLC_GEMV_CASE(R)                                                                                              \
    case R: e = cudaLaunchKernelEx(&cfg, s8_gemv_kernel<R>, a, lda, b, ldb, n, kp, split, p); break;
        QLC_GEMV_CASE(1) QLC_GEMV_CASE(2) QLC_GEMV_CASE(3) QLC_GEMV_CASE(4)
        QLC_GEMV_CASE(5) QLC_GEMV_CASE(6) QLC_GEMV_CASE(7) QLC_GEMV_CASE(8)
#undef QLC_GEMV_CASE
    default: return cudaErrorInvalidValue;
    }
    return e;
}

int64_t gemv_row_blocks(int64_t n, int split, int sms)
{
    const int64_t cpb = GEMV_ROW_WARPS / split, need = (n + cpb - 1) / cpb, wave = 2 * (int64_t)(sms > 0 ? sms : 1);
    return need < wave ? need : wave;
}

namespace {
/* Every block rotates the row (twice where it does not stay in registers): worth it while that is at most
 * ~16384 values per SM, less issue than the prologue kernel's launch and latency it replaces. */
bool row_work_ok(int xdt, int64_t blocks, int64_t k, int sms)
{
    const int hold = xdt == DT_F32 ? row_hold<DT_F32>() : row_hold<DT_BF16>();
    const int64_t passes = k / 256 <= hold * 2 * GEMV_ROW_ROT_WARPS ? 1 : 2;
    return blocks * k * passes <= 16384 * (int64_t)(sms > 0 ? sms : 1);
}
} // namespace

bool gemv_row_g256_ok(int xdt, const void *x, int64_t m, int64_t n, int64_t k, int64_t group, int sms)
{
    if (m != 1 || group != 256 || k <= 0 || k % 256 || k > QLC_GEMV_ROW_MAX_K || (uintptr_t)x % 16) return false;
    return row_work_ok(xdt, gemv_row_blocks(n, 1, sms), k, sms);
}

int gemv_row_split(int xdt, int64_t n, int64_t k, int bits, int sms, int force)
{
    const int64_t step = bits ? 1024 : 512; /* K one warp's loop covers a round */
    const int64_t wave = 2 * (int64_t)(sms > 0 ? sms : 1);
    if (!bits && !force) return 1; /* int8: one warp a column measured as fast (docs/MEASUREMENTS.md §31) */
    for (int s = force ? force : 4; s > 1; s /= 2) {
        const int64_t cpb = GEMV_ROW_WARPS / s;
        if (!force && (k < 4 * s * step || (n + cpb - 1) / cpb > wave)) continue; /* a part too short, or past a wave */
        if (row_work_ok(xdt, gemv_row_blocks(n, s, sms), k, sms)) return s;
    }
    return 1;
}

cudaError_t launch_s8_gemv_row(const void *x, int xdt, int64_t k, const int8_t *b, int64_t n, int split,
                               const EpiParams &p, int8_t *q, float *sx, int sms, cudaStream_t stream, bool pdl)
{
    if (split != 1 && split != 2 && split != 4) return cudaErrorInvalidValue;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg =
        launch_config(dim3((unsigned)gemv_row_blocks(n, split, sms)), dim3(GEMV_ROW_WARPS * 32), 0, stream, pdl, attr);
    const char *xc = (const char *)x;
    const int kk = (int)k;
    if (xdt == DT_BF16) return cudaLaunchKernelEx(&cfg, s8_gemv_row_g256_kernel<DT_BF16>, xc, kk, b, n, split, p, q, sx);
    if (xdt == DT_F16) return cudaLaunchKernelEx(&cfg, s8_gemv_row_g256_kernel<DT_F16>, xc, kk, b, n, split, p, q, sx);
    return cudaLaunchKernelEx(&cfg, s8_gemv_row_g256_kernel<DT_F32>, xc, kk, b, n, split, p, q, sx);
}
} // namespace qlc
