/* qlinear bench --device cuda: the peer of a fused input activation, "the
 * activation as its own op, then the layer". Each op here is one kernel,
 * bf16 in and out, fp32 math, that reads its input once and writes the
 * activated rows once: the least any separate op costs (PyTorch's gelu is one
 * such kernel; eager's swiglu is two, silu then the product), so a fused
 * layer that beats this peer beats PyTorch's op followed by the layer. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "qlinear.h"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float gelu_tanh(float x)
{
    const float beta = 0.7978845608028654f, kappa = 0.044715f; /* sqrt(2/pi), the cubic's factor */
    return 0.5f * x * (1.0f + tanhf(beta * (x + kappa * x * x * x)));
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

/* 8 values a thread through 16-byte accesses (k % 8 == 0), grid-stride. */
__global__ void gelu_tanh_kernel(const uint4 *x, uint4 *y, size_t n8)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = x[i];
        bf16 *h = (bf16 *)&v;
#pragma unroll
        for (int j = 0; j < 8; j++) h[j] = __float2bfloat16_rn(gelu_tanh(__bfloat162float(h[j])));
        y[i] = v;
    }
}

/* x [m, 2k]: gate | up; y [m, k] = round(round(silu(gate)) * up). */
__global__ void swiglu_kernel(const uint4 *x, uint4 *y, size_t n8, size_t k8)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / k8, c = i % k8;
        uint4 g = x[r * 2 * k8 + c];
        const uint4 u = x[r * 2 * k8 + k8 + c];
        bf16 *gh = (bf16 *)&g;
        const bf16 *uh = (const bf16 *)&u;
#pragma unroll
        for (int j = 0; j < 8; j++)
            gh[j] = __float2bfloat16_rn(__bfloat162float(__float2bfloat16_rn(silu(__bfloat162float(gh[j])))) *
                                        __bfloat162float(uh[j]));
        y[i] = g;
    }
}

/* One block a row: the sum of squares, then the row scaled by rsqrt(mean + eps) and w. */
__global__ void rms_norm_kernel(const uint4 *x, const uint4 *w, uint4 *y, int64_t k8, float eps)
{
    const uint4 *row = x + (size_t)blockIdx.x * k8;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < k8; c += blockDim.x) {
        const uint4 v = row[c];
        const bf16 *h = (const bf16 *)&v;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float f = __bfloat162float(h[j]);
            ss = fmaf(f, f, ss);
        }
    }
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    __shared__ float part[32];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (threadIdx.x == 0) part[0] = ss;
    }
    __syncthreads();
    const float r = rsqrtf(part[0] / (float)(k8 * 8) + eps);
    uint4 *out = y + (size_t)blockIdx.x * k8;
    for (int64_t c = threadIdx.x; c < k8; c += blockDim.x) {
        uint4 v = row[c];
        const uint4 wv = w[c];
        bf16 *h = (bf16 *)&v;
        const bf16 *wh = (const bf16 *)&wv;
#pragma unroll
        for (int j = 0; j < 8; j++) h[j] = __float2bfloat16_rn(__bfloat162float(h[j]) * r * __bfloat162float(wh[j]));
        out[c] = v;
    }
}

/* act: a ql_input_act code; x [m, k] bf16 ([m, 2k] for swiglu), y [m, k]
 * bf16, w [k] bf16 (rms_norm), all device pointers, 16-byte aligned,
 * k % 8 == 0. 0 on success, -1 on a bad argument or a launch error. */
extern "C" int ql_bench_act_op(int act, const void *x, void *y, const void *w, int64_t m, int64_t k, float eps, int sms,
                               cudaStream_t s)
{
    if (k % 8 || m < 1) return -1;
    const size_t n8 = (size_t)m * (size_t)k / 8;
    size_t blocks = (n8 + 255) / 256;
    if (blocks > (size_t)sms * 16) blocks = (size_t)sms * 16;
    switch (act) {
    case QL_INPUT_ACT_GELU_TANH: gelu_tanh_kernel<<<(unsigned)blocks, 256, 0, s>>>((const uint4 *)x, (uint4 *)y, n8); break;
    case QL_INPUT_ACT_SWIGLU:
        swiglu_kernel<<<(unsigned)blocks, 256, 0, s>>>((const uint4 *)x, (uint4 *)y, n8, (size_t)k / 8);
        break;
    case QL_INPUT_ACT_RMS_NORM:
        rms_norm_kernel<<<(unsigned)m, 256, 0, s>>>((const uint4 *)x, (const uint4 *)w, (uint4 *)y, k / 8, eps);
        break;
    default: return -1;
    }
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
