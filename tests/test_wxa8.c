/* W4A8 / W6A8 numerics against independent models: e4m3 both ways, decode
 * to the int8 grid, pack/unpack, the quantizers (a per-group scalar model of
 * the reference, written separately from the library's lane-batched code),
 * and the linears (decode once / decode in the GEMM, every ISA) against the
 * reference int8 linear on the decoded grid and against float64. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "quant/wxa8.h"
#include "testutil.h"

/* ---------------------------------------------------------------- models */

static long double model_e4m3(unsigned b)
{
    int s = (b >> 7) & 1, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    long double v = e ? ldexpl(1.0L + m / 8.0L, e - 7) : ldexpl((long double)m, -9);
    return s ? -v : v;
}

/* fp32 -> e4m3 by brute force: the nearest finite e4m3 value, ties to the
 * even code; what rounds above 448 (|x| > 464, NaN) -> NaN, as c10 (whose
 * rounding carries into the NaN pattern 0x7F). */
static unsigned model_to_e4m3(float x)
{
    if (isnan(x) || fabsf(x) > 464.0f) return signbit(x) ? 0xFF : 0x7F;
    unsigned best = 0;
    long double bd = INFINITY;
    for (unsigned b = 0; b < 0x7F; b++) {
        long double d = fabsl(fabsl((long double)x) - model_e4m3(b));
        if (d < bd || (d == bd && (b & 1) == 0 && (best & 1))) bd = d, best = b;
    }
    return best | (signbit(x) ? 0x80u : 0u);
}

static int model_grid(long double v, long double s)
{
    long double x = model_round_dtype(QL_F32, v * s); /* the fp32 product */
    long double r = nearbyintl(x);
    return (int)(r > 127 ? 127 : r < -127 ? -127 : r);
}

/* ------------------------------------------------------------- e4m3 tests */

static void test_e4m3(void)
{
    int bad = 0;
    for (unsigned b = 0; b < 256; b++) {
        float f = ql_e4m3_to_fp32((uint8_t)b);
        long double m = model_e4m3(b);
        if (isnan(m) ? !isnan(f) : (long double)f != m) bad++;
    }
    CHECK(bad == 0, "e4m3 decode: %d of 256 bytes differ from the model", bad);
    /* encode: every value, every midpoint (ties), neighbours, random values,
     * subnormals, the overflow edge */
    bad = 0;
    int n = 0;
    for (unsigned b = 0; b < 0x7F; b++) {
        float v = (float)model_e4m3(b), nx = b + 1 < 0x7F ? (float)model_e4m3(b + 1) : 480.0f;
        float probes[6] = {v, -v, 0.5f * (v + nx), nextafterf(0.5f * (v + nx), 0), nextafterf(0.5f * (v + nx), 1e9f),
                           -0.5f * (v + nx)};
        for (int i = 0; i < 6; i++, n++) {
            if (ql_fp32_to_e4m3(probes[i]) != model_to_e4m3(probes[i]))
                printf("  e4m3(%a) = %02x, model %02x\n", probes[i], ql_fp32_to_e4m3(probes[i]), model_to_e4m3(probes[i]));
            bad += ql_fp32_to_e4m3(probes[i]) != model_to_e4m3(probes[i]);
        }
    }
    for (int i = 0; i < 20000; i++, n++) {
        float x = (float)(tu_gauss() * ldexp(1.0, (int)tu_range(-14, 9)));
        bad += ql_fp32_to_e4m3(x) != model_to_e4m3(x);
    }
    float edge[] = {448.0f, 463.99f, 464.0f, 464.01f, 479.9f, 480.0f, 1e30f, INFINITY, NAN, 0.0f, -0.0f, 1e-30f, 0x1p-10f,
                    0x1.8p-10f, 0x1p-9f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++, n++) {
        unsigned got = ql_fp32_to_e4m3(edge[i]), want = model_to_e4m3(edge[i]);
        if (isnan(edge[i])) want = 0x7F;
        if (got != want) printf("  e4m3(%a) = %02x, model %02x\n", edge[i], got, want);
        bad += got != want;
    }
    CHECK(bad == 0, "e4m3 encode: %d of %d probes differ from the nearest-even model", bad, n);
}

/* ------------------------------------------------------ pack / decode */

static void random_weight(int bits, int64_t n, int64_t k, int64_t g, int codebook, int s_f32, ql_wxa8_weight *w,
                          uint8_t **codes_out)
{
    const int64_t ng = k / g;
    uint8_t *codes = malloc((size_t)(n * k));
    uint8_t *q = malloc((size_t)(n * ql_wxa8_row_bytes(bits, k)));
    void *sr = malloc((size_t)(n * ng) * (s_f32 ? 4 : 1));
    float *sc = malloc((size_t)n * 4);
    float *cb = codebook ? malloc(64) : NULL;
    for (int64_t i = 0; i < n * k; i++) codes[i] = (uint8_t)(tu_next() % (bits == 6 ? 64 : 16)); /* 6 bits: code 0 too */
    for (int64_t r = 0; r < n; r++) ql_wxa8_pack_row(bits, codes + r * k, k, q + r * ql_wxa8_row_bytes(bits, k));
    for (int64_t i = 0; i < n * ng; i++) {
        uint8_t b;
        int kind = (int)(tu_next() % 8);
        if (kind == 0) b = (uint8_t)tu_range(0, 7);        /* zero and subnormals */
        else if (kind == 1) b = (uint8_t)tu_range(0x70, 0x7E); /* large: the ±127 clamp */
        else b = (uint8_t)tu_range(0x08, 0x6F);
        if (s_f32) ((float *)sr)[i] = (float)model_e4m3(b) * (float)(0.75 + 0.5 * tu_uniform());
        else ((uint8_t *)sr)[i] = b;
    }
    for (int64_t i = 0; i < n; i++) sc[i] = (float)(1e-3 * (0.5 + tu_uniform()));
    if (cb) {
        for (int i = 0; i < 16; i++) cb[i] = (float)(-1.0 + 2.0 * (i + tu_uniform()) / 16.0);
    }
    *w = (ql_wxa8_weight){.n = n, .k = k, .bits = bits, .q = q, .ldq = ql_wxa8_row_bytes(bits, k), .s_rel = sr,
                          .s_rel_f32 = s_f32, .s_channel = sc, .codebook = cb, .group = g, .convrot_group = 16};
    *codes_out = codes;
}

static void free_weight(ql_wxa8_weight *w)
{
    free((void *)w->q);
    free((void *)w->s_rel);
    free((void *)w->s_channel);
    free((void *)w->codebook);
    free((void *)w->correction);
}

static void test_pack_decode(void)
{
    int clamps = 0;
    const struct { int bits; int64_t g; int cb, f32; } cases[] = {
        {4, 4, 1, 0}, {4, 8, 0, 0}, {4, 16, 1, 0}, {4, 32, 0, 1}, {4, 64, 1, 1}, {6, 16, 0, 0}, {6, 32, 0, 1}, {6, 64, 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n = tu_range(1, 9), k = 64 * tu_range(1, 4);
        ql_wxa8_weight w;
        uint8_t *codes;
        random_weight(cases[c].bits, n, k, cases[c].g, cases[c].cb, cases[c].f32, &w, &codes);
        /* unpack(pack(codes)) == codes, and the file layout by hand for row 0 */
        uint8_t *back = malloc((size_t)k);
        int bad = 0;
        for (int64_t r = 0; r < n; r++) {
            ql_wxa8_unpack_row(w.bits, w.q + r * w.ldq, k, back);
            bad += memcmp(back, codes + r * k, (size_t)k) != 0;
        }
        CHECK(bad == 0, "pack/unpack round trip, %d bits: %d rows differ", w.bits, bad);
        int lay = 0;
        for (int64_t j = 0; j < k; j++) {
            int lo = (w.q[j / 2] >> (4 * (j % 2))) & 15;
            int hi = w.bits == 6 ? (w.q[k / 2 + j / 4] >> (2 * (j % 4))) & 3 : 0;
            lay += (lo | hi << 4) != codes[j];
        }
        CHECK(lay == 0, "file layout, %d bits: %d codes not where docs/FORMATS.md puts them", w.bits, lay);
        int8_t *grid = malloc((size_t)(n * k));
        CHECK_OK(ql_wxa8_decode(&w, grid, k));
        int wrong = 0, clamp = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++) {
                int code = codes[r * k + j];
                long double v = w.bits == 6 ? code - 32 : w.codebook ? w.codebook[code] : code - 8;
                long double s = w.s_rel_f32 ? ((const float *)w.s_rel)[r * (k / w.group) + j / w.group]
                                            : model_e4m3(((const uint8_t *)w.s_rel)[r * (k / w.group) + j / w.group]);
                int want = model_grid(v, s);
                wrong += grid[r * k + j] != want;
                clamp += abs(want) == 127;
            }
        CHECK(wrong == 0, "decode %d-bit g=%lld %s %s: %d of %lld grid values differ from the model", w.bits,
              (long long)w.group, w.codebook ? "codebook" : "uniform", w.s_rel_f32 ? "f32" : "e4m3", wrong,
              (long long)(n * k));
        clamps += clamp;
        free(back);
        free(grid);
        free(codes);
        free_weight(&w);
    }
    CHECK(clamps > 0, "the decode cases exercised the ±127 clamp (%d values)", clamps);
}

/* --------------------------------------------------- quantizer model */

static float m_clamp(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Σ p[0..g) in the reference's order (docs/FORMATS.md §5.2) */
static float m_sum(const float *p, int64_t g)
{
    if (g < 8) {
        float s = p[0];
        for (int64_t j = 1; j < g; j++) s += p[j];
        return s;
    }
    float a[8];
    for (int j = 0; j < 8; j++) {
        a[j] = p[j];
        for (int64_t i = j + 8; i < g; i += 8) a[j] += p[i];
    }
    float s = a[0];
    for (int j = 1; j < 8; j++) s += a[j];
    return s;
}

static int m_nearest(const float *lv, int nl, float t)
{
    int pos = 0;
    while (pos < nl && lv[pos] < t) pos++; /* searchsorted left */
    int lo = pos - 1 < 0 ? 0 : pos - 1, hi = pos > nl - 1 ? nl - 1 : pos;
    return fabsf(t - lv[hi]) < fabsf(t - lv[lo]) ? hi : lo;
}

/* One row (already rotated, fp32) the way the reference does it, group by group. */
static void model_wxa8_row(ql_wxa8_mode mode, const float *w, int64_t k, int64_t g, const float *cb, int search,
                               uint8_t *codes, uint8_t *srel, float *sch_out)
{
    const int64_t ng = k / g;
    float *gs = malloc((size_t)ng * 4), *sh = malloc((size_t)k * 4), *p = malloc((size_t)g * 4);
    float amax = 0;
    for (int64_t gi = 0; gi < ng; gi++) {
        const float *x = w + gi * g;
        float *v = sh + gi * g;
        uint8_t *c = codes + gi * g;
        float a = 0;
        for (int64_t j = 0; j < g; j++) a = fmaxf(a, fabsf(x[j]));
        float s;
        if (mode == QL_WXA8_CODEBOOK) {
            s = fmaxf(a, 1e-8f);
            for (int it = 0; it < 3; it++) {
                if (it) {
                    for (int64_t j = 0; j < g; j++) p[j] = x[j] * cb[c[j]];
                    float num = m_sum(p, g);
                    for (int64_t j = 0; j < g; j++) p[j] = cb[c[j]] * cb[c[j]];
                    float den = m_sum(p, g);
                    s = fmaxf(num / fmaxf(den, 1e-8f), 1e-8f);
                }
                for (int64_t j = 0; j < g; j++) c[j] = (uint8_t)m_nearest(cb, 16, x[j] / s);
            }
            for (int64_t j = 0; j < g; j++) v[j] = cb[c[j]] * s;
        } else if (mode == QL_WXA8_UNIFORM) {
            s = fmaxf(a / 7.0f, 1e-8f);
            for (int64_t j = 0; j < g; j++) {
                float q = m_clamp(rintf(x[j] / s), -8, 7);
                c[j] = (uint8_t)(q + 8);
                v[j] = q * s;
            }
        } else {
            s = fmaxf(a / 31.0f, 1e-8f);
            float q[4096];
            for (int it = 0; it < 3; it++) {
                if (it) {
                    for (int64_t j = 0; j < g; j++) p[j] = x[j] * q[j];
                    float num = m_sum(p, g);
                    for (int64_t j = 0; j < g; j++) p[j] = q[j] * q[j];
                    float den = m_sum(p, g);
                    s = fmaxf(num / fmaxf(den, 1e-8f), 1e-8f);
                }
                for (int64_t j = 0; j < g; j++) q[j] = m_clamp(rintf(x[j] / s), -31, 31);
            }
            for (int64_t j = 0; j < g; j++) v[j] = q[j] * s;
        }
        gs[gi] = s;
        for (int64_t j = 0; j < g; j++) amax = fmaxf(amax, fabsf(v[j]));
    }
    float sch = fmaxf(amax / 127.0f, 1e-8f);
    *sch_out = sch;
    for (int64_t gi = 0; gi < ng; gi++) {
        srel[gi] = (uint8_t)model_to_e4m3(gs[gi] / sch);
        const float *x = w + gi * g;
        uint8_t *c = codes + gi * g;
        if (mode == QL_WXA8_CODEBOOK) {
            float lv[16], s = (float)model_e4m3(srel[gi]);
            for (int i = 0; i < 16; i++) lv[i] = m_clamp(rintf(cb[i] * s), -127, 127);
            for (int64_t j = 0; j < g; j++) c[j] = (uint8_t)m_nearest(lv, 16, x[j] / sch);
        } else if (mode == QL_WXA8_6BIT) {
            unsigned b = srel[gi], cand[3] = {b, (unsigned)((uint8_t)(b - 1)) > 1 ? (uint8_t)(b - 1) : 1u,
                                              b + 1 < 0x7E ? b + 1 : 0x7E};
            float best = INFINITY;
            for (int ci = 0; ci < (search ? 3 : 1); ci++) {
                float lv[63], s = (float)model_e4m3(cand[ci]);
                if (isnan(s)) continue;
                for (int i = 0; i < 63; i++) lv[i] = m_clamp(rintf((float)(i - 31) * s), -127, 127);
                uint8_t cc[4096];
                for (int64_t j = 0; j < g; j++) {
                    float t = x[j] / sch;
                    cc[j] = (uint8_t)m_nearest(lv, 63, t);
                    p[j] = (lv[cc[j]] - t) * (lv[cc[j]] - t);
                }
                float err = m_sum(p, g);
                if (ci == 0 || err < best) {
                    best = err;
                    srel[gi] = (uint8_t)cand[ci];
                    for (int64_t j = 0; j < g; j++) c[j] = (uint8_t)(cc[j] + 1);
                }
            }
        }
    }
    free(gs);
    free(sh);
    free(p);
}

static double rel_l2_f(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void test_quantize_model(void)
{
    const ql_wxa8_mode modes[3] = {QL_WXA8_CODEBOOK, QL_WXA8_UNIFORM, QL_WXA8_6BIT};
    const int64_t groups[] = {16, 16, 32, 64, 4, 8};
    float lut[16];
    ql_wxa8_fixed_lut(lut);
    for (int mi = 0; mi < 3; mi++)
        for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
            const ql_wxa8_mode mode = modes[mi];
            const int64_t g = groups[gi];
            if (mode == QL_WXA8_6BIT && g < 16) continue;
            const ql_dtype dts[3] = {QL_F32, QL_BF16, QL_F16};
            const ql_dtype dt = dts[gi % 3];
            const int64_t n = tu_range(1, 7), k = 256 * tu_range(1, 2);
            float *wf = malloc((size_t)(n * k) * 4);
            uint16_t *wh = malloc((size_t)(n * k) * 2);
            tu_fill_gauss(QL_F32, wf, n * k, 0.02);
            for (int64_t j = 0; j < g; j++) wf[j] = 0.0f; /* a zero group */
            if (k > 2 * g) {                              /* a group with one non-zero */
                for (int64_t j = g; j < 2 * g; j++) wf[j] = 0.0f;
                wf[g + 3] = 0.05f;
            }
            const void *w = wf;
            if (dt != QL_F32) {
                for (int64_t i = 0; i < n * k; i++) wh[i] = dt == QL_BF16 ? ql_fp32_to_bf16(wf[i]) : ql_fp32_to_fp16(wf[i]);
                w = wh;
            }
            const int64_t ng = k / g, rb = ql_wxa8_row_bytes(mode == QL_WXA8_6BIT ? 6 : 4, k);
            uint8_t *q = malloc((size_t)(n * rb)), *sr = malloc((size_t)(n * ng)), *codes = malloc((size_t)k);
            uint8_t *mc = malloc((size_t)k), *msr = malloc((size_t)ng);
            float *sc = malloc((size_t)n * 4), *row = malloc((size_t)k * 4);
            ql_wxa8_qparams p = {mode, g, 256, lut, 1};
            CHECK_OK(ql_wxa8_quantize(dt, w, n, k, k, &p, q, rb, sr, sc, NULL));
            int bad_codes = 0, bad_s = 0;
            for (int64_t r = 0; r < n; r++) {
                ql_load_row_rotated(dt, ql_row_cptr(dt, w, r, k), k, 256, row);
                float msc;
                model_wxa8_row(mode, row, k, g, lut, 1, mc, msr, &msc);
                ql_wxa8_unpack_row(mode == QL_WXA8_6BIT ? 6 : 4, q + r * rb, k, codes);
                for (int64_t j = 0; j < k; j++) bad_codes += codes[j] != mc[j];
                bad_s += memcmp(msr, sr + r * ng, (size_t)ng) != 0 || msc != sc[r];
            }
            CHECK(bad_codes == 0 && bad_s == 0, "quantize mode %d g=%lld %s [%lld, %lld]: %d codes and %d rows' scales "
                  "differ from the per-group model", (int)mode, (long long)g, ql_dtype_name(dt), (long long)n,
                  (long long)k, bad_codes, bad_s);
            /* the zero group decodes to zeros; the lone value survives */
            ql_wxa8_weight ww = {.n = n, .k = k, .bits = mode == QL_WXA8_6BIT ? 6 : 4, .q = q, .ldq = rb, .s_rel = sr,
                                 .s_channel = sc, .codebook = mode == QL_WXA8_CODEBOOK ? lut : NULL, .group = g,
                                 .convrot_group = 256};
            float *deq = malloc((size_t)(n * k) * 4), *ref = malloc((size_t)(n * k) * 4);
            CHECK_OK(ql_wxa8_dequantize(&ww, QL_F32, deq, k));
            for (int64_t i = 0; i < n * k; i++) ref[i] = ql_load_f(dt, w, i);
            double e = rel_l2_f(deq, ref, n * k);
            double bound = mode == QL_WXA8_6BIT ? 0.04 : mode == QL_WXA8_CODEBOOK ? 0.14 : 0.17;
            CHECK(e < bound, "quantize mode %d g=%lld: weight rel-L2 %.4f < %.2f", (int)mode, (long long)g, e, bound);
            free(wf), free(wh), free(q), free(sr), free(codes), free(mc), free(msr), free(sc), free(row), free(deq), free(ref);
        }
}

/* Hand-checkable: K = 16, group 16, ConvRot 16 of a weight whose rotation is
 * exact: w = H·e_0 ⇒ rotated row = e_0 (a single 1, the rest 0). */
static void test_quantize_hand(void)
{
    float h[256], w[16];
    CHECK_OK(ql_hadamard(16, h));
    for (int j = 0; j < 16; j++) w[j] = h[j * 16]; /* column 0 of H (= row 0) */
    float lut[16];
    ql_wxa8_fixed_lut(lut);
    uint8_t q[12], sr[1];
    float sc;
    ql_wxa8_qparams p = {QL_WXA8_UNIFORM, 16, 16, NULL, 0};
    CHECK_OK(ql_wxa8_quantize(QL_F32, w, 1, 16, 16, &p, q, 8, sr, &sc, NULL));
    /* rotated: [1, 0 × 15]: gs = 1/7; codes 15 (7+8) then 8s; s_channel = 7·(1/7)/127; s_rel = (1/7)/s_ch ≈ 18.14 */
    uint8_t codes[16];
    ql_wxa8_unpack_row(4, q, 16, codes);
    int ok = codes[0] == 15;
    for (int j = 1; j < 16; j++) ok &= codes[j] == 8;
    float gs = 1.0f / 7.0f, sch = (7.0f * gs) / 127.0f;
    CHECK(ok && sc == sch && sr[0] == ql_fp32_to_e4m3(gs / sch), "uniform hand case: codes %d,%d.. s_ch %g (want %g) s_rel 0x%02x",
          codes[0], codes[1], sc, sch, sr[0]);
    p = (ql_wxa8_qparams){QL_WXA8_CODEBOOK, 16, 16, lut, 0};
    CHECK_OK(ql_wxa8_quantize(QL_F32, w, 1, 16, 16, &p, q, 8, sr, &sc, NULL));
    ql_wxa8_unpack_row(4, q, 16, codes);
    /* t = w/gs: 1 -> level 15 (0.980671); 0 -> a tie-free nearest: index 7 (-0.050720) */
    ok = codes[0] == 15;
    for (int j = 1; j < 16; j++) ok &= codes[j] == 7;
    CHECK(ok, "codebook hand case: codes %d, %d (want 15, 7)", codes[0], codes[1]);
}

/* 6 bits: the search never does worse than no search (per group, on the grid). */
static void test_search(void)
{
    const int64_t n = 8, k = 512, g = 16, ng = k / g, rb = ql_wxa8_row_bytes(6, k);
    float *w = malloc((size_t)(n * k) * 4);
    tu_fill_gauss(QL_F32, w, n * k, 1.0);
    uint8_t *q[2], *sr[2];
    float *sc[2];
    for (int s = 0; s < 2; s++) {
        q[s] = malloc((size_t)(n * rb));
        sr[s] = malloc((size_t)(n * ng));
        sc[s] = malloc((size_t)n * 4);
        ql_wxa8_qparams p = {QL_WXA8_6BIT, g, 256, NULL, s};
        CHECK_OK(ql_wxa8_quantize(QL_F32, w, n, k, k, &p, q[s], rb, sr[s], sc[s], NULL));
    }
    int worse = 0, changed = 0;
    double tot[2] = {0, 0};
    float *row = malloc((size_t)k * 4);
    uint8_t codes[512];
    for (int64_t r = 0; r < n; r++) {
        ql_load_row_rotated(QL_F32, w + r * k, k, 256, row);
        double e[2][64] = {{0}};
        for (int s = 0; s < 2; s++) {
            ql_wxa8_unpack_row(6, q[s] + r * rb, k, codes);
            for (int64_t j = 0; j < k; j++) {
                double d = model_grid(codes[j] - 32, model_e4m3(sr[s][r * ng + j / g])) - (double)row[j] / sc[s][r];
                e[s][j / g] += d * d;
            }
        }
        for (int64_t gi = 0; gi < ng; gi++) {
            worse += e[1][gi] > e[0][gi] * (1 + 1e-5) + 1e-9;
            changed += sr[1][r * ng + gi] != sr[0][r * ng + gi];
            tot[0] += e[0][gi];
            tot[1] += e[1][gi];
        }
    }
    CHECK(worse == 0, "6-bit scale search: %d groups worse than without it", worse);
    CHECK(changed > 0 && tot[1] < tot[0], "6-bit scale search changed %d scales; error %.4g -> %.4g", changed, tot[0], tot[1]);
    for (int s = 0; s < 2; s++) free(q[s]), free(sr[s]), free(sc[s]);
    free(w);
    free(row);
}

/* ------------------------------------------------------------ linears */

static void test_linear(void)
{
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    ql_isa isas[32];
    const int n_isas = tu_isas(isas);
    float lut[16];
    ql_wxa8_fixed_lut(lut);
    /* Error energy over all cases of a bit width, normalised by sum |x_r|^2 |w_j|^2
     * (the output's expected energy): a single case with N = M = 1 is one
     * chi-square(1) draw and no bound on it can be both tight and safe. */
    double num_b[2] = {0, 0}, den_b[2] = {0, 0};
    for (int c = 0; c < 6; c++) {
        const ql_wxa8_mode mode = c % 3 == 0 ? QL_WXA8_CODEBOOK : c % 3 == 1 ? QL_WXA8_UNIFORM : QL_WXA8_6BIT;
        const int bits = mode == QL_WXA8_6BIT ? 6 : 4;
        const int64_t g = bits == 6 ? 16 * tu_range(1, 2) : (int64_t[]){4, 8, 16, 32}[tu_range(0, 3)];
        const int64_t n = tu_range(1, 70), k = 256 * tu_range(1, 3), m = c == 0 ? 1 : tu_range(2, 40);
        const ql_dtype xdt = c % 2 ? QL_BF16 : QL_F32;
        float *wf = malloc((size_t)(n * k) * 4), *xf = malloc((size_t)(m * k) * 4);
        uint16_t *xb = malloc((size_t)(m * k) * 2);
        tu_fill_gauss(QL_F32, wf, n * k, 0.02);
        tu_fill_gauss(QL_F32, xf, m * k, 1.0);
        for (int64_t i = 0; i < m * k; i++) {
            xb[i] = ql_fp32_to_bf16(xf[i]);
            if (xdt == QL_BF16) xf[i] = ql_bf16_to_fp32(xb[i]);
        }
        const void *x = xdt == QL_BF16 ? (const void *)xb : xf;
        const int64_t ng = k / g, rb = ql_wxa8_row_bytes(bits, k);
        uint8_t *q = malloc((size_t)(n * rb)), *sr = malloc((size_t)(n * ng));
        float *sc = malloc((size_t)n * 4);
        ql_wxa8_qparams p = {mode, g, 256, lut, 1};
        CHECK_OK(ql_wxa8_quantize(QL_F32, wf, n, k, k, &p, q, rb, sr, sc, NULL));
        ql_wxa8_weight w = {.n = n, .k = k, .bits = bits, .q = q, .ldq = rb, .s_rel = sr, .s_channel = sc,
                            .codebook = mode == QL_WXA8_CODEBOOK ? lut : NULL, .group = g, .convrot_group = 256};
        int8_t *grid = malloc((size_t)(n * k));
        CHECK_OK(ql_wxa8_decode(&w, grid, k));
        ql_int8_weight iw = {n, k, grid, k, sc, n, 256, NULL, QL_F32};
        float *yref = malloc((size_t)(m * n) * 4), *y = malloc((size_t)(m * n) * 4);
        CHECK_OK(ql_int8_linear_ref(&iw, x, xdt, m, k, yref, QL_F32, n, NULL));
        /* vs float64 of the unquantized layer */
        double num = 0, den = 0;
        for (int64_t r = 0; r < m; r++) {
            double xx = 0;
            for (int64_t t = 0; t < k; t++) xx += (double)xf[r * k + t] * xf[r * k + t];
            for (int64_t j = 0; j < n; j++) {
                double s = 0, ww = 0;
                for (int64_t t = 0; t < k; t++) s += (double)xf[r * k + t] * wf[j * k + t], ww += (double)wf[j * k + t] * wf[j * k + t];
                num += (yref[r * n + j] - s) * (yref[r * n + j] - s);
                den += xx * ww;
            }
        }
        num_b[bits == 6] += num, den_b[bits == 6] += den;
        /* per case only a gross bound (5x the aggregate one): catches a broken case, not noise */
        CHECK(sqrt(num / den) < (bits == 6 ? 0.2 : 1.0), "%d-bit linear vs float64: normalised error %.4f", bits, sqrt(num / den));
        for (int ii = 0; ii < n_isas; ii++) {
            if (!ql_isa_supported(isas[ii])) continue;
            CHECK_OK(ql_context_set_isa(ctx, isas[ii]));
            for (int kind = 0; kind < 2; kind++) {
                ql_linear_desc d = {.kind = kind ? QL_LINEAR_WXA8_PACKED : QL_LINEAR_W8A8, .wxa8 = w};
                ql_linear *lin = NULL;
                CHECK_OK(ql_linear_create(ctx, &d, &lin));
                memset(y, 0xAB, (size_t)(m * n) * 4);
                CHECK_OK(ql_linear_forward(lin, x, xdt, m, k, y, QL_F32, n, NULL));
                CHECK(memcmp(y, yref, (size_t)(m * n) * 4) == 0,
                      "%s %d-bit g=%lld [%lld x %lld] M=%lld %s: bit-identical to decode + reference",
                      kind ? "packed (decode in GEMM)" : "decode once", bits, (long long)g, (long long)n, (long long)k,
                      (long long)m, ql_isa_name(isas[ii]));
                size_t wb = ql_linear_weight_bytes(lin);
                /* codes, scale bytes, the decode table (256 scale bytes × 2^bits codes), the row scales, and
                 * for signed layouts with a register decode (AMX) the column sums */
                const int64_t npad = (n + 31) / 32 * 32,
                              want = npad * k * bits / 8 + npad * ng + (256 << bits) + 4 * n + 4 * npad;
                if (kind) CHECK(wb <= (size_t)want, "packed resident bytes %zu <= %lld for %lld weights", wb, (long long)want, (long long)(n * k));
                ql_linear_destroy(lin);
            }
        }
        free(wf), free(xf), free(xb), free(q), free(sr), free(sc), free(grid), free(yref), free(y);
    }
    const double e4 = sqrt(num_b[0] / den_b[0]), e6 = sqrt(num_b[1] / den_b[1]);
    CHECK(e4 < 0.2 && e6 < 0.04, "linear vs float64 over all cases: 4-bit %.4f (< 0.2), 6-bit %.4f (< 0.04)", e4, e6);
    CHECK(e6 < e4, "6-bit linear error %.4f is below 4-bit's %.4f (activation error included)", e6, e4);
    ql_context_destroy(ctx);
}

/* Asymmetric W4A8: the int8 GEMM plus the correction term, against float64
 * of the same quantized operands. */
static void test_asym(void)
{
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    const int64_t n = tu_range(1, 50), k = 512, m = tu_range(1, 30), g = (int64_t[]){8, 16, 32}[tu_range(0, 2)],
                  ng = k / g, rb = k / 2;
    float *wf = malloc((size_t)(n * k) * 4), *xf = malloc((size_t)(m * k) * 4);
    tu_fill_gauss(QL_F32, wf, n * k, 0.02);
    for (int64_t i = 0; i < n * k; i++) wf[i] += 0.01f; /* an offset: what asymmetric quantization is for */
    tu_fill_gauss(QL_F32, xf, m * k, 1.0);
    uint8_t *q = malloc((size_t)(n * rb)), *sr = malloc((size_t)(n * ng));
    float *sc = malloc((size_t)n * 4), *corr_rows = malloc((size_t)(n * ng) * 4), *corr = malloc((size_t)(n * ng) * 4);
    ql_wxa8_qparams p = {QL_WXA8_ASYM, g, 256, NULL, 0};
    CHECK_OK(ql_wxa8_quantize(QL_F32, wf, n, k, k, &p, q, rb, sr, sc, corr_rows));
    for (int64_t r = 0; r < n; r++)
        for (int64_t gi = 0; gi < ng; gi++) corr[gi * n + r] = corr_rows[r * ng + gi];
    ql_wxa8_weight w = {.n = n, .k = k, .bits = 4, .q = q, .ldq = rb, .s_rel = sr, .s_channel = sc, .correction = corr,
                        .correction_dtype = QL_F32, .group = g, .convrot_group = 256};
    int8_t *grid = malloc((size_t)(n * k));
    CHECK_OK(ql_wxa8_decode(&w, grid, k));
    /* float64: quantized rotated x times (grid·s_ch + corr) */
    float *xr = malloc((size_t)(m * k) * 4), *sx = malloc((size_t)m * 4);
    int8_t *xq = malloc((size_t)(m * k));
    memcpy(xr, xf, (size_t)(m * k) * 4);
    CHECK_OK(ql_rotate(QL_F32, xr, m, k, k, 256));
    CHECK_OK(ql_quantize_rowwise(QL_F32, xr, m, k, k, xq, k, sx));
    double *ref = malloc((size_t)(m * n) * 8), num_w = 0, den_w = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t t = 0; t < k; t++)
                s += (double)sx[r] * xq[r * k + t] * ((double)grid[j * k + t] * sc[j] + corr[(t / g) * n + j]);
            ref[r * n + j] = s;
        }
    float *deq = malloc((size_t)(n * k) * 4);
    CHECK_OK(ql_wxa8_dequantize(&w, QL_F32, deq, k));
    for (int64_t i = 0; i < n * k; i++) num_w += ((double)deq[i] - wf[i]) * ((double)deq[i] - wf[i]), den_w += (double)wf[i] * wf[i];
    CHECK(sqrt(num_w / den_w) < 0.2, "asymmetric weight rel-L2 %.4f", sqrt(num_w / den_w));
    float *y = malloc((size_t)(m * n) * 4);
    for (int kind = 0; kind < 2; kind++) {
        ql_linear_desc d = {.kind = kind ? QL_LINEAR_WXA8_PACKED : QL_LINEAR_W8A8, .wxa8 = w};
        ql_linear *lin = NULL;
        CHECK_OK(ql_linear_create(ctx, &d, &lin));
        CHECK_OK(ql_linear_forward(lin, xf, QL_F32, m, k, y, QL_F32, n, NULL));
        double num = 0, den = 0, worst = 0;
        for (int64_t i = 0; i < m * n; i++) {
            num += (y[i] - ref[i]) * (y[i] - ref[i]);
            den += ref[i] * ref[i];
        }
        for (int64_t r = 0; r < m; r++) { /* per element, relative to the row's scale */
            double rs = 0;
            for (int64_t j = 0; j < n; j++) rs = fmax(rs, fabs(ref[r * n + j]));
            for (int64_t j = 0; j < n; j++) worst = fmax(worst, fabs(y[r * n + j] - ref[r * n + j]) / (rs > 0 ? rs : 1));
        }
        CHECK(sqrt(num / den) < 2e-5 && worst < 1e-4, "asymmetric %s vs float64: rel-L2 %.3g, worst %.3g",
              kind ? "packed" : "decode once", sqrt(num / den), worst);
        ql_linear_destroy(lin);
    }
    ql_linear_desc d = {.kind = QL_LINEAR_WEIGHT_ONLY, .wxa8 = w};
    ql_linear *lin = NULL;
    CHECK(ql_linear_create(ctx, &d, &lin) == QL_ERR_UNSUPPORTED, "asymmetric weight-only is refused: %s", ql_last_error());
    free(wf), free(xf), free(q), free(sr), free(sc), free(corr_rows), free(corr), free(grid), free(xr), free(sx), free(xq);
    free(ref), free(deq), free(y);
    ql_context_destroy(ctx);
}

static void test_bad_args(void)
{
    uint8_t q[64] = {0}, sr[8] = {0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38};
    float sc[2] = {1, 1}, cb[16] = {0};
    int8_t grid[256];
    ql_wxa8_weight base = {.n = 1, .k = 64, .bits = 4, .q = q, .ldq = 32, .s_rel = sr, .s_channel = sc, .group = 16,
                           .convrot_group = 16};
    CHECK_OK(ql_wxa8_decode(&base, grid, 64));
    struct { const char *what; ql_wxa8_weight w; } bad[8];
    for (int i = 0; i < 8; i++) bad[i].w = base;
    bad[0].what = "K % 16", bad[0].w.k = 40, bad[0].w.group = 8, bad[0].w.ldq = 20;
    bad[1].what = "group 12", bad[1].w.group = 12;
    bad[2].what = "group 24", bad[2].w.group = 24;
    bad[3].what = "6-bit K % 32", bad[3].w.bits = 6, bad[3].w.k = 48, bad[3].w.ldq = 36;
    bad[4].what = "6-bit codebook", bad[4].w.bits = 6, bad[4].w.ldq = 48, bad[4].w.codebook = cb;
    bad[5].what = "K % convrot", bad[5].w.convrot_group = 256;
    bad[6].what = "NaN s_rel", bad[6].w.s_rel = (const uint8_t[]){0x7F, 0x38, 0x38, 0x38};
    bad[7].what = "NaN s_channel", bad[7].w.s_channel = (const float[]){NAN};
    for (int i = 0; i < 8; i++) {
        ql_status st = ql_wxa8_decode(&bad[i].w, grid, 64);
        CHECK(st != QL_OK && strchr(ql_last_error(), '\n') == NULL, "%s refused: %s", bad[i].what, ql_last_error());
    }
}

/* Weight quality on the upstream test's case (384 x 1024 bf16 Gaussian):
 * 6 bits < 0.03 and < 4 bits / 2.5; the scale search < 0.95 x without it. */
static double weight_rel_l2(ql_wxa8_mode mode, const uint16_t *w, int64_t n, int64_t k, int search, const float *cb)
{
    const int bits = mode == QL_WXA8_6BIT ? 6 : 4;
    const int64_t rb = ql_wxa8_row_bytes(bits, k), ng = k / 16;
    uint8_t *q = malloc((size_t)(n * rb)), *sr = malloc((size_t)(n * ng));
    float *sc = malloc((size_t)n * 4), *deq = malloc((size_t)(n * k) * 4), *ref = malloc((size_t)(n * k) * 4);
    ql_wxa8_qparams p = {mode, 16, 256, cb, search};
    CHECK_OK(ql_wxa8_quantize(QL_BF16, w, n, k, k, &p, q, rb, sr, sc, NULL));
    ql_wxa8_weight ww = {.n = n, .k = k, .bits = bits, .q = q, .ldq = rb, .s_rel = sr, .s_channel = sc,
                         .codebook = mode == QL_WXA8_CODEBOOK ? cb : NULL, .group = 16, .convrot_group = 256};
    CHECK_OK(ql_wxa8_dequantize(&ww, QL_F32, deq, k));
    for (int64_t i = 0; i < n * k; i++) ref[i] = ql_bf16_to_fp32(w[i]);
    double e = rel_l2_f(deq, ref, n * k);
    free(q), free(sr), free(sc), free(deq), free(ref);
    return e;
}

static void test_quality(void)
{
    const int64_t n = 384, k = 1024;
    uint16_t *w = malloc((size_t)(n * k) * 2);
    tu_fill_gauss(QL_BF16, w, n * k, 0.02);
    float cb[16];
    int fitted = -1;
    ql_wxa8_qparams p = {QL_WXA8_CODEBOOK, 16, 256, NULL, 0};
    CHECK_OK(ql_wxa8_fit_codebook(QL_BF16, w, n, k, k, &p, cb, &fitted));
    CHECK(fitted == 0, "Gaussian weights select the fixed LUT (kurtosis rule)");
    double e4 = weight_rel_l2(QL_WXA8_CODEBOOK, w, n, k, 0, cb), eu = weight_rel_l2(QL_WXA8_UNIFORM, w, n, k, 0, NULL);
    double e6 = weight_rel_l2(QL_WXA8_6BIT, w, n, k, 1, NULL), e6n = weight_rel_l2(QL_WXA8_6BIT, w, n, k, 0, NULL);
    printf("weight rel-L2 (384x1024 bf16 Gaussian): w4a8 codebook %.4f, uniform %.4f, w6a8 %.4f (no search %.4f)\n", e4,
           eu, e6, e6n);
    CHECK(e4 < 0.12 && e4 < eu, "codebook %.4f beats uniform %.4f", e4, eu);
    CHECK(e6 < 0.03 && e6 < e4 / 2.5, "6-bit %.4f < 0.03 and < 4-bit %.4f / 2.5", e6, e4);
    CHECK(e6 < 0.95 * e6n, "scale search %.4f < 0.95 x no search %.4f", e6, e6n);
    /* heavy tails: most of each group near 0, one spike -> Lloyd-Max */
    for (int64_t i = 0; i < n * k; i++) w[i] = ql_fp32_to_bf16((float)(tu_gauss() * (i % 16 == 0 ? 1.0 : 0.001)));
    p.convrot_group = 4;
    CHECK_OK(ql_wxa8_fit_codebook(QL_BF16, w, n, k, k, &p, cb, &fitted));
    int asc = 1;
    for (int i = 1; i < 16; i++) asc &= cb[i] >= cb[i - 1];
    CHECK(fitted == 1 && asc, "heavy-tailed weights fit a Lloyd-Max codebook (ascending: %d)", asc);
    free(w);
}

/* Packed layers (decoded inside the GEMM: in registers for a few rows, into
 * a buffer for more, blocked for many) against the reference linear of the
 * decoded grid, bit for bit, on raw random layers: every code and scale
 * byte (zero, subnormal, clamping to ±127), every group size, K not a
 * multiple of the kernels' 64-blocks (K padding), N off the 32-column
 * panels, M across the paths' limits, every ISA, one and two threads. */
static void test_packed_paths(void)
{
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    ql_isa isas[32];
    const int n_isas = tu_isas(isas);
    const int64_t ms[] = {1, 2, 3, 4, 7, 8, 9, 13, 40, 100};
    int64_t cases = 0;
    for (int c = 0; c < 24; c++) {
        const ql_wxa8_mode mode = c % 3 == 0 ? QL_WXA8_CODEBOOK : c % 3 == 1 ? QL_WXA8_UNIFORM : QL_WXA8_6BIT;
        const int bits = mode == QL_WXA8_6BIT ? 6 : 4;
        /* W4A8: K any multiple of 16 (an odd count of 16-k blocks leaves half of the kernels' last 32-block as padding) */
        const int64_t k = bits == 6 ? 32 * tu_range(1, 9) : 16 * tu_range(1, 18);
        const int64_t n = (int64_t[]){1, 5, 32, 33, 70}[tu_range(0, 4)];
        int64_t g;
        do g = bits == 6 ? 16 * tu_range(1, 4) : (int64_t[]){4, 8, 16, 32, 64}[tu_range(0, 4)];
        while (k % g);
        /* one case in four at M = 1 (the register decode of a single row on every ISA that has one) */
        const int64_t ng = k / g, rb = ql_wxa8_row_bytes(bits, k), m = c % 4 == 0 ? 1 : ms[tu_range(0, 9)];
        uint8_t *q = malloc((size_t)(n * rb)), *sr = malloc((size_t)(n * ng));
        float *sc = malloc((size_t)n * 4), cb[16], *x = malloc((size_t)(m * k) * 4);
        for (int64_t i = 0; i < n * rb; i++) q[i] = (uint8_t)tu_next();
        for (int64_t i = 0; i < n * ng; i++) {
            uint8_t b = (uint8_t)tu_next();
            sr[i] = (b & 0x7F) == 0x7F ? (uint8_t)(b - 1) : b; /* every finite e4m3 byte */
        }
        for (int64_t i = 0; i < n; i++) sc[i] = (float)(0.01 * (1.0 + tu_uniform()));
        for (int i = 0; i < 16; i++) cb[i] = (float)(8.0 * tu_gauss());
        tu_fill_gauss(QL_F32, x, m * k, 1.0);
        ql_wxa8_weight w = {.n = n, .k = k, .bits = bits, .q = q, .ldq = rb, .s_rel = sr, .s_channel = sc,
                            .codebook = mode == QL_WXA8_CODEBOOK ? cb : NULL, .group = g, .convrot_group = 16};
        int8_t *grid = malloc((size_t)(n * k));
        CHECK_OK(ql_wxa8_decode(&w, grid, k));
        ql_int8_weight iw = {n, k, grid, k, sc, n, 16, NULL, QL_F32};
        float *yref = malloc((size_t)(m * n) * 4), *y = malloc((size_t)(m * n) * 4);
        CHECK_OK(ql_int8_linear_ref(&iw, x, QL_F32, m, k, yref, QL_F32, n, NULL));
        for (int ii = 0; ii < n_isas; ii++) {
            if (!ql_isa_supported(isas[ii])) continue;
            CHECK_OK(ql_context_set_isa(ctx, isas[ii]));
            for (int threads = 1; threads <= 2; threads++) {
                CHECK_OK(ql_context_set_threads(ctx, threads));
                ql_linear_desc d = {.kind = QL_LINEAR_WXA8_PACKED, .wxa8 = w};
                ql_linear *lin = NULL;
                CHECK_OK(ql_linear_create(ctx, &d, &lin));
                memset(y, 0xAB, (size_t)(m * n) * 4);
                CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, k, y, QL_F32, n, NULL));
                CHECK(memcmp(y, yref, (size_t)(m * n) * 4) == 0,
                      "packed %s %d-bit g=%lld [%lld x %lld] M=%lld %s, %d threads: bit-identical to decode + reference",
                      mode == QL_WXA8_CODEBOOK ? "codebook" : "uniform", bits, (long long)g, (long long)n, (long long)k,
                      (long long)m, ql_isa_name(isas[ii]), threads);
                ql_linear_destroy(lin);
                cases++;
            }
        }
        free(q), free(sr), free(sc), free(x), free(grid), free(yref), free(y);
    }
    printf("  packed paths: %lld layer runs, bit-identical to the reference of the decoded grid\n", (long long)cases);
    ql_context_destroy(ctx);
}

int main(void)
{
    tu_init("test_wxa8");
    test_e4m3();
    test_pack_decode();
    test_quantize_hand();
    test_quantize_model();
    test_search();
    test_quality();
    test_linear();
    test_packed_paths();
    test_asym();
    test_bad_args();
    return tu_finish();
}
