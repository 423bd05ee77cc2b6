/* Float GEMM on the tile-driver pattern: C = A·Bᵀ with fp32 arithmetic.
 * A is read in place (fp32 rows, stride lda). B (the weight) is packed in
 * panels of NR columns as [K][NR], stored as fp32, bf16 or int8 codes; bf16
 * and int8 panels are decoded to fp32 one K slice at a time into a per-thread
 * buffer that stays in L1/L2 while the block's rows pass by, so the resident
 * weight keeps its compact size. (On CPUs whose bf16 dot product is slower
 * than fp32 FMA — this one — that is also the fastest bf16 path.) */
#ifndef QL_F32_GEMM_H
#define QL_F32_GEMM_H

#include "core/core.h"

/* c: tile of mr×nr fp32 (row stride nr); accumulate: add to it. b: the
 * B slice, fp32 [k][nr]; for a kernel with kb = 4 (or 2) the packed bf16
 * blocks [ceil(k/kb)][nr][kb] themselves (cast), read in place; for a kernel
 * with a_bf16 and kb = 0 the decoded slice, bf16 pairs [ceil(k/2)][nr][2]
 * (with tile_k: [ceil(k/tile_k)·tile_k/2][nr][2], the pairs past k zero).
 * With a_bf16, a points at the slice of a packed bf16 A panel (cast; see
 * ql_pack_a_bf16) and lda is unused. */
typedef void (*ql_f32_tile_fn)(int64_t k, const float *a, int64_t lda, const float *b, float *c, int accumulate);
typedef void (*ql_f32_decode_fn)(ql_dtype dt, const void *src, int64_t n, float *dst);

/* Small-M tile: rows × (panels·NR) over the whole K (panels 1 or 2, rows
 * 1..small_rows; with small_wide, 1 row also 3 or 4 panels), the weight (panel p at b + p·panel_elems elements, dtype
 * bdt) decoded in registers; c gets the tile with row stride panels·NR.
 * Each output is the same chain of multiply-adds over k = 0, 1, ... as in
 * the blocked kernel (AMX: the same tile instructions on the same blocks),
 * so both paths give the same bits. */
typedef void (*ql_f32_small_fn)(int rows, int panels, int64_t k, const float *a, int64_t lda, const void *b,
                                int64_t panel_elems, ql_dtype bdt, float *c);

typedef struct ql_f32_kernel {
    ql_isa isa; /* the table whose blocking the driver uses */
    const char *name;
    int mr, nr;
    ql_f32_tile_fn tile;
    ql_f32_decode_fn decode; /* bf16 / int8 -> fp32, n elements */
    const char *small_name;
    int small_rows;
    ql_f32_small_fn small;
    int small_max; /* the small route up to this many rows (measured per kernel, see gemm_f32.c) */
    /* 0: B is packed [K][NR] and (bf16 / int8) decoded to fp32 per K slice;
     * 4: B is packed bf16 in blocks of 4 k ([K/4][NR][4], K padded with 0),
     * the layout BFMMLA reads (a 2×4 by 4×2 product), used without decoding,
     * and A rows must hold bf16 values (the kernel takes their top halves);
     * 2: B packed bf16 in pairs of k ([K/2][NR][2], K padded with 0), the
     * layout VDPBF16PS reads (AVX512_BF16), used without decoding. */
    int kb;
    /* A is bf16 (the VDPBF16PS kernels): for the small-M tile bf16 rows
     * (uint16, lda in elements, read up to k only: an odd K's last pair is
     * completed with 0 by the kernel), for the blocked driver and tile packed
     * panels (ql_pack_a_bf16). With kb = 0 (weight-only, int8 codes [K][NR])
     * decode writes bf16 pairs [ceil(n/nr/2)][nr][2], an odd slice's last
     * pair completed with 0. */
    int a_bf16;
    /* the same kernel for int8 codes without -128 (a cheaper decode; a
     * weight-only layer checks its codes once), NULL: none */
    const struct ql_f32_kernel *sym;
    /* 1: the small tile also takes 4 panels (panels = 4) when it has one row:
     * a row's accumulators are chains through K, so one row over 2 panels
     * (4 zmm) waits on the instruction's latency; 8 keep it busy */
    int small_wide;
    /* 0, or the K of one tile step (the AMX kernels: 32): A panels are
     * [kp/tile_k][mr][tile_k] bf16 (row r's tile_k values in a row of the A
     * tile; else pairs [ceil(k/2)][mr][2]), and B's K is padded with zeros to
     * a multiple of it (packed bf16; a decoder zeroes its slice's last block) */
    int tile_k;
    /* Kernels with per-thread state (AMX: the tile configuration) have
     * begin (else NULL): the drivers call it on each thread before its first
     * tile of a run of tiles (see ql_s8_kernel.begin in gemm.h). */
    void (*begin)(void);
} ql_f32_kernel;


typedef struct ql_packed_f32 {
    int64_t n, k, panels;
    int nr;
    ql_dtype dtype; /* QL_F32, QL_BF16 or QL_I8 */
    void *data;     /* panels · kp · nr elements */
    int64_t kp;     /* k rounded up to the kernel's kb (and tile_k) */
} ql_packed_f32;

/* Pack w [n, k] (fp32/bf16/fp16 or int8 codes) as `store` (fp32, bf16 or
 * int8; int8 only from int8; bf16 only for a kernel with kb). */
ql_status ql_pack_b_float(const ql_f32_kernel *kern, ql_dtype src_dt, const void *w, int64_t n, int64_t k,
                          int64_t ldw, ql_dtype store, int threads, ql_packed_f32 *out);
void ql_packed_f32_free(ql_packed_f32 *b);
size_t ql_packed_f32_bytes(const ql_packed_f32 *b);

typedef void (*ql_f32_epilogue_fn)(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);

/* The largest small-M tile of any kernel (AMX: 32 rows × 2 panels of 32),
 * for the driver's stack buffer. */
#define QL_F32_SMALL_TILE_MAX (32 * 64)

/* The float small-M path (see ql_s8_plan in gemm.h): threads split N, every
 * weight byte is read once per row group of small_rows rows. */
bool ql_f32_small_m(const ql_f32_kernel *kern, int64_t m, int64_t limit); /* limit -1: the default */
/* Rows per tile for m rows: m split into equal groups of at most small_rows. */
int ql_f32_small_rows(const ql_f32_kernel *kern, int64_t m);
/* Panels per small tile for m rows: 2, or 4 for one row with small_wide. */
int ql_f32_small_panels(const ql_f32_kernel *kern, int64_t m);
void ql_gemm_f32_small_part(const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m, const ql_packed_f32 *b,
                            int64_t jp0, int64_t jp1, ql_f32_epilogue_fn epi, void *arg);

ql_status ql_gemm_f32_run(int threads, const ql_f32_kernel *kern, const float *a, int64_t lda, int64_t m,
                          const ql_packed_f32 *b, ql_f32_epilogue_fn epi, void *arg);

/* A for the blocked a_bf16 kernels: panels of mr rows, each [ceil(k/2)][mr][2]
 * bf16 (row r's k and k+1 side by side, the pairs of the panel's rows in
 * turn; K padded with 0, rows >= m all 0), so a tile's broadcasts read one
 * stream; with tile_k, [kp/tile_k][mr][tile_k] (each block of a panel one A
 * tile of row stride tile_k·2 bytes). ql_gemm_f32_run takes the panels as a
 * (cast), lda unused. */
static inline int ql_a_bf16_block(const ql_f32_kernel *kern) { return kern->tile_k ? kern->tile_k : 2; }
/* K as the packed A panels hold it */
static inline int64_t ql_a_bf16_kp(const ql_f32_kernel *kern, int64_t k)
{
    const int blk = ql_a_bf16_block(kern);
    return (k + blk - 1) / blk * blk;
}
static inline size_t ql_packed_a_bf16_bytes(const ql_f32_kernel *kern, int64_t m, int64_t k)
{
    return (size_t)((m + kern->mr - 1) / kern->mr * kern->mr) * (size_t)ql_a_bf16_kp(kern, k) * 2;
}
/* Panel ip from its rows (k bf16 values each; rows[r] NULL: zeros), a pair
 * of each row in turn. */
void ql_pack_a_bf16_panel(const ql_f32_kernel *kern, const uint16_t *const *rows, int64_t k, int64_t ip, uint16_t *panels);

#endif
