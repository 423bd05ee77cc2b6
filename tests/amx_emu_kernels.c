/* The AMX-BF16 kernels of src/cpu/x86/bf16_amx.c, compiled here against an
 * emulated tile unit (for test_amx_emu): the kernels' own code (addresses,
 * strides, configurations, the decode, the K tail, the small-M loop) on any
 * x86-64 CPU with the AVX-512 subset of their decode, the tile instructions
 * replaced by C that follows Intel's SDM: LDTILECFG (all tiles zeroed),
 * TILELOADD / TILESTORED of the configured rows × colsb bytes (the rest of a
 * tile zero), TILEZERO, and TDPBF16PS with its shape checks (a violation
 * aborts, as the #UD would) and the SDM pseudo-code's arithmetic, the one
 * ql_bf16_tdp_32x32c2__generic models. So these kernels must equal that model
 * bit for bit; the real instruction is only held to the float64 bound.
 * Compiled with AVX512-F/BW/VL/DQ and VBMI; test_amx_emu calls it only where
 * the CPU has them. */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#if defined(__x86_64__)

/* amx.h's place: the same configuration bytes (the library's table) and an
 * emulated tile unit behind the same names */
#include "amx_emu.h"
extern const ql_amx_cfg ql_amx_cfgs[33];

static _Thread_local const ql_amx_cfg *emu_cur; /* as the kernels' ql_amx_cur */

void ql_amx_emu_begin(void) { emu_cur = NULL; }
#define ql_amx_begin ql_amx_emu_begin

static inline void ql_amx_use(const ql_amx_cfg *want)
{
    if (emu_cur == want) return;
    emu_configure(want);
    emu_cur = want;
}

/* The SDM's FP32 steps: bf16 operands and fp32 inputs below 2^-126 read as
 * 0, nearest even, results tiny after rounding flushed; NaN: any NaN. */
static float emu_flush(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }
static float emu_round(double d)
{
    if (isnan(d)) return NAN;
    if (fabs(d) < 0x1p-126) {
        const float t = (float)(d * 0x1p100);
        return fabsf(t) < 0x1p-26f ? copysignf(0.0f, (float)d) : copysignf(0x1p-126f, (float)d);
    }
    return (float)d;
}
static float emu_bf16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return emu_flush(ql_bf16_to_fp32(h));
}

static void emu_dpbf16ps(int dst, int a, int b)
{
    emu_check(dst), emu_check(a), emu_check(b);
    const ql_amx_cfg *c = &emu.cfg;
    if (c->rows[dst] != c->rows[a] || c->colsb[a] != 4 * c->rows[b] || c->colsb[dst] != c->colsb[b])
        emu_fail("TDPBF16PS shapes do not match", dst);
    for (int m = 0; m < c->rows[dst]; m++)
        for (int n = 0; n < c->colsb[dst] / 4; n++) {
            float even = 0.0f, odd = 0.0f, acc;
            memcpy(&acc, &emu.t[dst][m][4 * n], 4);
            for (int k = 0; k < c->colsb[a] / 4; k++) {
                const float a0 = emu_bf16(&emu.t[a][m][4 * k]), a1 = emu_bf16(&emu.t[a][m][4 * k + 2]);
                const float b0 = emu_bf16(&emu.t[b][k][4 * n]), b1 = emu_bf16(&emu.t[b][k][4 * n + 2]);
                even = emu_round((double)emu_flush(even) + (double)a0 * b0);
                odd = emu_round((double)emu_flush(odd) + (double)a1 * b1);
            }
            acc = emu_round((double)emu_flush(acc) + (double)emu_round((double)even + (double)odd));
            memcpy(&emu.t[dst][m][4 * n], &acc, 4);
        }
}

#undef _tile_dpbf16ps
#define _tile_dpbf16ps(d, a, b) emu_dpbf16ps(d, a, b)

/* the kernels, under other names beside the library's */
#define ql_bf16_gemm_32x32c2__amx ql_bf16_emu_32x32c2
#define ql_bf16_gemm_32x32c2i8__amx ql_bf16_emu_32x32c2i8
#include "cpu/x86/bf16_amx.c"

long ql_amx_emu_ldtilecfg(void) { return emu_ldtilecfg; }

#endif
