/* Hopper int8 GEMM with the W8A8 epilogue fused: C = A[M,K]·B[N,K]ᵀ, both
 * operands K-major int8 in global memory (row pitch a multiple of 16 bytes).
 * One producer warp streams 128-byte K slices of the A and B tiles into a
 * ring of shared-memory stages with the tensor-memory accelerator (TMA,
 * 128-byte swizzle, completion on an mbarrier); one or two consumer
 * warpgroups run wgmma m64nBNk32 (s32 += s8·s8) on them and apply the
 * epilogue straight from the accumulator registers. Out-of-range rows and
 * K columns arrive as zeros from TMA, so tails need no code in the loop.
 * Two kernels share these parts: one tile per block (small grids, several
 * blocks per SM), and a persistent one (a block per SM walking 128 x 256
 * tiles, bf16 tiles leaving by TMA stores while the next tile runs). */
#include <cuda.h>

#include "common.cuh"
#include "async_copy.cuh"
#include "cuda_internal.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QLC_SM90A 1
#include "wgmma_s8.cuh"
#endif

namespace qlc {
namespace {

#ifdef QLC_SM90A
/* The dynamic shared memory rounded up to 1024 bytes (the 128-byte
 * swizzle's period) by pointer arithmetic on the shared array itself: a
 * round trip through an integer would make the pointer generic, and every
 * epilogue access through it a generic load or store (slower, and waited
 * for on the long scoreboard) instead of LDS/STS. */
__device__ __forceinline__ uint8_t *smem_1024(uint8_t *raw)
{
    return raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
}

/* Shared-memory matrix descriptor: K-major rows of BK bytes (one swizzle
 * row: 128- or 64-byte swizzle), 8-row groups 8·BK bytes apart (leading
 * offset unused for swizzled K-major layouts). */
template <int BK> __device__ __forceinline__ uint64_t smem_desc(const void *p)
{
    static_assert(BK == 128 || BK == 64, "swizzle width");
    uint64_t a = smem_u32(p);
    return ((a & 0x3ffff) >> 4) | (1ull << 16) | ((uint64_t)(8 * BK >> 4) << 32) | ((BK == 128 ? 1ull : 2ull) << 62);
}
template <int BN> __device__ __forceinline__ void wgmma_tile(int32_t (&d)[BN / 2], uint64_t da, uint64_t db, int acc)
{
    if constexpr (BN == 256) wgmma_m64n256k32_s8(d, da, db, acc);
    else if constexpr (BN == 128) wgmma_m64n128k32_s8(d, da, db, acc);
    else wgmma_m64n64k32_s8(d, da, db, acc);
}
#endif

/* Epilogue variants, chosen at launch so that the common cases carry no
 * dtype branches (the generic one, unrolled over the tile, is large enough
 * to miss the instruction cache). The fast variants stage the tile in shared
 * memory and need N even, y 16-byte aligned and rows a multiple of 16 bytes. */
enum {
    EPI_GENERIC = 0,
    EPI_I32 = 1,
    EPI_BF16 = 2,
    EPI_BF16_RES = 3, /* bf16 with a gated residual */
    EPI_BF16_LORA = 4, /* bf16 plus an unmerged LoRA's rank-R term (mma.sync per 8 columns), residual if any */
    EPI_BF16_ACT = 5   /* bf16 with the output GELU (its table), residual if any */
};
__host__ __device__ constexpr bool is_bf16(int epi)
{
    return epi == EPI_BF16 || epi == EPI_BF16_RES || epi == EPI_BF16_LORA || epi == EPI_BF16_ACT;
}

/* The k32 steps of t·Uᵀ that the GEMM's LoRA epilogue takes (a total rank
 * of 64); a larger rank goes to the LoRA epilogue kernel. */
constexpr int LORA_U_KS = 2;
/* The output GELU's bf16 table, copied to shared memory by EPI_BF16_ACT. */
constexpr int GELU_LUT_BYTES = QL_GELU_LUT_SIZE * 2;

#ifdef QLC_SM90A
/* A bf16 pair of the accumulator's 8-column block j: plain, or with the
 * LoRA term l (lora_chunk) of the same block. */
template <int EPI>
__device__ __forceinline__ uint32_t pair_of(const EpiParams &p, int32_t a0, int32_t a1, float sx, float2 sw,
                                            float2 bias, int64_t row, int64_t col, bool at, const int32_t *l, float st,
                                            float2 su)
{
    if constexpr (EPI == EPI_BF16_LORA) {
        const float v0 = lora_value(a0, __fmul_rn(sx, sw.x), l[0], st, su.x);
        const float v1 = lora_value(a1, __fmul_rn(sx, sw.y), l[1], st, su.y);
        return epi_pair_bf16_v<true>(p, v0, v1, bias, row, col, at && p.res);
    } else if constexpr (EPI == EPI_BF16_ACT) return epi_pair_bf16<false>(p, a0, a1, sx, sw, bias, row, col, false);
    else return epi_pair_bf16<EPI == EPI_BF16_RES>(p, a0, a1, sx, sw, bias, row, col, at);
}

/* The GELU of one bf16 pair through ql_gelu_bf16_bits, the table at shared
 * address lut_s: gelu_bf16x2_lut's rare path, out of line (its branches
 * inlined into every epilogue's unrolled loop cost registers and spills). */
static __device__ __noinline__ uint32_t gelu_bf16x2_any(uint32_t r, uint32_t lut_s)
{
    uint32_t out = 0;
    for (int e = 0; e < 2; e++) {
        const uint16_t h = (uint16_t)(r >> (16 * e));
        uint16_t t;
        asm volatile("ld.shared.u16 %0, [%1];" : "=h"(t) : "r"(lut_s + 2 * ql_gelu_bf16_index(h)));
        out |= (uint32_t)ql_gelu_bf16_fix(h, t) << (16 * e);
    }
    return out;
}
/* round_bf16(gelu(x)) of N bf16 pairs, from the table's copy in shared
 * memory at address lut_s (the fast epilogues copy it there: read from L1,
 * a warp's 32 lookups touch ~20 cache lines, one wavefront each). All reads
 * are issued together at clamped indices; 2^-125 <= |x| < 2^-12 (one in a
 * few thousand of real activations, so in many warps' batches) takes x/2,
 * which in bf16 bits is one exponent step down. Only where some lane of the
 * warp has |x| >= 16, NaN, zero or |x| < 2^-125 does each pair go through
 * gelu_bf16x2_any. Whole warps call this. */
template <int N> __device__ __forceinline__ void gelu_bf16x2_lut(uint32_t (&v)[N], uint32_t lut_s)
{
    uint32_t worst = 0; /* the largest of |x|'s bits - 0x100, unsigned: past HI - 0x100 also when |x| < 2^-125 */
#pragma unroll
    for (int i = 0; i < N; i++) {
        const uint32_t al = v[i] & 0x7fffu, ah = (v[i] >> 16) & 0x7fffu;
        worst = max(worst, max(al - 0x100u, ah - 0x100u));
    }
    if (__any_sync(0xffffffffu, worst >= QL_GELU_LUT_HI - 0x100u)) {
#pragma unroll
        for (int i = 0; i < N; i++) v[i] = gelu_bf16x2_any(v[i], lut_s);
        return;
    }
#pragma unroll
    for (int i = 0; i < N; i++) {
        const uint16_t lo = (uint16_t)(v[i] & 0xffffu), hi = (uint16_t)(v[i] >> 16);
        uint16_t tl, th;
        /* volatile: kept after the barrier that makes the copy visible */
        asm volatile("ld.shared.u16 %0, [%1];" : "=h"(tl) : "r"(lut_s + 2 * ql_gelu_bf16_index(lo)));
        asm volatile("ld.shared.u16 %0, [%1];" : "=h"(th) : "r"(lut_s + 2 * ql_gelu_bf16_index(hi)));
        if ((lo & 0x7fffu) < QL_GELU_LUT_LO) tl = (uint16_t)(lo - 0x80u); /* as ql_gelu_bf16_outside */
        if ((hi & 0x7fffu) < QL_GELU_LUT_LO) th = (uint16_t)(hi - 0x80u);
        v[i] = (uint32_t)tl | (uint32_t)th << 16;
    }
}

/* EPI_BF16_ACT, after pair_of (scale, bias): the GELU of 8 column blocks'
 * pairs of this thread's rows r0 and r0 + 8 (the column of block jj is
 * col0 + 8·jj), all 32 reads of the table's shared-memory copy (at lut_s)
 * in flight together, then the residual if any. (Read from global memory
 * one pair at a time between the staging stores, the layer took 1.8-2.2x
 * its time.) */
__device__ __forceinline__ void act_blocks8(const EpiParams &p, uint32_t (&va)[8], uint32_t (&vb)[8], int m, int n,
                                            int64_t r0, int col0, uint32_t lut_s)
{
    uint32_t v[16];
#pragma unroll
    for (int jj = 0; jj < 8; jj++) v[jj] = va[jj], v[8 + jj] = vb[jj];
    gelu_bf16x2_lut(v, lut_s);
#pragma unroll
    for (int jj = 0; jj < 8; jj++) va[jj] = v[jj], vb[jj] = v[8 + jj];
    if (p.res) {
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            const int col = col0 + 8 * jj;
            if (col >= n) continue;
            if (r0 < m) va[jj] = res_bf16x2(p, va[jj], r0, col);
            if (r0 + 8 < m) vb[jj] = res_bf16x2(p, vb[jj], r0 + 8, col);
        }
    }
}

/* The LoRA term of the tile's 8-column accumulator block j (l, in the C
 * layout) and the su of this thread's two columns (from the column table):
 * U's fragments from the tile's copy in shared memory (USM) or from L2. */
template <bool USM, int KR>
__device__ __forceinline__ void lora_block(int32_t (&l)[4], float2 &su, const LoraRows<KR> &lr, const EpiParams &p, int64_t m,
                                           int64_t r0, const uint2 *usm, int n0, int j, int lane, const float *col_su)
{
    if constexpr (USM) lora_chunk<KR, LORA_U_KS>(l, lr, p, m, r0, usm + j * p.lks * 32 + lane, lane);
    else lora_chunk<KR, LORA_U_KS>(l, lr, p, m, r0, lora_u_global(p, (n0 + j * 8) / 8, lane), lane);
    su = *(const float2 *)col_su;
}
#endif

/* Staging of the fast epilogues: columns per pass (int32 tiles leave in two
 * passes of 128 so that the staging area stays at 64·544 bytes per
 * warpgroup) and the row pitch (rows 8 or 4 banks apart). */
template <int BN, int EPI> struct Staging {
    static constexpr int ES = EPI == EPI_I32 ? 4 : 2;
    static constexpr int HC = EPI == EPI_I32 && BN > 128 ? 128 : BN;
    static constexpr int PITCH = HC * ES + (EPI == EPI_I32 ? 32 : 16);
    static constexpr int BYTES = 64 * PITCH; /* per consumer warpgroup */
};

/* A persistent block's own staging area: room for the int32 tile's passes,
 * or (EPI_BF16_ACT, which needs the room for its table) for the bf16 TMA
 * boxes only — a warpgroup's BN/64 boxes per 64 rows, two row halves in
 * ping-pong. */
template <int NWG, int BN, bool PP, int EPI> __host__ __device__ constexpr int persistent_staging()
{
    return EPI == EPI_BF16_ACT ? NWG * (PP ? 2 : 1) * (BN / 64) * 8192 : NWG * Staging<BN, EPI_I32>::BYTES;
}
/* The ring, its barriers, the column tables (two in a persistent block), a
 * persistent block's own staging area and GELU table; 1024 for the
 * alignment. (A one-tile block keeps the GELU table in the LoRA U tile's
 * room, or in the ring after its epilogue's staging.) */
template <int BM, int NWG, int BN, int BK, int STAGES, bool PERSIST, bool PP, int EPI> constexpr size_t smem_bytes()
{
    return (size_t)STAGES * (BM + BN) * BK + 2 * STAGES * sizeof(uint64_t) +
           (PERSIST ? (PP ? 4 : 2) : 1) * 3 * BN * sizeof(float) +
           (PERSIST ? persistent_staging<NWG, BN, PP, EPI>() + (EPI == EPI_BF16_ACT ? GELU_LUT_BYTES : 0) : 0) + 1024;
}
/* Whether a one-tile-per-block kernel's blocks per SM still fit with a
 * LoRA's U tile (BN·LORA_U_KS·32 bytes) after the table. */
__host__ __device__ constexpr size_t single_tile_u_bytes(int bn) { return (size_t)bn * LORA_U_KS * 32; }
__host__ __device__ constexpr bool single_tile_u_room(int nwg, int bn, int bk, int stages, int ctas)
{
    return ((size_t)stages * (64 * nwg + bn) * bk + 2 * stages * sizeof(uint64_t) + 3 * bn * sizeof(float) +
            single_tile_u_bytes(bn) + 1024) * ctas <= 227 * 1024;
}

#ifdef QLC_SM90A
/* Producer: the TMA loads of one tile's K slices into the ring. `it` counts
 * stages over the block's whole life (a persistent block runs many tiles).
 * pdl_first: the weight slices of the first stages are requested before
 * waiting for the previous kernel (the prologue that writes A). */
template <int BM, int BN, int BK, int STAGES, int CM = 1>
__device__ __forceinline__ void produce_tile(const CUtensorMap &tma_a, const CUtensorMap &tma_b, uint8_t *smem,
                                             uint64_t *full, uint64_t *empty, int m0, int n0, int kt_count,
                                             uint32_t &it, bool pdl_first, uint32_t rank = 0)
{
    constexpr int A_BYTES = BM * BK, STAGE_BYTES = (BM + BN) * BK, B_PART = BN / CM;
    /* CM > 1: this block loads rows [rank·B_PART, +B_PART) of the B tile
     * into every block of the cluster (they share n0); each block's full
     * barrier still counts the whole stage */
    auto load_b = [&](uint8_t *st, uint64_t *bar, int kk) {
        if constexpr (CM == 1) tma_load_2d(st + A_BYTES, &tma_b, bar, kk, n0);
        else tma_load_2d_multicast(st + A_BYTES + rank * B_PART * BK, &tma_b, bar, kk, n0 + rank * B_PART, (1 << CM) - 1);
    };
    int kt = 0;
    if (pdl_first) {
        const int pre = kt_count < STAGES ? kt_count : STAGES;
        for (int i = 0; i < pre; i++) {
            mbar_expect_tx(&full[i], STAGE_BYTES);
            load_b(smem + i * STAGE_BYTES, &full[i], i * BK);
        }
        asm volatile("griddepcontrol.wait;" ::: "memory");
        for (int i = 0; i < pre; i++) tma_load_2d(smem + i * STAGE_BYTES, &tma_a, &full[i], i * BK, m0);
        kt = pre, it += pre;
    }
    for (; kt < kt_count; kt++, it++) {
        const uint32_t s = it % STAGES;
        if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
        uint8_t *st = smem + s * STAGE_BYTES;
        mbar_expect_tx(&full[s], STAGE_BYTES);
        tma_load_2d(st, &tma_a, &full[s], kt * BK, m0);
        load_b(st, &full[s], kt * BK);
    }
}

/* Consumer warpgroup c: wgmma over one tile's K slices, accumulators in d:
 * MH row halves of 64 (rows (c·MH + h)·64 of the stage's A slice).
 * Every stage is released (one arrival per warp) once its wgmmas retired. */
template <int BM, int BN, int BK, int STAGES, int CM = 1, int MH = 1>
__device__ __forceinline__ void consume_tile(int32_t (&d)[MH][BN / 2], uint8_t *smem, uint64_t *full,
                                             uint64_t *empty, int c, int tid, int kt_count, uint32_t &it)
{
    /* a stage is free once every block whose producer writes it (all of
     * the cluster's, through the multicast B) has released it */
    auto release = [&](uint64_t *bar) {
        if constexpr (CM == 1) {
            if (tid % 32 == 0) mbar_arrive(bar);
        } else if (tid % 32 < CM) mbar_arrive_cluster(bar, tid % 32); /* lane r to block r, in parallel */
    };
    constexpr int A_BYTES = BM * BK, STAGE_BYTES = (BM + BN) * BK;
    /* no zeroing: the first wgmma ignores d (K >= 1 here; K = 0 never comes
     * to this kernel), and a non-wgmma write to the accumulators would make
     * ptxas serialise the wgmmas */
    for (int kt = 0; kt < kt_count; kt++, it++) {
        const uint32_t s = it % STAGES;
        mbar_wait(&full[s], (it / STAGES) & 1);
        const uint8_t *a = smem + s * STAGE_BYTES + c * MH * 64 * BK;
        const uint8_t *b = smem + s * STAGE_BYTES + A_BYTES;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 32; kk++)
#pragma unroll
            for (int h = 0; h < MH; h++)
                wgmma_tile<BN>(d[h], smem_desc<BK>(a + h * 64 * BK + kk * 32), smem_desc<BK>(b + kk * 32),
                               kt > 0 || kk > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        /* Keep one group in flight: the previous stage is free once the
         * group before this one has retired. */
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        if (kt > 0) release(&empty[(it - 1) % STAGES]);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    release(&empty[(it - 1) % STAGES]);
#pragma unroll
    for (int h = 0; h < MH; h++)
#pragma unroll
        for (int i = 0; i < BN / 2; i++) asm volatile("" : "+r"(d[h][i])::"memory");
}

/* The epilogue of consumer warpgroup c's 64 x BN part of a tile (rows from
 * row0, columns from n0): scale restore, rounding, bias (col_sw / col_bias:
 * the tile's table in shared memory), store. Fast variants go through
 * `stage` (Staging<BN, EPI>::BYTES, this warpgroup's own) and named barrier
 * `bar` of the warpgroup.
 * Accumulator layout of wgmma m64nN: warp w of the group owns rows
 * 16w + lane/4 (+8); register 4j+{0,1} holds columns 8j + 2(lane%4) + {0,1}
 * of the first row, 4j+{2,3} the same columns of the second. */
template <int BN, int EPI, int KR = 2, bool USM = false>
__device__ __forceinline__ void epilogue_tile(const int32_t (&d)[BN / 2], const EpiParams &p, int m, int n,
                                              int64_t row0, int n0, int tid, const float *col_sw,
                                              const float *col_bias, uint8_t *stage, int bar,
                                              const uint2 *usm = nullptr /* USM: the tile's U (lora_u_copy);
                                                                            EPI_BF16_ACT: the GELU table */)
{
    const bool scaled = p.ydt != DT_I32;
    const int warp = tid / 32, lane = tid % 32;
    const int64_t r0 = row0 + warp * 16 + lane / 4, r1 = r0 + 8;
    const float sx0 = scaled && r0 < m ? p.sx[r0] : 0.f, sx1 = scaled && r1 < m ? p.sx[r1] : 0.f;
    if constexpr (EPI == EPI_I32 || is_bf16(EPI)) {
        /* the accumulator layout scatters 8 rows per warp store; the staged
         * tile leaves in 16-byte row chunks */
        using S = Staging<BN, EPI>;
        constexpr int ES = S::ES, HC = S::HC, PITCH = S::PITCH;
        const int lr0 = warp * 16 + lane / 4, lr1 = lr0 + 8;
        LoraRows<KR> lr{};
        if constexpr (EPI == EPI_BF16_LORA) lora_rows(lr, p, m, r0, lane);
#pragma unroll
        for (int h = 0; h < BN / HC; h++) {
            if (h > 0) asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory"); /* the previous pass has left */
            if constexpr (EPI == EPI_BF16_ACT) {
                static_assert(HC % 64 == 0, "whole groups of 8 column blocks");
#pragma unroll
                for (int jg = 0; jg < HC / 8; jg += 8) {
                    uint32_t va[8], vb[8];
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        const int cl = (jg + q) * 8 + 2 * (lane % 4);
                        const float2 sw = *(const float2 *)(col_sw + cl), bs = *(const float2 *)(col_bias + cl);
                        const int j = h * (HC / 8) + jg + q; /* (HC = BN for bf16: h = 0) */
                        const int32_t *l = nullptr;
                        va[q] = pair_of<EPI>(p, d[4 * j], d[4 * j + 1], sx0, sw, bs, r0, n0 + cl, false, l, 0.f, sw);
                        vb[q] = pair_of<EPI>(p, d[4 * j + 2], d[4 * j + 3], sx1, sw, bs, r1, n0 + cl, false, l, 0.f, sw);
                    }
                    act_blocks8(p, va, vb, m, n, r0, n0 + jg * 8 + 2 * (lane % 4), smem_u32(usm));
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        const int cl = (jg + q) * 8 + 2 * (lane % 4);
                        *(uint32_t *)(stage + lr0 * PITCH + cl * 2) = va[q];
                        *(uint32_t *)(stage + lr1 * PITCH + cl * 2) = vb[q];
                    }
                }
            } else
#pragma unroll
            for (int jj = 0; jj < HC / 8; jj++) {
                const int j = h * (HC / 8) + jj, cl = jj * 8 + 2 * (lane % 4);
                if constexpr (EPI == EPI_I32) {
                    *(int2 *)(stage + lr0 * PITCH + cl * 4) = make_int2(d[4 * j], d[4 * j + 1]);
                    *(int2 *)(stage + lr1 * PITCH + cl * 4) = make_int2(d[4 * j + 2], d[4 * j + 3]);
                } else {
                    const float2 sw = *(const float2 *)(col_sw + cl), bs = *(const float2 *)(col_bias + cl);
                    const int64_t col = n0 + cl; /* HC = BN for bf16: one pass */
                    int32_t l[4] = {};
                    float2 su = {};
                    if constexpr (EPI == EPI_BF16_LORA) lora_block<USM>(l, su, lr, p, m, r0, usm, n0, j, lane, col_bias + BN + cl);
                    *(uint32_t *)(stage + lr0 * PITCH + cl * 2) =
                        pair_of<EPI>(p, d[4 * j], d[4 * j + 1], sx0, sw, bs, r0, col, r0 < m && col < n, l, lr.st0, su);
                    *(uint32_t *)(stage + lr1 * PITCH + cl * 2) =
                        pair_of<EPI>(p, d[4 * j + 2], d[4 * j + 3], sx1, sw, bs, r1, col, r1 < m && col < n, l + 2,
                                     lr.st1, su);
                }
            }
            asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory");
            constexpr int CH = HC * ES / 16, PER = 16 / ES; /* chunks per row, elements per chunk */
            uint8_t *ybase = (uint8_t *)p.y;
#pragma unroll 4
            for (int idx = tid; idx < 64 * CH; idx += 128) {
                const int lr = idx / CH, ch = idx % CH;
                const int64_t row = row0 + lr, col = n0 + h * HC + ch * PER;
                if (row >= m || col >= n) continue;
                const uint4 v = *(const uint4 *)(stage + lr * PITCH + ch * 16);
                uint8_t *dst = ybase + (row * p.ldy + col) * ES;
                if (col + PER <= n) {
                    *(uint4 *)dst = v;
                } else { /* the last columns (N even: whole 2-element pairs) */
                    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
                    const int pairs = (int)(n - col) / 2;
                    for (int q = 0; q < pairs; q++) {
                        if constexpr (ES == 2) ((uint32_t *)dst)[q] = w[q];
                        else ((uint2 *)dst)[q] = make_uint2(w[2 * q], w[2 * q + 1]);
                    }
                }
            }
        }
        return;
    }
    const bool fast = scaled && !p.res && !p.act && p.vec2;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const int cl = j * 8 + 2 * (lane % 4);
        const int64_t col = n0 + cl;
        if (col >= n) continue;
        if (fast && col + 1 < n) {
            const float2 sw = *(const float2 *)(col_sw + cl), bs = *(const float2 *)(col_bias + cl);
            if (r0 < m) epi_store_pair(p, r0, col, d[4 * j], d[4 * j + 1], sx0, sw, bs);
            if (r1 < m) epi_store_pair(p, r1, col, d[4 * j + 2], d[4 * j + 3], sx1, sw, bs);
            continue;
        }
        if (r0 < m) epi_store2(p, r0, col, n, d[4 * j], d[4 * j + 1], sx0);
        if (r1 < m) epi_store2(p, r1, col, n, d[4 * j + 2], d[4 * j + 3], sx1);
    }
}

/* bf16 epilogue of a persistent block: warpgroup c's 64 x BN part rounded
 * into `stage` as BN/64 boxes of 64 x 64 in TMA's 128-byte swizzle (16-byte
 * chunk i of row r at chunk i ^ (r % 8): the accumulator layout writes
 * without bank conflicts). Each warp sends its own 16 rows of a box (2 KiB,
 * 1024-aligned, the swizzle repeating every 8 rows) by a TMA store as soon
 * as it has written them and goes on while they drain: the warps never wait
 * for each other (no warpgroup barrier per box; on the H200 the anima
 * totals were within run-to-run noise of the barrier version's). The
 * staging area holds SLOTS boxes, used in turn (SLOTS = BN/64, or twice
 * that for a ping-pong tile's two row halves): a warp rewrites its part of a box once its store of that part
 * from the previous tile has left shared memory (bulk groups complete in
 * order: at most SLOTS - 1 of the warp's others pending), so a layer bound
 * by its output (K = 256) computes while the last tile drains. */
/* The activation scales of this thread's two accumulator rows of the 64
 * rows from row0 (read before the main loop, whose wgmmas hide the load). */
__device__ __forceinline__ float2 tile_sx(const EpiParams &p, int m, int row0, int tid)
{
    const int r0 = row0 + tid / 32 * 16 + tid % 32 / 4, r1 = r0 + 8;
    return make_float2(r0 < m ? p.sx[r0] : 0.f, r1 < m ? p.sx[r1] : 0.f);
}

template <int BN, int SLOTS, int EPI, int KR, bool USM = false>
__device__ __forceinline__ void epilogue_bf16_tma(const int32_t (&d)[BN / 2], const EpiParams &p, int m, int n,
                                                  int row0, int n0, int tid, float2 sx, const float *col_sw,
                                                  const float *col_bias, uint8_t *stage, const CUtensorMap *tma_y,
                                                  const uint2 *usm = nullptr /* USM: the tile's U (lora_u_copy);
                                                                                EPI_BF16_ACT: the GELU table */)
{
    constexpr int BOXES = BN / 64;
    const int warp = tid / 32, lane = tid % 32;
    const int r0 = row0 + warp * 16 + lane / 4, r1 = r0 + 8;
    const float sx0 = sx.x, sx1 = sx.y;
    uint8_t *row_a = stage + (warp * 16 + lane / 4) * 128 + 4 * (lane % 4), *row_b = row_a + 8 * 128;
    const int xr = lane / 4; /* (row % 8) for both rows */
    LoraRows<KR> lr{};
    if constexpr (EPI == EPI_BF16_LORA) lora_rows(lr, p, m, r0, lane);
#pragma unroll
    for (int q = 0; q < BOXES; q++) {
        if (lane == 0) asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(SLOTS - 1) : "memory");
        __syncwarp();
        uint32_t va[8], vb[8]; /* EPI_BF16_ACT: the box's pairs before their GELU */
#pragma unroll
        for (int jj = 0; jj < 8; jj++) {
            const int j = q * 8 + jj, cl = j * 8 + 2 * (lane % 4), off = (q % SLOTS) * 8192 + (jj ^ xr) * 16;
            const float2 sw = *(const float2 *)(col_sw + cl), bs = *(const float2 *)(col_bias + cl);
            const int col = n0 + cl;
            int32_t l[4] = {};
            float2 su = {};
            if constexpr (EPI == EPI_BF16_LORA) lora_block<USM>(l, su, lr, p, m, r0, usm, n0, j, lane, col_bias + BN + cl);
            const uint32_t ya = pair_of<EPI>(p, d[4 * j], d[4 * j + 1], sx0, sw, bs, r0, col, r0 < m && col < n, l, lr.st0, su);
            const uint32_t yb =
                pair_of<EPI>(p, d[4 * j + 2], d[4 * j + 3], sx1, sw, bs, r1, col, r1 < m && col < n, l + 2, lr.st1, su);
            if constexpr (EPI == EPI_BF16_ACT) va[jj] = ya, vb[jj] = yb;
            else *(uint32_t *)(row_a + off) = ya, *(uint32_t *)(row_b + off) = yb;
        }
        if constexpr (EPI == EPI_BF16_ACT) {
            act_blocks8(p, va, vb, m, n, r0, n0 + q * 64 + 2 * (lane % 4), smem_u32(usm));
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
                const int off = (q % SLOTS) * 8192 + (jj ^ xr) * 16;
                *(uint32_t *)(row_a + off) = va[jj], *(uint32_t *)(row_b + off) = vb[jj];
            }
        }
        fence_proxy_async_smem();
        __syncwarp();
        if (lane == 0) {
            /* rows wholly past the output store nothing; the group is
             * committed anyway so that the count above stays exact */
            if (row0 + warp * 16 < m && n0 + q * 64 < n)
                tma_store_2d(tma_y, stage + (q % SLOTS) * 8192 + warp * 2048, n0 + q * 64, row0 + warp * 16);
            bulk_commit();
        }
    }
}

/* A LoRA's U fragments of the tile's columns n0 .. n0 + bn (bn·lks·32 bytes,
 * contiguous: U is padded to whole 256-column tiles) copied to shared memory
 * by threads t of nt (cp.async, 16 bytes each, waited for with
 * lora_u_wait before a barrier): the epilogue then reads each fragment from
 * shared memory instead of waiting on L2 once per 8 columns. Served where
 * the kernel has room: up to LORA_U_KS k32 steps (total rank 64). */
__device__ __forceinline__ void lora_u_copy(uint8_t *dst, const EpiParams &p, int n0, int bn, int t, int nt)
{
    const uint8_t *src = (const uint8_t *)(p.luf + (int64_t)(n0 / 8) * p.lks * 32);
    for (int i = 16 * t; i < bn * p.lks * 32; i += 16 * nt)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst + i)), "l"(src + i) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void lora_u_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* The output GELU's table (8 KB, ql_gelu_bf16_bits) copied to shared memory
 * the same way, by threads t of nt; waited for with lora_u_wait. */
__device__ __forceinline__ void gelu_lut_copy(uint8_t *dst, const EpiParams &p, int t, int nt)
{
    const uint8_t *src = (const uint8_t *)p.gelu_lut;
    for (int i = 16 * t; i < GELU_LUT_BYTES; i += 16 * nt)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst + i)), "l"(src + i) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* The tile's weight scales and bias (rounded to the output dtype), read from
 * shared memory in the epilogue: no global loads between its stores. */
__device__ __forceinline__ void fill_col_table(const EpiParams &p, int n, int n0, int bn, int t, int nt,
                                               float *col_sw, float *col_bias) /* col_su: col_bias + bn */
{
    if (p.ydt == DT_I32) return; /* raw int32 output (the bare GEMM) has no scales */
    for (int i = t; i < bn; i += nt) {
        const int64_t col = n0 + i < n ? n0 + i : n - 1;
        col_sw[i] = p.sw[p.sw_per_row ? col : 0];
        col_bias[i] = p.bias ? round_to(p.ydt, p.bias[col]) : 0.0f;
        if (p.lks) col_bias[bn + i] = p.lsu[col];
    }
}
#endif

/* One tile per block: NWG consumer warpgroups (BM = 64·NWG rows; warps
 * 0 .. 4·NWG-1, aligned as wgmma wants) and one producer warp after them;
 * BN columns; BK bytes of K per stage (128 or 64: a consumer holds two
 * stages, so shorter stages keep more of the ring in flight); a STAGES-deep
 * ring; CTAS blocks per SM (2 lets one block's epilogue overlap the other's
 * main loop). The fast epilogues stage the tile in the ring, free by then. */
template <int NWG, int BN, int BK, int STAGES, int CTAS, int EPI>
__global__ void __launch_bounds__(NWG * 128 + 32, CTAS)
    s8_gemm_sm90_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                        const __grid_constant__ CUtensorMap tma_y, int m, int n, int k, EpiParams p)
{
#ifdef QLC_SM90A
    pdl_trigger(); /* the next layer's prologue may launch (it waits for this grid) */
    constexpr int BM = 64 * NWG, STAGE_BYTES = (BM + BN) * BK;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_1024(smem_raw);
    uint64_t *full = (uint64_t *)(smem + STAGES * STAGE_BYTES);
    uint64_t *empty = full + STAGES;
    float *col_sw = (float *)(empty + STAGES), *col_bias = col_sw + BN; /* and LoRA's su */
    /* a LoRA's U tile after the table, where the kernel's shared memory has room (Cfg) */
    constexpr bool U_ROOM = EPI == EPI_BF16_LORA && single_tile_u_room(NWG, BN, BK, STAGES, CTAS);
    uint2 *usm = (uint2 *)(col_sw + 3 * BN);
    constexpr bool u_smem = U_ROOM; /* the launcher fuses a LoRA of at most LORA_U_KS steps only */
    /* EPI_BF16_ACT: the GELU table in the U tile's room, copied under the
     * main loop; without that room, in the ring after the staging area,
     * copied once the main loop has left the ring */
    constexpr bool LUT_EARLY = EPI == EPI_BF16_ACT && single_tile_u_room(NWG, BN, BK, STAGES, CTAS);
    constexpr bool LUT_LATE = EPI == EPI_BF16_ACT && !LUT_EARLY;
    static_assert(single_tile_u_bytes(BN) >= GELU_LUT_BYTES, "the GELU table fits the U tile's room");

    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128; /* wg == NWG: the producer warp */
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int kt_count = (k + BK - 1) / BK;

    /* layer constants, read before waiting for the prologue */
    fill_col_table(p, n, n0, BN, threadIdx.x, NWG * 128, col_sw, col_bias);
    if (threadIdx.x == 0) {
        /* empty: one arrival per consumer warp (256 thread arrivals per stage
         * serialised on the barrier cost more than the stage's wgmma) */
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], NWG * 4);
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == NWG) {
        uint32_t it = 0;
        if (tid == 0) produce_tile<BM, BN, BK, STAGES>(tma_a, tma_b, smem, full, empty, m0, n0, kt_count, it, true);
        return;
    }
    /* Programmatic dependent launch: the activation scales come from the
     * prologue kernel just before; everything above overlapped its tail. */
    if (u_smem) lora_u_copy((uint8_t *)usm, p, n0, BN, threadIdx.x, NWG * 128); /* U: written long before */
    if (LUT_EARLY) gelu_lut_copy((uint8_t *)usm, p, threadIdx.x, NWG * 128);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    int32_t d[1][BN / 2];
    uint32_t it = 0;
    consume_tile<BM, BN, BK, STAGES>(d, smem, full, empty, wg, tid, kt_count, it);
    using S = Staging<BN, EPI>;
    static_assert(EPI == EPI_GENERIC || NWG * S::BYTES + (LUT_LATE ? GELU_LUT_BYTES : 0) <= STAGES * STAGE_BYTES,
                  "staged tile (and GELU table) fit the ring");
    if (u_smem || LUT_EARLY) lora_u_wait();
    /* the staging area is the ring: every consumer's last wgmma must have read it */
    if constexpr (EPI != EPI_GENERIC) asm volatile("bar.sync 1, %0;" ::"n"(NWG * 128) : "memory");
    if constexpr (LUT_LATE) {
        usm = (uint2 *)(smem + NWG * S::BYTES); /* 16-byte aligned: S::BYTES = 64 · PITCH, PITCH a multiple of 16 */
        gelu_lut_copy((uint8_t *)usm, p, threadIdx.x, NWG * 128);
        lora_u_wait();
        asm volatile("bar.sync 1, %0;" ::"n"(NWG * 128) : "memory");
    }
    epilogue_tile<BN, EPI, (CTAS >= 2 ? 0 : 2), U_ROOM>(d[0], p, m, n, m0 + wg * 64, n0, tid, col_sw, col_bias,
                                                        smem + wg * S::BYTES, 2 + wg, usm);
#endif
}

/* Persistent: one block per SM walks the 128 x 256 tiles (128 x 128 in
 * ping-pong, see PP) (row-major, N fastest) with a stride of the grid. The producer warp runs ahead into the
 * next tile while the consumers finish the last one, so the epilogue hides
 * the next tile's first loads and no block pays a pipeline ramp per tile;
 * 128 x 256 needs a quarter less L2 -> shared traffic per MAC than 128 x 128.
 * The fast epilogues stage through their own area (the ring stays busy);
 * bf16 tiles leave by TMA stores that overlap the next tile's main loop. */
template <int BK, int STAGES, int EPI, int CM, bool PP>
__global__ void __launch_bounds__(3 * 128, 1)
    s8_gemm_sm90_persistent_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b,
                                   const __grid_constant__ CUtensorMap tma_y, int m, int n, int k, EpiParams p)
{
#ifdef QLC_SM90A
    pdl_trigger(); /* the next layer's prologue may launch (it waits for this grid) */
    /* PP (ping-pong): each consumer warpgroup owns every other 128 x 128
     * tile (two wgmmas of 64 rows per K step), so that one's epilogue runs
     * under the other's main loop; else both share a 128 x 256 tile */
    constexpr int NWG = 2, BM = 128, BN = PP ? 128 : 256, MH = PP ? 2 : 1, STAGE_BYTES = (BM + BN) * BK;
    static_assert(!PP || CM == 1, "ping-pong: no clusters (sharing B measured no faster)");
    using S = Staging<BN, EPI>;
    /* the TMA epilogue's boxes per warpgroup: 1024-aligned for the swizzle */
    constexpr int TMA_STAGE = BN / 64 * 8192;
    constexpr int STAGING = persistent_staging<NWG, BN, PP, EPI>();
    static_assert(NWG * MH * TMA_STAGE <= STAGING && STAGE_BYTES % 1024 == 0, "staging");
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_1024(smem_raw);
    uint8_t *staging = smem + STAGES * STAGE_BYTES;
    uint64_t *full = (uint64_t *)(staging + STAGING);
    uint64_t *empty = full + STAGES;
    float *tables = (float *)(empty + STAGES); /* two tiles' tables: [2][sw BN, bias BN, su BN] (per warpgroup, PP) */
    /* EPI_BF16_ACT: the GELU table after them, copied once per block under
     * the first main loop (in ping-pong by each warpgroup for itself: the
     * two write the same bytes, and each waits for its own copy only) */
    uint2 *lut = (uint2 *)(tables + (PP ? 4 : 2) * 3 * BN);

    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int kt_count = (k + BK - 1) / BK;
    /* CM > 1: a cluster of CM blocks takes CM vertically adjacent tiles at
     * a time (a unit), which share their B slices (multicast); a block of a
     * unit past the last row of tiles computes zeros and stores nothing */
    const int tiles_n = (n + BN - 1) / BN, units = tiles_n * (((m + BM - 1) / BM + CM - 1) / CM);
    const uint32_t rank = CM > 1 ? cluster_rank() : 0;
    const int first = blockIdx.x / CM, stride = gridDim.x / CM;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], (PP ? 1 : NWG) * 4 * CM);
        mbar_init_fence();
    }
    /* the cluster's barriers are initialized before any block multicasts or arrives */
    if constexpr (CM > 1) cluster_sync();
    else __syncthreads();

    /* The producer is a whole warpgroup so that registers can move to the
     * consumers (128 accumulators each and the epilogue's temporaries). */
    if (wg == NWG) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid == 0) {
            uint32_t it = 0;
            for (int u = first; u < units; u += stride)
                produce_tile<BM, BN, BK, STAGES, CM>(tma_a, tma_b, smem, full, empty, ((u / tiles_n) * CM + rank) * BM,
                                                     (u % tiles_n) * BN, kt_count, it, u == first, rank);
            if constexpr (CM > 1) {
                /* the other blocks' consumers arrive on this block's barriers:
                 * stay until the last fills are released */
                for (int i = 0; i < STAGES; i++, it++)
                    if (it >= STAGES) mbar_wait(&empty[it % STAGES], ((it / STAGES) - 1) & 1);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    if constexpr (EPI == EPI_BF16_ACT) gelu_lut_copy((uint8_t *)lut, p, PP ? tid : threadIdx.x, PP ? 128 : NWG * 128);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if constexpr (PP) {
        /* The block's g-th tile belongs to warpgroup g % 2. The main loops
         * take turns (named barrier 4: warpgroup 0's has ended, 5: warpgroup
         * 1's): a warpgroup that skips the other's stages must not wait on a
         * ring slot before the other has consumed the slot's previous fill —
         * a parity wait cannot tell phases two apart. */
        const int count = first < units ? (units - first + stride - 1) / stride : 0;
        uint32_t it = wg * kt_count;
        int32_t d[MH][BN / 2];
        float *mine = tables + wg * 6 * BN; /* this warpgroup's two tables */
        for (int g = wg, j = 0; g < count; g += 2, j++) {
            const int u = first + g * stride, m0 = (u / tiles_n) * BM, n0 = (u % tiles_n) * BN;
            float *col_sw = mine + (j & 1) * 3 * BN, *col_bias = col_sw + BN;
            fill_col_table(p, n, n0, BN, tid, 128, col_sw, col_bias);
            float2 sx[MH];
#pragma unroll
            for (int h = 0; h < MH; h++) sx[h] = is_bf16(EPI) ? tile_sx(p, m, m0 + h * 64, tid) : make_float2(0.f, 0.f);
            if (g > 0) asm volatile("bar.sync %0, 256;" ::"r"(5 - wg) : "memory");
            consume_tile<BM, BN, BK, STAGES, 1, MH>(d, smem, full, empty, 0, tid, kt_count, it);
            if (g + 1 < count) asm volatile("bar.arrive %0, 256;" ::"r"(4 + wg) : "memory");
            it += kt_count; /* the other warpgroup's tile */
            if constexpr (EPI == EPI_BF16_ACT) lora_u_wait();
            asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory"); /* the table is complete */
#pragma unroll
            for (int h = 0; h < MH; h++) {
                if constexpr (is_bf16(EPI)) {
                    epilogue_bf16_tma<BN, MH * BN / 64, EPI, 0>(d[h], p, m, n, m0 + h * 64, n0, tid, sx[h], col_sw, col_bias,
                                                        staging + wg * MH * TMA_STAGE + h * TMA_STAGE, &tma_y, lut);
                } else {
                    if (EPI != EPI_GENERIC && h > 0) asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");
                    epilogue_tile<BN, EPI>(d[h], p, m, n, m0 + h * 64, n0, tid, col_sw, col_bias,
                                           staging + wg * S::BYTES, 2 + wg);
                }
            }
            if constexpr (EPI != EPI_GENERIC && !is_bf16(EPI)) asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");
        }
        if constexpr (is_bf16(EPI))
            if (tid % 32 == 0) bulk_wait_all();
        return;
    }
    uint32_t it = 0;
    int32_t d[1][BN / 2];
    /* A LoRA's U tiles (two, by tile parity, like the tables) where the
     * output boxes leave room: their ring of boxes is then two deep. */
    constexpr bool U_ROOM = EPI == EPI_BF16_LORA;
    constexpr int BOX_SLOTS = U_ROOM ? 2 : BN / 64, U_TILE = BN * LORA_U_KS * 32;
    static_assert(!U_ROOM || NWG * BOX_SLOTS * 8192 + 2 * U_TILE <= STAGING, "U tiles");
    constexpr bool u_smem = U_ROOM; /* the launcher fuses a LoRA of at most LORA_U_KS steps only */
    for (int u = first, j = 0; u < units; u += stride, j++) {
        const int m0 = ((u / tiles_n) * CM + rank) * BM, n0 = (u % tiles_n) * BN;
        /* Double-buffered: a consumer writes tile j's table after passing
         * barrier 1 of tile j-1, which every consumer reaches only after
         * reading tile j-2's (the same buffer). */
        float *col_sw = tables + (j & 1) * 3 * BN, *col_bias = col_sw + BN;
        fill_col_table(p, n, n0, BN, threadIdx.x, NWG * 128, col_sw, col_bias);
        uint2 *usm = (uint2 *)(staging + NWG * BOX_SLOTS * 8192 + (j & 1) * U_TILE);
        if (u_smem) lora_u_copy((uint8_t *)usm, p, n0, BN, threadIdx.x, NWG * 128);
        const float2 sx = is_bf16(EPI) ? tile_sx(p, m, m0 + wg * 64, tid) : make_float2(0.f, 0.f);
        consume_tile<BM, BN, BK, STAGES, CM>(d, smem, full, empty, wg, tid, kt_count, it);
        if (u_smem || EPI == EPI_BF16_ACT) lora_u_wait();
        asm volatile("bar.sync 1, %0;" ::"n"(NWG * 128) : "memory"); /* the table (and U tile) is complete */
        if constexpr (is_bf16(EPI)) {
            epilogue_bf16_tma<BN, BOX_SLOTS, EPI, 2, U_ROOM>(d[0], p, m, n, m0 + wg * 64, n0, tid, sx, col_sw, col_bias,
                                                             staging + wg * (U_ROOM ? BOX_SLOTS * 8192 : TMA_STAGE),
                                                             &tma_y, EPI == EPI_BF16_ACT ? lut : usm);
        } else {
            epilogue_tile<BN, EPI>(d[0], p, m, n, m0 + wg * 64, n0, tid, col_sw, col_bias, staging + wg * S::BYTES,
                                   2 + wg);
            /* the staging area is rewritten by the next tile */
            if constexpr (EPI != EPI_GENERIC) asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");
        }
    }
    if constexpr (is_bf16(EPI))
        if (tid % 32 == 0) bulk_wait_all(); /* shared memory stays until the stores have read it */
#endif
}

/* cuTensorMapEncodeTiled, fetched from the driver at run time (no -lcuda). */
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

encode_tiled_fn get_encode()
{
    static encode_tiled_fn fn = nullptr;
    if (!fn) {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (encode_tiled_fn)f;
    }
    return fn;
}

} // namespace

/* A 2-D int8 tensor map over [rows, cols] with row pitch `ld` bytes. */
bool make_map(CUtensorMap *map, const int8_t *base, int64_t rows, int64_t cols, int64_t ld, int box_rows, int bk)
{
    encode_tiled_fn enc = get_encode();
    if (!enc) return false;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)ld};
    cuuint32_t box[2] = {(cuuint32_t)bk, (cuuint32_t)box_rows};
    cuuint32_t estr[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)base, dims, strides, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, bk == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* The bf16 output [rows, cols] (row pitch ld elements) in boxes of 64
 * columns x 16 rows (a warp's share) with 128-byte swizzle, for the TMA
 * epilogue. */
static bool make_out_map(CUtensorMap *map, void *base, int64_t rows, int64_t cols, int64_t ld)
{
    encode_tiled_fn enc = get_encode();
    if (!enc) return false;
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)(ld * 2)};
    cuuint32_t box[2] = {64, 16};
    cuuint32_t estr[2] = {1, 1};
    return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

namespace {

/* A Hopper tile configuration as a type (with_tile lists them). */
template <int NWG_, int BN_, int BK_, int STAGES_, int CTAS_, bool PERSIST_ = false, int CM_ = 1, bool PP_ = false>
struct Cfg {
    static constexpr int NWG = NWG_, BN = BN_, BK = BK_, STAGES = STAGES_, CTAS = CTAS_, CM = CM_;
    static constexpr bool PERSIST = PERSIST_, PP = PP_;
    static constexpr int BM = PP ? 128 : 64 * NWG; /* ping-pong: a warpgroup's tile */
    static_assert(CM == 1 || PERSIST, "clusters: the persistent kernel");
    static_assert(PERSIST ? NWG == 2 && BN == (PP ? 128 : 256) : !PP, "the persistent kernel's tiles");
    template <int EPI> static constexpr size_t smem()
    {
        return smem_bytes<BM, NWG, BN, BK, STAGES, PERSIST, PP, EPI>() +
               (!PERSIST && single_tile_u_room(NWG, BN, BK, STAGES, CTAS) ? single_tile_u_bytes(BN) : 0);
    }
    static_assert(smem<EPI_I32>() * CTAS <= 227 * 1024 && smem<EPI_BF16_ACT>() * CTAS <= 227 * 1024,
                  "shared memory per SM");
};

typedef void (*gemm_kernel_fn)(CUtensorMap, CUtensorMap, CUtensorMap, int, int, int, EpiParams);
template <typename C, int EPI> gemm_kernel_fn kernel_of()
{
    if constexpr (C::PERSIST) return s8_gemm_sm90_persistent_kernel<C::BK, C::STAGES, EPI, C::CM, C::PP>;
    else return s8_gemm_sm90_kernel<C::NWG, C::BN, C::BK, C::STAGES, C::CTAS, EPI>;
}

/* f(Cfg<...>{}) for Hopper tile t (QLINEAR_CUDA_TILE; pick_tile chooses):
 * two blocks per SM where the grid fills the SMs twice (one block's
 * epilogue overlaps the other's main loop); deep rings with one block per
 * SM where it does not (then the load latency is what a block waits for);
 * then persistent (one block per SM walking the 128 x 256 tiles), the
 * last two in clusters of two blocks on vertically adjacent tiles that
 * share each B slice (each block loads half and multicasts it: a third less
 * traffic from L2 per stage); last, persistent ping-pong: each consumer
 * warpgroup a whole 128 x 128 tile, every other one (cuBLASLt's int8 tile
 * at K = 2048), one's epilogue under the other's main loop. */
template <typename F> cudaError_t with_tile(int tile, F &&f)
{
    switch (tile) {
    case 0: return f(Cfg<2, 256, 64, 8, 1>{});
    case 1: return f(Cfg<2, 128, 128, 3, 2>{});
    case 2: return f(Cfg<2, 128, 64, 6, 2>{});
    case 3: return f(Cfg<2, 128, 128, 6, 1>{});
    case 4: return f(Cfg<1, 128, 128, 8, 1>{});
    case 5: return f(Cfg<1, 128, 128, 2, 4>{});
    case 6: return f(Cfg<2, 256, 128, 3, 1, true>{});
    case 7: return f(Cfg<2, 256, 64, 6, 1, true>{});
    case 8: return f(Cfg<2, 256, 128, 3, 1, true, 2>{});
    case 9: return f(Cfg<2, 256, 64, 6, 1, true, 2>{});
    default: return f(Cfg<2, 128, 128, 4, 1, true, 1, true>{});
    }
}

template <typename C, int EPI>
cudaError_t launch_epi(const CUtensorMap &ma, const CUtensorMap &mb, int m, int n, int k, const EpiParams &p,
                       cudaStream_t stream, bool pdl, int sms, int pairs, bool set_attr)
{
    const gemm_kernel_fn kern = kernel_of<C, EPI>();
    dim3 grid((unsigned)((n + C::BN - 1) / C::BN), (unsigned)((m + C::BM - 1) / C::BM), 1);
    CUtensorMap my = {}; /* the output, for the TMA epilogue only */
    if (set_attr) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)C::template smem<EPI>());
        if (e != cudaSuccess) return e;
    }
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg = launch_config(grid, dim3(C::PERSIST ? 3 * 128 : C::NWG * 128 + 32, 1, 1),
                                           C::template smem<EPI>(), stream, pdl, attr);
    if (C::CM > 1) {
        cudaLaunchAttribute &c = attr[cfg.numAttrs++];
        c.id = cudaLaunchAttributeClusterDimension;
        c.val.clusterDim.x = C::CM, c.val.clusterDim.y = 1, c.val.clusterDim.z = 1;
    }
    if constexpr (C::PERSIST) {
        static_assert(C::NWG == 2 && C::CTAS == 1, "the persistent kernel");
        const int64_t units = (int64_t)grid.x * ((grid.y + C::CM - 1) / C::CM);
        int64_t resident = sms / C::CM; /* units at a time: one block per SM */
        if (C::CM > 1) {
            /* clusters fit by GPC, not by SM */
            int clusters = pairs;
            if (clusters <= 0) {
                cfg.gridDim = dim3((unsigned)(C::CM * units));
                cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg);
                if (e != cudaSuccess) return e;
            }
            if (clusters > 0) resident = clusters;
        }
        grid = dim3((unsigned)(C::CM * (units < resident ? units : resident)), 1, 1);
        if (is_bf16(EPI) && !make_out_map(&my, p.y, m, n, p.ldy)) return cudaErrorInvalidValue;
    }
    cfg.gridDim = grid;
    return cudaLaunchKernelEx(&cfg, kern, ma, mb, my, m, n, k, p);
}

} // namespace

/* The shape of tile t, read off its configuration in with_tile. */
Sm90Tile sm90_tile(int tile)
{
    Sm90Tile r = {};
    with_tile(tile, [&](auto c) {
        using C = decltype(c);
        r = {C::BM, C::BN, C::BK, C::CTAS, C::PERSIST, C::CM, C::PP};
        return cudaSuccess;
    });
    return r;
}

bool make_sm90_maps(int tile, const int8_t *a, int64_t lda, int64_t m, const int8_t *b, int64_t ldb, int64_t n,
                    int64_t k, CUtensorMap *ma, CUtensorMap *mb)
{
    const Sm90Tile t = sm90_tile(tile);
    return (!ma || make_map(ma, a, m, k, lda, t.bm, t.bk)) &&
           (!mb || make_map(mb, b, n, k, ldb, t.bn / t.cluster, t.bk));
}

cudaError_t prepare_s8_gemm_sm90(int *pairs)
{
    for (int t = 0; t < QLC_SM90_TILES; t++) {
        cudaError_t e = with_tile(t, [](auto c) {
            using C = decltype(c);
            const gemm_kernel_fn ks[6] = {kernel_of<C, EPI_GENERIC>(),  kernel_of<C, EPI_I32>(),
                                          kernel_of<C, EPI_BF16>(),     kernel_of<C, EPI_BF16_RES>(),
                                          kernel_of<C, EPI_BF16_LORA>(), kernel_of<C, EPI_BF16_ACT>()};
            const size_t bytes[6] = {C::template smem<EPI_GENERIC>(),  C::template smem<EPI_I32>(),
                                     C::template smem<EPI_BF16>(),     C::template smem<EPI_BF16_RES>(),
                                     C::template smem<EPI_BF16_LORA>(), C::template smem<EPI_BF16_ACT>()};
            for (int i = 0; i < 6; i++) {
                cudaError_t e = cudaFuncSetAttribute(ks[i], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes[i]);
                if (e != cudaSuccess) return e;
            }
            return cudaSuccess;
        });
        if (e != cudaSuccess) return e;
    }
    /* the multicast kernels (clusters of two, one block per SM) */
    using C = Cfg<2, 256, 64, 6, 1, true, 2>;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1024);
    cfg.blockDim = dim3(3 * 128);
    cfg.dynamicSmemBytes = C::template smem<EPI_BF16>();
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    *pairs = 0;
    return cudaOccupancyMaxActiveClusters(pairs, kernel_of<C, EPI_BF16>(), &cfg);
}

namespace {
/* The staged variants store 16-byte chunks of rows. */
bool staged_ok(const EpiParams &p, int64_t n)
{
    const int es = p.ydt == DT_I32 ? 4 : 2;
    return (uintptr_t)p.y % 16 == 0 && (p.ldy * es) % 16 == 0 && n % 2 == 0;
}

/* The staged bf16 epilogues: a residual is read in bf16 pairs there (4-byte
 * aligned, an even row pitch). */
bool bf16_epilogue_ok(const EpiParams &p, int64_t n)
{
    const bool res_pairs = !p.res || ((uintptr_t)p.res % 4 == 0 && p.ldr % 2 == 0 && (uintptr_t)p.rs % 4 == 0);
    return p.ydt == DT_BF16 && staged_ok(p, n) && res_pairs;
}
} // namespace

bool sm90_fuses_lora(const EpiParams &p, int64_t n)
{
    if (p.lks > LORA_U_KS) return false; /* the U tile in shared memory holds a total rank of 64 */
    if (p.act) return false;             /* with the GELU: the LoRA epilogue kernel (one variant fewer) */
    return bf16_epilogue_ok(p, n);
}

cudaError_t launch_s8_gemm_sm90(int tile, const CUtensorMap &ma, const CUtensorMap &mb, int64_t m, int64_t n,
                                int64_t k, const EpiParams &p, cudaStream_t stream, bool pdl, int sms, int pairs,
                                bool set_attr)
{
    const int im = (int)m, in = (int)n, ik = (int)k;
    const bool chunks = staged_ok(p, n), bf16 = bf16_epilogue_ok(p, n);
    if (p.lks && !sm90_fuses_lora(p, n)) return cudaErrorInvalidValue; /* a LoRA term only in the bf16 epilogue */
    const int epi = p.lks                      ? EPI_BF16_LORA
                    : chunks && p.ydt == DT_I32 ? EPI_I32
                    : bf16                      ? (p.act ? EPI_BF16_ACT : p.res ? EPI_BF16_RES : EPI_BF16)
                                                : EPI_GENERIC;
    return with_tile(tile, [&](auto c) {
        using C = decltype(c);
        if (epi == EPI_BF16_LORA)
            return launch_epi<C, EPI_BF16_LORA>(ma, mb, im, in, ik, p, stream, pdl, sms, pairs, set_attr);
        if (epi == EPI_I32) return launch_epi<C, EPI_I32>(ma, mb, im, in, ik, p, stream, pdl, sms, pairs, set_attr);
        if (epi == EPI_BF16) return launch_epi<C, EPI_BF16>(ma, mb, im, in, ik, p, stream, pdl, sms, pairs, set_attr);
        if (epi == EPI_BF16_RES)
            return launch_epi<C, EPI_BF16_RES>(ma, mb, im, in, ik, p, stream, pdl, sms, pairs, set_attr);
        if (epi == EPI_BF16_ACT)
            return launch_epi<C, EPI_BF16_ACT>(ma, mb, im, in, ik, p, stream, pdl, sms, pairs, set_attr);
        return launch_epi<C, EPI_GENERIC>(ma, mb, im, in, ik, p, stream, pdl, sms, pairs, set_attr);
    });
}

} // namespace qlc
