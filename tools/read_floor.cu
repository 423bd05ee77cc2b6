/* qlinear bench --device cuda: the floor of a layer at small M, one kernel
 * that reads a weight's bytes once and does nothing else (16-byte loads,
 * four in flight a thread). A one-kernel layer that must read those bytes
 * costs at least this much: the launch, the DRAM latency and the bytes. */
#include <cuda_runtime.h>
#include <stdint.h>

__global__ void read_bytes_kernel(const uint4 *p, size_t n16, unsigned *sink)
{
    const size_t st = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t x = 0;
    for (; i + 3 * st < n16; i += 4 * st) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + st), c = __ldg(p + i + 2 * st), d = __ldg(p + i + 3 * st);
        x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += st) {
        const uint4 a = __ldg(p + i);
        x ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (x == 0x9e3779b9u) *sink = x; /* keeps the loads */
}

/* bytes rounded down to 16; p 16-byte aligned. */
extern "C" int ql_bench_read_bytes(const void *p, size_t bytes, unsigned *sink, int sms, cudaStream_t s)
{
    const size_t n16 = bytes / 16, per_block = 256 * 4;
    size_t blocks = (n16 + per_block - 1) / per_block;
    if (blocks > (size_t)sms * 8) blocks = (size_t)sms * 8;
    if (blocks == 0) blocks = 1;
    read_bytes_kernel<<<(unsigned)blocks, 256, 0, s>>>((const uint4 *)p, n16, sink);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
