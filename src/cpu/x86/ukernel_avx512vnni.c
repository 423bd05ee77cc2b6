/* AVX512-VNNI int8 micro-kernel, 12×32 tile: 24 zmm accumulators; per 4-k
 * step two 64-byte weight loads and 12 activation broadcasts (GCC 12 emits
 * one vpbroadcastd load per row, not embedded-broadcast operands of
 * vpdpbusd; the "eb" small tiles below force that form). A holds each row's codes
 * in 64-byte blocks ([k/64][12][64], see gemm.h), so k4 is a multiple of 16. */
#include <immintrin.h>

#include "cpu/x86/x86.h"

static inline __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

static void tile_12x32c4_avx512vnni(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
#define QL_ROW_DECL(r)                                                                     \
    __m512i c##r##0 = accumulate ? _mm512_load_si512((const void *)(c + 32 * (r) + 16 * 0)) : _mm512_setzero_si512(); \
    __m512i c##r##1 = accumulate ? _mm512_load_si512((const void *)(c + 32 * (r) + 16 * 1)) : _mm512_setzero_si512();
    QL_ROW_DECL(0) QL_ROW_DECL(1) QL_ROW_DECL(2) QL_ROW_DECL(3) QL_ROW_DECL(4) QL_ROW_DECL(5)
    QL_ROW_DECL(6) QL_ROW_DECL(7) QL_ROW_DECL(8) QL_ROW_DECL(9) QL_ROW_DECL(10) QL_ROW_DECL(11)
#undef QL_ROW_DECL
    for (int64_t q0 = 0; q0 < k4; q0 += 16, a += 12 * 64) {
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++, b += 128) {
            __m512i b0 = _mm512_load_si512((const void *)b), b1 = _mm512_load_si512((const void *)(b + 64));
            _mm_prefetch((const char *)(b + 1024), _MM_HINT_T0);
#define QL_ROW(r)                                        \
    {                                                    \
        __m512i ar = bcast4(a + 64 * (r) + 4 * u);       \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, b0, ar);  \
        c##r##1 = _mm512_dpbusd_epi32(c##r##1, b1, ar);  \
    }
            QL_ROW(0) QL_ROW(1) QL_ROW(2) QL_ROW(3) QL_ROW(4) QL_ROW(5)
            QL_ROW(6) QL_ROW(7) QL_ROW(8) QL_ROW(9) QL_ROW(10) QL_ROW(11)
#undef QL_ROW
        }
    }
#define QL_STORE(r)                                            \
    _mm512_store_si512((void *)(c + 32 * (r)), c##r##0);      \
    _mm512_store_si512((void *)(c + 32 * (r) + 16), c##r##1);
    QL_STORE(0) QL_STORE(1) QL_STORE(2) QL_STORE(3) QL_STORE(4) QL_STORE(5)
    QL_STORE(6) QL_STORE(7) QL_STORE(8) QL_STORE(9) QL_STORE(10) QL_STORE(11)
#undef QL_STORE
}

const ql_s8_kernel ql_s8_gemm_12x32c4__avx512vnni = {QL_ISA_AVX512VNNI, "s8_gemm_12x32c4__avx512vnni", 12, 32, 64, true, true,
                                                     tile_12x32c4_avx512vnni, 4, 1, NULL, NULL, NULL};

/* Small-M tiles, R×32 for R = 1..11 (ql_s8_kernel_rows): the same loop with
 * R rows. Tiles of up to 3 rows keep two accumulator sets (even and odd k
 * steps, summed at the end: exact integers) so at least four vpdpbusd
 * chains cover its latency while the weights stream past. */
/* The weight stream's software prefetch: 8 KiB ahead into L2. At M = 1 the
 * stream comes from DRAM and one core's hardware prefetch alone keeps too
 * few lines in flight (Zen 4, qwen3-te M = 1 from DRAM: the GEMM 0.75-0.89x
 * oneDNN int8's time on one thread against 1.42-1.65x with 1 KiB into L1;
 * 0.79-0.80x against 1.18x on two); the distance is past the end of the
 * panel for its last 8 KiB, which costs nothing (a prefetch never faults). */
#define QL_SMALL_PF 8192
#define QL_SMALL_HINT _MM_HINT_T1
/* EB (the "eb" variants, chosen per CPU by the table's tuning): each row's
 * activation dword as an embedded-broadcast memory operand of both its
 * vpdpbusd ({1to16}, written in assembly: GCC otherwise loads it once with a
 * separate vpbroadcastd), so the broadcasts ride the load ports. */
static inline __attribute__((always_inline)) __m512i dp_bcast(__m512i acc, __m512i b, const int8_t *p)
{
    __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(*(const int32_t *)p), "v"(b));
    return acc;
}

static inline __attribute__((always_inline)) void tile_rx32(const int R, const int EB, int64_t k4, const int8_t *a,
                                                            const uint8_t *b, int32_t *c, int accumulate)
{
    __m512i acc[12][2], alt[3][2];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        acc[r][0] = accumulate ? _mm512_load_si512((const void *)(c + 32 * r)) : _mm512_setzero_si512();
        acc[r][1] = accumulate ? _mm512_load_si512((const void *)(c + 32 * r + 16)) : _mm512_setzero_si512();
        if (r < 3) alt[r][0] = alt[r][1] = _mm512_setzero_si512();
    }
    for (int64_t q0 = 0; q0 < k4; q0 += 16, a += R * 64) {
#pragma GCC unroll 16
        for (int u = 0; u < 16; u++, b += 128) {
            const __m512i b0 = _mm512_load_si512((const void *)b), b1 = _mm512_load_si512((const void *)(b + 64));
            _mm_prefetch((const char *)(b + QL_SMALL_PF), QL_SMALL_HINT);
#pragma GCC unroll 12
            for (int r = 0; r < R; r++) {
                if (EB) {
                    const int8_t *ap = a + 64 * r + 4 * u;
                    if (R <= 3 && (u & 1)) {
                        alt[r][0] = dp_bcast(alt[r][0], b0, ap);
                        alt[r][1] = dp_bcast(alt[r][1], b1, ap);
                    } else {
                        acc[r][0] = dp_bcast(acc[r][0], b0, ap);
                        acc[r][1] = dp_bcast(acc[r][1], b1, ap);
                    }
                    continue;
                }
                const __m512i ar = bcast4(a + 64 * r + 4 * u);
                if (R <= 3 && (u & 1)) {
                    alt[r][0] = _mm512_dpbusd_epi32(alt[r][0], b0, ar);
                    alt[r][1] = _mm512_dpbusd_epi32(alt[r][1], b1, ar);
                } else {
                    acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], b0, ar);
                    acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], b1, ar);
                }
            }
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        if (R <= 3) {
            acc[r][0] = _mm512_add_epi32(acc[r][0], alt[r][0]);
            acc[r][1] = _mm512_add_epi32(acc[r][1], alt[r][1]);
        }
        _mm512_store_si512((void *)(c + 32 * r), acc[r][0]);
        _mm512_store_si512((void *)(c + 32 * r + 16), acc[r][1]);
    }
}

#define QL_SMALL(R)                                                                                    \
    static void tile_##R##x32c4_avx512vnni(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int acc) \
    {                                                                                                  \
        tile_rx32(R, 0, k4, a, b, c, acc);                                                             \
    }                                                                                                  \
    QL_SMALL_EB(R)
#define QL_SMALL_EB(R)                                                                                 \
    static void tile_##R##x32c4eb_avx512vnni(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int acc) \
    {                                                                                                  \
        tile_rx32(R, 1, k4, a, b, c, acc);                                                             \
    }
QL_SMALL(1) QL_SMALL(2) QL_SMALL(3) QL_SMALL(4) QL_SMALL(5) QL_SMALL(6)
QL_SMALL(7) QL_SMALL(8) QL_SMALL(9) QL_SMALL(10) QL_SMALL(11)
#undef QL_SMALL
#undef QL_SMALL_EB
#define QL_K(R) {QL_ISA_AVX512VNNI, "s8_gemm_" #R "x32c4__avx512vnni", R, 32, 64, true, true, tile_##R##x32c4_avx512vnni, 4, 1, NULL, NULL, NULL}
const ql_s8_kernel ql_s8_small_avx512vnni[11] = {QL_K(1), QL_K(2), QL_K(3), QL_K(4), QL_K(5), QL_K(6),
                                                 QL_K(7), QL_K(8), QL_K(9), QL_K(10), QL_K(11)};
#undef QL_K
#define QL_K(R) {QL_ISA_AVX512VNNI, "s8_gemm_" #R "x32c4eb__avx512vnni", R, 32, 64, true, true, tile_##R##x32c4eb_avx512vnni, 4, 1, NULL, NULL, NULL}
const ql_s8_kernel ql_s8_small_eb_avx512vnni[11] = {QL_K(1), QL_K(2), QL_K(3), QL_K(4), QL_K(5), QL_K(6),
                                                    QL_K(7), QL_K(8), QL_K(9), QL_K(10), QL_K(11)};
#undef QL_K
