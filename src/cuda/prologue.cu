/* The W8A8 prologue on the GPU: each activation row is read once, rotated
 * group-wise (fast Walsh–Hadamard transform, the reference's butterflies in
 * the reference's order), rounded to its dtype, reduced to its absmax and
 * quantized with the reference's roundings. Output: int8 codes [M, ldq]
 * (zero-padded to ldq, the GEMM's 16-byte row pitch) and fp32 scales [M].
 * Bit-identical to ql_load_row_rotated + ql_quantize_row_f32. */
#include "common.cuh"
#include "async_copy.cuh"
#include "cuda_internal.h"

namespace qlc {
namespace {

constexpr int PRO_THREADS = 128;

/* One radix-4 butterfly, exactly ql_fwht_f32's. */
__device__ __forceinline__ void bfly(float &a, float &b, float &c, float &d)
{
    float t0 = __fadd_rn(a, b), t1 = __fadd_rn(c, d), t2 = __fsub_rn(a, b), t3 = __fsub_rn(c, d);
    a = __fadd_rn(t0, t3);
    b = __fsub_rn(t0, t3);
    c = __fadd_rn(t1, t2);
    d = __fsub_rn(t1, t2);
}

/* 16 consecutive elements of a row as fp32 (16-byte loads where aligned). */
__device__ __forceinline__ void load16(int dt, const char *row, int64_t j, bool vec, float (&v)[16])
{
    if (vec && dt != DT_F32) {
        const uint4 *p = (const uint4 *)(row + j * 2);
        uint4 u[2] = {p[0], p[1]};
        const uint16_t *h = (const uint16_t *)u;
#pragma unroll
        for (int i = 0; i < 16; i++)
            v[i] = dt == DT_BF16 ? __bfloat162float(__ushort_as_bfloat16(h[i])) : __half2float(__ushort_as_half(h[i]));
        return;
    }
    if (vec) {
        const float4 *p = (const float4 *)(row + j * 4);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float4 f = p[i];
            v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < 16; i++) v[i] = load_f(dt, row, j + i);
}

__device__ __forceinline__ float tiny_of(int dt) { return dt == DT_F16 ? 6.103515625e-05f : 1.17549435e-38f; }

/* log4 of the group (0: no rotation). */
__global__ void __launch_bounds__(PRO_THREADS) quantize_rows_kernel(const char *x, int xdt, int64_t ldx_bytes,
                                                                     int64_t k, int log4g, bool vec, int8_t *q,
                                                                     int64_t ldq, float *sx)
{
    extern __shared__ float v[]; /* the row, fp32, rotated in place */
    __shared__ float red_max[PRO_THREADS / 32];
    __shared__ int red_bad[PRO_THREADS / 32];
    const int64_t r = blockIdx.x;
    const char *row = x + r * ldx_bytes;
    const int tid = threadIdx.x;
    const int64_t g = log4g ? (int64_t)1 << (2 * log4g) : 0;
    const float norm = log4g ? ldexpf(1.0f, -log4g) : 1.0f; /* 1/sqrt(G), exact */

    if (g == 256) {
        /* Stages of stride 1 and 4 in registers on 16 consecutive values... */
        for (int64_t c = tid; c < k / 16; c += PRO_THREADS) {
            float e[16];
            load16(xdt, row, c * 16, vec, e);
#pragma unroll
            for (int i = 0; i < 16; i++) e[i] = __fmul_rn(e[i], norm);
#pragma unroll
            for (int i = 0; i < 16; i += 4) bfly(e[i], e[i + 1], e[i + 2], e[i + 3]);
#pragma unroll
            for (int i = 0; i < 4; i++) bfly(e[i], e[i + 4], e[i + 8], e[i + 12]);
            float4 *dst = (float4 *)(v + c * 16);
#pragma unroll
            for (int i = 0; i < 4; i++) dst[i] = make_float4(e[4 * i], e[4 * i + 1], e[4 * i + 2], e[4 * i + 3]);
        }
        __syncthreads();
        /* ...then stride 16 and 64 on the 16 values j = base + i + 16·t. */
        for (int64_t c = tid; c < k / 16; c += PRO_THREADS) {
            float *p = v + (c / 16) * 256 + (c % 16);
            float e[16];
#pragma unroll
            for (int t = 0; t < 16; t++) e[t] = p[16 * t];
#pragma unroll
            for (int i = 0; i < 16; i += 4) bfly(e[i], e[i + 1], e[i + 2], e[i + 3]);
#pragma unroll
            for (int i = 0; i < 4; i++) bfly(e[i], e[i + 4], e[i + 8], e[i + 12]);
#pragma unroll
            for (int t = 0; t < 16; t++) p[16 * t] = e[t];
        }
    } else {
        for (int64_t j = tid; j < k; j += PRO_THREADS) v[j] = __fmul_rn(load_f(xdt, row, j), norm);
        /* Any other group: one butterfly per thread and stage, through shared memory. */
        for (int t = 0; t < log4g; t++) {
            const int64_t s = (int64_t)1 << (2 * t);
            __syncthreads();
            for (int64_t b = tid; b < k / 4; b += PRO_THREADS) {
                int64_t grp = b >> (2 * log4g - 2), idx = b & ((g >> 2) - 1);
                int64_t j = grp * g + (idx >> (2 * t)) * 4 * s + (idx & (s - 1));
                bfly(v[j], v[j + s], v[j + 2 * s], v[j + 3 * s]);
            }
        }
    }
    __syncthreads();

    /* Round to the dtype (the reference rotates in the operand's dtype), absmax. */
    float amax = 0.0f;
    int bad = 0;
    for (int64_t j = tid; j < k; j += PRO_THREADS) {
        float e = round_to(xdt, v[j]);
        v[j] = e;
        float m = fabsf(e);
        if (!(m <= 3.402823466e38f)) bad = 1;
        else amax = fmaxf(amax, m);
    }
    for (int o = 16; o; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if ((tid & 31) == 0) red_max[tid / 32] = amax, red_bad[tid / 32] = bad;
    __syncthreads();
    amax = 0.0f, bad = 0;
#pragma unroll
    for (int w = 0; w < PRO_THREADS / 32; w++) amax = fmaxf(amax, red_max[w]), bad |= red_bad[w];

    int8_t *qrow = q + r * ldq;
    if (bad) {
        for (int64_t j = tid; j < ldq; j += PRO_THREADS) qrow[j] = 0;
        if (tid == 0) sx[r] = __int_as_float(0x7fc00000);
        return;
    }
    float s = __fdiv_rn(amax, 127.0f);
    s = s > 1e-30f ? s : 1e-30f;
    float st = round_to(xdt, s);
    if (st == 0.0f) st = tiny_of(xdt);
    /* bf16: a quotient of two bf16 values is never within 2^-17 of a bf16
     * rounding boundary, so x·RN(1/st) rounds to the same bf16 as x/st (the
     * argument and its adversarial test are the CPU prologue's). */
    const float rcp = __frcp_rn(st);
    for (int64_t j0 = (int64_t)tid * 4; j0 < ldq; j0 += PRO_THREADS * 4) {
        char4 out;
        signed char *o = (signed char *)&out;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int64_t j = j0 + i;
            float c = 0.0f;
            if (j < k) {
                float quo = xdt == DT_BF16 ? __fmul_rn(v[j], rcp) : __fdiv_rn(v[j], st);
                c = fminf(fmaxf(rintf(round_to(xdt, quo)), -128.0f), 127.0f);
            }
            o[i] = (signed char)(int)c;
        }
        *(char4 *)(qrow + j0) = out;
    }
    if (tid == 0) sx[r] = s;
}


/* The fast path for G = 256 (and K <= 8192, K a multiple of 256): each
 * thread owns 16 values and every row's values stay in registers from load
 * to code. A row takes K/16 threads; a block holds whole rows (several when
 * K is short). Stages of stride 1 and 4 run on 16 consecutive values; one
 * exchange through shared memory regroups them so that the thread holds
 * i + 16·t (t = 0..15) of one group, where the stages of stride 16 and 64
 * run; codes go back through shared memory so that each thread stores 16
 * consecutive bytes. */
constexpr int FAST_THREADS = 256;
constexpr int GROUP_PITCH = 256 + 16; /* floats: a padded group, so the regrouping reads hit distinct banks */

/* Grid-stride over blocks of whole rows. On sm_90 one thread streams each
 * block's rows into shared memory with bulk asynchronous copies, the next
 * block's while this one is computed (double buffer, mbarriers): the loads
 * stay in flight without registers or occupancy. Before sm_90 the threads
 * load their 16 values themselves. Rows must be 16-byte aligned (`vec`). */
__global__ void __launch_bounds__(512) quantize_rows_g256_kernel(const char *x, int xdt, int64_t ldx_bytes,
                                                                  int64_t m, int k, int8_t *q, int64_t ldq,
                                                                  float *sx)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ unsigned row_max[FAST_THREADS / 16], row_bad[FAST_THREADS / 16];
    const int esize = xdt == DT_F32 ? 4 : 2;
    const int row_bytes = k * esize;
    const int tpr = k / 16;            /* threads per row */
    const int rows = blockDim.x / tpr; /* rows in a block */
    const int lr = threadIdx.x / tpr, c = threadIdx.x % tpr;
    const int64_t nrb = (m + rows - 1) / rows;
    float *sv = (float *)(smem_raw + 2 * (size_t)rows * row_bytes); /* [rows][k/256][GROUP_PITCH] */
    float *rowv = sv + (size_t)lr * (k / 256) * GROUP_PITCH;
    int8_t *codes = (int8_t *)(sv + (size_t)rows * (k / 256) * GROUP_PITCH) + (size_t)lr * k;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ __align__(8) uint64_t bars[2];
    unsigned char *in = smem_raw; /* [2][rows][row_bytes] */
    /* thread 0: the rows of block `b` into buffer `buf` */
    auto issue = [&](int64_t b, int buf) {
        const int64_t r0 = b * rows;
        const int live_rows = (int)(m - r0 < rows ? m - r0 : rows);
        mbar_expect_tx(&bars[buf], (uint32_t)(live_rows * row_bytes));
        for (int i = 0; i < live_rows; i++)
            bulk_load(in + ((size_t)buf * rows + i) * row_bytes, x + (r0 + i) * ldx_bytes, (uint32_t)row_bytes,
                      &bars[buf]);
    };
    if (threadIdx.x == 0) {
        mbar_init(&bars[0], 1), mbar_init(&bars[1], 1);
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0 && blockIdx.x < nrb) issue(blockIdx.x, 0);
#endif
    int it = 0;
    for (int64_t rb = blockIdx.x; rb < nrb; rb += gridDim.x, it++) {
        const int64_t r = rb * rows + lr;
        const bool live = r < m;
        const int buf = it & 1;
        if (threadIdx.x < rows) row_max[threadIdx.x] = 0u, row_bad[threadIdx.x] = 0u;
        float e[16];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        /* the other buffer was read in the previous round, which ended with a barrier */
        if (threadIdx.x == 0 && rb + gridDim.x < nrb) issue(rb + gridDim.x, buf ^ 1);
        mbar_wait(&bars[buf], (it >> 1) & 1);
        const unsigned char *src_row = in + ((size_t)buf * rows + lr) * row_bytes;
#else
        (void)buf;
        const unsigned char *src_row = (const unsigned char *)(x + (live ? r : 0) * ldx_bytes);
#endif
        if (xdt == DT_F32) {
            const float4 *p = (const float4 *)(src_row + (size_t)c * 64);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 f = p[i];
                e[4 * i] = f.x, e[4 * i + 1] = f.y, e[4 * i + 2] = f.z, e[4 * i + 3] = f.w;
            }
        } else {
            const uint4 *p = (const uint4 *)(src_row + (size_t)c * 32);
            uint4 u[2] = {p[0], p[1]};
            const uint16_t *h = (const uint16_t *)u;
#pragma unroll
            for (int i = 0; i < 16; i++)
                e[i] = xdt == DT_BF16 ? __uint_as_float((uint32_t)h[i] << 16) : __half2float(__ushort_as_half(h[i]));
        }
        if (!live)
#pragma unroll
            for (int i = 0; i < 16; i++) e[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) e[i] = __fmul_rn(e[i], 0.0625f); /* 1/sqrt(256) */
#pragma unroll
        for (int i = 0; i < 16; i += 4) bfly(e[i], e[i + 1], e[i + 2], e[i + 3]);
#pragma unroll
        for (int i = 0; i < 4; i++) bfly(e[i], e[i + 4], e[i + 8], e[i + 12]);
        {
            float4 *dst = (float4 *)(rowv + (c / 16) * GROUP_PITCH + (c % 16) * 16);
#pragma unroll
            for (int i = 0; i < 4; i++) dst[i] = make_float4(e[4 * i], e[4 * i + 1], e[4 * i + 2], e[4 * i + 3]);
        }
        __syncthreads();
        /* now thread c takes i = c % 16 of group c / 16: values i + 16·t */
        const float *src = rowv + (c / 16) * GROUP_PITCH + (c % 16);
#pragma unroll
        for (int t = 0; t < 16; t++) e[t] = src[16 * t];
#pragma unroll
        for (int i = 0; i < 16; i += 4) bfly(e[i], e[i + 1], e[i + 2], e[i + 3]);
#pragma unroll
        for (int i = 0; i < 4; i++) bfly(e[i], e[i + 4], e[i + 8], e[i + 12]);
        float amax = 0.0f;
        unsigned bad = 0;
#pragma unroll
        for (int t = 0; t < 16; t++) {
            if (e[t] != e[t]) bad = 1; /* NaN: tested before the integer rounding */
            e[t] = round_to_nonan(xdt, e[t]);
            float a = fabsf(e[t]);
            if (!(a <= 3.402823466e38f)) bad = 1;
            else amax = fmaxf(amax, a);
        }
        /* non-negative floats order like their bit patterns */
        atomicMax(&row_max[lr], __float_as_uint(amax));
        if (bad) atomicOr(&row_bad[lr], 1u);
        __syncthreads();
        const bool row_bad_now = row_bad[lr] != 0;
        float s = __fdiv_rn(__uint_as_float(row_max[lr]), 127.0f);
        s = s > 1e-30f ? s : 1e-30f;
        float st = round_to(xdt, s);
        if (st == 0.0f) st = tiny_of(xdt);
        const float rcp = __frcp_rn(st);
        int8_t *cg = codes + (c / 16) * 256 + (c % 16);
#pragma unroll
        for (int t = 0; t < 16; t++) {
            /* finite row: |quotient| <= ~128, never NaN */
            float quo = xdt == DT_BF16 ? __fmul_rn(e[t], rcp) : __fdiv_rn(e[t], st);
            cg[16 * t] = row_bad_now ? (int8_t)0 : (int8_t)rint_clamp_s8(round_to_nonan(xdt, quo));
        }
        __syncthreads();
        if (live) {
            *(int4 *)(q + r * ldq + c * 16) = *(const int4 *)(codes + c * 16);
            if (c == 0) sx[r] = row_bad_now ? __int_as_float(0x7fc00000) : s; /* ldq == k: K is a multiple of 256 */
        }
        __syncthreads(); /* row_max, the regrouping buffer and the input buffer are reused */
    }
}

} // namespace

int log4_of(int64_t g)
{
    int p = 0;
    while (g > 1) g /= 4, p++;
    return p;
}

/* The fast kernel's block: whole rows of k/16 threads, up to FAST_THREADS (one row when longer). */
static int fast_rows(int64_t k) { return k / 16 >= FAST_THREADS ? 1 : (int)(FAST_THREADS / (k / 16)); }
static bool fast_ok(int64_t k, int64_t group) { return group == 256 && k % 256 == 0 && k > 0 && k <= 8192; }
static size_t fast_smem(int64_t k, int esize)
{
    if (!fast_ok(k, 256)) return 0;
    const size_t rows = (size_t)fast_rows(k);
    return 2 * rows * (size_t)k * (size_t)esize + rows * (size_t)(k / 256) * GROUP_PITCH * sizeof(float) +
           rows * (size_t)k;
}
static const size_t fast_smem_cap = 200 * 1024;

size_t quantize_rows_smem(int64_t k)
{
    const size_t bytes = (size_t)k * sizeof(float);
    return bytes <= 200u * 1024u ? (bytes ? bytes : 4) : 0;
}

cudaError_t prepare_quantize_rows(int64_t k)
{
    /* Raise each kernel's dynamic shared-memory limit once, to the largest a layer needs. */
    static size_t generic_set = 48 * 1024, fast_set = 48 * 1024;
    const size_t g = quantize_rows_smem(k), f = fast_smem(k, 4);
    cudaError_t e = cudaSuccess;
    if (g > generic_set) {
        e = cudaFuncSetAttribute(quantize_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)g);
        if (e == cudaSuccess) generic_set = g;
    }
    if (e == cudaSuccess && f > fast_set && f <= fast_smem_cap) {
        e = cudaFuncSetAttribute(quantize_rows_g256_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)f);
        if (e == cudaSuccess) fast_set = f;
    }
    return e;
}

cudaError_t launch_quantize_rows(const void *x, int xdt, int64_t ldx, int64_t m, int64_t k, int64_t group,
                                 int8_t *q, int64_t ldq, float *sx, cudaStream_t stream)
{
    const int esize = xdt == DT_F32 ? 4 : 2;
    const bool vec = ((uintptr_t)x % 16 == 0) && ((ldx * esize) % 16 == 0);
    const size_t smem = fast_smem(k, esize);
    if (vec && fast_ok(k, group) && smem <= fast_smem_cap) {
        const int rows = fast_rows(k), threads = rows * (int)(k / 16);
        int64_t blocks = (m + rows - 1) / rows;
        /* as many blocks as stay resident (each streams its next rows while it computes) */
        static int64_t last_k = -1, last_es = -1, resident = 0;
        if (k != last_k || esize != last_es) {
            int dev = 0, sms = 0, per_sm = 0;
            cudaGetDevice(&dev);
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, quantize_rows_g256_kernel, threads, smem);
            resident = (int64_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
            last_k = k, last_es = esize;
        }
        if (blocks > resident) blocks = resident;
        quantize_rows_g256_kernel<<<(unsigned)blocks, (unsigned)threads, smem, stream>>>(
            (const char *)x, xdt, ldx * esize, m, (int)k, q, ldq, sx);
        return cudaGetLastError();
    }
    quantize_rows_kernel<<<(unsigned)m, PRO_THREADS, quantize_rows_smem(k), stream>>>(
        (const char *)x, xdt, ldx * esize, k, log4_of(group), vec, q, ldq, sx);
    return cudaGetLastError();
}

} // namespace qlc
