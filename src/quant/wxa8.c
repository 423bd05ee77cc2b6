/* W4A8 / W6A8 reference numerics (docs/FORMATS.md §5, §5.6): e4m3, decode to the
 * int8 grid, dequantize, and the weight quantizers of comfy-kitchen's eager
 * backend. The quantizer works on 16 groups at once, one group per lane, so
 * every per-group sum keeps the reference's summation order while the
 * compiler vectorizes across groups. */
#include "quant/wxa8.h"

#include <math.h>
#include <stdlib.h>

float ql_e4m3_to_fp32(uint8_t b)
{
    const int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return (b & 0x80) ? -v : v;
}

uint8_t ql_fp32_to_e4m3(float x)
{
    /* c10's fp8e4m3fn_from_fp32_value: |x| >= 480 (and NaN) -> 0x7F; below
     * the smallest normal (2^-6) a float add against 2^14 rounds to a
     * multiple of 2^-9; else round the mantissa to 3 bits, ties to even. */
    uint32_t f, sign;
    memcpy(&f, &x, 4);
    sign = f & 0x80000000u;
    f ^= sign;
    uint8_t r;
    if (f >= (1087u << 20)) r = 0x7F;
    else if (f < (121u << 23)) {
        float a, d;
        uint32_t dm = 141u << 23, ab;
        memcpy(&a, &f, 4);
        memcpy(&d, &dm, 4);
        a = a + d;
        memcpy(&ab, &a, 4);
        r = (uint8_t)(ab - dm);
    } else {
        uint32_t odd = (f >> 20) & 1;
        f += ((uint32_t)(7 - 127) << 23) + 0x7FFFF;
        f += odd;
        r = (uint8_t)(f >> 20);
    }
    return (uint8_t)(r | (sign >> 24));
}

/* ------------------------------------------------------------- checks */

bool ql_wxa8_group_ok(int bits, int64_t g)
{
    if (bits == 6) return g >= 16 && g % 16 == 0;
    return g >= 4 && (16 % g == 0 || g % 16 == 0);
}

ql_status ql_wxa8_check(const ql_wxa8_weight *w)
{
    const char *fn = "ql_wxa8_check";
    QL_CHECK_PTR(fn, w);
    if (w->bits != 4 && w->bits != 6)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: bits = %d; W4A8/W6A8 codes have 4 or 6 bits", fn, w->bits);
    if (w->n < 0 || w->k < 0 || w->k > QL_MAX_ELEMENTS / (w->n > 0 ? w->n : 1))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: bad shape [%lld, %lld]", fn, (long long)w->n, (long long)w->k);
    const int64_t kmul = w->bits == 6 ? 32 : 16;
    if (w->k % kmul != 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: K = %lld is not a multiple of %lld (%d-bit codes)", fn,
                       (long long)w->k, (long long)kmul, w->bits);
    if (!ql_wxa8_group_ok(w->bits, w->group))
        return ql_fail(QL_ERR_INVALID_ARGUMENT,
                       w->bits == 6 ? "%s: group_size %lld must be a multiple of 16 for 6-bit codes"
                                    : "%s: group_size %lld must be 4, 8, 16 or a multiple of 16",
                       fn, (long long)w->group);
    if (w->k % w->group != 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: K = %lld is not a multiple of group_size %lld", fn,
                       (long long)w->k, (long long)w->group);
    if (!ql_group_valid(w->convrot_group))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: convrot_groupsize %lld is not a power of 4 in [4, 65536]", fn,
                       (long long)w->convrot_group);
    if (w->k % w->convrot_group != 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: K = %lld is not a multiple of convrot_groupsize %lld", fn,
                       (long long)w->k, (long long)w->convrot_group);
    if (w->bits == 6 && (w->codebook || w->correction))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: a 6-bit layer has no %s", fn,
                       w->codebook ? "codebook" : "correction");
    if (w->n == 0 || w->k == 0) return QL_OK;
    QL_CHECK_PTR(fn, w->q);
    QL_CHECK_PTR(fn, w->s_rel);
    QL_CHECK_PTR(fn, w->s_channel);
    if (w->ldq < ql_wxa8_row_bytes(w->bits, w->k))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: ldq = %lld is less than a packed row (%lld bytes)", fn,
                       (long long)w->ldq, (long long)ql_wxa8_row_bytes(w->bits, w->k));
    if (w->correction) QL_TRY(ql_check_float_dtype(fn, "correction_dtype", w->correction_dtype));
    const int64_t ng = w->k / w->group;
    for (int64_t i = 0; i < w->n * ng; i++) {
        float s = w->s_rel_f32 ? ((const float *)w->s_rel)[i] : ql_e4m3_to_fp32(((const uint8_t *)w->s_rel)[i]);
        if (!isfinite(s))
            return ql_fail(QL_ERR_NONFINITE, "%s: s_rel[%lld, %lld] is %s", fn, (long long)(i / ng), (long long)(i % ng),
                           isnan(s) ? "NaN" : "infinite");
    }
    for (int64_t i = 0; i < w->n; i++)
        if (!isfinite(w->s_channel[i]))
            return ql_fail(QL_ERR_NONFINITE, "%s: s_channel[%lld] is %s", fn, (long long)i,
                           isnan(w->s_channel[i]) ? "NaN" : "infinite");
    if (w->codebook)
        for (int i = 0; i < 16; i++)
            if (!isfinite(w->codebook[i]))
                return ql_fail(QL_ERR_NONFINITE, "%s: codebook[%d] is not finite", fn, i);
    if (w->correction)
        for (int64_t i = 0; i < w->n * ng; i++)
            if (!isfinite(ql_load_f(w->correction_dtype, w->correction, i)))
                return ql_fail(QL_ERR_NONFINITE, "%s: correction[%lld, %lld] is not finite", fn, (long long)(i / w->n),
                               (long long)(i % w->n));
    return QL_OK;
}

/* ------------------------------------------------------- decode / dequant */

void ql_wxa8_values(const ql_wxa8_weight *w, float *values)
{
    const int levels = 1 << w->bits;
    for (int c = 0; c < levels; c++)
        values[c] = w->bits == 6 ? (float)(c - 32) : w->codebook ? w->codebook[c] : (float)(c - 8);
}

void ql_wxa8_unpack_row(int bits, const uint8_t *row, int64_t k, uint8_t *codes)
{
    for (int64_t j = 0; j < k; j++) {
        uint8_t b = row[j >> 1];
        codes[j] = (j & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15);
        if (bits == 6) codes[j] |= (uint8_t)(((row[k / 2 + j / 4] >> (2 * (j % 4))) & 3) << 4);
    }
}

void ql_wxa8_pack_row(int bits, const uint8_t *codes, int64_t k, uint8_t *row)
{
    memset(row, 0, (size_t)ql_wxa8_row_bytes(bits, k));
    for (int64_t j = 0; j < k; j++) {
        row[j >> 1] |= (uint8_t)((codes[j] & 15) << (4 * (j & 1)));
        if (bits == 6) row[k / 2 + j / 4] |= (uint8_t)(((codes[j] >> 4) & 3) << (2 * (j % 4)));
    }
}

float ql_wxa8_s_rel(const ql_wxa8_weight *w, int64_t row, int64_t g)
{
    const int64_t i = row * (w->k / w->group) + g;
    return w->s_rel_f32 ? ((const float *)w->s_rel)[i] : ql_e4m3_to_fp32(((const uint8_t *)w->s_rel)[i]);
}

ql_status ql_wxa8_decode(const ql_wxa8_weight *w, int8_t *grid, int64_t ldg)
{
    QL_TRY(ql_wxa8_check(w));
    QL_TRY(ql_check_matrix("ql_wxa8_decode", "grid", grid, w->n, w->k, ldg));
    if (w->n == 0 || w->k == 0) return QL_OK;
    uint8_t *codes = malloc((size_t)w->k);
    if (!codes) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_wxa8_decode: out of memory");
    float values[64];
    ql_wxa8_values(w, values);
    for (int64_t r = 0; r < w->n; r++) {
        ql_wxa8_unpack_row(w->bits, w->q + r * w->ldq, w->k, codes);
        for (int64_t j = 0; j < w->k; j++)
            grid[r * ldg + j] = ql_wxa8_grid(values[codes[j]], ql_wxa8_s_rel(w, r, j / w->group));
    }
    free(codes);
    return QL_OK;
}

ql_status ql_wxa8_dequantize(const ql_wxa8_weight *w, ql_dtype odt, void *out, int64_t ldo)
{
    QL_TRY(ql_wxa8_check(w));
    QL_TRY(ql_check_float_dtype("ql_wxa8_dequantize", "out_dtype", odt));
    QL_TRY(ql_check_matrix("ql_wxa8_dequantize", "out", out, w->n, w->k, ldo));
    if (w->n == 0 || w->k == 0) return QL_OK;
    int8_t *g = malloc((size_t)(w->n * w->k));
    float *row = malloc((size_t)w->k * sizeof(float));
    ql_status st = g && row ? ql_wxa8_decode(w, g, w->k) : ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_wxa8_dequantize: out of memory");
    for (int64_t r = 0; st == QL_OK && r < w->n; r++) {
        for (int64_t j = 0; j < w->k; j++) {
            float v = (float)g[r * w->k + j] * w->s_channel[r];
            if (w->correction) v = v + ql_load_f(w->correction_dtype, w->correction, (j / w->group) * w->n + r);
            row[j] = ql_round_to(odt, v);
        }
        for (int64_t j0 = 0; j0 < w->k; j0 += w->convrot_group) ql_fwht_f32(row + j0, w->convrot_group);
        for (int64_t j = 0; j < w->k; j++) ql_store_f(odt, out, r * ldo + j, row[j]);
    }
    free(g);
    free(row);
    return st;
}

/* ------------------------------------------------------------ quantizer */

/* The fixed 16-entry LUT (Lloyd-Max levels of a group-normalized Gaussian),
 * as Python floats rounded to fp32. */
static const double FIXED_LUT[16] = {-0.980602, -0.794529, -0.638165, -0.500986, -0.377321, -0.263187,
                                     -0.155210, -0.050720, 0.052541,  0.156985,  0.265284,  0.379533,
                                     0.502636,  0.638953,  0.794876,  0.980671};

void ql_wxa8_fixed_lut(float cb[16])
{
    for (int i = 0; i < 16; i++) cb[i] = (float)FIXED_LUT[i];
}

#define L 16 /* groups per batch: one per lane */
#define KURT_SAMPLE ((int64_t)1 << 19) /* the reference's kurtosis sample */
#define LLOYD_SAMPLE ((int64_t)300000) /* and its Lloyd-Max sample */

/* Sum of the group's p[j] (stored [j][L]) in the order PyTorch's vectorized
 * CPU reduction uses for a group of 16 (measured, docs/FORMATS.md §5.2): eight
 * lanes a[j] = p[j] + p[j+8] (+ p[j+16] ... for larger groups), then a[0] +
 * a[1] + ... left to right. Groups below 8: left to right. */
static void lane_sum(const float (*p)[L], int64_t g, float *out)
{
    float a[8][L];
    const int w = g < 8 ? 1 : 8;
    for (int j = 0; j < w; j++)
        for (int l = 0; l < L; l++) a[j][l] = p[j][l];
    for (int64_t j = w; j < g; j++)
        for (int l = 0; l < L; l++) a[j % w][l] = a[j % w][l] + p[j][l];
    if (g < 8) {
        for (int l = 0; l < L; l++) out[l] = a[0][l];
        return;
    }
    for (int l = 0; l < L; l++) out[l] = a[0][l];
    for (int j = 1; j < 8; j++)
        for (int l = 0; l < L; l++) out[l] = out[l] + a[j][l];
}

/* Nearest of the nondecreasing levels lv[0..nl) (stride st) to t, the
 * reference's way: pos = searchsorted-left (first level >= t), compare the neighbours pos-1 and pos (clamped), the upper one
 * only if strictly closer. A NaN level set gives index 0 and value NaN. */
/* searchsorted-left: the number of levels below t (branch-free; nl is 16 or 63). */
static inline int lower_bound(const float *lv, int st, int nl, float t)
{
    int lo = 0;
    for (int step = nl == 16 ? 8 : 32; step; step >>= 1) lo += lv[(lo + step - 1) * st] < t ? step : 0;
    if (nl == 16) lo += lv[lo * st] < t;
    return lo;
}

static inline int nearest1(const float *lv, int st, int nl, float t, float *val)
{
    const int lo = lower_bound(lv, st, nl, t);
    const int a = lo - 1 < 0 ? 0 : lo - 1, b = lo > nl - 1 ? nl - 1 : lo;
    const int up = fabsf(t - lv[b * st]) < fabsf(t - lv[a * st]);
    *val = lv[(up ? b : a) * st];
    return up ? b : a;
}

/* nearest1 for each lane: levels shared (lv[nl]) or per lane ([nl][L]). */
static void nearest(const float *lv, int nl, int per_lane, const float *t, int *idx, float *val)
{
    for (int l = 0; l < L; l++) idx[l] = per_lane ? nearest1(lv + l, L, nl, t[l], &val[l]) : nearest1(lv, 1, nl, t[l], &val[l]);
}

static inline float rne(float x) { return rintf(x); }
static inline float clampf(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Work space of one batch of L groups of one row. */
typedef struct qbatch {
    int64_t g;          /* group size */
    float (*w)[L];      /* [g][L] the rotated weights, transposed */
    float (*p)[L];      /* [g][L] products */
    float (*v)[L];      /* [g][L] current levels (shifted values) */
    int (*c)[L];        /* [g][L] codes */
    float gs[L];
    int sr;             /* stochastic rounding (else nearest) */
    const float *noise; /* its noise: element (j, l) has noise[l·g + j] (the row's, from this batch's first group) */
} qbatch;

/* The stochastic-rounding noise of element (j, l) of the batch. */
static inline float batch_noise(const qbatch *b, int64_t j, int l) { return b->noise[l * b->g + j]; }

/* Codebook mode, steps 2 (ALS) and the shifted values of step 3. */
static void batch_codebook(qbatch *b, const float *cb)
{
    const int64_t g = b->g;
    float num[L], den[L], t[L];
    for (int l = 0; l < L; l++) b->gs[l] = 0.0f;
    for (int64_t j = 0; j < g; j++)
        for (int l = 0; l < L; l++) b->gs[l] = fmaxf(b->gs[l], fabsf(b->w[j][l]));
    for (int l = 0; l < L; l++) b->gs[l] = b->gs[l] > 1e-8f ? b->gs[l] : 1e-8f;
    for (int pass = 0; pass <= 2; pass++) {
        if (pass > 0) { /* gs = max(Σ w·cb[c] / max(Σ cb[c]², 1e-8), 1e-8) */
            for (int64_t j = 0; j < g; j++)
                for (int l = 0; l < L; l++) b->p[j][l] = b->w[j][l] * b->v[j][l];
            lane_sum((const float (*)[L])b->p, g, num);
            for (int64_t j = 0; j < g; j++)
                for (int l = 0; l < L; l++) b->p[j][l] = b->v[j][l] * b->v[j][l];
            lane_sum((const float (*)[L])b->p, g, den);
            for (int l = 0; l < L; l++) {
                float q = num[l] / (den[l] > 1e-8f ? den[l] : 1e-8f);
                b->gs[l] = q > 1e-8f ? q : 1e-8f;
            }
        }
        for (int64_t j = 0; j < g; j++) {
            for (int l = 0; l < L; l++) t[l] = b->w[j][l] / b->gs[l];
            nearest(cb, 16, 0, t, b->c[j], b->v[j]);
        }
    }
    for (int64_t j = 0; j < g; j++)
        for (int l = 0; l < L; l++) b->v[j][l] = b->v[j][l] * b->gs[l];
}

static void batch_uniform(qbatch *b)
{
    const int64_t g = b->g;
    for (int l = 0; l < L; l++) b->gs[l] = 0.0f;
    for (int64_t j = 0; j < g; j++)
        for (int l = 0; l < L; l++) b->gs[l] = fmaxf(b->gs[l], fabsf(b->w[j][l]));
    for (int l = 0; l < L; l++) {
        float s = b->gs[l] / 7.0f;
        b->gs[l] = s > 1e-8f ? s : 1e-8f;
    }
    for (int64_t j = 0; j < g; j++)
        for (int l = 0; l < L; l++) {
            const float x = clampf(b->w[j][l] / b->gs[l], -64.0f, 64.0f);
            float s = clampf(b->sr ? floorf(x + batch_noise(b, j, l)) : rne(x), -8.0f, 7.0f);
            b->c[j][l] = (int)s + 8;
            b->v[j][l] = s * b->gs[l];
        }
}

/* Asymmetric: b->p receives the per-lane minimum in row 0. */
static void batch_asym(qbatch *b, float *mn)
{
    const int64_t g = b->g;
    float mx[L];
    for (int l = 0; l < L; l++) mn[l] = mx[l] = b->w[0][l];
    for (int64_t j = 1; j < g; j++)
        for (int l = 0; l < L; l++) {
            mn[l] = fminf(mn[l], b->w[j][l]);
            mx[l] = fmaxf(mx[l], b->w[j][l]);
        }
    for (int l = 0; l < L; l++) {
        float s = (mx[l] - mn[l]) / 15.0f;
        b->gs[l] = s > 1e-8f ? s : 1e-8f;
    }
    for (int64_t j = 0; j < g; j++)
        for (int l = 0; l < L; l++) {
            const float x = clampf((b->w[j][l] - mn[l]) / b->gs[l], -64.0f, 64.0f);
            float c = clampf(b->sr ? floorf(x + batch_noise(b, j, l)) : rne(x), 0.0f, 15.0f);
            b->c[j][l] = (int)c;
            b->v[j][l] = (c - 8.0f) * b->gs[l];
        }
}

static void batch_6bit(qbatch *b)
{
    const int64_t g = b->g;
    float num[L], den[L];
    for (int l = 0; l < L; l++) b->gs[l] = 0.0f;
    for (int64_t j = 0; j < g; j++)
        for (int l = 0; l < L; l++) b->gs[l] = fmaxf(b->gs[l], fabsf(b->w[j][l]));
    for (int l = 0; l < L; l++) {
        float s = b->gs[l] / 31.0f;
        b->gs[l] = s > 1e-8f ? s : 1e-8f;
    }
    for (int pass = 0; pass <= 2; pass++) {
        if (pass > 0) {
            for (int64_t j = 0; j < g; j++)
                for (int l = 0; l < L; l++) b->p[j][l] = b->w[j][l] * b->v[j][l];
            lane_sum((const float (*)[L])b->p, g, num);
            for (int64_t j = 0; j < g; j++)
                for (int l = 0; l < L; l++) b->p[j][l] = b->v[j][l] * b->v[j][l];
            lane_sum((const float (*)[L])b->p, g, den);
            for (int l = 0; l < L; l++) {
                float q = num[l] / (den[l] > 1e-8f ? den[l] : 1e-8f);
                b->gs[l] = q > 1e-8f ? q : 1e-8f;
            }
        }
        for (int64_t j = 0; j < g; j++)
            for (int l = 0; l < L; l++) b->v[j][l] = clampf(rne(clampf(b->w[j][l] / b->gs[l], -64.0f, 64.0f)), -31.0f, 31.0f);
    }
    for (int64_t j = 0; j < g; j++)
        for (int l = 0; l < L; l++) b->v[j][l] = b->v[j][l] * b->gs[l];
}

/* The decoded int8 level of value v at scale s (NaN if v·s is NaN). */
static inline float grid_level(float v, float s)
{
    const float x = v * s;
    return x != x ? NAN : clampf(rne(clampf(x, -256.0f, 256.0f)), -127.0f, 127.0f);
}

/* Step 5 (codebook) / the 6-bit grid-aware search: codes against the decoded
 * int8 grid of each lane's s_rel (e4m3 bytes srb, or fp32 srf when srb is
 * NULL). t = w / s_channel. With b->sr, the final assignment rounds
 * stochastically between the bracketing levels (scales as in the nearest
 * mode: the search, if any, is decided by nearest assignments). */
static void batch_regrid(qbatch *b, const float *cb, int bits, int search, float sch, uint8_t *srb, float *srf)
{
    const int64_t g = b->g;
    const int nl = bits == 6 ? 63 : 16;
    float lv[63 * L], t[L], err[L], best[L], val[L], cs[3][L];
    int idx[L];
    uint8_t cand[3][L];
    const int ncand = bits == 6 && search ? 3 : 1;
    for (int l = 0; l < L; l++) {
        if (srb) {
            uint8_t s = srb[l];
            cand[0][l] = s;
            uint8_t m1 = (uint8_t)(s - 1), p1 = (uint8_t)(s + 1);
            cand[1][l] = m1 > 1 ? m1 : 1;
            cand[2][l] = p1 < 0x7E ? p1 : 0x7E;
            for (int c = 0; c < 3; c++) cs[c][l] = ql_e4m3_to_fp32(cand[c][l]);
        } else { /* the reference: base·(1 - 0.03), base·(1 + 0.03) with fp32 factors */
            cs[0][l] = srf[l];
            cs[1][l] = srf[l] * (float)(1.0 - 0.03);
            cs[2][l] = srf[l] * (float)(1.0 + 0.03);
        }
        best[l] = INFINITY;
    }
    int chosen[L] = {0};
    for (int cnd = 0; cnd < ncand; cnd++) {
        for (int l = 0; l < L; l++) {
            for (int i = 0; i < nl; i++) lv[i * L + l] = grid_level(bits == 6 ? (float)(i - 31) : cb[i], cs[cnd][l]);
            err[l] = 0.0f;
        }
        for (int64_t j = 0; j < g; j++) {
            for (int l = 0; l < L; l++) t[l] = b->w[j][l] / sch;
            nearest(lv, nl, 1, t, idx, val);
            for (int l = 0; l < L; l++) {
                float d = val[l] - t[l];
                b->p[j][l] = d * d;
                if (cnd == 0) b->c[j][l] = idx[l];
                else b->v[j][l] = (float)idx[l]; /* candidate codes, kept below if it wins */
            }
        }
        if (ncand == 1) break;
        lane_sum((const float (*)[L])b->p, g, err);
        for (int l = 0; l < L; l++) {
            const int wins = cnd == 0 || err[l] < best[l];
            if (!wins) continue;
            best[l] = err[l];
            chosen[l] = cnd;
            if (cnd > 0)
                for (int64_t j = 0; j < g; j++) b->c[j][l] = (int)b->v[j][l];
        }
    }
    for (int l = 0; l < L; l++) {
        if (srb) srb[l] = cand[chosen[l]][l];
        else srf[l] = cs[chosen[l]][l];
    }
    if (b->sr) { /* stochastic: lo = clamp(searchsorted-left - 1, 0, nl - 2); hi iff t > U·width + level_lo */
        for (int l = 0; l < L; l++)
            for (int i = 0; i < nl; i++) lv[i * L + l] = grid_level(bits == 6 ? (float)(i - 31) : cb[i], cs[chosen[l]][l]);
        for (int64_t j = 0; j < g; j++)
            for (int l = 0; l < L; l++) {
                const float tt = b->w[j][l] / sch;
                int lo = lower_bound(lv + l, L, nl, tt) - 1;
                lo = lo < 0 ? 0 : lo > nl - 2 ? nl - 2 : lo;
                const float base = lv[lo * L + l], width = lv[(lo + 1) * L + l] - base;
                const float thr = batch_noise(b, j, l) * width + base;
                b->c[j][l] = lo + (tt > thr);
            }
    }
    if (bits == 6)
        for (int64_t j = 0; j < g; j++)
            for (int l = 0; l < L; l++) b->c[j][l] += 1; /* level index -> stored code (level + 32) */
}

static int64_t lane_count(int64_t ng, int64_t g0) { return ng - g0 < L ? ng - g0 : L; }

ql_status ql_wxa8_quantize(ql_dtype dtype, const void *w, int64_t rows, int64_t k, int64_t ldw, const ql_wxa8_qparams *p,
                           uint8_t *q, int64_t ldq, uint8_t *s_rel, float *s_channel, float *correction)
{
    return ql_wxa8_quantize_ex(dtype, w, rows, k, ldw, p, NULL, q, ldq, s_rel, s_channel, correction);
}

ql_status ql_wxa8_quantize_ex(ql_dtype dtype, const void *w, int64_t rows, int64_t k, int64_t ldw,
                              const ql_wxa8_qparams *p, const ql_wxa8_qoptions *o, uint8_t *q, int64_t ldq,
                              void *s_rel, float *s_channel, float *correction)
{
    const char *fn = "ql_wxa8_quantize";
    const ql_wxa8_qoptions none = {0, 0, 0, 0};
    if (!o) o = &none;
    QL_CHECK_PTR(fn, p);
    QL_TRY(ql_check_float_dtype(fn, "dtype", dtype));
    QL_TRY(ql_check_matrix(fn, "w", w, rows, k, ldw));
    const int bits = p->mode == QL_WXA8_6BIT ? 6 : 4;
    const int64_t g = p->group ? p->group : 16, cg = p->convrot_group ? p->convrot_group : 256;
    ql_wxa8_weight shape = {.n = rows, .k = k, .bits = bits, .group = g, .convrot_group = cg};
    {
        /* shape rules only (no data yet) */
        ql_wxa8_weight s0 = shape;
        s0.n = 0;
        QL_TRY(ql_wxa8_check(&s0));
    }
    if (p->mode < QL_WXA8_CODEBOOK || p->mode > QL_WXA8_6BIT)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown mode %d", fn, (int)p->mode);
    if (p->mode == QL_WXA8_CODEBOOK) QL_CHECK_PTR(fn, p->codebook);
    const int torch_sr = o->sr_seed && o->sr_stream == QL_SR_TORCH_CPU;
    if (o->sr_stream != QL_SR_CUDA_PCG && o->sr_stream != QL_SR_TORCH_CPU)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown sr_stream %d", fn, o->sr_stream);
    if (o->sr_idx0 < 0 || (torch_sr && k > 0 && o->sr_idx0 % k != 0))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: sr_idx0 = %lld must be >= 0%s", fn, (long long)o->sr_idx0,
                       torch_sr ? " and a multiple of K (the torch stream starts at a row)" : "");
    if (rows == 0 || k == 0) return QL_OK;
    QL_CHECK_PTR(fn, q);
    QL_CHECK_PTR(fn, s_rel);
    QL_CHECK_PTR(fn, s_channel);
    if (p->mode == QL_WXA8_ASYM) QL_CHECK_PTR(fn, correction);
    if (ldq < ql_wxa8_row_bytes(bits, k)) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: ldq is less than a packed row", fn);
    if (p->mode == QL_WXA8_CODEBOOK)
        for (int i = 0; i < 16; i++)
            if (!isfinite(p->codebook[i]) || (i && !(p->codebook[i] >= p->codebook[i - 1])))
                return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: the codebook must be 16 finite ascending values", fn);
    const int64_t ng = k / g;
    const size_t plane = (size_t)g * L * sizeof(float);
    float *row = ql_aligned_alloc((size_t)k * sizeof(float));
    float *gsrow = ql_aligned_alloc((size_t)ng * sizeof(float)), *mnrow = ql_aligned_alloc((size_t)ng * sizeof(float));
    float *vrow = ql_aligned_alloc((size_t)k * sizeof(float));
    uint8_t *codes = ql_aligned_alloc((size_t)k);
    char *ws = ql_aligned_alloc(4 * plane);
    /* the row's noise, padded for the unused lanes of the last batch */
    const int64_t nnoise = o->sr_seed ? (ng + L) * g : 1;
    float *noise = ql_aligned_alloc((size_t)nnoise * sizeof(float));
    if (!row || !gsrow || !mnrow || !vrow || !codes || !ws || !noise) {
        ql_aligned_free(row), ql_aligned_free(gsrow), ql_aligned_free(mnrow), ql_aligned_free(vrow);
        ql_aligned_free(codes), ql_aligned_free(ws), ql_aligned_free(noise);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    for (int64_t i = 0; i < nnoise; i++) noise[i] = 0.0f;
    qbatch b = {g, (float (*)[L])ws, (float (*)[L])(ws + plane), (float (*)[L])(ws + 2 * plane),
                (int (*)[L])(ws + 3 * plane), {0}, o->sr_seed != 0, noise};
    /* the torch stream: eager's chunks of B rows, chunk R0 seeded with seed + R0 */
    const int64_t chunk = k < ((int64_t)1 << 22) ? ((int64_t)1 << 22) / k : 1, row0 = o->sr_idx0 / k;
    ql_mt19937 mt;
    const int f32 = o->s_rel_f32 != 0;
    int64_t bad = -1;
    for (int64_t r = 0; r < rows; r++) {
        ql_load_row_rotated(dtype, ql_row_cptr(dtype, w, r, ldw), k, cg, row);
        if (torch_sr) { /* drawn for every row, finite or not */
            const int64_t ra = row0 + r, c0 = ra - ra % chunk;
            if (r == 0 || ra == c0) {
                ql_mt19937_seed(&mt, o->sr_seed + (uint64_t)c0);
                ql_mt19937_skip(&mt, (ra - c0) * k);
            }
            ql_torch_rand_fill(&mt, QL_F32, k, noise);
        } else if (o->sr_seed)
            for (int64_t j = 0; j < k; j++) noise[j] = ql_sr_noise(o->sr_idx0 + r * k + j, o->sr_seed);
        int finite = 1;
        for (int64_t j = 0; j < k; j++) finite &= isfinite(row[j]) != 0;
        if (!finite) {
            if (bad < 0) bad = r;
            memset(q + r * ldq, 0, (size_t)ql_wxa8_row_bytes(bits, k));
            if (f32)
                for (int64_t gi = 0; gi < ng; gi++) ((float *)s_rel)[r * ng + gi] = NAN;
            else memset((uint8_t *)s_rel + r * ng, 0x7F, (size_t)ng);
            s_channel[r] = NAN;
            continue;
        }
        /* pass 1: group scales, shifted values (and codes of the uniform modes) */
        float amax = 0.0f;
        for (int64_t g0 = 0; g0 < ng; g0 += L) {
            const int64_t nlanes = lane_count(ng, g0);
            for (int64_t j = 0; j < g; j++)
                for (int l = 0; l < L; l++) b.w[j][l] = l < nlanes ? row[(g0 + l) * g + j] : 0.0f;
            b.noise = noise + g0 * g;
            float mn[L] = {0};
            switch (p->mode) {
            case QL_WXA8_CODEBOOK: batch_codebook(&b, p->codebook); break;
            case QL_WXA8_UNIFORM: batch_uniform(&b); break;
            case QL_WXA8_ASYM: batch_asym(&b, mn); break;
            default: batch_6bit(&b); break;
            }
            for (int l = 0; l < nlanes; l++) {
                gsrow[g0 + l] = b.gs[l];
                mnrow[g0 + l] = mn[l];
                for (int64_t j = 0; j < g; j++) {
                    vrow[(g0 + l) * g + j] = b.v[j][l];
                    codes[(g0 + l) * g + j] = (uint8_t)b.c[j][l];
                    amax = fmaxf(amax, fabsf(b.v[j][l]));
                }
            }
        }
        float sch = amax / 127.0f;
        sch = sch > 1e-8f ? sch : 1e-8f;
        s_channel[r] = sch;
        uint8_t *sr = f32 ? NULL : (uint8_t *)s_rel + r * ng;
        float *srf = f32 ? (float *)s_rel + r * ng : NULL;
        for (int64_t gi = 0; gi < ng; gi++) {
            if (f32) srf[gi] = gsrow[gi] / sch;
            else sr[gi] = ql_fp32_to_e4m3(gsrow[gi] / sch);
        }
        if (p->mode == QL_WXA8_ASYM)
            for (int64_t gi = 0; gi < ng; gi++) correction[r * ng + gi] = 8.0f * gsrow[gi] + mnrow[gi];
        /* pass 2: codebook / 6-bit codes on the decoded grid */
        if (p->mode == QL_WXA8_CODEBOOK || p->mode == QL_WXA8_6BIT)
            for (int64_t g0 = 0; g0 < ng; g0 += L) {
                const int64_t nlanes = lane_count(ng, g0);
                uint8_t srl[L];
                float srlf[L];
                for (int l = 0; l < L; l++) {
                    srl[l] = l < nlanes && !f32 ? sr[g0 + l] : 0x38;
                    srlf[l] = l < nlanes && f32 ? srf[g0 + l] : 1.0f;
                }
                for (int64_t j = 0; j < g; j++)
                    for (int l = 0; l < L; l++) b.w[j][l] = l < nlanes ? row[(g0 + l) * g + j] : 0.0f;
                b.noise = noise + g0 * g;
                batch_regrid(&b, p->codebook, bits, p->scale_search, sch, f32 ? NULL : srl, srlf);
                for (int l = 0; l < nlanes; l++) {
                    if (f32) srf[g0 + l] = srlf[l];
                    else sr[g0 + l] = srl[l];
                    for (int64_t j = 0; j < g; j++) codes[(g0 + l) * g + j] = (uint8_t)b.c[j][l];
                }
            }
        ql_wxa8_pack_row(bits, codes, k, q + r * ldq);
    }
    ql_aligned_free(row), ql_aligned_free(gsrow), ql_aligned_free(mnrow), ql_aligned_free(vrow);
    ql_aligned_free(codes), ql_aligned_free(ws), ql_aligned_free(noise);
    if (bad >= 0)
        return ql_fail(QL_ERR_NONFINITE, "%s: row %lld holds (or rotates to) NaN or Inf; refusing to quantize it", fn,
                       (long long)bad);
    return QL_OK;
}

/* ------------------------------------------------------------ codebook */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* torch.linspace(start, end, steps)[i] in fp32 on the CPU (measured, torch
 * 2.15): the first half fma(step, i, start), the second fma(-step,
 * steps - 1 - i, end), step = (end - start) / (steps - 1) in fp32. */
static float torch_linspace(float start, float end, int64_t steps, int64_t i)
{
    const float step = steps > 1 ? (end - start) / (float)(steps - 1) : 0.0f;
    return i < steps / 2 ? fmaf(step, (float)i, start) : fmaf(-step, (float)(steps - 1 - i), end);
}

/* c10::CeilLog2 */
static int64_t ceil_log2(int64_t x)
{
    int64_t r = 0;
    if (x <= 2) return 1;
    for (uint64_t v = (uint64_t)(x - 1); v; v >>= 1) r++;
    return r;
}

/* The sum torch's CPU cascade_sum gives for n contiguous fp32 values on one
 * thread (SumKernel.cpp, measured to agree bit for bit with torch 2.15 on an
 * AVX-512 machine): lanes of W = 8, four vector accumulators (ilp) summed
 * with a 4-level cascade of 2^max(4, ceil_log2(rows)/4)-row steps, the
 * leftover vectors into accumulator 0, then 0 + 1 + 2 + 3; finally the
 * scalar tail from 0 and the 8 lanes added to it in order. Below 8 values:
 * the same ilp-4 row sum on scalars. */
enum { TS_W = 8, TS_ILP = 4, TS_LEVELS = 4 };

static void ts_multi_row(const float *x, int64_t stride_row, int w, int64_t size, float out[TS_ILP][TS_W])
{
    float acc[TS_LEVELS][TS_ILP][TS_W];
    memset(acc, 0, sizeof acc);
    const int64_t pw = ceil_log2(size) / TS_LEVELS > 4 ? ceil_log2(size) / TS_LEVELS : 4;
    const int64_t step = (int64_t)1 << pw, mask = step - 1;
    int64_t i = 0;
    for (; i + step <= size;) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int r = 0; r < TS_ILP; r++)
                for (int l = 0; l < w; l++) acc[0][r][l] = acc[0][r][l] + x[i * stride_row + r * w + l];
        for (int j = 1; j < TS_LEVELS; j++) {
            for (int r = 0; r < TS_ILP; r++)
                for (int l = 0; l < w; l++) {
                    acc[j][r][l] = acc[j][r][l] + acc[j - 1][r][l];
                    acc[j - 1][r][l] = 0.0f;
                }
            if ((i & (mask << (j * pw))) != 0) break;
        }
    }
    for (; i < size; i++)
        for (int r = 0; r < TS_ILP; r++)
            for (int l = 0; l < w; l++) acc[0][r][l] = acc[0][r][l] + x[i * stride_row + r * w + l];
    for (int j = 1; j < TS_LEVELS; j++)
        for (int r = 0; r < TS_ILP; r++)
            for (int l = 0; l < w; l++) acc[0][r][l] = acc[0][r][l] + acc[j][r][l];
    for (int r = 0; r < TS_ILP; r++)
        for (int l = 0; l < w; l++) out[r][l] = acc[0][r][l];
}

/* row_sum over `size` items of w lanes (w = 1: scalars; w = 8: vectors). */
static void ts_row_sum(const float *x, int w, int64_t size, float out[TS_W])
{
    float ps[TS_ILP][TS_W];
    const int64_t rows = size / TS_ILP;
    ts_multi_row(x, TS_ILP * w, w, rows, ps);
    for (int64_t i = rows * TS_ILP; i < size; i++)
        for (int l = 0; l < w; l++) ps[0][l] = ps[0][l] + x[i * w + l];
    for (int r = 1; r < TS_ILP; r++)
        for (int l = 0; l < w; l++) ps[0][l] = ps[0][l] + ps[r][l];
    for (int l = 0; l < w; l++) out[l] = ps[0][l];
}

static float torch_sum(const float *x, int64_t n)
{
    float lanes[TS_W];
    if (n < TS_W) {
        ts_row_sum(x, 1, n, lanes);
        return 0.0f + lanes[0];
    }
    const int64_t nv = n / TS_W;
    ts_row_sum(x, TS_W, nv, lanes);
    float acc = 0.0f;
    for (int64_t i = nv * TS_W; i < n; i++) acc = acc + x[i];
    for (int l = 0; l < TS_W; l++) acc = acc + lanes[l];
    return acc;
}

/* torch.quantile's linear interpolation (measured, torch 2.15): the rank
 * q·(n - 1) in double from the fp32 q, and the lerp in double from the
 * nearer end, rounded once to fp32. */
static float torch_quantile(const float *sorted, int64_t n, float q)
{
    const double rank = (double)q * (double)(n - 1);
    const int64_t lo = (int64_t)rank, hi = (int64_t)ceil(rank) < n ? (int64_t)ceil(rank) : n - 1;
    const double a = sorted[lo], b = sorted[hi], w = rank - (double)lo;
    return (float)(w < 0.5 ? a + w * (b - a) : b - (b - a) * (1.0 - w));
}

ql_status ql_wxa8_fit_codebook(ql_dtype dtype, const void *w, int64_t n, int64_t k, int64_t ldw,
                               const ql_wxa8_qparams *p, float cb[16], int *fitted)
{
    const char *fn = "ql_wxa8_fit_codebook";
    QL_CHECK_PTR(fn, p);
    QL_CHECK_PTR(fn, cb);
    QL_TRY(ql_check_float_dtype(fn, "dtype", dtype));
    QL_TRY(ql_check_matrix(fn, "w", w, n, k, ldw));
    const int64_t g = p->group ? p->group : 16, cg = p->convrot_group ? p->convrot_group : 256;
    ql_wxa8_weight s0 = {.n = 0, .k = k, .bits = 4, .group = g, .convrot_group = cg};
    QL_TRY(ql_wxa8_check(&s0));
    if (fitted) *fitted = 0;
    ql_wxa8_fixed_lut(cb);
    if (n == 0 || k == 0) return QL_OK;
    /* The row sample: R = max(1, 2^22 // K) rows at torch.linspace(0, N-1, R).long(). */
    int64_t R = ((int64_t)1 << 22) / k;
    if (R < 1) R = 1;
    if (R > n) R = n;
    const int64_t nv = R * k;
    /* the samples draw from one stream seeded with 0: the first 2^19 (kurtosis)
     * and, from a fresh generator, the first 300000 (Lloyd-Max) indices */
    const int64_t nk = nv > KURT_SAMPLE ? KURT_SAMPLE : nv, ns = nv > LLOYD_SAMPLE ? LLOYD_SAMPLE : nv;
    float *v = malloc((size_t)nv * sizeof(float));
    float *x = malloc((size_t)(nk > ns ? nk : ns) * sizeof(float) * 2);
    int64_t *idx = malloc((size_t)(nk > ns ? nk : ns) * sizeof(int64_t));
    if (!v || !x || !idx) {
        free(v), free(x), free(idx);
        return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld floats", fn, (long long)nv);
    }
    for (int64_t i = 0; i < R; i++) {
        const int64_t r = R == n ? i : (int64_t)torch_linspace(0.0f, (float)(n - 1), R, i);
        float *xr = v + i * k;
        ql_load_row_rotated(dtype, ql_row_cptr(dtype, w, r, ldw), k, cg, xr);
        for (int64_t g0 = 0; g0 < k; g0 += g) {
            float a = 0.0f;
            for (int64_t j = 0; j < g; j++) a = fmaxf(a, fabsf(xr[g0 + j]));
            a = a > 1e-8f ? a : 1e-8f;
            for (int64_t j = 0; j < g; j++) xr[g0 + j] = xr[g0 + j] / a;
        }
    }
    int finite = 1;
    for (int64_t i = 0; i < nv; i++) finite &= isfinite(v[i]) != 0;
    if (!finite) {
        free(v), free(x), free(idx);
        return ql_fail(QL_ERR_NONFINITE, "%s: the weight holds (or rotates to) NaN or Inf", fn);
    }
    if (nv > nk) {
        ql_torch_randint(0, 0, nv, 0, nk, idx);
        for (int64_t i = 0; i < nk; i++) x[i] = v[idx[i]];
    } else memcpy(x, v, (size_t)nv * sizeof(float));
    /* Excess kurtosis with the unbiased sigma, in double: only its side of
     * -0.1 matters (the reference's fp32 value can differ within rounding). */
    double mu = 0, m2 = 0, m4 = 0;
    for (int64_t i = 0; i < nk; i++) mu += x[i];
    mu /= (double)nk;
    for (int64_t i = 0; i < nk; i++) m2 += (x[i] - mu) * (x[i] - mu);
    double sigma = nk > 1 ? sqrt(m2 / (double)(nk - 1)) : 0.0;
    for (int64_t i = 0; i < nk; i++) {
        double z = (x[i] - mu) / (sigma + 1e-9);
        m4 += z * z * z * z;
    }
    double kurt = m4 / (double)nk - 3.0;
    if (kurt <= -0.1) {
        free(v), free(x), free(idx);
        return QL_OK;
    }
    /* Lloyd-Max (eager _fit_codebook), in fp32 as torch computes it: the
     * samples (the first 300000 indices of the stream above, or every value
     * in order); init at torch.quantile(samples, linspace(0, 1, 16)); 25
     * iterations of: assign to the first nearest level (|s - cb| in fp32),
     * each non-empty cluster's level = torch's sum of its samples (in sample
     * order) / count. */
    float *s = x, *sorted = x + ns;
    if (nv > ns) {
        if (nv > nk) /* the same stream: the first ns of the nk indices */
            for (int64_t i = 0; i < ns; i++) s[i] = v[idx[i]];
        else {
            ql_torch_randint(0, 0, nv, 0, ns, idx);
            for (int64_t i = 0; i < ns; i++) s[i] = v[idx[i]];
        }
    } else memcpy(s, v, (size_t)ns * sizeof(float));
    memcpy(sorted, s, (size_t)ns * sizeof(float));
    qsort(sorted, (size_t)ns, sizeof(float), cmp_float);
    for (int i = 0; i < 16; i++) cb[i] = torch_quantile(sorted, ns, torch_linspace(0.0f, 1.0f, 16, i));
    /* clusters are gathered in sample order into `sorted` (reused) */
    int64_t cnt[16], start[17];
    uint8_t *asg = (uint8_t *)idx;
    for (int it = 0; it < 25; it++) {
        memset(cnt, 0, sizeof cnt);
        for (int64_t i = 0; i < ns; i++) {
            int best = 0;
            float bd = fabsf(s[i] - cb[0]);
            for (int c = 1; c < 16; c++) {
                float d = fabsf(s[i] - cb[c]);
                if (d < bd) bd = d, best = c;
            }
            asg[i] = (uint8_t)best;
            cnt[best]++;
        }
        start[0] = 0;
        for (int c = 0; c < 16; c++) start[c + 1] = start[c] + cnt[c];
        int64_t pos[16];
        for (int c = 0; c < 16; c++) pos[c] = start[c];
        for (int64_t i = 0; i < ns; i++) sorted[pos[asg[i]]++] = s[i];
        for (int c = 0; c < 16; c++)
            if (cnt[c]) cb[c] = torch_sum(sorted + start[c], cnt[c]) / (float)cnt[c];
    }
    qsort(cb, 16, sizeof(float), cmp_float);
    free(v), free(x), free(idx);
    if (fitted) *fitted = 1;
    return QL_OK;
}
