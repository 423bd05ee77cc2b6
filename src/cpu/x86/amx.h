/* What the AMX kernels share (ukernel_amx.c: int8, bf16_amx.c: bf16): one
 * tile configuration per thread, loaded through ql_amx_use, and the tile
 * loads and stores with their full memory operands. The configurations of
 * both kernel families are the same bytes (R rows: C tiles tmm0-tmm3 of 16
 * rows × 64 bytes, rows 16.. in tmm2/tmm3; A tiles tmm4/tmm5 of 64 bytes a
 * row; B tiles tmm6/tmm7 of 16 rows × 64 bytes), so a thread that switches
 * between them reloads nothing. Only x86-64 has the tile instructions. */
#ifndef QL_CPU_X86_AMX_H
#define QL_CPU_X86_AMX_H

#include <stdint.h>

#if defined(__x86_64__)

/* LDTILECFG / STTILECFG's 64-byte operand. */
typedef struct ql_amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16]; /* tiles 8-15: 0 */
    uint8_t rows[16];   /* tiles 8-15: 0 */
} ql_amx_cfg;
_Static_assert(sizeof(ql_amx_cfg) == 64, "the tile configuration is 64 bytes");

/* [R]: the configuration of an R-row tile (R = 1..32; [0] unused): tmm0,
 * tmm1, tmm4 with min(R, 16) rows and, for R > 16, tmm2, tmm3, tmm5 with
 * R - 16 (else 0 × 0), so no padded row is loaded or multiplied. */
extern const ql_amx_cfg ql_amx_cfgs[33];

/* The thread's loaded configuration as these kernels know it: NULL after
 * ql_amx_begin (the start of a run of tiles: other code in the thread,
 * oneDNN inside PyTorch say, may have configured or released the tiles
 * since), so the run's first tile loads its own. */
extern _Thread_local const ql_amx_cfg *ql_amx_cur;

/* The configuration instruction and the tile loads and stores with their
 * full memory operands ("memory": GCC 12's _tile_loadd names no memory at
 * all, and its _tile_loadconfig only 8 of the 64 bytes). LDTILECFG zeroes
 * every tile. */
static inline void ql_amx_use(const ql_amx_cfg *want)
{
    if (ql_amx_cur != want) {
        __asm__ volatile("ldtilecfg %0" : : "m"(*want));
        ql_amx_cur = want;
    }
}
#define QL_TLOAD(t, p, stride) \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t : : "r"((const void *)(p)), "r"((int64_t)(stride)) : "memory")
#define QL_TSTORE(t, p, stride) \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" : : "r"((void *)(p)), "r"((int64_t)(stride)) : "memory")

#endif

/* The begin hook of every AMX kernel (ql_s8_kernel.begin, ql_f32_kernel.begin):
 * forgets the thread's configuration (a no-op where there are no tiles). */
void ql_amx_begin(void);

#endif
