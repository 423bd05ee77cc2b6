/* AMX-INT8 micro-kernels (Sapphire Rapids and later). The 32×32 tile is
 * 2×2 accumulator tiles tmm0..tmm3 (16 rows × 16 int32 each), two A tiles
 * tmm4, tmm5 (16 rows × 64 codes) and two B tiles tmm6, tmm7 (16 k-quads ×
 * 16 columns × 4 codes: the VNNI layout); per 64-k block four tile loads and
 * four TDPBSSD (s8 × s8 -> s32, exact).
 *
 * Peak: one TDPBSSD is 16·16·64 = 16384 multiply-adds and a core issues one
 * every 16 cycles, so 1024 int8 MAC/cycle/core (2048 ops/cycle), 8× the two
 * zmm vpdpbusd per cycle of the avx512vnni kernel; the four C tiles are four
 * independent chains, enough to cover TDPBSSD's latency.
 *
 * Layouts (gemm.h), the AVX-512 prologue's, decoder's and LoRA helper's:
 *   A panels [kp/64][R][64]: the R rows of a 64-block are an A tile of row
 *     stride 64 (rows 0-15 at +0, 16-31 at +1024);
 *   B panels [kp/4][32][4] signed, no +128 (TDPBSSD is s8 × s8): a 64-block
 *     is 16 rows of 128 bytes, columns 0-15 at +0 and 16-31 at +64, row
 *     stride 128;
 *   C the driver's tile, row stride 32 int32 (128 bytes).
 * Inside a 64-block A and B hold their k in the same permuted order
 * (ql_k64_element), which the dot products do not see. K is padded with
 * zero codes to a multiple of 64 (k4 a multiple of 16), M and N tails are
 * padding rows and columns of zeros the epilogue does not store.
 *
 * Row variants (small M): r rows configure tmm0, tmm1, tmm4 with min(r, 16)
 * rows and, for r > 16, tmm2, tmm3, tmm5 with r - 16 (unused tiles 0 × 0),
 * so no padded row is loaded or multiplied.
 *
 * Tile configuration (amx.h, shared with the bf16 kernels): the drivers
 * call begin (ql_amx_begin) on each thread before its first tile of a run
 * of tiles, which forgets what the thread had loaded: other code in the
 * thread (oneDNN inside PyTorch, say) may have configured or released the
 * tiles since, which a per-thread "configured" flag kept across runs would
 * not notice (a tile load then faults, #UD, or reads the wrong shape).
 * Inside a run a tile loads its configuration (LDTILECFG) only when it
 * differs from the last one loaded. The tiles stay configured after a run:
 * no TILERELEASE. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu/x86/amx.h"
#include "cpu/x86/x86.h"

#if defined(__x86_64__)

#define QL_R0(R) ((R) < 16 ? (R) : 16)
#define QL_R1(R) ((R) > 16 ? (R) - 16 : 0)
#define QL_CB(R) ((R) > 16 ? 64 : 0)
#define QL_CFG(R)                                                                                                    \
    {1, 0, {0}, {64, 64, QL_CB(R), QL_CB(R), 64, QL_CB(R), 64, 64},                                                 \
     {QL_R0(R), QL_R0(R), QL_R1(R), QL_R1(R), QL_R0(R), QL_R1(R), 16, 16}}
_Alignas(64) const ql_amx_cfg ql_amx_cfgs[33] = {
    {0},         QL_CFG(1),  QL_CFG(2),  QL_CFG(3),  QL_CFG(4),  QL_CFG(5),  QL_CFG(6),  QL_CFG(7),  QL_CFG(8),
    QL_CFG(9),   QL_CFG(10), QL_CFG(11), QL_CFG(12), QL_CFG(13), QL_CFG(14), QL_CFG(15), QL_CFG(16), QL_CFG(17),
    QL_CFG(18),  QL_CFG(19), QL_CFG(20), QL_CFG(21), QL_CFG(22), QL_CFG(23), QL_CFG(24), QL_CFG(25), QL_CFG(26),
    QL_CFG(27),  QL_CFG(28), QL_CFG(29), QL_CFG(30), QL_CFG(31), QL_CFG(32)};
#undef QL_CFG
#undef QL_CB

/* Reading the configuration back (STTILECFG) on every tile instead of
 * trusting ql_amx_cur waits for the tile unit to drain: 10-17 % of the
 * GEMM's time at M = 1024. */
_Thread_local const ql_amx_cfg *ql_amx_cur;

void ql_amx_begin(void) { ql_amx_cur = NULL; }

/* Software prefetch distances, in 64-k blocks ahead, of the B (weight) and
 * A (activation) tiles into L1 (0: none): QLINEAR_AMX_PF=b[,a], a tuning
 * hook read once at load time. */
static int amx_pf_b, amx_pf_a;
__attribute__((constructor)) static void amx_pf_read(void)
{
    const char *v = getenv("QLINEAR_AMX_PF");
    if (v && *v) {
        int b = 0, a = 0;
        if (sscanf(v, "%d,%d", &b, &a) >= 1 && b >= 0 && b <= 64 && a >= 0 && a <= 64) amx_pf_b = b, amx_pf_a = a;
    }
}

static inline __attribute__((always_inline)) void amx_prefetch(const void *p, int lines)
{
    for (int i = 0; i < lines; i++) _mm_prefetch((const char *)p + 64 * i, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void tile_amx(const int R, int64_t k4, const int8_t *a, const uint8_t *b,
                                                           int32_t *c, int accumulate)
{
    ql_amx_use(&ql_amx_cfgs[R]);
    if (accumulate) {
        QL_TLOAD(0, c, 128);
        QL_TLOAD(1, c + 16, 128);
        if (R > 16) {
            QL_TLOAD(2, c + 16 * 32, 128);
            QL_TLOAD(3, c + 16 * 32 + 16, 128);
        }
    } else {
        _tile_zero(0);
        _tile_zero(1);
        if (R > 16) {
            _tile_zero(2);
            _tile_zero(3);
        }
    }
    const int pfb = amx_pf_b, pfa = amx_pf_a;
    for (int64_t q = 0; q < k4; q += 16, a += R * 64, b += 16 * 128) {
        if (pfb) amx_prefetch(b + pfb * 16 * 128, 32);
        if (pfa) amx_prefetch(a + pfa * R * 64, R);
        /* every load of the block before its products: each load waits only
         * for the last product that read its tile (no renaming of tiles) */
        QL_TLOAD(4, a, 64);
        if (R > 16) QL_TLOAD(5, a + 16 * 64, 64);
        QL_TLOAD(6, b, 128);
        QL_TLOAD(7, b + 64, 128);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        if (R > 16) {
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
    }
    QL_TSTORE(0, c, 128);
    QL_TSTORE(1, c + 16, 128);
    if (R > 16) {
        QL_TSTORE(2, c + 16 * 32, 128);
        QL_TSTORE(3, c + 16 * 32 + 16, 128);
    }
}
#undef QL_R0
#undef QL_R1

#else /* 32-bit x86: no tile instructions, and the amx table is never supported (features_x86.c) */

void ql_amx_begin(void) {}

static inline void tile_amx(const int R, int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate)
{
    (void)R, (void)k4, (void)a, (void)b, (void)c, (void)accumulate;
}

#endif

#define QL_AMX(R)                                                                                        \
    static void tile_##R##x32c4_amx(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int acc) \
    {                                                                                                    \
        tile_amx(R, k4, a, b, c, acc);                                                                   \
    }
QL_AMX(1) QL_AMX(2) QL_AMX(3) QL_AMX(4) QL_AMX(5) QL_AMX(6) QL_AMX(7) QL_AMX(8)
QL_AMX(9) QL_AMX(10) QL_AMX(11) QL_AMX(12) QL_AMX(13) QL_AMX(14) QL_AMX(15) QL_AMX(16)
QL_AMX(17) QL_AMX(18) QL_AMX(19) QL_AMX(20) QL_AMX(21) QL_AMX(22) QL_AMX(23) QL_AMX(24)
QL_AMX(25) QL_AMX(26) QL_AMX(27) QL_AMX(28) QL_AMX(29) QL_AMX(30) QL_AMX(31) QL_AMX(32)
#undef QL_AMX

/* a_outer: an activation panel slice (32 rows × KC) stays in L1 while the
 * block's weight micro-panel slices stream from L2, as on avx512vnni */
#define QL_K(R) {QL_ISA_AMX, "s8_gemm_" #R "x32c4__amx", R, 32, 64, false, true, tile_##R##x32c4_amx, 4, 1, NULL, NULL, ql_amx_begin}
const ql_s8_kernel ql_s8_amx[32] = {
    QL_K(1),  QL_K(2),  QL_K(3),  QL_K(4),  QL_K(5),  QL_K(6),  QL_K(7),  QL_K(8),  QL_K(9),  QL_K(10), QL_K(11),
    QL_K(12), QL_K(13), QL_K(14), QL_K(15), QL_K(16), QL_K(17), QL_K(18), QL_K(19), QL_K(20), QL_K(21), QL_K(22),
    QL_K(23), QL_K(24), QL_K(25), QL_K(26), QL_K(27), QL_K(28), QL_K(29), QL_K(30), QL_K(31), QL_K(32)};
#undef QL_K
