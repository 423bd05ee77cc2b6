/* The int8 dot-product peak of this machine, sampled inside `qlinear bench`
 * between the paths it times, so GEMM efficiency is read against the peak of
 * the same minutes (these machines are shared; their speed drifts). A
 * register-only loop of vpdpbusd on 12 independent accumulators per thread:
 * enough chains to cover the instruction's latency on two ports. */
#include "peak.h"

#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* Written in assembly so no compiler can spill or fold the chains. */
#define QL_DP(op, r) op " %%" r "1, %%" r "0, %%" r
#define QL_CHAINS(op, r)                                                                                        \
    QL_DP(op, r) "2\n\t" QL_DP(op, r) "3\n\t" QL_DP(op, r) "4\n\t" QL_DP(op, r) "5\n\t" QL_DP(op, r) "6\n\t"      \
    QL_DP(op, r) "7\n\t" QL_DP(op, r) "8\n\t" QL_DP(op, r) "9\n\t" QL_DP(op, r) "10\n\t" QL_DP(op, r) "11\n\t"    \
    QL_DP(op, r) "12\n\t" QL_DP(op, r) "13\n\t"

__attribute__((target("avx512f,avx512vnni"))) static void loop_zmm(long iters)
{
    __asm__ volatile("vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
                     "vpternlogd $0xff, %%zmm1, %%zmm1, %%zmm1\n\t"
                     "1:\n\t" QL_CHAINS("vpdpbusd", "zmm") QL_CHAINS("vpdpbusd", "zmm")
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     : "+r"(iters)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
                       "xmm12", "xmm13", "cc");
}

__attribute__((target("avx2,avxvnni"))) static void loop_ymm(long iters)
{
    __asm__ volatile("vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
                     "vpcmpeqd %%ymm1, %%ymm1, %%ymm1\n\t"
                     "1:\n\t" QL_CHAINS("%{vex%} vpdpbusd", "ymm")
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     : "+r"(iters)
                     :
                     : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
                       "xmm12", "xmm13", "cc");
}

/* AMX: four independent accumulator tiles (tmm0-3, 16 × 16 int32) fed by
 * tmm4-7 (16 × 64 int8), 16 TDPBSSD per round, no loads: the tile unit's
 * own rate. Operands: zero tiles, or tiles loaded once from a buffer of
 * pseudo-random bytes. The two differ: a multiply array fed zeros draws
 * less power and the core's clock follows it (the lent Xeon: on one core
 * zero operands ran 2.5× the random ones' rate, on 16 cores 1.1-1.3×), so
 * the random-operand rate is the one a GEMM on real data can approach; a
 * short sample can still catch the clock mid-change (a GEMM on one core
 * measured up to 1.09× it). The
 * caller's ISA is amx, so the library has already been given the tile data
 * permission (per process); the configuration is per thread. */
__attribute__((target("amx-tile,amx-int8"))) static void loop_amx(long iters, const void *operands)
{
    _Alignas(64) uint8_t cfg[64] = {1};
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = 64; /* bytes per row */
        cfg[48 + t] = 16;     /* rows */
    }
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
    __asm__ volatile("tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3\n\t"
                     "tilezero %%tmm4\n\ttilezero %%tmm5\n\ttilezero %%tmm6\n\ttilezero %%tmm7" ::: "memory");
    if (operands) {
        const int64_t stride = 64;
        const char *o = operands;
        __asm__ volatile("tileloadd (%0,%1,1), %%tmm4" : : "r"(o), "r"(stride) : "memory");
        __asm__ volatile("tileloadd (%0,%1,1), %%tmm5" : : "r"(o + 1024), "r"(stride) : "memory");
        __asm__ volatile("tileloadd (%0,%1,1), %%tmm6" : : "r"(o + 2048), "r"(stride) : "memory");
        __asm__ volatile("tileloadd (%0,%1,1), %%tmm7" : : "r"(o + 3072), "r"(stride) : "memory");
    }
#define QL_TD(a, b, c) "tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c "\n\t"
#define QL_TD4 QL_TD(4, 6, 0) QL_TD(4, 7, 1) QL_TD(5, 6, 2) QL_TD(5, 7, 3)
    __asm__ volatile("1:\n\t" QL_TD4 QL_TD4 QL_TD4 QL_TD4
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     "tilerelease\n\t"
                     : "+r"(iters)
                     :
                     : "cc", "memory");
#undef QL_TD4
#undef QL_TD
}

double ql_bench_amx_rate_gops(int threads, long iters, int random_operands)
{
    _Alignas(64) static uint8_t operands[4096];
    if (random_operands && !operands[0]) {
        uint32_t x = 2463534242u; /* xorshift32: any bytes with both signs will do */
        for (int i = 0; i < 4096; i++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            operands[i] = (uint8_t)(x >> 24) | 1u;
        }
    }
    /* 16 TDPBSSD per round, each 16·16·64 multiply-adds */
    const double ops = (double)threads * (double)iters * 16.0 * 16384.0 * 2.0;
    double t0 = now_s();
#pragma omp parallel num_threads(threads)
    loop_amx(iters, random_operands ? operands : NULL);
    return ops / (now_s() - t0) / 1e9;
}

double ql_bench_int8_peak_gops(ql_isa isa, int threads, long iters)
{
    if (isa == QL_ISA_AMX) {
        /* the rounds cut so a sample takes about as long as the vpdpbusd one */
        return ql_bench_amx_rate_gops(threads, iters / 16 > 0 ? iters / 16 : 1, 1);
    }
    /* avx512bf16's int8 kernels are avx512vnni's */
    if (isa != QL_ISA_AVX512VNNI && isa != QL_ISA_AVX512BF16 && isa != QL_ISA_AVXVNNI) return 0.0;
    const int zmm = isa != QL_ISA_AVXVNNI;
    /* 24 (zmm) or 12 (ymm) instructions per round, each lanes · 4 products · 2 ops */
    const double ops = (double)threads * (double)iters * (zmm ? 24.0 * 16 : 12.0 * 8) * 8.0;
    double t0 = now_s();
#pragma omp parallel num_threads(threads)
    {
        if (zmm) loop_zmm(iters);
        else loop_ymm(iters);
    }
    return ops / (now_s() - t0) / 1e9;
}

#elif defined(__aarch64__)
/* 16 independent accumulators v0..v15 (SDOT/SMMLA latency 3-4 cycles on up
 * to 4 pipes), sources v16, v17. The instructions are emitted as .inst words
 * (SDOT 0x4e809400, SMMLA 0x4e80a400 | Vm << 16 | Vn << 5 | Vd), so neither
 * compiler nor assembler needs to be told the CPU has them. */
#define QL_A64_1(base, d) ".inst " base " | (17 << 16) | (16 << 5) | " #d "\n\t"
#define QL_A64(base)                                                                                            \
    QL_A64_1(base, 0) QL_A64_1(base, 1) QL_A64_1(base, 2) QL_A64_1(base, 3) QL_A64_1(base, 4) QL_A64_1(base, 5)   \
    QL_A64_1(base, 6) QL_A64_1(base, 7) QL_A64_1(base, 8) QL_A64_1(base, 9) QL_A64_1(base, 10)                    \
    QL_A64_1(base, 11) QL_A64_1(base, 12) QL_A64_1(base, 13) QL_A64_1(base, 14) QL_A64_1(base, 15)
#define QL_A64_LOOP(base)                                                                                       \
    __asm__ volatile("movi v16.16b, #1\n\t"                                                                     \
                     "movi v17.16b, #1\n\t"                                                                     \
                     "1:\n\t" QL_A64(base) "subs %0, %0, #1\n\t"                                               \
                     "b.ne 1b\n\t"                                                                              \
                     : "+r"(iters)                                                                              \
                     :                                                                                          \
                     : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13",  \
                       "v14", "v15", "v16", "v17", "cc")

static void loop_sdot(long iters) { QL_A64_LOOP("0x4e809400"); }
static void loop_smmla(long iters) { QL_A64_LOOP("0x4e80a400"); }

/* AArch64: SDOT (16 MACs) or SMMLA (32 MACs) per instruction; none for
 * plain NEON, whose exact int8 product takes two instructions. */
double ql_bench_int8_peak_gops(ql_isa isa, int threads, long iters)
{
    if (isa != QL_ISA_NEONDOT && isa != QL_ISA_I8MM && isa != QL_ISA_NEONBF16) return 0.0;
    const int mm = isa != QL_ISA_NEONDOT;
    const double ops = (double)threads * (double)iters * 16.0 * (mm ? 32 : 16) * 2.0;
    double t0 = now_s();
#pragma omp parallel num_threads(threads)
    {
        if (mm) loop_smmla(iters);
        else loop_sdot(iters);
    }
    return ops / (now_s() - t0) / 1e9;
}
#else
double ql_bench_int8_peak_gops(ql_isa isa, int threads, long iters)
{
    (void)isa; (void)threads; (void)iters;
    return 0.0;
}
#endif

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_avx2(const char *p, size_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, a);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

#endif

static uint64_t read_scalar(const char *p, size_t n)
{
    uint64_t s = 0, w;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        s ^= w;
    }
    return s;
}

double ql_bench_read_gbs(const void *buf, size_t bytes, int threads)
{
    static volatile uint64_t sink;
#if defined(__x86_64__)
    const int avx2 = __builtin_cpu_supports("avx2");
#endif
    double t0 = 0, t1 = 0;
    /* timed between barriers inside the region: the read alone, without the
     * cost of starting the threads (which the paths do pay) */
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const size_t lo = bytes * (size_t)t / (size_t)n & ~(size_t)127, hi = bytes * (size_t)(t + 1) / (size_t)n & ~(size_t)127;
        const char *p = (const char *)buf + lo;
#pragma omp barrier
#pragma omp master
        t0 = now_s();
#if defined(__x86_64__)
        uint64_t v = avx2 ? read_avx2(p, hi - lo) : read_scalar(p, hi - lo);
#else
        uint64_t v = read_scalar(p, hi - lo);
#endif
        sink ^= v;
#pragma omp barrier
#pragma omp master
        t1 = now_s();
    }
    return (double)(bytes & ~(size_t)127) / (t1 - t0) / 1e9;
}

/* The last-level cache: sysfs's index3 (the L3 of cpu0) when Linux exports
 * it, else CPUID's deterministic cache parameters (leaf 4 on Intel,
 * 0x8000001D on AMD: ways · partitions · line · sets), else 0. */
size_t ql_bench_llc_bytes(const char **source)
{
    if (source) *source = "none";
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f) {
        char buf[64] = "";
        const int got = fgets(buf, sizeof buf, f) != NULL;
        fclose(f);
        char *end = NULL;
        const unsigned long long v = got ? strtoull(buf, &end, 10) : 0;
        if (v > 0) {
            const size_t mult = end && (*end == 'K' || *end == 'k') ? 1024 : end && *end == 'M' ? 1024 * 1024 : 1;
            if (source) *source = "sysfs";
            return (size_t)v * mult;
        }
    }
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    const int amd = b == 0x68747541u; /* "Auth" */
    const unsigned leaf = amd ? 0x8000001Du : 4u;
    if (amd && __get_cpuid_max(0x80000000u, NULL) < leaf) return 0;
    if (!amd && a < 4) return 0;
    size_t best = 0;
    for (unsigned i = 0; i < 16; i++) {
        __cpuid_count(leaf, i, a, b, c, d);
        const unsigned type = a & 31, level = (a >> 5) & 7;
        if (type == 0) break;
        if (type == 2) continue; /* instruction cache */
        const size_t bytes = (size_t)((b >> 22) + 1) * (((b >> 12) & 1023) + 1) * ((b & 4095) + 1) * ((size_t)c + 1);
        if (level >= 2 && bytes > best) best = bytes;
    }
    if (best && source) *source = "cpuid";
    return best;
#else
    return 0;
#endif
}
