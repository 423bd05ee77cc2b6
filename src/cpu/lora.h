/* Unmerged LoRA inside the W8A8 pipeline (see ql_lora_desc in qlinear.h).
 *
 * Per LoRA, at load: down is rotated (ConvRot) in fp32 and quantized to int8
 * with one power-of-two scale 2^e_r per row (exact to fold anywhere); up is
 * kept in double as up·2^e_r·scale. The active LoRAs are then concatenated
 * along the rank (R_tot) and packed for the layer's micro-kernel: the down
 * codes as R_tot extra weight columns (D), the up values normalized by a
 * power of two 2^E and quantized per output row to int8 (U, scale su[n]).
 *
 * Per call: after the prologue packs an activation panel, D × that panel gives
 * t = x_q·D_qᵀ (exact int32, panel hot in L1); each row of t is quantized to
 * int8 with σ = max|t|/127 (T panels) and st[m] = s_x·σ·2^E. Every output
 * tile then runs the same micro-kernel over the R_tot-long T × U product and
 * the epilogue adds fp32(acc2)·(st[m]·su[n]) before its first rounding. */
#ifndef QL_LORA_H
#define QL_LORA_H

#include "cpu/kernels.h"

typedef struct ql_lora_set ql_lora_set;

/* kern NULL: a set for another backend (the CUDA one), whose active LoRAs
 * stay as plain row-major codes (ql_lora_set_codes) instead of packed. */
ql_status ql_lora_set_add(ql_lora_set **set, const ql_s8_kernel *kern, int64_t n, int64_t k, int64_t group,
                          const ql_lora_desc *d, int *id);
ql_status ql_lora_set_remove(ql_lora_set *set, int id);
void ql_lora_set_free(ql_lora_set *set);
int ql_lora_set_count(const ql_lora_set *set);
int64_t ql_lora_set_rank(const ql_lora_set *set);
/* A low-rank term to add (some LoRA with a non-zero scale). */
bool ql_lora_set_active(const ql_lora_set *set);
/* A set made without a kernel: D [R_tot, K] (rotated down codes, row-major),
 * U [N, R_tot], su [N] and 2^E of the active LoRAs; returns R_tot (0: none). */
int64_t ql_lora_set_codes(const ql_lora_set *set, const int8_t **dq, const int8_t **uq, const float **su, double *e2);

/* Per-call state of the LoRA term for one chunk of rows. */
typedef struct ql_lora_run {
    const ql_lora_set *set;
    const ql_s8_kernel *kern;
    int8_t *t_packed;  /* T panels: [panels][rpad/kb][mr][kb] */
    float *st;         /* [chunk] */
    int32_t *trowsum;  /* [chunk] Σ t_q */
    int32_t *cbuf;     /* per thread: [D panels][mr][nr] */
    size_t cbuf_stride; /* int32 elements per thread */
    ql_w8a8_epi base;  /* the base epilogue's state */
    ql_tile_epilogue_fn inner;
} ql_lora_run;

/* Workspace bytes for `chunk` rows on `threads` threads. */
size_t ql_lora_ws_bytes(const ql_lora_set *set, const ql_s8_kernel *kern, int64_t chunk, int threads);
void ql_lora_run_init(ql_lora_run *r, const ql_lora_set *set, const ql_s8_kernel *kern, void *ws, int64_t chunk,
                      int threads);
/* t for activation panel p (rows of the current chunk, mc of them), on
 * thread th, right after the prologue packed it. */
void ql_lora_down_panel(const ql_lora_run *r, int64_t p, int64_t mc, int64_t k, const int8_t *packed, const float *sx,
                        const int32_t *rowsum, int th);
/* Tile epilogue (arg: ql_lora_run): the T × U tile, then r->inner with the
 * low-rank term attached. */
void ql_lora_epilogue(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);

#endif
