/* AVX-512 prologue: one pass per activation row — load to fp32, fast
 * Walsh–Hadamard transform of each group in registers, round to the input
 * dtype, row absmax, quantize with the reference rounding, scatter into the
 * packed A panels. Same operations, in the same order, as the generic twin. */
#include "cpu/generic/generic.h"
#include "cpu/x86/x86.h"
#include "cpu/x86/simd512.h"

#include <math.h>

static void fwht_group(float *v, int64_t g)
{
    int p = 0;
    for (int64_t t = g; t > 1; t /= 4) p++;
    const __m512 norm = _mm512_set1_ps(ldexpf(1.0f, -p));
    for (int64_t i = 0; i < g; i += 16) {
        __m512 x = _mm512_mul_ps(_mm512_load_ps(v + i), norm);
        x = ql512_fwht_s1(x);
        x = ql512_fwht_s4(x);
        _mm512_store_ps(v + i, x);
    }
    for (int64_t s = 16; s < g; s *= 4)
        for (int64_t base = 0; base < g; base += 4 * s)
            for (int64_t j = base; j < base + s; j += 16) {
                __m512 a = _mm512_load_ps(v + j), b = _mm512_load_ps(v + j + s);
                __m512 c = _mm512_load_ps(v + j + 2 * s), d = _mm512_load_ps(v + j + 3 * s);
                __m512 t0 = _mm512_add_ps(a, b), t1 = _mm512_add_ps(c, d);
                __m512 t2 = _mm512_sub_ps(a, b), t3 = _mm512_sub_ps(c, d);
                _mm512_store_ps(v + j, _mm512_add_ps(t0, t3));
                _mm512_store_ps(v + j + s, _mm512_sub_ps(t0, t3));
                _mm512_store_ps(v + j + 2 * s, _mm512_add_ps(t1, t2));
                _mm512_store_ps(v + j + 3 * s, _mm512_sub_ps(t1, t2));
            }
}

/* The whole 256-group in 16 registers: stages 1 and 4 inside each register,
 * 16 and 64 across registers — the same butterflies as the generic order. */
static inline void butterfly4(__m512 *a, __m512 *b, __m512 *c, __m512 *d)
{
    __m512 t0 = _mm512_add_ps(*a, *b), t1 = _mm512_add_ps(*c, *d);
    __m512 t2 = _mm512_sub_ps(*a, *b), t3 = _mm512_sub_ps(*c, *d);
    *a = _mm512_add_ps(t0, t3);
    *b = _mm512_sub_ps(t0, t3);
    *c = _mm512_add_ps(t1, t2);
    *d = _mm512_sub_ps(t1, t2);
}

static inline void fwht256_regs(__m512 v[16])
{
    const __m512 norm = _mm512_set1_ps(1.0f / 16.0f);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) v[i] = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(v[i], norm)));
#pragma GCC unroll 4
    for (int b = 0; b < 16; b += 4) butterfly4(&v[b], &v[b + 1], &v[b + 2], &v[b + 3]); /* stride 16 */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) butterfly4(&v[j], &v[j + 4], &v[j + 8], &v[j + 12]); /* stride 64 */
}

/* Load a row to fp32, rotate, round to dtype; return max|v| (NaN if any
 * value is NaN or Inf). */
/* Rounding of rotated values for the quantizer: a denormal rotated value is
 * below 2^-126 while the divisor is at least 1e-30 (the scale floor), so its
 * code is 0 whether or not vcvtneps2bf16 flushed it, and the row absmax can
 * only change where every value is denormal, where the scale is the floor
 * either way: the one-instruction rounding gives the same codes and scales. */
static inline __m512 round_for_quant(ql_dtype dt, __m512 v, bool fbf)
{
    if (dt == QL_BF16 && fbf)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
    return ql512_round_to(dt, v);
}

/* fbf: AVX512-BF16 present; exact: keep denormals exact (float paths) rather
 * than only the quantized result (W8A8). */
static float load_rotate_absmax(ql_dtype dt, const void *src, int64_t k, int64_t group, float *v, bool fbf, bool exact)
{
    int64_t kp = (k + 15) & ~(int64_t)15;
    const __m512 fmax = _mm512_set1_ps(3.402823466e38f);
    if (group == 256) { /* the common case: one pass, the group in registers */
        __m512 amax = _mm512_setzero_ps();
        __mmask16 bad = 0;
        for (int64_t g0 = 0; g0 < k; g0 += 256) {
            __m512 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) r[i] = ql512_load(dt, src, g0 + 16 * i, 0xFFFF);
            fwht256_regs(r);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                __m512 x = dt == QL_F32 ? r[i] : exact ? ql512_round_to_fast(dt, r[i], fbf) : round_for_quant(dt, r[i], fbf);
                _mm512_store_ps(v + g0 + 16 * i, x);
                __m512 ax = _mm512_abs_ps(x);
                bad |= _mm512_cmp_ps_mask(ax, fmax, _CMP_NLE_UQ);
                amax = _mm512_max_ps(amax, ax);
            }
        }
        return bad ? NAN : _mm512_reduce_max_ps(amax);
    }
    for (int64_t i = 0; i < kp; i += 16) _mm512_store_ps(v + i, ql512_load(dt, src, i, ql512_mask(k - i)));
    if (group >= 16) {
        for (int64_t g0 = 0; g0 < k; g0 += group) fwht_group(v + g0, group);
    } else if (group == 4) { /* four groups per vector; lanes past k are zeros and stay zeros */
        const __m512 norm = _mm512_set1_ps(0.5f);
        for (int64_t i = 0; i < kp; i += 16) _mm512_store_ps(v + i, ql512_fwht_s1(_mm512_mul_ps(_mm512_load_ps(v + i), norm)));
    }
    __m512 amax = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int64_t i = 0; i < kp; i += 16) {
        __m512 x = _mm512_load_ps(v + i);
        if (group > 0 && dt != QL_F32) {
            x = exact ? ql512_round_to_fast(dt, x, fbf) : round_for_quant(dt, x, fbf);
            _mm512_store_ps(v + i, x);
        }
        __m512 ax = _mm512_abs_ps(x);
        bad |= _mm512_cmp_ps_mask(ax, fmax, _CMP_NLE_UQ); /* > max, or NaN */
        amax = _mm512_max_ps(amax, ax);
    }
    return bad ? NAN : _mm512_reduce_max_ps(amax);
}

/* The reference's quotient RN(v / st) without a vdivps per vector (it
 * would take ~10 cycles of the one port that also does half of the other
 * work): q' = RN(v · RN(1/st)) is within 2 ulps of RN(v / st) (two
 * roundings of relative size 2^-24 each). The code computed from the
 * quotient — round to the dtype, round to an integer, clamp — is a monotone
 * step function of it, so q' gives the same code unless a step lies within
 * 2 ulps of q': within 2 ulps of a bf16 (fp16) rounding midpoint, or, for
 * fp32, within 2^-14 (> 2.5 ulps of any |q| <= 256) of a half-integer.
 * Those rare lanes are divided exactly. */
static inline __m512 quotient16(ql_dtype dt, __m512 v, __m512 st, __m512 rcp)
{
    __m512 q = _mm512_mul_ps(v, rcp);
    __mmask16 risky;
    if (dt == QL_F32) {
        __m512 d = _mm512_abs_ps(_mm512_sub_ps(q, _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
        risky = _mm512_cmp_ps_mask(d, _mm512_set1_ps(0.5f - 0x1p-14f), _CMP_GE_OQ);
    } else {
        const bool b16 = dt == QL_BF16;
        __m512i lowbits = _mm512_and_si512(_mm512_sub_epi32(_mm512_castps_si512(q), _mm512_set1_epi32(b16 ? 0x7FFE : 0x0FFE)),
                                           _mm512_set1_epi32(b16 ? 0xFFFF : 0x1FFF));
        risky = _mm512_cmple_epu32_mask(lowbits, _mm512_set1_epi32(4));
    }
    if (QL_UNLIKELY(risky)) q = _mm512_mask_div_ps(q, risky, v, st);
    return q;
}

/* ---- W8A8 prologue: codes in the 64-block order of gemm.h (ql_k64_element)
 *
 * Pass 1 turns a row into rotated values rounded to the input dtype, stored
 * as fp32 in "q order": scratch vector 4h + j holds the 16 values that become
 * lanes of q_j in 64-block h. Pass 2 quantizes four such vectors at a time and
 * packs them with vpackssdw/vpacksswb, whose signed saturation is the
 * reference's clamp to [-128, 127]; one vpdpbusd by ones sums the codes. */

/* Register order of the G = 256 fast path: R[2c + b], lane 4L + t holds the
 * group's value 32c + 8L + 4b + t — what vpunpck{l,h}wd of 32 bf16 give. */
static inline void load_group256(ql_dtype dt, const void *src, __m512 r[16])
{
    for (int c = 0; c < 8; c++) {
        if (dt == QL_BF16) {
            const __m512i x = _mm512_loadu_si512((const void *)((const uint16_t *)src + 32 * c));
            r[2 * c] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), x));
            r[2 * c + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), x));
            continue;
        }
        const __m512 v0 = ql512_load(dt, src, 32 * c, 0xFFFF), v1 = ql512_load(dt, src, 32 * c + 16, 0xFFFF);
        r[2 * c] = _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
        r[2 * c + 1] = _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* The canonical radix-4 FWHT of fwht_group (same butterflies, same operand
 * order, so the same bits) on the register order of load_group256: bits 0-1
 * of the index are lane bits 0-1; bit 2 the register parity, bit 3 lane bit 2;
 * bit 4 lane bit 3, bit 5 bit 1 of the register index; bits 6-7 its bits 2-3. */
static inline void fwht256_qorder(__m512 r[16])
{
    const __m512 norm = _mm512_set1_ps(1.0f / 16.0f);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = ql512_fwht_s1(_mm512_mul_ps(r[i], norm));
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) { /* bits 2 (across registers) and 3 (adjacent 128-bit blocks) */
        const __m512 s = _mm512_add_ps(r[2 * c], r[2 * c + 1]), d = _mm512_sub_ps(r[2 * c], r[2 * c + 1]);
        const __m512 p = _mm512_shuffle_f32x4(d, d, _MM_SHUFFLE(2, 3, 0, 1));
        r[2 * c] = _mm512_add_ps(s, p);
        r[2 * c + 1] = _mm512_sub_ps(s, p);
    }
    /* i = 4c + e, e = 0, 1: two constant-count loops, so that GCC unrolls
     * them and keeps r[] in registers (a stride of (i % 4 == 1) ? 3 : 1 left
     * a real loop, and the whole group on the stack) */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++)
#pragma GCC unroll 2
    for (int e = 0; e < 2; e++) { /* bits 4 (256-bit halves) and 5 (registers i, i + 2) */
        const int i = 4 * c + e;
        const __m512 x = r[i], y = r[i + 2];
        const __m512 xs = _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)), ys = _mm512_shuffle_f32x4(y, y, _MM_SHUFFLE(1, 0, 3, 2));
        /* halves (lo, hi) of x are (a, b), of y (c, d): x + xs = (t0, t0),
         * x - xs = (t2, -t2), y + ys = (t1, t1), y - ys = (t3, -t3) */
        r[i] = _mm512_add_ps(_mm512_add_ps(x, xs), _mm512_sub_ps(y, ys));
        r[i + 2] = _mm512_add_ps(_mm512_add_ps(y, ys), _mm512_sub_ps(x, xs));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) butterfly4(&r[j], &r[j + 4], &r[j + 8], &r[j + 12]); /* bits 6 and 7 */
}

/* Round registers 2c, 2c + 1 to dt and store them in q order: vcvtne2ps2bf16
 * puts the pair's 32 bf16 in one register and vpunpck{l,h}wd spreads them
 * back, so vector 2c gets 128-bit blocks (R0.0, R0.2, R1.0, R1.2) and vector
 * 2c + 1 blocks (R0.1, R0.3, R1.1, R1.3); fp32 and fp16 move the same blocks. */
static inline void round_store_pair(ql_dtype dt, __m512 a, __m512 b, float *dst, bool fbf)
{
    __m512 lo, hi;
    if (dt == QL_BF16 && fbf) {
        const __m512i z = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* flushes denormals: harmless, see round_for_quant */
        lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), z));
        hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), z));
    } else {
        a = ql512_round_to(dt, a);
        b = ql512_round_to(dt, b);
        lo = _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        hi = _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    }
    _mm512_store_ps(dst, lo);
    _mm512_store_ps(dst + 16, hi);
}

/* Pass 1 for G = 256. Returns max|v| of the rounded row, NaN if any value is
 * NaN or Inf. The maximum is taken on the unrounded values (rounding is
 * monotone, so max|RN(v)| = RN(max|v|)) as an unsigned maximum of |v|'s bits,
 * in which NaN and Inf exceed every finite value. */
static float rotate_row256(ql_dtype dt, const void *src, int64_t k, float *scr, bool fbf)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i amax = _mm512_setzero_si512();
    for (int64_t g0 = 0; g0 < k; g0 += 256) {
        __m512 r[16];
        load_group256(dt, (const char *)src + g0 * (int64_t)ql_dtype_size(dt), r);
        fwht256_qorder(r);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) amax = _mm512_max_epu32(amax, _mm512_and_si512(_mm512_castps_si512(r[i]), absmask));
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) round_store_pair(dt, r[2 * c], r[2 * c + 1], scr + g0 + 32 * c, fbf);
    }
    uint32_t bits = (uint32_t)_mm512_reduce_max_epu32(amax);
    float a;
    memcpy(&a, &bits, 4);
    if (bits >= 0x7F800000u) return NAN;
    a = ql_round_to(dt, a);
    return a <= 3.402823466e38f ? a : NAN;
}

/* vpermt2ps indices turning canonical vectors (v0, v1) = values 32c..32c+31
 * into q_{2c + b} (b = 0, 1), from ql_k64_element. */
static inline __m512i qorder_index(int b)
{
    int32_t idx[16];
    for (int l = 0; l < 16; l++) idx[l] = ql_k64_element(16 * (l >> 2) + 4 * b + (l & 3));
    return _mm512_loadu_si512((const void *)idx);
}

/* Codes of 16 values: exact path (the reference quotient, rounded to dt,
 * rounded to an integer); q' = v·RN(1/st) replaced by v / st where risky. */
static inline __m512i codes16_exact(ql_dtype dt, __m512 v, __m512 st, __m512 rcp, bool fbf)
{
    __m512 y = round_for_quant(dt, quotient16(dt, v, st, rcp), fbf);
    return _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* Pass 2: q-order (or canonical) fp32 scratch -> 64-byte code blocks of row r. */
static int32_t quantize_row_blocks(ql_dtype dt, const float *scr, bool canonical, int64_t kp, float stf, int mr, int r,
                                   int8_t *panel, bool fbf)
{
    const __m512 st = _mm512_set1_ps(stf), rcp = _mm512_set1_ps(1.0f / stf);
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i idx0 = canonical ? qorder_index(0) : _mm512_setzero_si512(), idx1 = canonical ? qorder_index(1) : idx0;
    __m512i sum = _mm512_setzero_si512();
    for (int64_t h = 0; h < kp / 64; h++) {
        const float *s = scr + 64 * h;
        __m512 v[4];
        if (canonical) {
            for (int c = 0; c < 2; c++) {
                const __m512 a = _mm512_load_ps(s + 32 * c), b = _mm512_load_ps(s + 32 * c + 16);
                v[2 * c] = _mm512_permutex2var_ps(a, idx0, b);
                v[2 * c + 1] = _mm512_permutex2var_ps(a, idx1, b);
            }
        } else
            for (int j = 0; j < 4; j++) v[j] = _mm512_load_ps(s + 16 * j);
        __m512i qi[4];
        bool risky = false;
        if (dt == QL_BF16) {
            /* v and st are bf16 (8-bit significands), so v/st is never
             * within 2^-17 (relative) of a bf16 rounding midpoint, and q'
             * (within 2 ulps of it) rounds the same way: RN to bf16 is
             * (bits + 0x8000) with the low half cleared (no tie possible).
             * test_linear's risky-quotient search checks this claim. */
            const __m512i half = _mm512_set1_epi32(0x8000), low = _mm512_set1_epi32(0xFFFF);
            for (int j = 0; j < 4; j++) {
                const __m512i w = _mm512_add_epi32(_mm512_castps_si512(_mm512_mul_ps(v[j], rcp)), half);
                qi[j] = _mm512_cvt_roundps_epi32(_mm512_castsi512_ps(_mm512_andnot_si512(low, w)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            }
        } else if (dt == QL_F16) {
            /* RN to fp16 of a quotient whose dropped bits are not within 2
             * of the half-way pattern is (bits + 0x1000 + 2) with them
             * cleared: no tie is possible; the others are risky (see
             * quotient16) */
            const __m512i bias = _mm512_set1_epi32(0x1002), low = _mm512_set1_epi32(0x1FFF);
            __mmask16 any = 0;
            for (int j = 0; j < 4; j++) {
                const __m512i w = _mm512_add_epi32(_mm512_castps_si512(_mm512_mul_ps(v[j], rcp)), bias);
                any |= _mm512_cmple_epu32_mask(_mm512_and_si512(w, low), _mm512_set1_epi32(4));
                qi[j] = _mm512_cvt_roundps_epi32(_mm512_castsi512_ps(_mm512_andnot_si512(low, w)),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            }
            risky = any != 0;
        } else {
            __mmask16 any = 0;
            for (int j = 0; j < 4; j++) {
                const __m512 q = _mm512_mul_ps(v[j], rcp);
                const __m512 d = _mm512_abs_ps(_mm512_sub_ps(q, _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
                any |= _mm512_cmp_ps_mask(d, _mm512_set1_ps(0.5f - 0x1p-14f), _CMP_GE_OQ);
                qi[j] = _mm512_cvt_roundps_epi32(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            }
            risky = any != 0;
        }
        if (QL_UNLIKELY(risky))
            for (int j = 0; j < 4; j++) qi[j] = codes16_exact(dt, v[j], st, rcp, fbf);
        const __m512i codes = _mm512_packs_epi16(_mm512_packs_epi32(qi[0], qi[1]), _mm512_packs_epi32(qi[2], qi[3]));
        _mm512_store_si512((void *)(panel + (h * mr + r) * 64), codes);
        sum = _mm512_dpbusd_epi32(sum, ones, codes);
    }
    return _mm512_reduce_add_epi32(sum);
}

static void zero_row64(int64_t kp, int mr, int r, int8_t *panel)
{
    for (int64_t h = 0; h < kp / 64; h++) _mm512_store_si512((void *)(panel + (h * mr + r) * 64), _mm512_setzero_si512());
}

void ql_prologue_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t m, int64_t k, int64_t group, int mr,
                        int64_t r0, int64_t r1, int8_t *packed, float *sx, int32_t *rowsum, float *scratch)
{
    const int64_t kp = (k + 63) & ~(int64_t)63, kp16 = (k + 15) & ~(int64_t)15;
    const bool fbf = ql_cpu()->avx512bf16, fast = group == 256;
    for (int64_t row = r0; row < r1; row++) {
        int8_t *panel = packed + (size_t)(row / mr * kp * mr);
        const int r = (int)(row % mr);
        if (row >= m) {
            zero_row64(kp, mr, r, panel);
            continue;
        }
        const void *src = ql_row_cptr(dt, x, row, ldx);
        float a;
        if (fast) a = rotate_row256(dt, src, k, scratch, fbf);
        else {
            a = load_rotate_absmax(dt, src, k, group, scratch, fbf, false);
            for (int64_t i = kp16; i < kp; i += 16) _mm512_store_ps(scratch + i, _mm512_setzero_ps());
        }
        if (isnan(a)) { /* non-finite row: codes 0, scale NaN -> NaN output row */
            sx[row] = NAN;
            rowsum[row] = 0;
            zero_row64(kp, mr, r, panel);
            continue;
        }
        const float s = ql_scale_from_absmax(a);
        sx[row] = s;
        rowsum[row] = quantize_row_blocks(dt, scratch, !fast, kp, ql_scale_divisor(dt, s), mr, r, panel, fbf);
    }
}

/* Float paths: rows of x -> fp32 (rotated and rounded to dt when group > 0;
 * rounded to bf16 when round_bf16). out rows have stride ldo >= k rounded up
 * to 16 and are 64-byte aligned. */
void ql_rows_to_f32_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k, int64_t group,
                           int round_bf16, float *out, int64_t ldo)
{
    const int64_t kp = (k + 15) & ~(int64_t)15;
    const bool fbf = ql_cpu()->avx512bf16;
    for (int64_t r = r0; r < r1; r++) {
        float *o = out + r * ldo;
        (void)load_rotate_absmax(dt, ql_row_cptr(dt, x, r, ldx), k, group, o, fbf, true);
        if (round_bf16)
            for (int64_t i = 0; i < kp; i += 16) _mm512_store_ps(o + i, ql512_round_to_fast(QL_BF16, _mm512_load_ps(o + i), fbf));
    }
}

/* Row-major codes for weights: the same operations as the prologue (so the
 * same codes and scales as the reference quantizer, tested), rows [r0, r1).
 * Returns the first row holding (or rotating to) NaN/Inf, or -1; such rows
 * get codes 0 and scale NaN. scratch holds k rounded up to 16 floats. */
int64_t ql_quantize_rows_avx512(ql_dtype dt, const void *x, int64_t ldx, int64_t r0, int64_t r1, int64_t k,
                                int64_t group, int8_t *q, int64_t ldq, float *scale, float *scratch)
{
    const int64_t kp = (k + 15) & ~(int64_t)15;
    const bool fbf = ql_cpu()->avx512bf16;
    const __m512 lo = _mm512_set1_ps(-128.0f), hi = _mm512_set1_ps(127.0f);
    int64_t bad = -1;
    for (int64_t row = r0; row < r1; row++) {
        int8_t *qr = q + row * ldq;
        float a = load_rotate_absmax(dt, ql_row_cptr(dt, x, row, ldx), k, group, scratch, fbf, false);
        if (isnan(a)) {
            memset(qr, 0, (size_t)k);
            scale[row] = NAN;
            if (bad < 0) bad = row;
            continue;
        }
        float s = ql_scale_from_absmax(a);
        const float stf = ql_scale_divisor(dt, s);
        const __m512 st = _mm512_set1_ps(stf), rcp = _mm512_set1_ps(1.0f / stf);
        for (int64_t i = 0; i < kp; i += 16) {
            __m512 y = round_for_quant(dt, quotient16(dt, _mm512_load_ps(scratch + i), st, rcp), fbf);
            y = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
            const __mmask16 mk = ql512_mask(k - i);
            _mm_mask_storeu_epi8(qr + i, mk, _mm512_cvtepi32_epi8(_mm512_maskz_cvtps_epi32(mk, y)));
        }
        scale[row] = s;
    }
    return bad;
}
