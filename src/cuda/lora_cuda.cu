/* Unmerged LoRA on CUDA, the CPU's numerics (cpu/lora.h) step for step:
 * t = x_q·D_qᵀ (exact int32, split over K), each row of t
 * requantized to int8 with σ = max|t|/127 and st = s_x·σ·2^E, then an
 * epilogue kernel that reads the base GEMM's int32 accumulators, forms the
 * rank-R_tot product t_q·U_qᵀ with dp4a and adds fp32(acc2)·(st·su) to
 * acc·(s_x·s_w) before the first rounding. The base GEMM's accumulators make
 * one round trip through memory (8 bytes an output): the fused form (the
 * low-rank product inside the Hopper GEMM's epilogue) is not built. */
#include "common.cuh"
#include "cuda_internal.h"

namespace qlc {
namespace {

/* t += x_q·D_qᵀ over one K slice: 32 rows × 64 columns of t per pass, the
 * slice's codes staged in shared memory, dp4a, integer atomics into t (exact
 * in any order). Split over K so that t, a thin [m, R] matrix, fills the
 * GPU: a row block's whole K on one SM would take as long as the base GEMM. */
constexpr int DR = 32, DC = 64, DKS = 256, DW = DKS / 4;
__global__ void __launch_bounds__(256) lora_down_kernel(const int8_t *q, int64_t ldq, const int8_t *d, int64_t m,
                                                         int64_t rt, int64_t kp, int32_t *t, int64_t ldt)
{
    __shared__ int32_t xs[DR][DW + 1], ds[DC][DW + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t m0 = (int64_t)blockIdx.x * DR, k0 = (int64_t)blockIdx.y * DKS;
    const int words = (int)((kp - k0 < DKS ? kp - k0 : DKS) / 4); /* kp: a multiple of 16 */
    for (int i = threadIdx.x; i < DR * DW; i += 256) {
        const int r = i / DW, w = i % DW;
        xs[r][w] = w < words && m0 + r < m ? *(const int32_t *)(q + (m0 + r) * ldq + k0 + 4 * w) : 0;
    }
    for (int64_t c0 = 0; c0 < rt; c0 += DC) {
        __syncthreads();
        for (int i = threadIdx.x; i < DC * DW; i += 256) {
            const int c = i / DW, w = i % DW;
            ds[c][w] = w < words && c0 + c < rt ? *(const int32_t *)(d + (c0 + c) * kp + k0 + 4 * w) : 0;
        }
        __syncthreads();
        int32_t acc[2][4] = {};
        for (int w = 0; w < words; w++) {
            const int32_t a0 = xs[ty][w], a1 = xs[ty + 16][w];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int32_t b = ds[tx + 16 * j][w];
                acc[0][j] = __dp4a(a0, b, acc[0][j]);
                acc[1][j] = __dp4a(a1, b, acc[1][j]);
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int64_t row = m0 + ty + 16 * i;
            if (row >= m) continue;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int64_t c = c0 + tx + 16 * j;
                if (c < rt) atomicAdd(&t[row * ldt + c], acc[i][j]);
            }
        }
    }
}

/* A warp per row: amax over the rt values of t, codes rne(t·127/amax) in
 * double (the CPU's rounding), zeros up to rp; st[row] as the CPU forms it. */
__global__ void lora_t_kernel(const int32_t *t, int64_t ldt, int64_t m, int64_t rt, int64_t rp, const float *sx,
                              double e2, int8_t *tq, float *st)
{
    const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= m) return;
    const int32_t *tr = t + row * ldt;
    int32_t amax = 0;
    for (int64_t c = lane; c < rt; c += 32) amax = max(amax, abs(tr[c]));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const double inv = amax ? 127.0 / (double)amax : 0.0;
    for (int64_t c = lane; c < rp; c += 32)
        tq[row * rp + c] = c < rt ? (int8_t)__double2int_rn(__dmul_rn((double)tr[c], inv)) : (int8_t)0;
    if (lane == 0)
        st[row] = amax ? (float)__dmul_rn(__dmul_rn((double)sx[row], __ddiv_rn((double)amax, 127.0)), e2) : 0.0f;
}

/* 64 × 64 outputs per block of 256 threads; thread (ty, tx) owns rows
 * ty + 16i and columns tx + 16j (coalesced reads of acc, writes of y); the
 * T and U codes pass through shared memory 64 bytes of R at a time. */
constexpr int LT = 64, LC = 64, LW = LC / 4;
__global__ void __launch_bounds__(256) lora_epilogue_kernel(const int32_t *acc, int64_t ldacc, const int8_t *tq,
                                                             const float *st, const int8_t *uq, const float *su,
                                                             int64_t m, int64_t n, int64_t rp, EpiParams p)
{
    __shared__ int32_t ts[LT][LW + 1], us[LT][LW + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t m0 = (int64_t)blockIdx.y * LT, n0 = (int64_t)blockIdx.x * LT;
    int32_t l[4][4] = {};
    for (int64_t r0 = 0; r0 < rp; r0 += LC) {
        const int words = (int)((rp - r0 < LC ? rp - r0 : LC) / 4); /* rp is a multiple of 16 */
        __syncthreads();
        for (int i = threadIdx.x; i < LT * LW; i += 256) {
            const int rr = i / LW, w = i % LW;
            const bool in = w < words;
            ts[rr][w] = in && m0 + rr < m ? *(const int32_t *)(tq + (m0 + rr) * rp + r0 + 4 * w) : 0;
            us[rr][w] = in && n0 + rr < n ? *(const int32_t *)(uq + (n0 + rr) * rp + r0 + 4 * w) : 0;
        }
        __syncthreads();
        for (int w = 0; w < words; w++) {
            int32_t a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = ts[ty + 16 * i][w], b[i] = us[tx + 16 * i][w];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) l[i][j] = __dp4a(a[i], b[j], l[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t row = m0 + ty + 16 * i;
        if (row >= m) continue;
        const float sx = p.sx[row], sr = st[row];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t col = n0 + tx + 16 * j;
            if (col >= n) continue;
            const float sxw = __fmul_rn(sx, p.sw[p.sw_per_row ? col : 0]);
            const float v = __fadd_rn(__fmul_rn(__int2float_rn(acc[row * ldacc + col]), sxw),
                                      __fmul_rn(__int2float_rn(l[i][j]), __fmul_rn(sr, su[col])));
            store_one(p, row, col, epi_after(p, v, row, col), 0);
        }
    }
}

} // namespace

cudaError_t launch_lora_down(const int8_t *q, int64_t ldq, const int8_t *d, int64_t m, int64_t rt, int64_t kp, int32_t *t,
                             int64_t ldt, cudaStream_t stream)
{
    cudaError_t e = cudaMemsetAsync(t, 0, (size_t)(m * ldt) * sizeof(int32_t), stream);
    if (e != cudaSuccess) return e;
    lora_down_kernel<<<dim3((unsigned)((m + DR - 1) / DR), (unsigned)((kp + DKS - 1) / DKS)), 256, 0, stream>>>(
        q, ldq, d, m, rt, kp, t, ldt);
    return cudaGetLastError();
}

cudaError_t launch_lora_t(const int32_t *t, int64_t ldt, int64_t m, int64_t rt, int64_t rp, const float *sx, double e2,
                          int8_t *tq, float *st, cudaStream_t stream)
{
    lora_t_kernel<<<(unsigned)((m + 7) / 8), 256, 0, stream>>>(t, ldt, m, rt, rp, sx, e2, tq, st);
    return cudaGetLastError();
}

cudaError_t launch_lora_epilogue(const int32_t *acc, int64_t ldacc, const int8_t *tq, const float *st, const int8_t *uq,
                                 const float *su, int64_t m, int64_t n, int64_t rp, const EpiParams &p,
                                 cudaStream_t stream)
{
    lora_epilogue_kernel<<<dim3((unsigned)((n + LT - 1) / LT), (unsigned)((m + LT - 1) / LT)), 256, 0, stream>>>(
        acc, ldacc, tq, st, uq, su, m, n, rp, p);
    return cudaGetLastError();
}

} // namespace qlc
