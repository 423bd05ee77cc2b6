/* Unmerged LoRA on CUDA, the CPU's numerics (cpu/lora.h) step for step:
 * t = x_q·D_qᵀ (exact int32, tensor cores, split over K), each row of t
 * requantized to int8 (the same kernel) with σ = max|t|/127 and st = s_x·σ·2^E, then the
 * rank-R product t_q·U_qᵀ (tensor cores) added as fp32(l)·(st·su) to
 * acc·(s_x·s_w) before the first rounding. Where the Hopper GEMM writes
 * bf16, that last step runs inside its epilogue (gemm_sm90.cu,
 * EPI_BF16_LORA); lora_epilogue_kernel here serves the other outputs from
 * the base GEMM's int32 accumulators. */
#include <string.h>

#include "common.cuh"
#include "cuda_internal.h"

namespace qlc {
namespace {

constexpr int DOWN_ROWS = 32, DOWN_KW = 4, DOWN_THREADS = 256;
static_assert(DOWN_THREADS == 8 * DOWN_ROWS, "the requantization: eight threads per row");

/* t's rows rb0 .. rb0 + 31 requantized, eight threads of a 256-thread
 * block per row (8-column pieces, in turn), loads of a pass issued
 * together: amax over the row (columns past rt hold zeros), codes
 * rne(t·127/amax) in double (the CPU's rounding), st as the CPU forms it.
 * t read from L2 (other blocks' atomics, or the GEMM that wrote it), then
 * cleared. */
__device__ __forceinline__ void requant_rows(int32_t *t, int64_t ldt, int64_t m, int rc, int64_t rb0, const float *sx,
                                             double e2, int8_t *tq, float *st)
{
    const int64_t row = rb0 + threadIdx.x / 8;
    const int part = threadIdx.x % 8, rp = 8 * rc;
    int32_t *tr = t + (row < m ? row : 0) * ldt;
    int32_t amax = 0;
    if (row < m)
        for (int c = 8 * part; c < rp; c += 64) {
            const int4 v0 = __ldcg((const int4 *)(tr + c)), v1 = __ldcg((const int4 *)(tr + c) + 1);
            amax = max(amax, max(max(max(abs(v0.x), abs(v0.y)), max(abs(v0.z), abs(v0.w))),
                                 max(max(abs(v1.x), abs(v1.y)), max(abs(v1.z), abs(v1.w)))));
        }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (row < m) {
        const double inv = amax ? 127.0 / (double)amax : 0.0;
        for (int c = 8 * part; c < rp; c += 64) {
            const int4 v0 = __ldcg((const int4 *)(tr + c)), v1 = __ldcg((const int4 *)(tr + c) + 1);
            const int32_t e[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
            uint32_t w[2] = {0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++)
                w[j / 4] |= (uint32_t)(uint8_t)(int8_t)__double2int_rn(__dmul_rn((double)e[j], inv)) << (8 * (j % 4));
            *(uint2 *)(tq + row * rp + c) = make_uint2(w[0], w[1]);
            ((int4 *)(tr + c))[0] = make_int4(0, 0, 0, 0);
            ((int4 *)(tr + c))[1] = make_int4(0, 0, 0, 0);
        }
        if (part == 0)
            st[row] = amax ? (float)__dmul_rn(__dmul_rn((double)sx[row], __ddiv_rn((double)amax, 127.0)), e2) : 0.0f;
    }
}

/* t = x_q·D_qᵀ, then t's codes. A block: 32 rows (two row warps) and
 * every rank column (64 at a time, 8 accumulator blocks) over the K steps
 * [s0, s1), which its four K warps take in turn (steps kw, kw + 4, ..);
 * their sums meet in shared memory. A fragments straight from the codes (kp
 * a multiple of 16: a step's second half is wholly inside or wholly past
 * K), B fragments from D's fragment order (coalesced 256-byte rows, shared
 * by every warp through L1). Where the row blocks alone do not fill the
 * GPU, several blocks share a row block over K, adding into t with integer
 * atomics (exact in any order); the last of them to finish (a counter per
 * row block) requantizes the rows. t and the counters are zeros between
 * calls: the requantizing block clears what it read. One launch in all. */
__global__ void __launch_bounds__(DOWN_THREADS) lora_down_kernel(const int8_t *q, int64_t ldq, const uint2 *df, int64_t m,
                                                                  int rc, int64_t kp, int steps_per_block, int32_t *t,
                                                                  int64_t ldt, int *count, const float *sx, double e2,
                                                                  int8_t *tq, float *st)
{
    __shared__ int32_t red[DOWN_KW][DOWN_ROWS][64 + 4];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rw = warp % 2, kw = warp / 2;
    const int64_t rb0 = (int64_t)blockIdx.x * DOWN_ROWS;
    const int lr0 = rw * 16 + lane / 4, lr1 = lr0 + 8;
    const int64_t r0 = rb0 + lr0, r1 = rb0 + lr1;
    const int steps = (int)((kp + 31) / 32);
    const int s0 = blockIdx.y * steps_per_block, s1 = min(steps, s0 + steps_per_block);
    const bool split = gridDim.y > 1;
    const int8_t *q0 = q + (r0 < m ? r0 : 0) * ldq + 4 * (lane % 4), *q1 = q + (r1 < m ? r1 : 0) * ldq + 4 * (lane % 4);
    for (int c0 = 0; c0 < rc; c0 += 8) {
        int32_t acc[8][4] = {};
#pragma unroll 2
        for (int s = s0 + kw; s < s1; s += DOWN_KW) {
            const bool hi = 32 * s + 16 < kp;
            const uint32_t a[4] = {r0 < m ? *(const uint32_t *)(q0 + 32 * s) : 0u,
                                   r1 < m ? *(const uint32_t *)(q1 + 32 * s) : 0u,
                                   r0 < m && hi ? *(const uint32_t *)(q0 + 32 * s + 16) : 0u,
                                   r1 < m && hi ? *(const uint32_t *)(q1 + 32 * s + 16) : 0u};
            const uint2 *b = df + ((int64_t)s * rc + c0) * 32 + lane;
#pragma unroll
            for (int cc = 0; cc < 8; cc++)
                if (c0 + cc < rc) {
                    const uint2 v = b[32 * cc];
                    const uint32_t bb[2] = {v.x, v.y};
                    mma_s8(acc[cc], a, bb);
                }
        }
#pragma unroll
        for (int cc = 0; cc < 8; cc++) {
            const int col = 8 * cc + 2 * (lane % 4);
            red[kw][lr0][col] = acc[cc][0], red[kw][lr0][col + 1] = acc[cc][1];
            red[kw][lr1][col] = acc[cc][2], red[kw][lr1][col + 1] = acc[cc][3];
        }
        __syncthreads();
        const int cols = min(64, 8 * (rc - c0));
        for (int i = threadIdx.x; i < DOWN_ROWS * 64; i += DOWN_THREADS) {
            const int r = i / 64, c = i % 64;
            const int64_t row = rb0 + r;
            if (row >= m || c >= cols) continue;
            const int32_t v = red[0][r][c] + red[1][r][c] + red[2][r][c] + red[3][r][c];
            int32_t *dst = t + row * ldt + 8 * c0 + c;
            if (split) atomicAdd(dst, v);
            else *dst = v;
        }
        __syncthreads();
    }
    __shared__ int last;
    if (split) {
        __threadfence(); /* this block's sums are in t before it counts itself */
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(&count[blockIdx.x], 1) == (int)gridDim.y - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
    }
    requant_rows(t, ldt, m, rc, rb0, sx, e2, tq, st);
    if (split && threadIdx.x == 0) count[blockIdx.x] = 0;
}

/* t's codes where a GEMM wrote t (launch_lora_requant). */
__global__ void __launch_bounds__(DOWN_THREADS) lora_requant_kernel(int32_t *t, int64_t ldt, int64_t m, int rc,
                                                                   const float *sx, double e2, int8_t *tq, float *st)
{
    requant_rows(t, ldt, m, rc, (int64_t)blockIdx.x * DOWN_ROWS, sx, e2, tq, st);
}

/* The unfused form: 4 warps per 64 × 64 outputs, each warp 16 rows × 8
 * column blocks; the LoRA term from lora_chunk, the base from the int32
 * accumulators, through the generic epilogue (any dtype, residual, bias). */
__global__ void __launch_bounds__(128) lora_epilogue_kernel(const int32_t *acc, int64_t ldacc, int64_t m, int64_t n,
                                                             EpiParams p)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r0 = (int64_t)blockIdx.y * 64 + warp * 16 + lane / 4;
    const int64_t n0 = (int64_t)blockIdx.x * 64;
    if (r0 - lane / 4 >= m) return; /* the warp's rows are all past M */
    LoraRows<4> lr;
    lora_rows(lr, p, m, r0, lane);
    for (int j = 0; j < 8; j++) {
        const int64_t c0 = n0 + 8 * j;
        if (c0 >= n) break;
        int32_t l[4];
        lora_chunk(l, lr, p, m, r0, lora_u_global(p, c0 / 8, lane), lane);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = r0 + 8 * h;
            if (row >= m) continue;
            const float sx = p.sx[row], st = h ? lr.st1 : lr.st0;
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int64_t col = c0 + 2 * (lane % 4) + e;
                if (col >= n) continue;
                const float sxw = __fmul_rn(sx, p.sw[p.sw_per_row ? col : 0]);
                const float v = lora_value(acc[row * ldacc + col], sxw, l[2 * h + e], st, p.lsu[col]);
                store_one(p, row, col, epi_after(p, v, row, col), 0);
            }
        }
    }
}

} // namespace

int64_t lora_row_blocks(int64_t m) { return (m + DOWN_ROWS - 1) / DOWN_ROWS; }

cudaError_t launch_lora_down(const int8_t *q, int64_t ldq, const uint2 *df, int64_t m, int64_t rp, int64_t kp,
                             int32_t *t, int *count, const float *sx, double e2, int8_t *tq, float *st, int sms,
                             cudaStream_t stream)
{
    /* about a block per SM: row blocks, each split over K where there are
     * fewer of them than SMs (every block at least 8 K steps) */
    const int64_t row_blocks = lora_row_blocks(m), steps = (kp + 31) / 32;
    int64_t split = ((int64_t)(sms > 0 ? sms : 132) + row_blocks / 2) / row_blocks;
    const int64_t most = steps / 8 > 1 ? steps / 8 : 1;
    if (split > most) split = most;
    if (split < 1) split = 1;
    const int64_t per = (steps + split - 1) / split;
    split = (steps + per - 1) / per;
    lora_down_kernel<<<dim3((unsigned)row_blocks, (unsigned)split), DOWN_THREADS, 0, stream>>>(
        q, ldq, df, m, (int)(rp / 8), kp, (int)per, t, rp, count, sx, e2, tq, st);
    return cudaGetLastError();
}

cudaError_t launch_lora_requant(int32_t *t, int64_t m, int64_t rp, const float *sx, double e2, int8_t *tq, float *st,
                               cudaStream_t stream)
{
    lora_requant_kernel<<<(unsigned)lora_row_blocks(m), DOWN_THREADS, 0, stream>>>(t, rp, m, (int)(rp / 8), sx, e2, tq, st);
    return cudaGetLastError();
}

cudaError_t launch_lora_epilogue(const int32_t *acc, int64_t ldacc, int64_t m, int64_t n, const EpiParams &p,
                                 cudaStream_t stream)
{
    lora_epilogue_kernel<<<dim3((unsigned)((n + 63) / 64), (unsigned)((m + 63) / 64)), 128, 0, stream>>>(acc, ldacc, m, n,
                                                                                                       p);
    return cudaGetLastError();
}

void lora_frag_order(const int8_t *codes, int64_t ld, int64_t rows, int64_t cols, int64_t rows_pad, bool c_major,
                     uint8_t *out)
{
    const int64_t nc = (rows_pad + 7) / 8, ns = (cols + 31) / 32;
    for (int64_t c = 0; c < nc; c++)
        for (int64_t s = 0; s < ns; s++) {
            uint8_t *blk = out + (c_major ? c * ns + s : s * nc + c) * 256;
            for (int lane = 0; lane < 32; lane++)
                for (int half = 0; half < 2; half++)
                    for (int b = 0; b < 4; b++) {
                        const int64_t r = 8 * c + lane / 4, k = 32 * s + 16 * half + 4 * (lane % 4) + b;
                        blk[lane * 8 + half * 4 + b] = r < rows && k < cols ? (uint8_t)codes[r * ld + k] : 0;
                    }
        }
}

} // namespace qlc
