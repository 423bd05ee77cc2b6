/* An emulated AMX tile unit for the kernels' own code (amx_emu_kernels.c:
 * AMX-BF16, amx_emu_s8.c: AMX-INT8), in place of src/cpu/x86/amx.h: the
 * configuration type, the thread's tiles, and LDTILECFG / TILELOADD /
 * TILESTORED / TILEZERO as Intel's SDM describes them (LDTILECFG zeroes
 * every tile; loads and stores move the configured rows × colsb bytes, the
 * rest of a loaded tile is zero); a use the real instruction would fault on
 * aborts. The includer defines ql_amx_use on top of emu_configure (which
 * tracks the configuration its kernels believe loaded differs per file) and
 * the multiply it emulates. */
#ifndef QL_TESTS_AMX_EMU_H
#define QL_TESTS_AMX_EMU_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QL_CPU_X86_AMX_H 1
typedef struct ql_amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} ql_amx_cfg;

static _Thread_local struct {
    ql_amx_cfg cfg;
    int configured;
    uint8_t t[8][16][64];
} emu;
static _Thread_local long emu_ldtilecfg;

static void emu_fail(const char *what, int t)
{
    fprintf(stderr, "amx_emu: %s (tmm%d): the real instruction would fault\n", what, t);
    abort();
}

static void emu_configure(const ql_amx_cfg *want)
{
    emu.cfg = *want;
    emu.configured = 1;
    memset(emu.t, 0, sizeof emu.t);
    emu_ldtilecfg++;
}

static void emu_check(int t)
{
    if (!emu.configured || emu.cfg.palette != 1) emu_fail("tiles not configured", t);
    if (emu.cfg.rows[t] == 0 || emu.cfg.colsb[t] == 0 || emu.cfg.rows[t] > 16 || emu.cfg.colsb[t] > 64)
        emu_fail("an unconfigured or invalid tile", t);
}

static void emu_load(int t, const void *p, int64_t stride)
{
    emu_check(t);
    memset(emu.t[t], 0, sizeof emu.t[t]);
    for (int r = 0; r < emu.cfg.rows[t]; r++) memcpy(emu.t[t][r], (const char *)p + r * stride, emu.cfg.colsb[t]);
}

static void emu_store(int t, void *p, int64_t stride)
{
    emu_check(t);
    for (int r = 0; r < emu.cfg.rows[t]; r++) memcpy((char *)p + r * stride, emu.t[t][r], emu.cfg.colsb[t]);
}

static void emu_zero(int t)
{
    emu_check(t);
    memset(emu.t[t], 0, sizeof emu.t[t]);
}

#undef _tile_zero
#define _tile_zero(t) emu_zero(t)
#define QL_TLOAD(t, p, stride) emu_load(t, p, stride)
#define QL_TSTORE(t, p, stride) emu_store(t, p, stride)

#endif
