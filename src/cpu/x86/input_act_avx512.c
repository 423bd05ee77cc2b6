/* The input activations on 16 fp32 lanes (input_act_body.h). */
#include "cpu/x86/simd512.h"
#include "cpu/x86/x86.h"

#define QW 16
#define QV __m512
#define QVI __m512i
#define QV_SET1 _mm512_set1_ps
#define QV_ADD _mm512_add_ps
#define QV_MUL _mm512_mul_ps
#define QV_DIV _mm512_div_ps
#define QV_FMA _mm512_fmadd_ps
#define QV_MIN _mm512_min_ps
#define QV_MAX _mm512_max_ps
#define QV_ABS _mm512_abs_ps
#define QV_NEG(v) _mm512_xor_ps(v, _mm512_set1_ps(-0.0f)) /* the sign bit flipped, as the scalar's -g */
#define QV_RINT(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define QV_CVT_I32 _mm512_cvtps_epi32
#define QV_FROM_BITS _mm512_castsi512_ps
#define QVI_SET1 _mm512_set1_epi32
#define QVI_ADD _mm512_add_epi32
#define QVI_SUB _mm512_sub_epi32
#define QVI_SRAI _mm512_srai_epi32
#define QVI_SLLI _mm512_slli_epi32
#define QV_IF_NAN(x, v) _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x)
#define QV_SELECT_LT(a, b, lt, ge) _mm512_mask_mov_ps(ge, _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), lt)
/* copysignf(v, x): bitwise, sign bit ? x : v */
#define QV_COPYSIGN(v, x)                                                                                               \
    _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_set1_epi32((int)0x80000000u), _mm512_castps_si512(v),          \
                                                  _mm512_castps_si512(x), 0xAC))
#define QV_LOAD(dt, p, j) ql512_load(dt, p, j, 0xFFFF)
#define QV_STORE(dt, p, j, v) ql512_store(dt, p, j, v, 0xFFFF)
#define QV_ROUND_TO ql512_round_to
#define QV_STOREU_F32 _mm512_storeu_ps

/* 16 entries of a 16-bit table (act_table.h) at the indices g[0..16), as
 * fp32 values of dt: one gather of 4-byte words at 2·index (the table's
 * pad keeps the last inside), the entry in each word's low half. */
static inline __m512 lookup16(ql_dtype dt, const uint16_t *t, const uint16_t *g)
{
    const __m512i w = _mm512_i32gather_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)g)), t, 2);
    if (dt == QL_F16) return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
#define QV_LOOKUP16 lookup16

#include "cpu/input_act_body.h"

void ql_input_act_row_avx512(const ql_input_act_plan *p, const void *src, int64_t k, void *dst)
{
    qv_input_act_row(p, src, k, dst);
}
