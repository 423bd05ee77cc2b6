/* The packed int8 GEMM: BLIS-style driver around tiny per-ISA micro-kernels.
 *
 * Packed layouts (kp = K rounded up to the kernel's block kb, k4 = kp / 4):
 *   A (activations): panels of MR rows; panel p holds rows p·MR .. p·MR+MR-1
 *     as [kp/kb][MR][kb] int8: each row's codes in blocks of kb (64 for the
 *     AVX-512 kernel, 32 for the AVX2 ones, whose prologues emit that many
 *     codes per store; 4 for the generic kernel). Padding rows and columns
 *     are 0.
 *   Inside a 64- (32-) block, position p holds the code of k =
 *     ql_k64_element(p) (ql_k32_element(p)): the order in which the
 *     prologue's pack instructions emit codes. B uses the same order, so the
 *     dot products are unchanged.
 *   kb = 8 (the SMMLA kernel): A as [kp/8][MR][8] and B as [kp/8][NR][8]
 *     (kg = 8), each row's (column's) codes in natural k order, 8 at a time.
 *   B (weights): panels of NR columns as [k4][NR][4] bytes (kg = 4; the int16
 *     kernels use [k/2][NR][2], kg = 2); int8 codes, or
 *     codes + 128 as uint8 for the VNNI kernels (vpdpbusd multiplies u8 by s8),
 *     whose result then exceeds the true product by 128·Σ_k a[m,k]; the
 *     epilogue subtracts that row correction (computed in the prologue).
 *     The AMX kernels (tdpbssd: s8 × s8) take the plain codes, and read a
 *     64-block of [k4][32][4] as two B tiles of row stride 128 and a
 *     64-block of A ([R][64]) as A tiles of row stride 64.
 * Micro-kernels compute one MR×NR int32 tile over a block of K (KC); partial
 * sums wait in a per-thread buffer until the last K block, whose tiles the
 * tile epilogue consumes at once, while they are hot in L1. */
#ifndef QL_GEMM_H
#define QL_GEMM_H

#include "core/core.h"

/* c (row stride nr) receives the tile; with accumulate set it also holds the
 * partial sums of earlier K blocks, which the kernel adds to. */
typedef void (*ql_s8_tile_fn)(int64_t k4, const int8_t *a, const uint8_t *b, int32_t *c, int accumulate);

/* The largest MR×NR tile of any kernel (AMX: 32×32), for the drivers'
 * per-tile stack buffers. */
#define QL_S8_TILE_MAX (32 * 32)

typedef struct ql_s8_kernel {
    ql_isa isa;
    const char *name; /* e.g. "s8_gemm_12x32c4__avx512vnni" */
    int mr, nr;
    int kb;           /* A's K block: 4, 32 or 64 (see the layouts above) */
    bool b_offset128; /* B stored as code + 128 (u8) */
    bool a_outer;     /* the driver keeps an activation panel slice in L1 while the
                       * weight micro-panels pass (else the reverse): measured per kernel */
    ql_s8_tile_fn tile;
    /* Kernels on int16 operands (AVX2 without VNNI): B panels hold k in
     * pairs ([k/2][NR][2] bytes, kg = 2; else kg = 4), A holds int16 codes
     * (aes = 2 bytes per code, same positions), and the blocked driver widens
     * each B slice once per block into a per-thread buffer for tile_b16
     * (tile reads int8 B and widens it in registers: the small-M path). */
    int kg, aes;
    ql_s8_tile_fn tile_b16;
    void (*widen)(const int8_t *src, int16_t *dst, int64_t n); /* n a multiple of 32 */
    /* Kernels with per-thread state (AMX: the tile configuration) have
     * begin (else NULL): a thread calls it before its first tile of a run of
     * tiles (ql_s8_begin), since code between runs (oneDNN inside PyTorch,
     * say) may have changed that state; inside a run the tile calls trust it. */
    void (*begin)(void);
} ql_s8_kernel;

static inline void ql_s8_begin(const ql_s8_kernel *kern)
{
    if (kern->begin) kern->begin();
}

struct ql_cpu_kernels;
/* The r-row variant of a table's kernel for small M (the same B packing:
 * nr, kb, kg), r clamped to 1..s8_rows_max. */
const ql_s8_kernel *ql_s8_kernel_rows(const struct ql_cpu_kernels *kt, int rows);

typedef struct ql_packed_b {
    int64_t n, k, k4, panels;
    int nr;
    bool offset128;
    uint8_t *data; /* panels · k4 · nr · 4 bytes, 64-byte aligned */
    /* Weights decoded inside the GEMM (W4A8/W6A8): data is NULL, and before
     * the tiles of a block's K slice run, decode(src, jp0, jp1, pc, kc, dst)
     * writes panels [jp0, jp1), k4 rows [pc, pc + kc) in the layout above
     * into a per-thread buffer (panel stride kc · nr · 4). */
    void (*decode)(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst);
    const void *src;
    /* Or, for m <= rows_max rows (the small-M path): rows(src, a, mr, m, jp,
     * c) writes the int32 sums c[m][nr] of panel jp against the m rows of
     * the packed A panels a (kb = 64, mr rows per panel), decoding in
     * registers; NULL: decode into a buffer. */
    void (*rows)(const void *src, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c);
    int rows_max;
} ql_packed_b;

ql_status ql_pack_b_s8(const ql_s8_kernel *kern, const int8_t *w, int64_t n, int64_t k, int64_t ldw, ql_packed_b *out);
void ql_packed_b_free(ql_packed_b *b);

static inline int64_t ql_k4(int64_t k) { return (k + 3) / 4; }

/* K padded with zero codes to a multiple of the kernel's A block. */
static inline int64_t ql_kpad(const ql_s8_kernel *kern, int64_t k) { return (k + kern->kb - 1) / kern->kb * kern->kb; }

/* The k (0..63) whose code sits at position p of a 64-block: the AVX-512
 * prologue packs four vectors q0..q3 of 16 codes with two vpackssdw and one
 * vpacksswb, so position p = 16L + 4j + t holds lane 4L + t of q_j, and its
 * FWHT register order puts k = t + 4·L1 + 8·(j&1) + 16·L0 + 32·(j>>1) there. */
static inline int ql_k64_element(int p)
{
    return (p & 3) | ((p >> 5) & 1) << 2 | ((p >> 2) & 1) << 3 | ((p >> 4) & 1) << 4 | ((p >> 3) & 1) << 5;
}

/* The same for the 32-blocks of the AVX2 prologue: four 8-lane vectors q_j
 * holding k = 8j .. 8j+7, packed within 128-bit lanes, put k = 8j + 4L + t at
 * position p = 16L + 4j + t. */
static inline int ql_k32_element(int p) { return (p & 3) | ((p >> 4) & 1) << 2 | ((p >> 2) & 3) << 3; }

/* Byte offset, inside an A panel, of the code at packed position pos of row r. */
static inline size_t ql_a_offset(int kb, int mr, int r, int64_t pos)
{
    return (size_t)(((pos / kb) * mr + r) * kb + pos % kb);
}

/* k of the code at packed position pos. */
static inline int64_t ql_a_element(int kb, int64_t pos)
{
    if (kb == 64) return (pos & ~(int64_t)63) + ql_k64_element((int)(pos & 63));
    if (kb == 32) return (pos & ~(int64_t)31) + ql_k32_element((int)(pos & 31));
    return pos;
}

/* The panel ranges [*ip0, *ip1) × [*jp0, *jp1) of block `blk` of the grid
 * (column-block-major, so a thread's consecutive blocks share weight panels). */
typedef struct ql_block {
    int64_t ip0, ip1, jp0, jp1;
} ql_block;
static inline ql_block ql_block_at(int64_t blk, int64_t mblocks, int64_t mc, int64_t nc, int64_t mpanels,
                                   int64_t npanels)
{
    const int64_t nb = blk / mblocks, mb = blk % mblocks;
    ql_block b = {mb * mc, 0, nb * nc, 0};
    b.ip1 = b.ip0 + mc < mpanels ? b.ip0 + mc : mpanels;
    b.jp1 = b.jp0 + nc < npanels ? b.jp0 + nc : npanels;
    return b;
}

/* Split mpanels × npanels panels into blocks of at most *mc × *nc panels
 * (the cache-sized defaults on entry), shrinking them for small problems
 * until every thread has several blocks. */
static inline void ql_block_grid(int64_t mpanels, int64_t npanels, int threads, int64_t *mc, int64_t *nc,
                                 int64_t *mblocks, int64_t *nblocks)
{
    *mblocks = (mpanels + *mc - 1) / *mc;
    *nblocks = (npanels + *nc - 1) / *nc;
    while (*mblocks * *nblocks < 8 * (int64_t)threads && (*mc > 1 || *nc > 1)) {
        if (*mc >= *nc && *mc > 1) *mc = (*mc + 1) / 2;
        else *nc = (*nc + 1) / 2;
        *mblocks = (mpanels + *mc - 1) / *mc;
        *nblocks = (npanels + *nc - 1) / *nc;
    }
}
static inline int64_t ql_panels(int64_t rows, int mr) { return (rows + mr - 1) / mr; }

/* Bytes of the packed A of m rows (as int8; int16 kernels need aes times that). */
static inline size_t ql_packed_a_bytes(const ql_s8_kernel *kern, int64_t m, int64_t k)
{
    return (size_t)(ql_panels(m, kern->mr) * kern->mr * ql_kpad(kern, k));
}

/* Pack plain int8 rows into A panels (for the raw GEMM API; the linear's
 * prologue packs straight from float). rowsum gets Σ_k a[m,k]. */
void ql_pack_a_s8(const ql_s8_kernel *kern, const int8_t *a, int64_t m, int64_t k, int64_t lda, void *packed,
                  int32_t *rowsum);

/* Called once per finished MR×NR tile: rows m0 .. m0+mr_eff-1, columns
 * n0 .. n0+nr_eff-1; c has row stride nr. */
typedef void (*ql_tile_epilogue_fn)(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff,
                                    int nr_eff);

/* Run C = A·Bᵀ tile by tile over `threads` threads. Each tile is computed the
 * same way whatever the thread count, so results never depend on it.
 * packed_a holds int8 codes, or int16 ones for kernels with aes == 2. */
ql_status ql_gemm_s8_run(int threads, const ql_s8_kernel *kern, const void *packed_a, int64_t m, const ql_packed_b *b,
                    ql_tile_epilogue_fn epi, void *arg);
/* The prologue that packs A, run first by each thread t of the n in the
 * GEMM's parallel region (one fork-join per call instead of two). ready
 * NULL: a barrier follows it. Else no barrier: a block starts once
 * ready(arg, ip0, ip1) says its row panels are packed, so a thread whose
 * share is done starts on blocks whose rows are, and no thread sleeps in a
 * barrier (on the 16-core AMX VM, waking one cost up to ~1 ms a call). run
 * returns only once every piece of the prologue is claimed, so a wait on
 * ready always ends. */
typedef struct ql_gemm_pre {
    void (*run)(void *arg, int t, int n);
    bool (*ready)(void *arg, int64_t ip0, int64_t ip1);
    void *arg;
} ql_gemm_pre;
ql_status ql_gemm_s8_run_pre(int threads, const ql_s8_kernel *kern, const void *packed_a, int64_t m, const ql_packed_b *b,
                             const ql_gemm_pre *pre, ql_tile_epilogue_fn epi, void *arg);

/* A spin-wait's pause. */
static inline void ql_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The small-M path (GEMV / narrow panels, bound by the weight stream):
 * threads split N, not M — thread t owns a contiguous range of weight
 * panels, which are contiguous in memory, and streams each byte once; every
 * tile runs over the whole K with its accumulators in registers (no partial
 * sums leave them, no K slices), and the kernel's row count is fitted to M
 * (ql_s8_plan_for), so no padded row is multiplied. */
typedef struct ql_s8_plan {
    const ql_s8_kernel *kern;
    bool small;
} ql_s8_plan;
/* The path for m rows of an [n, k] weight, chosen from measurements (see
 * driver.c): small-M up to a row count per ISA, else blocked; either way
 * with the tile height fitted to m. */
ql_s8_plan ql_s8_plan_for(const struct ql_cpu_kernels *kt, int64_t m, int64_t n, int64_t k);
/* The same with the small-M limit of a context (QLINEAR_SMALL_M; -1: the table's). */
ql_s8_plan ql_s8_plan_limit(const struct ql_cpu_kernels *kt, int64_t m, int64_t n, int64_t k, int64_t limit);
/* Weight panels [*jp0, *jp1) of thread t of `threads`. */
void ql_split_panels(int64_t npanels, int t, int threads, int64_t *jp0, int64_t *jp1);
/* Dynamic split of work items (the small-M path's weight panels, the
 * blocked drivers' blocks): thread t starts on its static range
 * (ql_split_panels) and, when that is done, takes items from the back of
 * the others' ranges, so a thread that runs slower (a later start, a busier
 * core) is not waited for at the join; a thread of the planned count that
 * never starts has its range taken by the others. Each tile is computed the
 * same way whoever takes it, so results do not depend on it. */
typedef struct ql_panel_range {
    _Alignas(64) _Atomic uint64_t lohi; /* [lo, hi) as hi << 32 | lo; one cache line per thread */
} ql_panel_range;
void ql_panel_ranges_init(ql_panel_range *r, int64_t npanels, int threads);
/* The next panel for thread t (false: none left). */
bool ql_panel_next(ql_panel_range *r, int t, int threads, int64_t *jp);
/* Thread t's share of the small-M GEMM over ranges (initialized for `threads`). */
void ql_gemm_s8_small_shared(const ql_s8_kernel *kern, const void *packed_a, int64_t m, const ql_packed_b *b,
                             ql_panel_range *ranges, int t, int threads, ql_tile_epilogue_fn epi, void *arg);
/* One thread's share of the small-M GEMM: panels [jp0, jp1) against every
 * row panel of A. */
void ql_gemm_s8_small_part(const ql_s8_kernel *kern, const void *packed_a, int64_t m, const ql_packed_b *b,
                           int64_t jp0, int64_t jp1, ql_tile_epilogue_fn epi, void *arg);
/* Either path over `threads` threads. */
ql_status ql_gemm_s8_exec(int threads, ql_s8_plan plan, const void *packed_a, int64_t m, const ql_packed_b *b,
                          ql_tile_epilogue_fn epi, void *arg);

#endif
