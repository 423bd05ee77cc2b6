/* Reference quantization building blocks shared by the reference API and
 * the fast paths (which must reproduce them bit for bit). */
#ifndef QL_QUANT_H
#define QL_QUANT_H

#include "core/core.h"

/* Valid ConvRot group: a power of 4, >= 4, <= 2^16. */
bool ql_group_valid(int64_t group);
ql_status ql_check_group(const char *fn, int64_t group, int64_t k);
/* A valid int8 weight: shape, scales (1 or N), K within QL_MAX_K, group, bias dtype. */
ql_status ql_check_int8_weight(const char *fn, const ql_int8_weight *w);

/* The canonical fast Walsh–Hadamard transform of one group of `group` fp32
 * values, in place: scale by 1/sqrt(group) (a power of two, exact), then
 * radix-4 butterflies with strides 1, 4, 16, ...:
 *   (a,b,c,d) -> (a+b + (c-d), a+b - (c-d), (c+d) + (a-b), (c+d) - (a-b)).
 * Every vectorized rotation performs exactly these operations. */
void ql_fwht_f32(float *v, int64_t group);

/* Quantize one row whose values are already representable in dtype (given as
 * fp32): the eager row-wise rule. Returns false (codes 0, scale NaN) if the
 * row holds NaN/Inf. *rowsum gets Σ q (may be NULL). */
bool ql_quantize_row_f32(ql_dtype dtype, const float *v, int64_t k, int8_t *q, float *scale);

/* The divisor the reference uses: scale rounded to dtype, or dtype's smallest
 * normal if that rounds to zero. */
static inline float ql_scale_divisor(ql_dtype dtype, float s)
{
    float st = ql_round_to(dtype, s);
    return st == 0.0f ? ql_dtype_tiny(dtype) : st;
}

/* s = max(a / 127, 1e-30) in fp32. */
static inline float ql_scale_from_absmax(float a)
{
    float s = a / 127.0f;
    return s > 1e-30f ? s : 1e-30f;
}

/* One code: rne(round_to(dtype, v / st)) clamped to [-128, 127]. */
int8_t ql_quantize_value(ql_dtype dtype, float v, float st);

/* Load a row of dtype values to fp32, optionally rotate group-wise (rounding
 * the rotated values to dtype, as the reference rotates in dtype). */
void ql_load_row_rotated(ql_dtype dtype, const void *src, int64_t k, int64_t group, float *dst);

/* The CUDA quantizer's scale: max(min(a, FLT_MAX)·fp32(1/127), 1e-30) (a
 * multiplication, where the eager reference divides). */
float ql_sr_scale(float absmax);
/* One code the CUDA way for fp32 input: y = v/s; seed != 0: floor(y + noise(idx,
 * seed)) (the sum rounded to fp32), seed 0: rne(y); clamp to [-128, 127]. */
int8_t ql_sr_code(float v, float s, int64_t idx, uint64_t seed);

/* n torch.rand values of dtype from g's next n draws (ql_torch_rand_value). */
void ql_torch_rand_fill(ql_mt19937 *g, ql_dtype dtype, int64_t n, float *out);

#endif
