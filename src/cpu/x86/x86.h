/* The x86 kernels the x86 tables (table_*.c) point at; each file is
 * compiled with its own ISA flags (sources.cmake). */
#ifndef QL_CPU_X86_H
#define QL_CPU_X86_H

#include "cpu/kernels.h"

/* int8 micro-kernels: the main tile and the fewer-row variants (r rows at [r - 1]) */
extern const ql_s8_kernel ql_s8_gemm_12x32c4__avx512vnni, ql_s8_small_avx512vnni[11],
    ql_s8_small_eb_avx512vnni[11]; /* 1..11 rows, activations as embedded broadcasts (per-CPU tuning) */
extern const ql_s8_kernel ql_s8_amx[32]; /* AMX-INT8: r rows at [r - 1], 32 the main tile */
extern const ql_s8_kernel ql_s8_gemm_6x16c4__avxvnni, ql_s8_small_avxvnni[5];
extern const ql_s8_kernel ql_s8_small_avx2[6]; /* 6 rows is the main tile */
extern const ql_f32_kernel ql_f32_gemm_6x16__avx2, ql_f32_gemm_12x32__avx512;
/* VDPBF16PS (AVX512_BF16 + VBMI): dense bf16 (B bf16 pairs) and weight-only
 * with bf16 activations (f32's int8 packing, decoded to bf16) */
extern const ql_f32_kernel ql_bf16_gemm_12x32c2__avx512bf16, ql_bf16_gemm_12x32c2i8__avx512bf16;
/* whether this CPU runs the VDPBF16PS kernels (features minus QLINEAR_DISABLE) */
static inline bool ql_x86_bf16_dot(const ql_cpu_features *f) { return f->avx512bf16 && f->avx512vbmi; }
/* whether VDPBF16PS does fewer multiply-adds a cycle than this core's FMAs
 * (table_avx512bf16.c's list; QLINEAR_BF16_DOT=vdpbf16ps|fma decides instead):
 * then bf16 layers run the fp32 kernel on widened operands */
bool ql_x86_bf16_dot_slow(const ql_cpu_features *f);
/* TDPBF16PS (AMX-BF16; the int8 decode: VBMI): dense bf16 (B bf16 pairs, K
 * padded to 32) and weight-only with bf16 activations (f32's int8 packing) */
extern const ql_f32_kernel ql_bf16_gemm_32x32c2__amx, ql_bf16_gemm_32x32c2i8__amx;
/* whether the amx table runs them: AMX-BF16 and what the VDPBF16PS kernels
 * need (every AMX-BF16 CPU has it; QLINEAR_DISABLE=avx512bf16 hides both) */
static inline bool ql_x86_amx_bf16(const ql_cpu_features *f) { return f->amx_bf16 && ql_x86_bf16_dot(f); }

void ql_prologue_avx2(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                      int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
void ql_prologue_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                        int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch);
void ql_w8a8_epilogue_avx2(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_w8a8_epilogue_avx512(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_f32_epilogue_avx2(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_f32_epilogue_avx512(void *arg, const float *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff);
void ql_rows_to_f32_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k, int64_t group,
                           int round_bf16, float *out, int64_t ldo);
int64_t ql_quantize_rows_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k,
                                int64_t group, int8_t *q, int64_t ldq, float *scale, float *scratch);
/* the input activations (quant/input_act.c's twins, bit for bit) */
void ql_input_act_row_avx512(const ql_input_act_plan *p, const void *src, int64_t k, void *dst);
void ql_input_act_row_avx2(const ql_input_act_plan *p, const void *src, int64_t k, void *dst);
void ql_sr_row_avx512(const float *v, int64_t k, float s, int64_t idx0, uint64_t seed, int8_t *q);
void ql_wxa8_decode_avx2(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst);
/* How far ahead (bytes) the W4A8/W6A8 decoders prefetch the codes into L2 (AVX-512's, AVX2's one-row decode):
 * QLINEAR_WXA8_PF (0..65536, default 8192, the small-M kernels' distance), a tuning hook read once at load time
 * (wxa8_decode_avx512.c). */
extern int ql_wxa8_decode_pf;
void ql_wxa8_rows_avx2(const void *src, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c);
bool ql_wxa8_rows_ok_avx2(const void *src, const struct ql_s8_kernel *kern);
void ql_wxa8_decode_avx512(const void *src, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc, uint8_t *dst);
void ql_wxa8_rows_avx512(const void *src, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c);
bool ql_wxa8_rows_ok_avx512(const void *src, const struct ql_s8_kernel *kern);
/* the 6-bit halves of the two above (AVX512-VBMI) */
struct ql_wxa8_panels;
void ql_wxa8_decode6_avx512vbmi(const struct ql_wxa8_panels *p, int64_t jp0, int64_t jp1, int64_t pc, int64_t kc,
                                uint8_t *dst);
void ql_wxa8_rows6_avx512vbmi(const struct ql_wxa8_panels *p, const int8_t *a, int mr, int64_t m, int64_t jp, int32_t *c);
int32_t ql_lora_t_row_s8_64__avx512(const int32_t *cb, int mr, int nr, int kb, int aes, const uint8_t *perm, int i,
                                    int64_t rt, int64_t rpad, int32_t corr, int8_t *tp, int32_t *scratch, int32_t *sum);
void ql_lowrank_add_avx2(float *w, int64_t rows, int64_t k, int64_t ld, const float *up, int64_t rank,
                         const float *down, float c);
void ql_lowrank_add_avx512(float *w, int64_t rows, int64_t k, int64_t ld, const float *up, int64_t rank,
                           const float *down, float c);


/* AMX: what decides whether the amx table runs (features_x86.c). */
typedef struct ql_amx_probe {
    bool avx512;     /* the AVX-512 subset of the amx table's other entries */
    bool tile, int8; /* CPUID AMX-TILE, AMX-INT8 */
    bool palette;    /* CPUID 0x1D: palette 1 of 8 tiles of 16 rows x 64 bytes */
    bool os;         /* XCR0: XTILECFG and XTILEDATA enabled */
    bool hook_deny;  /* QLINEAR_AMX_DENY set (a test hook: the permission refused) */
    int perm_errno;  /* the permission request: 0 granted, else its errno (ENOSYS: no such request) */
} ql_amx_probe;
/* Whether AMX runs on what p says; why gets the one-line reason it does
 * not ("" when it does). Checked in that order: the first obstacle names it. */
bool ql_amx_judge(const ql_amx_probe *p, char *why, size_t len);
/* "" when this CPU and OS run the amx table, else the reason; the first
 * call asks Linux for the tile data (arch_prctl ARCH_REQ_XCOMP_PERM) once
 * for the process, unless something else already rules AMX out. */
const char *ql_amx_refusal(const ql_cpu_features *f);

#endif
