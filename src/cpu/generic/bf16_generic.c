/* The portable twin of bf16_gemm_8x8c4__neonbf16: the same packed layout
 * (B in blocks of 4 k, [K/4][8][4] bf16) and, output by output, the
 * arithmetic BFMMLA is architected to do when FPCR.EBF = 0 (the default; this
 * library never sets it): for each 2-k half of a 4-k block,
 *     sum = RO(sum + RO(RO(a0·b0) + RO(a1·b1)))
 * where RO rounds to fp32 "to odd" (an inexact result takes whichever
 * neighbour has an odd last bit; overflow gives Inf), bf16 denormal inputs,
 * denormal products and sums are flushed to signed zero, and every NaN
 * becomes the default NaN. So the fast kernel can be tested bit for bit
 * (under qemu, which implements these rules), and both against float64.
 * Not a fast path: only tests use it. */
#include <math.h>

#include "cpu/f32.h"

static uint64_t dbits(double x)
{
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
}

static double dfrom(uint64_t u)
{
    double x;
    memcpy(&x, &u, 8);
    return x;
}

/* x (a double holding the exact value, or RO_53 of it) rounded to fp32 to
 * odd, flushed and saturated as BFMMLA does. RO_24(RO_53(v)) = RO_24(v):
 * rounding to odd twice is innocuous when the first precision has >= 2
 * more bits. */
static float ro_f32(double x)
{
    if (isnan(x)) return NAN; /* the default NaN (0x7fc00000) */
    if (fabs(x) < 0x1p-126) return copysignf(0.0f, (float)x); /* tiny (an RO result is never rounded up to 2^-126) */
    if (fabs(x) >= 0x1p128) return copysignf(INFINITY, (float)x);
    const uint64_t u = dbits(x), low = u & ((1ull << 29) - 1); /* the 29 mantissa bits fp32 lacks */
    float f = (float)dfrom(u - low);                            /* truncated: exact in fp32 */
    if (low) {
        uint32_t v;
        memcpy(&v, &f, 4);
        v |= 1;
        memcpy(&f, &v, 4);
    }
    return f;
}

/* RO_53(x + y) for fp32 x, y (exact in double unless their exponents are
 * far apart): the nearest-even sum, moved to its odd neighbour on the side
 * of the exact sum when it is inexact and even (TwoSum gives the error). */
static double ro_sum(double x, double y)
{
    double s = x + y;
    if (!isfinite(s)) return s;
    const double bv = s - x, err = (x - (s - bv)) + (y - bv);
    if (err != 0 && !(dbits(s) & 1)) s = nextafter(s, err > 0 ? INFINITY : -INFINITY);
    return s;
}

static float flush(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

/* A bf16 operand as BFMMLA reads it (denormals flushed). */
static double bf_in(uint16_t h) { return flush(ql_bf16_to_fp32(h)); }

/* BFDotAdd: sum + (a0·b0 + a1·b1), FPCR.EBF = 0. */
static float bfdotadd(float sum, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1)
{
    const float p0 = ro_f32(bf_in(a0) * bf_in(b0)), p1 = ro_f32(bf_in(a1) * bf_in(b1)); /* exact but for range */
    const float t = ro_f32(ro_sum(p0, p1));
    return ro_f32(ro_sum(flush(sum), t));
}

static uint16_t top(float x) /* the bf16 an fp32 holding a bf16 value carries */
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

static void tile_8x8c4_generic(int64_t k, const float *a, int64_t lda, const float *bv, float *c, int accumulate)
{
    const uint16_t *b = (const uint16_t *)bv;
    float acc[8][8] = {{0}};
    if (accumulate) memcpy(acc, c, sizeof acc);
    for (int64_t p = 0; p < k; p += 4, b += 32) {
        uint16_t ab[8][4]; /* this block of A, zero past k as the kernel's */
        for (int r = 0; r < 8; r++)
            for (int t = 0; t < 4; t++) ab[r][t] = p + t < k ? top(a[r * lda + p + t]) : 0;
        for (int r = 0; r < 8; r++)
            for (int j = 0; j < 8; j++) {
                const uint16_t *bj = b + 4 * j;
                acc[r][j] = bfdotadd(acc[r][j], ab[r][0], ab[r][1], bj[0], bj[1]);
                acc[r][j] = bfdotadd(acc[r][j], ab[r][2], ab[r][3], bj[2], bj[3]);
            }
    }
    memcpy(c, acc, sizeof acc);
}

const ql_f32_kernel ql_bf16_gemm_8x8c4__generic = {QL_ISA_GENERIC, "bf16_gemm_8x8c4__generic", 8, 8, tile_8x8c4_generic, NULL, NULL, 0, NULL, 0, 4, 0, NULL, 0, 0, NULL};

/* ---- The portable twins of the VDPBF16PS kernels (x86 AVX512_BF16):
 * bf16_gemm_12x32c2__avx512bf16 (B bf16 pairs [K/2][32][2]) and
 * bf16_gemm_12x32c2i8__avx512bf16 (int8 codes [K][32], decoded to bf16
 * pairs). Per pair (k, k+1) of an output, as Intel's SDM writes VDPBF16PS
 * (and as measured on Zen 5):
 *     acc = FMA(w[k+1], x[k+1], acc);  acc = FMA(w[k], x[k], acc)
 * each rounded to nearest even, with bf16 denormal inputs and a denormal
 * acc read as zero and a result that is tiny after rounding (below 2^-126
 * with an unbounded exponent) flushed to signed zero; NaN: the weight's
 * (src1), else the activation's, else acc's, quieted; an invalid operation
 * (Inf·0, Inf − Inf) the default NaN 0xffc00000. */

static float fbits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t ubits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* d (a finite or infinite double, or NaN) rounded to fp32, nearest even,
 * a result that is tiny after rounding flushed to signed zero. */
static float rn_ftz(double d)
{
    if (isnan(d)) return fbits(0xffc00000u);
    if (fabs(d) < 0x1p-126) { /* tiny unless it rounds (unbounded exponent) to 2^-126 */
        const float t = (float)(d * 0x1p100);
        return fabsf(t) < 0x1p-26f ? copysignf(0.0f, (float)d) : copysignf(0x1p-126f, (float)d);
    }
    return (float)d;
}

static float vdp_step(float acc, uint16_t w, uint16_t x)
{
    const float fw = ql_bf16_to_fp32(w), fx = ql_bf16_to_fp32(x);
    if (isnan(fw)) return fbits(ubits(fw) | 0x00400000u);
    if (isnan(fx)) return fbits(ubits(fx) | 0x00400000u);
    if (isnan(acc)) return fbits(ubits(acc) | 0x00400000u);
    /* the product is exact in double, and RN_24(RN_53(acc + p)) = RN_24(acc + p)
     * (a 24-bit and a 16-bit significand: 53 >= 2·24 + 2) */
    const double p = (double)flush(fw) * (double)flush(fx), d = (double)flush(acc) + p;
    return rn_ftz(d);
}

/* a: a packed A panel's slice ([ceil(k/2)][12][2], K padded with 0);
 * b: bf16 pairs [ceil(k/2)][32][2]. */
static void tile_12x32c2_generic(int64_t k, const float *av, int64_t lda, const float *bv, float *c, int accumulate)
{
    (void)lda;
    const uint16_t *a = (const uint16_t *)av, *b = (const uint16_t *)bv;
    for (int r = 0; r < 12; r++)
        for (int j = 0; j < 32; j++) {
            float acc = accumulate ? c[r * 32 + j] : 0.0f;
            for (int64_t p = 0; 2 * p < k; p++) {
                const uint16_t *w = b + (p * 32 + j) * 2;
                const uint16_t x0 = a[(p * 12 + r) * 2], x1 = a[(p * 12 + r) * 2 + 1];
                acc = vdp_step(acc, w[1], x1);
                acc = vdp_step(acc, w[0], x0);
            }
            c[r * 32 + j] = acc;
        }
}

/* n int8 codes [n/32][32] -> bf16 pairs [ceil(n/64)][32][2], an odd last row's partner 0. */
static void decode_i8_pairs_generic(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    (void)dt;
    const int8_t *s = src;
    uint16_t *d = (uint16_t *)dst;
    const int64_t rows = n / 32;
    for (int64_t r = 0; r < rows; r += 2)
        for (int j = 0; j < 32; j++) {
            d[(r / 2 * 32 + j) * 2] = ql_fp32_to_bf16((float)s[r * 32 + j]);
            d[(r / 2 * 32 + j) * 2 + 1] = r + 1 < rows ? ql_fp32_to_bf16((float)s[(r + 1) * 32 + j]) : 0;
        }
}

const ql_f32_kernel ql_bf16_gemm_12x32c2__generic = {QL_ISA_GENERIC, "bf16_gemm_12x32c2__generic", 12, 32,
                                                     tile_12x32c2_generic, NULL, NULL, 0, NULL, 0, 2, 1, NULL, 0, 0, NULL};
const ql_f32_kernel ql_bf16_gemm_12x32c2i8__generic = {QL_ISA_GENERIC, "bf16_gemm_12x32c2i8__generic", 12, 32,
                                                       tile_12x32c2_generic, decode_i8_pairs_generic, NULL, 0, NULL, 0, 0, 1, NULL, 0, 0, NULL};

/* ---- A model of TDPBF16PS (x86 AMX-BF16), the arithmetic Intel's SDM writes
 * for it, in the layouts of bf16_gemm_32x32c2__amx and …i8__amx (A panels
 * [kp/32][32][32], B bf16 pairs of whole 32-k blocks; f32.h, tile_k = 32).
 * Per output and 32-k block (one instruction), two fp32 FMA chains from 0
 * over the block's 16 pairs, one of the even k and one of the odd, then
 *     c = c + (even + odd)
 * every step rounded to nearest even with bf16-denormal operands and denormal
 * fp32 inputs read as 0 and tiny results flushed (as vdp_step); NaN payloads
 * not modelled (any NaN). The hardware's internal order is not architected
 * beyond this pseudo-code: the contract is the float64 bound of
 * docs/NUMERICS.md §4.2, which this model meets (test_bf16), and the tests
 * report how many outputs of the real instruction differ from the model
 * instead of requiring none. Not a fast path: only tests use it. */

static float ftz_add(float x, float y)
{
    if (isnan(x) || isnan(y)) return fbits(0xffc00000u);
    return rn_ftz((double)flush(x) + (double)flush(y)); /* exact in double but for far exponents: RN_24(RN_53) = RN_24 */
}

/* a: a packed A panel's slice ([ceil(k/32)][32][32]); b: bf16 pairs [ceil(k/32)·16][32][2]. */
static void tile_32x32c2_tdp(int64_t k, const float *av, int64_t lda, const float *bv, float *c, int accumulate)
{
    (void)lda;
    const uint16_t *a = (const uint16_t *)av, *b = (const uint16_t *)bv;
    for (int r = 0; r < 32; r++)
        for (int j = 0; j < 32; j++) {
            float acc = accumulate ? c[r * 32 + j] : 0.0f;
            for (int64_t blk = 0; blk * 32 < k; blk++) {
                const uint16_t *x = a + (blk * 32 + r) * 32, *w = b + blk * 16 * 64 + 2 * j;
                float even = 0.0f, odd = 0.0f;
                for (int p = 0; p < 16; p++) {
                    even = vdp_step(even, w[p * 64], x[2 * p]);
                    odd = vdp_step(odd, w[p * 64 + 1], x[2 * p + 1]);
                }
                acc = ftz_add(acc, ftz_add(even, odd));
            }
            c[r * 32 + j] = acc;
        }
}

/* n int8 codes [n/32][32] -> bf16 pairs of whole 32-k blocks, zero past n/32 rows. */
static void decode_i8_tdp(ql_dtype dt, const void *src, int64_t n, float *dst)
{
    (void)dt;
    const int8_t *s = src;
    uint16_t *d = (uint16_t *)dst;
    const int64_t rows = n / 32, padded = (rows + 31) / 32 * 32;
    for (int64_t r = 0; r < padded; r++)
        for (int j = 0; j < 32; j++) d[(r / 2 * 32 + j) * 2 + r % 2] = r < rows ? ql_fp32_to_bf16((float)s[r * 32 + j]) : 0;
}

const ql_f32_kernel ql_bf16_tdp_32x32c2__generic = {QL_ISA_GENERIC, "bf16_tdp_32x32c2__generic", 32, 32, tile_32x32c2_tdp,
                                                    NULL, NULL, 0, NULL, 0, 2, 1, NULL, 0, 32, NULL};
const ql_f32_kernel ql_bf16_tdp_32x32c2i8__generic = {QL_ISA_GENERIC, "bf16_tdp_32x32c2i8__generic", 32, 32,
                                                      tile_32x32c2_tdp, decode_i8_tdp, NULL, 0, NULL, 0, 0, 1, NULL, 0, 32,
                                                      NULL};
