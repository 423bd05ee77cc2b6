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

/* t = x_q·D_qᵀ, then t's codes: 4 warps, each 16 rows and every rank
 * column (64 at a time, 8 accumulator blocks), over the K steps
 * [s0, s1); A fragments read straight from the codes (kp a multiple of 16:
 * a step's second half is wholly inside or wholly past K), B fragments from
 * D's fragment order (coalesced 256-byte rows, shared by every warp
 * through L1). Where the rows alone do not fill the GPU, several blocks
 * share a row block over K, adding into t with integer atomics (exact in
 * any order); the last of them to finish (a counter per row block)
 * requantizes the block's rows. t and the counters are all zeros between
 * calls: the requantizing block clears what it read. One launch in all. */
constexpr int DOWN_ROWS = 64;
__global__ void __launch_bounds__(128) lora_down_kernel(const int8_t *q, int64_t ldq, const uint2 *df, int64_t m,
                                                         int rc, int64_t kp, int steps_per_block, int32_t *t,
                                                         int64_t ldt, int *count, const float *sx, double e2, int8_t *tq,
                                                         float *st)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64_t r0 = (int64_t)blockIdx.x * DOWN_ROWS + warp * 16 + lane / 4, r1 = r0 + 8;
    const int steps = (int)((kp + 31) / 32);
    const int s0 = blockIdx.y * steps_per_block, s1 = min(steps, s0 + steps_per_block);
    const bool split = gridDim.y > 1;
    const int8_t *q0 = q + (r0 < m ? r0 : 0) * ldq + 4 * (lane % 4), *q1 = q + (r1 < m ? r1 : 0) * ldq + 4 * (lane % 4);
    for (int c0 = 0; c0 < rc; c0 += 8) {
        int32_t acc[8][4] = {};
        for (int s = s0; s < s1; s++) {
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
            if (c0 + cc >= rc) continue;
            const int64_t col = 8 * (c0 + cc) + 2 * (lane % 4);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t r = h ? r1 : r0;
                if (r >= m) continue;
                int32_t *dst = t + r * ldt + col;
                if (split) atomicAdd(dst, acc[cc][2 * h]), atomicAdd(dst + 1, acc[cc][2 * h + 1]);
                else *(int2 *)dst = make_int2(acc[cc][2 * h], acc[cc][2 * h + 1]);
            }
        }
    }
    __shared__ int last;
    if (split) {
        __threadfence(); /* this block's sums are in t before it counts itself */
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(&count[blockIdx.x], 1) == (int)gridDim.y - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
    } else __syncthreads();
    /* the requantization, two threads per row (rank columns in 32-column
     * pieces, alternating), loads of a pass issued together: amax over the
     * rt values, codes rne(t·127/amax) in double (the CPU's rounding),
     * zeros up to 8·rc; st as the CPU forms it. t read from L2 (the other
     * blocks' atomics), then cleared. */
    {
        const int64_t row = (int64_t)blockIdx.x * DOWN_ROWS + threadIdx.x / 2;
        const int half = threadIdx.x % 2, rp = 8 * rc;
        int32_t *tr = t + (row < m ? row : 0) * ldt;
        int32_t amax = 0;
        if (row < m)
            for (int c0 = 32 * half; c0 < rp; c0 += 64) {
                int4 v[8];
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = __ldcg((const int4 *)(tr + c0) + i);
#pragma unroll
                for (int i = 0; i < 8; i++) /* columns past rt hold zeros */
                    amax = max(amax, max(max(abs(v[i].x), abs(v[i].y)), max(abs(v[i].z), abs(v[i].w))));
            }
        amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        if (row < m) {
            const double inv = amax ? 127.0 / (double)amax : 0.0;
            for (int c0 = 32 * half; c0 < rp; c0 += 64) {
                int4 v[8];
#pragma unroll
                for (int i = 0; i < 8; i++) v[i] = __ldcg((const int4 *)(tr + c0) + i);
                uint32_t w[8];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const int32_t e[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
                    uint32_t packed = 0;
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        packed |= (uint32_t)(uint8_t)(int8_t)__double2int_rn(__dmul_rn((double)e[j], inv)) << (8 * j);
                    w[i] = packed;
                    ((int4 *)(tr + c0))[i] = make_int4(0, 0, 0, 0);
                }
                uint4 *dst = (uint4 *)(tq + row * rp + c0);
                dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
                dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
            }
            if (half == 0)
                st[row] = amax ? (float)__dmul_rn(__dmul_rn((double)sx[row], __ddiv_rn((double)amax, 127.0)), e2) : 0.0f;
        }
    }
    if (split && threadIdx.x == 0) count[blockIdx.x] = 0;
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
        lora_chunk(l, lr, p, m, r0, c0 / 8, lane);
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

cudaError_t launch_lora_down(const int8_t *q, int64_t ldq, const uint2 *df, int64_t m, int64_t rt, int64_t rp, int64_t kp,
                             int32_t *t, int *count, const float *sx, double e2, int8_t *tq, float *st, int sms,
                             cudaStream_t stream)
{
    /* enough blocks for two per SM, each at least 2 K steps (64 bytes: a
     * few rows' t reads D, R·K bytes, from many SMs at once) */
    const int64_t row_blocks = lora_row_blocks(m), steps = (kp + 31) / 32;
    int64_t split = (2 * (int64_t)(sms > 0 ? sms : 132) + row_blocks - 1) / row_blocks;
    const int64_t most = steps / 2 > 1 ? steps / 2 : 1;
    if (split > most) split = most;
    const int64_t per = (steps + split - 1) / split;
    split = (steps + per - 1) / per;
    lora_down_kernel<<<dim3((unsigned)row_blocks, (unsigned)split), 128, 0, stream>>>(
        q, ldq, df, m, (int)(rp / 8), kp, (int)per, t, rp, count, sx, e2, tq, st);
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
