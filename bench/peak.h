#ifndef QL_BENCH_PEAK_H
#define QL_BENCH_PEAK_H

#include "qlinear.h"

/* GOP/s of `threads` threads each issuing `iters` rounds of 24 (12 for ymm)
 * int8 dot-product instructions of the ISA (zmm vpdpbusd for avx512vnni and avx512bf16, TDPBSSD for amx, ymm
 * for avxvnni; 16 SDOT or SMMLA for neondot / i8mm); 0 for ISAs without one. */
double ql_bench_int8_peak_gops(ql_isa isa, int threads, long iters);

/* x86-64 with AMX only: GOP/s of `threads` threads each issuing `iters`
 * rounds of 16 TDPBSSD from registers, on zero tiles or on tiles of
 * pseudo-random bytes (random_operands; the peak above uses those). */
double ql_bench_amx_rate_gops(int threads, long iters, int random_operands);

/* GB/s of `threads` threads reading `bytes` of buf once (each thread a
 * contiguous share, as the small-M GEMM splits the weight): a STREAM-like
 * read loop, sampled in the same rounds as the paths it is compared with. */
double ql_bench_read_gbs(const void *buf, size_t bytes, int threads);

/* Bytes of the last-level cache (sysfs, else CPUID; 0 if neither says);
 * *source (if not NULL) gets "sysfs", "cpuid" or "none". */
#include <stddef.h>
size_t ql_bench_llc_bytes(const char **source);

#endif
