/* The AMX-INT8 kernels of src/cpu/x86/ukernel_amx.c, compiled here against
 * an emulated tile unit (for test_amx_emu), as amx_emu_kernels.c does for the
 * AMX-BF16 ones: the kernels' own code (tile configurations of 1..32 rows,
 * addresses, strides, the K loop, the accumulation across K slices through C
 * tile loads) on any x86-64 CPU, the tile instructions replaced by C that
 * follows Intel's SDM: LDTILECFG (all tiles zeroed), TILELOADD / TILESTORED
 * of the configured rows × colsb bytes, TILEZERO, and TDPBSSD (signed bytes,
 * four products a dword, int32 sums that wrap) with its shape checks (a
 * violation aborts, as the #UD would). Exact arithmetic, so the kernels must
 * give the exact integer sums. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

#if defined(__x86_64__)

/* amx.h's place (an emulated tile unit), the kernel file's globals under
 * names of their own beside the library's */
#include "amx_emu.h"
#define ql_amx_cfgs ql_amx_emu8_cfgs
#define ql_amx_cur ql_amx_emu8_cur
#define ql_amx_begin ql_amx_emu8_begin
#define ql_s8_amx ql_s8_amx_emu
extern const ql_amx_cfg ql_amx_cfgs[33];
extern _Thread_local const ql_amx_cfg *ql_amx_cur;
void ql_amx_begin(void);

static inline void ql_amx_use(const ql_amx_cfg *want)
{
    if (ql_amx_cur == want) return;
    emu_configure(want);
    ql_amx_cur = want;
}

static void emu_dpbssd(int dst, int a, int b)
{
    emu_check(dst), emu_check(a), emu_check(b);
    const ql_amx_cfg *c = &emu.cfg;
    if (c->rows[dst] != c->rows[a] || c->colsb[a] != 4 * c->rows[b] || c->colsb[dst] != c->colsb[b])
        emu_fail("TDPBSSD shapes do not match", dst);
    for (int m = 0; m < c->rows[dst]; m++)
        for (int n = 0; n < c->colsb[dst] / 4; n++) {
            int32_t acc;
            memcpy(&acc, &emu.t[dst][m][4 * n], 4);
            uint32_t sum = (uint32_t)acc; /* the SDM's dword adds wrap */
            for (int k = 0; k < c->colsb[a] / 4; k++)
                for (int i = 0; i < 4; i++)
                    sum += (uint32_t)((int32_t)(int8_t)emu.t[a][m][4 * k + i] * (int32_t)(int8_t)emu.t[b][k][4 * n + i]);
            acc = (int32_t)sum;
            memcpy(&emu.t[dst][m][4 * n], &acc, 4);
        }
}

#undef _tile_dpbssd
#define _tile_dpbssd(d, a, b) emu_dpbssd(d, a, b)

#include "cpu/x86/ukernel_amx.c"

long ql_amx_emu8_ldtilecfg(void) { return emu_ldtilecfg; }

#endif
