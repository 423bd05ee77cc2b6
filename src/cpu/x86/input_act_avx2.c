/* The input activations on 8 fp32 lanes (input_act_body.h). */
#include "cpu/x86/simd256.h"
#include "cpu/x86/x86.h"

#define QW 8
#define QV __m256
#define QVI __m256i
#define QV_SET1 _mm256_set1_ps
#define QV_ADD _mm256_add_ps
#define QV_MUL _mm256_mul_ps
#define QV_DIV _mm256_div_ps
#define QV_FMA _mm256_fmadd_ps
#define QV_MIN _mm256_min_ps
#define QV_MAX _mm256_max_ps
#define QV_ABS(v) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v)
#define QV_NEG(v) _mm256_xor_ps(v, _mm256_set1_ps(-0.0f)) /* the sign bit flipped, as the scalar's -g */
#define QV_RINT(v) _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define QV_CVT_I32 _mm256_cvtps_epi32
#define QV_FROM_BITS _mm256_castsi256_ps
#define QVI_SET1 _mm256_set1_epi32
#define QVI_ADD _mm256_add_epi32
#define QVI_SUB _mm256_sub_epi32
#define QVI_SRAI _mm256_srai_epi32
#define QVI_SLLI _mm256_slli_epi32
#define QV_IF_NAN(x, v) _mm256_blendv_ps(v, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q))
#define QV_SELECT_LT(a, b, lt, ge) _mm256_blendv_ps(ge, lt, _mm256_cmp_ps(a, b, _CMP_LT_OQ))
#define QV_COPYSIGN(v, x)                                                                                               \
    _mm256_or_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), _mm256_and_ps(_mm256_set1_ps(-0.0f), x))
#define QV_LOAD ql256_load
#define QV_STORE ql256_store
#define QV_ROUND_TO ql256_round_to
#define QV_STOREU_F32 _mm256_storeu_ps

/* 8 entries of a 16-bit table (act_table.h) at the indices g[0..8), as fp32
 * values of dt: one gather of 4-byte words at 2·index (the table's pad keeps
 * the last inside), the entry in each word's low half. */
static inline __m256 lookup16(ql_dtype dt, const uint16_t *t, const uint16_t *g)
{
    const __m256i w = _mm256_i32gather_epi32((const int *)t, _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)g)), 2);
    if (dt == QL_F16) {
        const __m256i lo = _mm256_and_si256(w, _mm256_set1_epi32(0xFFFF));
        return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
#define QV_LOOKUP16 lookup16

#include "cpu/input_act_body.h"

void ql_input_act_row_avx2(const ql_input_act_plan *p, const void *src, int64_t k, void *dst)
{
    qv_input_act_row(p, src, k, dst);
}
