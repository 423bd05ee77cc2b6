/* Kernel launchers shared by the CUDA backend's host code (C++ only). */
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "input_act.cuh"

namespace qlc {

int log4_of(int64_t g);

/* Prologue: x [m, k] (ldx elements) -> codes q [m, ldq] (zero-padded past k)
 * and scales sx [m]. group 0: no rotation. act: the input activation of
 * each row first (x [m, 2k] for swiglu, ldx the caller's stride; rms_norm:
 * act.rms a device buffer of m floats for the row factors, filled here by
 * launch_rms_factors before the prologue runs). Where codes_permuted(k, group,
 * ldq), each group of 256 codes is stored transposed as 16 x 16 (value
 * i + 16·t at 16·i + t): the weight must be uploaded in that order too.
 * force_roww: warps per row of the G = 256 kernel (1, 2, 4; 0 = choose). */
bool codes_permuted(int64_t k, int64_t group, int64_t ldq);
/* What a launch needs to know of the device for a row length k (resident
 * blocks of the G = 256 kernel per dtype f32 / f16 / bf16 and team size),
 * filled by prepare_quantize_rows on the device that will run it. */
/* A launch of grid x block threads on `stream`; pdl: a programmatic
 * dependent launch (the attribute goes in attr[0]; a caller may append
 * more at attr[cfg.numAttrs]). */
inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                                        cudaLaunchAttribute *attr)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = pdl ? 1 : 0;
    return cfg;
}

#define QLC_INPUT_ACTS 4 /* ql_input_act codes: none, gelu_tanh, swiglu, rms_norm */
/* the G = 256 prologue's kernels: one per input activation, and gelu_tanh / swiglu by table with the lookups one item
 * ahead (QLINEAR_CUDA_ACT; the default on bf16 rows) */
#define QLC_ACT_GELU_AHEAD QLC_INPUT_ACTS
#define QLC_ACT_SWIGLU_AHEAD (QLC_INPUT_ACTS + 1)
#define QLC_KERNEL_ACTS (QLC_INPUT_ACTS + 2)
/* QLINEAR_CUDA_ACT, read once (linear_cuda.cu): the form of gelu_tanh / swiglu in the prologue */
enum { QLC_ACT_AUTO, QLC_ACT_AHEAD, QLC_ACT_TABLE, QLC_ACT_COMPUTED };
int act_form(void);
struct PrologueFit {
    /* [f32 / f16 / bf16 / bf16 on the tensor cores][input activation][team size 1, 2, 4] */
    int resident[4][QLC_KERNEL_ACTS][3];
    bool pdl; /* the fast prologue is a programmatic dependent launch (sm_90+) */
};
cudaError_t prepare_quantize_rows(int64_t k, PrologueFit *fit);
/* How bf16 rows are rotated by the G = 256 kernel (QLINEAR_CUDA_PROLOGUE):
 * by the reference's butterflies in its order (auto, exact: codes
 * bit-identical to the CPU's) or on the tensor cores (mma: issue #25's rule,
 * a code may move). Other dtypes and groups always take the butterflies. */
enum { PROLOGUE_AUTO = 0, PROLOGUE_EXACT = 1, PROLOGUE_MMA = 2 };
int prologue_form_from_env();
cudaError_t launch_quantize_rows(const void *x, int xdt, int64_t ldx, int64_t m, int64_t k, int64_t group,
                                 const InputAct &act, int8_t *q, int64_t ldq, float *sx, int force_roww, int form,
                                 const PrologueFit &fit, cudaStream_t stream);
/* rms_norm's row factors: out[r] = 1/sqrt(Σ x[r]²/k + eps) for x [m, k]
 * (ldx elements), the sum in the CPU's order (bit-identical); a block per
 * row. pdl: a programmatic dependent launch that waits for the kernel
 * before it (launch_quantize_rows calls it; a prologue of its own may too). */
cudaError_t launch_rms_factors(const void *x, int xdt, int64_t ldx, int64_t m, int64_t k, float eps, float *out,
                               bool pdl, cudaStream_t stream);
/* Shared memory the prologue needs for a row of k (it refuses rows that do not fit). */
size_t quantize_rows_smem(int64_t k);

/* Hopper (sm_90a) GEMM tiles: rows (64 per consumer warpgroup, or 128) × columns,
 * bytes of K per pipeline stage, blocks per SM; persistent: one block per SM
 * walks the tiles (the grid is at most `sms` blocks). */
struct Sm90Tile {
    int bm, bn, bk, ctas_per_sm, persistent, cluster, pingpong; /* cluster: blocks along M sharing B (multicast);
                                                                   pingpong: bm x bn is one warpgroup's tile */
};
#define QLC_SM90_TILES 11
Sm90Tile sm90_tile(int tile); /* tile < QLC_SM90_TILES */
/* TMA descriptors of the operands for a tile (either may be NULL: not made).
 * a, b: 16-byte aligned, lda/ldb multiples of 16 bytes. False: refused. */
bool make_sm90_maps(int tile, const int8_t *a, int64_t lda, int64_t m, const int8_t *b, int64_t ldb, int64_t n,
                    int64_t k, CUtensorMap *ma, CUtensorMap *mb);
/* pdl: may start while the previous kernel on the stream finishes (it waits for its results). */
/* set_attr: raise the kernel's shared-memory limit first (else
 * prepare_s8_gemm_sm90 has done it for every tile on this device).
 * pairs: two-block clusters resident at once (prepare_s8_gemm_sm90's
 * answer; 0: asked here). */
cudaError_t launch_s8_gemm_sm90(int tile, const CUtensorMap &ma, const CUtensorMap &mb, int64_t m, int64_t n,
                                int64_t k, const EpiParams &p, cudaStream_t stream, bool pdl, int sms, int pairs,
                                bool set_attr);
/* Every tile's shared-memory limit on the current device; *pairs: how many
 * two-block clusters of the multicast kernels fit at once (by GPC). */
cudaError_t prepare_s8_gemm_sm90(int *pairs);
/* Portable tensor-core GEMM (mma.sync, sm_80+): any K, any pitch and alignment. */
cudaError_t launch_s8_gemm_mma(const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t m, int64_t n,
                               int64_t k, const EpiParams &p, cudaStream_t stream);
/* Few rows (m <= QLC_GEMV_MAX_M): `split` warps (1, 2 or 4) an output
 * column stream its weight row once, each a part of K; 16-byte aligned
 * operands with pitches multiple of 16. gemv_split: the most warps a
 * column that leave every part at least four rounds of the loop (as
 * gemv_row_split) and at most 32 warps per SM; `force` (1, 2, 4; 0 auto)
 * wins. */
#define QLC_GEMV_MAX_M 8
/* ... and by default on Hopper up to this many rows, the Hopper GEMM above
 * (H100, anima with graphs: at 6 rows the GEMV 2.81 ms against 2.99, at 8
 * rows 3.16 against 3.06; docs/MEASUREMENTS.md §33) */
#define QLC_GEMV_AUTO_MAX_M_SM90 7
int gemv_split(int64_t n, int64_t k, int bits, int sms, int force);
cudaError_t launch_s8_gemv(const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int64_t m, int64_t n,
                           int64_t k, int split, const EpiParams &p, cudaStream_t stream, bool pdl);
/* The GEMVs for one row of x at G = 256 that quantize it themselves (no
 * prologue kernel): blocks of GEMV_ROW_WARPS warps, the first
 * GEMV_ROW_ROT_WARPS rotating; `split` (1, 2 or 4) warps share a column,
 * each a part of K (gemv_split_columns); gemv_row_blocks(n, split, sms) of
 * them (a wave of two per SM, fewer when N does not need them).
 * gemv_row_g256_ok: x and the shape allow it (a 16-byte aligned row, K a
 * multiple of 256 up to QLC_GEMV_ROW_MAX_K, and the row's work repeated in
 * every block small on `sms` multiprocessors). gemv_row_split: for a
 * packed layer (`bits`) the most warps a column that keep the grid within
 * a wave, every part at least four rounds of the loop (rounds4's batch, a
 * round 1 024 codes; shorter parts measured slower) and the row's work
 * within its budget; one for int8 (measured as fast); `force` (2 or 4; 0
 * auto, 1 none) skips all but the budget. launch_s8_gemv_row: the int8
 * weight b in the prologue's code order, pitch k; q [k] and sx [1] receive
 * the codes and scale the prologue kernel would have written (the packed
 * one: launch_wxa8_gemv_row, wxa8_cuda.h). */
#define QLC_GEMV_ROW_MAX_K 16384
constexpr int GEMV_ROW_WARPS = 16, GEMV_ROW_ROT_WARPS = 8;
int64_t gemv_row_blocks(int64_t n, int split, int sms);
bool gemv_row_g256_ok(int xdt, const void *x, int64_t m, int64_t n, int64_t k, int64_t group, int sms);
int gemv_row_split(int xdt, int64_t n, int64_t k, int bits, int sms, int force);
cudaError_t launch_s8_gemv_row(const void *x, int xdt, int64_t k, const int8_t *b, int64_t n, int split,
                               const EpiParams &p, int8_t *q, float *sx, int sms, cudaStream_t stream, bool pdl);

/* p.lks > 0 (an unmerged LoRA's term in the epilogue) is served by the
 * bf16 epilogue only: true when p's output takes it. */
bool sm90_fuses_lora(const EpiParams &p, int64_t n);

/* Unmerged LoRA (lora_cuda.cu). Codes of the rank, rp = rt padded to 32:
 * D in mma B-fragment order over (K, rank) (lora_frag_order with rows rp,
 * cols kp), U over (rank, N) (rows n, cols rp); tq [m, rp] row-major.
 * lora_down: t = q [m, kp] · Dᵀ (exact int32; split over K with integer
 * atomics where the rows alone do not fill the GPU), then t's codes tq and
 * st per row (the CPU's requantization). t [m, rp] and count
 * [lora_row_blocks(m)] must be zeros; they are left zeros.
 * lora_epilogue: y from the base GEMM's int32 acc [m, n] plus the LoRA term
 * (p.ltq, p.lst, p.luf, p.lsu, p.lks set), for the outputs the fused
 * epilogues do not take. */
cudaError_t launch_lora_down(const int8_t *q, int64_t ldq, const uint2 *df, int64_t m, int64_t rp, int64_t kp,
                             int32_t *t, int *count, const float *sx, double e2, int8_t *tq, float *st, int sms,
                             cudaStream_t stream);
int64_t lora_row_blocks(int64_t m);
/* lora_requant: t's codes tq and st (the requantization above) where a
 * GEMM wrote t [m, rp] whole (the Hopper kernel's raw int32 output, the
 * down projection where that kernel beats lora_down); t is left zeros. */
cudaError_t launch_lora_requant(int32_t *t, int64_t m, int64_t rp, const float *sx, double e2, int8_t *tq, float *st,
                                cudaStream_t stream);
cudaError_t launch_lora_epilogue(const int32_t *acc, int64_t ldacc, int64_t m, int64_t n, const EpiParams &p,
                                 cudaStream_t stream);
/* codes [rows, cols] (row-major, ld) into mma.sync fragment order: for
 * each 8-row block c and each 32-column step s, 32 lanes × 8 bytes (lane
 * L: row 8c + L/4, columns 32s + 4(L%4) .. +3 and 16 more), blocks of one c
 * together (c_major) or steps of one s together; zeros past rows/cols.
 * out holds ceil(rows_pad/8)·ceil(cols/32)·256 bytes. */
void lora_frag_order(const int8_t *codes, int64_t ld, int64_t rows, int64_t cols, int64_t rows_pad, bool c_major,
                     uint8_t *out);

} // namespace qlc
