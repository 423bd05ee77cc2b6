/* torch's CPU random stream (ql_mt19937, ql_torch_rand, ql_torch_randint)
 * against values printed by PyTorch, and the stochastic-rounding quantizers
 * that draw from it (ql_quantize_int8, ql_wxa8_quantize_ex with
 * QL_SR_TORCH_CPU): exact codes from those reference draws, the rounding
 * bracket, seed 0 = nearest, blocks of rows = the whole, eager's W4A8 chunk
 * seeding. The byte comparison with comfy-kitchen itself is
 * python/tests/test_eager_sr.py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Reference values, printed by torch 2.15.0 (CPU) on 2026-09; not results of
 * this library. For each seed: torch.rand(6, generator=g) * 2^24 (the low 24
 * bits of draws 1..6) and torch.randint(0, 2**32, (3,), generator=g) (64-bit
 * draws: the low word, i.e. draws 2, 4 and 6 whole). */
static const struct {
    uint64_t seed;
    uint32_t low24[6];
    uint32_t even[3];
} REF[] = {
    {0, {8325804, 12888623, 1484405, 2215104, 5157699, 10638075}, {2546248239u, 3626093760u, 3684848379u}},
    {1, {12710949, 4686059, 6762380, 12325960, 491263, 13419401}, {4282876139u, 4005303368u, 550290313u}},
    {5489, {9550684, 11443958, 14809838, 12787577, 8533292, 505823}, {581869302u, 3586334585u, 4161255391u}},
    /* a 64-bit seed: torch initializes from its low 32 bits (7) */
    {4294967303ull, {8974511, 3335364, 11059737, 11020790, 3905091, 7131347}, {976413892u, 1369975286u, 4201435347u}},
};

static void test_mt19937(void)
{
    for (size_t s = 0; s < sizeof REF / sizeof REF[0]; s++) {
        ql_mt19937 g;
        ql_mt19937_seed(&g, REF[s].seed);
        uint32_t d[6];
        for (int i = 0; i < 6; i++) d[i] = ql_mt19937_next(&g);
        int ok = 1;
        for (int i = 0; i < 6; i++) ok &= (d[i] & 0xFFFFFFu) == REF[s].low24[i];
        for (int i = 0; i < 3; i++) ok &= d[2 * i + 1] == REF[s].even[i];
        CHECK(ok, "seed %llu: the first draws are torch's", (unsigned long long)REF[s].seed);
    }
    /* std::mt19937's published 10000th output for its default seed 5489 */
    ql_mt19937 g;
    ql_mt19937_seed(&g, 5489);
    ql_mt19937_skip(&g, 9999);
    CHECK(ql_mt19937_next(&g) == 4123659995u, "10000th draw of seed 5489 (the C++ standard's check value)");
    /* fill and skip agree with next, across block boundaries */
    ql_mt19937 a, b;
    ql_mt19937_seed(&a, 77);
    ql_mt19937_seed(&b, 77);
    uint32_t *buf = malloc(3000 * sizeof(uint32_t));
    ql_mt19937_fill(&a, buf, 1000);
    ql_mt19937_skip(&a, 700);
    ql_mt19937_fill(&a, buf + 1000, 2000);
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= buf[i] == ql_mt19937_next(&b);
    for (int i = 0; i < 700; i++) ql_mt19937_next(&b);
    for (int i = 0; i < 2000; i++) ok &= buf[1000 + i] == ql_mt19937_next(&b);
    CHECK(ok, "fill / skip / next give one stream");
    free(buf);
}

static void test_rand(void)
{
    /* torch.rand(..., generator=g.manual_seed(3), dtype=...) elements 0..3
     * (torch 2.15), and an element whose fp32 value rounds to 1 in the
     * dtype: torch returns 0 there. */
    const float f32[4] = {0x1.176ap-8f, 0x1.b0698p-4f, 0x1.24b3e4p-2f, 0x1.b9a0cp-6f};
    const float bf16[4] = {0x1.18p-8f, 0x1.bp-4f, 0x1.24p-2f, 0x1.bap-6f};
    const float fp16[4] = {0x1.178p-8f, 0x1.b08p-4f, 0x1.24cp-2f, 0x1.b9cp-6f};
    float out[8000];
    CHECK_OK(ql_torch_rand(3, QL_F32, 0, 4, out));
    CHECK(memcmp(out, f32, sizeof f32) == 0, "fp32 rand, seed 3");
    CHECK_OK(ql_torch_rand(3, QL_BF16, 0, 4, out));
    CHECK(memcmp(out, bf16, sizeof bf16) == 0, "bf16 rand, seed 3");
    CHECK_OK(ql_torch_rand(3, QL_F16, 0, 4, out));
    CHECK(memcmp(out, fp16, sizeof fp16) == 0, "fp16 rand, seed 3");
    CHECK_OK(ql_torch_rand(3, QL_F32, 378, 1, out));
    CHECK(out[0] == 0x1.ffdc08p-1f, "fp32 rand[378] (seed 3) = %a", out[0]);
    CHECK_OK(ql_torch_rand(3, QL_BF16, 0, 400, out));
    CHECK(out[378] == 0.0f, "bf16 rand[378] (seed 3): 0x1.ffdc08p-1 rounds to 1 and torch gives 0 (%a)", out[378]);
    CHECK_OK(ql_torch_rand(3, QL_F16, 0, 7000, out));
    CHECK(out[6760] == 0.0f, "fp16 rand[6760] (seed 3) is 0 (torch)");
    /* seed 9, positions around the first block boundary and past 10^6 */
    CHECK_OK(ql_torch_rand(9, QL_F32, 623, 2, out));
    CHECK(out[0] == 0x1.97382ep-1f && out[1] == 0x1.e70a5ap-1f, "fp32 rand[623], [624] (seed 9)");
    CHECK_OK(ql_torch_rand(9, QL_F32, 1000003, 1, out));
    CHECK(out[0] == 0x1.8047ep-3f, "fp32 rand[1000003] (seed 9)");
    /* every 24-bit draw: fp32 value rounded to the dtype, 1 -> 0 */
    int all = 1;
    for (uint32_t m = 0; m < (1u << 24); m++) {
        const float v = (float)m * 0x1p-24f;
        float b = ql_bf16_to_fp32(ql_fp32_to_bf16(v)), h = ql_fp16_to_fp32(ql_fp32_to_fp16(v));
        b = b == 1.0f ? 0.0f : b;
        h = h == 1.0f ? 0.0f : h;
        const uint32_t r = m | 0xAB000000u; /* the top byte is ignored */
        all &= ql_torch_rand_value(QL_F32, r) == v && ql_torch_rand_value(QL_BF16, r) == b &&
               ql_torch_rand_value(QL_F16, r) == h;
    }
    CHECK(all, "all 2^24 draws: fp32 24 bits, bf16 / fp16 that rounded, 1 -> 0");
    /* the conversions, rule by rule */
    CHECK(ql_torch_rand_value(QL_F32, 0xFFFFFFFFu) == 0x1.fffffep-1f, "fp32: 24 bits");
    CHECK(ql_torch_rand_value(QL_BF16, 0xFFFFFFFFu) == 0.0f && ql_torch_rand_value(QL_F16, 0x00FFFFFFu) == 0.0f,
          "a value that rounds to 1 becomes 0");
    CHECK(ql_torch_rand_value(QL_BF16, 0x00800000u) == 0.5f && ql_torch_rand_value(QL_F16, 0x00000001u) == 0x1p-24f,
          "bf16 0.5; fp16 keeps 2^-24 (a subnormal)");
    CHECK(ql_torch_rand_value(QL_BF16, 0x00808000u) == 0.5f && ql_torch_rand_value(QL_BF16, 0x00818000u) == 0x1.04p-1f,
          "bf16 rounds to nearest even");
    CHECK(ql_torch_rand(3, QL_I8, 0, 1, out) == QL_ERR_INVALID_ARGUMENT || ql_torch_rand(3, QL_I8, 0, 1, out) == QL_ERR_UNSUPPORTED,
          "int8 rand refused");
    CHECK(ql_torch_rand(3, QL_F32, -1, 1, out) == QL_ERR_INVALID_ARGUMENT, "negative skip refused");
}

static void test_randint(void)
{
    /* torch.randint(low, high, (n,), generator=g.manual_seed(42)), torch 2.15 */
    int64_t v[5];
    CHECK_OK(ql_torch_randint(42, 0, 1000, 0, 5, v));
    CHECK(v[0] == 542 && v[1] == 67 && v[2] == 876 && v[3] == 414 && v[4] == 26, "randint(0, 1000)");
    CHECK_OK(ql_torch_randint(42, 5, 105, 0, 5, v));
    CHECK(v[0] == 47 && v[1] == 72 && v[2] == 81 && v[3] == 19 && v[4] == 31, "randint(5, 105)");
    CHECK_OK(ql_torch_randint(42, 0, (int64_t)1 << 28, 0, 3, v));
    CHECK(v[0] == 199900595 && v[1] == 250975502 && v[2] == 127521863, "randint(0, 2^28): 64-bit draws");
    CHECK_OK(ql_torch_randint(42, -7, (int64_t)1 << 40, 0, 3, v));
    CHECK(v[0] == 441463804072 && v[1] == 395813185266 && v[2] == 458529314964, "randint(-7, 2^40)");
    int64_t w[3];
    CHECK_OK(ql_torch_randint(42, -7, (int64_t)1 << 40, 1, 2, w));
    CHECK(w[0] == v[1] && w[1] == v[2], "skip counts elements (two draws each past 2^28)");
    CHECK(ql_torch_randint(42, 5, 5, 0, 1, v) == QL_ERR_INVALID_ARGUMENT, "empty range refused");
}

/* ---------------------------------------------------------------- int8 */

static ql_int8_qoptions sr_opts(int tensorwise, int64_t group, int stream, uint64_t seed, int64_t idx0)
{
    ql_int8_qoptions o = {tensorwise, group, stream, seed, idx0};
    return o;
}

static void test_int8_exact(void)
{
    /* One fp32 row of 6, seed 1: U_j = REF[1].low24[j]·2^-24 (torch's draws).
     * absmax 2.54 -> s = 2.54/127 = 0.02; code = floor(x/s + U). */
    const float x[6] = {0.51f, -1.27f, 2.54f, 0.013f, -0.0301f, 1.0f};
    int8_t q[6], want[6];
    float s;
    ql_int8_qoptions o = sr_opts(0, 0, QL_SR_TORCH_CPU, 1, 0);
    CHECK_OK(ql_quantize_int8(QL_F32, x, 1, 6, 6, &o, q, 6, &s));
    const float se = 2.54f / 127.0f;
    for (int j = 0; j < 6; j++) {
        const float u = (float)REF[1].low24[j] * 0x1p-24f;
        want[j] = (int8_t)floorf(x[j] / se + u);
    }
    CHECK(s == se && memcmp(q, want, 6) == 0, "codes from torch's draws: %d %d %d %d %d %d", q[0], q[1], q[2], q[3], q[4],
          q[5]);
}

static void test_int8_properties(void)
{
    const int64_t rows = 37, k = 300;
    const ql_dtype dts[3] = {QL_F32, QL_F16, QL_BF16};
    float *xf = malloc((size_t)(rows * k) * sizeof(float));
    int8_t *q = malloc((size_t)(rows * k)), *q2 = malloc((size_t)(rows * k)), *qn = malloc((size_t)(rows * k));
    float *s = malloc((size_t)rows * sizeof(float)), *s2 = malloc((size_t)rows * sizeof(float));
    void *x = malloc((size_t)(rows * k) * 4);
    for (int d = 0; d < 3; d++) {
        const ql_dtype dt = dts[d];
        tu_fill_gauss(dt, x, rows * k, 1.5);
        const size_t es = ql_dtype_size(dt);
        for (int tw = 0; tw < 2; tw++) {
            ql_int8_qoptions o = sr_opts(tw, 0, QL_SR_TORCH_CPU, 1234567, 0);
            CHECK_OK(ql_quantize_int8(dt, x, rows, k, k, &o, q, k, s));
            /* the bracket: floor(y) or floor(y) + 1, y = dtype(x / s_T) */
            int inb = 1, up = 0;
            for (int64_t r = 0; r < rows; r++) {
                const float sc = s[tw ? 0 : r];
                float stv; /* s rounded to dtype (never 0 here) */
                if (dt == QL_F32) stv = sc;
                else if (dt == QL_F16) stv = ql_fp16_to_fp32(ql_fp32_to_fp16(sc));
                else stv = ql_bf16_to_fp32(ql_fp32_to_bf16(sc));
                for (int64_t j = 0; j < k; j++) {
                    float v;
                    ql_convert((const char *)x + (size_t)(r * k + j) * es, dt, &v, QL_F32, 1);
                    float y = v / stv;
                    if (dt == QL_F16) y = ql_fp16_to_fp32(ql_fp32_to_fp16(y));
                    if (dt == QL_BF16) y = ql_bf16_to_fp32(ql_fp32_to_bf16(y));
                    const float f = floorf(y), c = q[r * k + j];
                    const float lo = f < -128 ? -128 : f > 127 ? 127 : f, hi = f + 1 > 127 ? 127 : f + 1;
                    inb &= c == lo || c == hi;
                    up += c != lo;
                }
            }
            CHECK(inb && up > rows * k / 10, "%s %s: codes are floor(y) or floor(y)+1 (%d rounded up)", ql_dtype_name(dt),
                  tw ? "tensor-wise" : "row-wise", up);
            /* seed 0: the nearest quantizers */
            o.sr_seed = 0;
            CHECK_OK(ql_quantize_int8(dt, x, rows, k, k, &o, q2, k, s2));
            if (tw) CHECK_OK(ql_quantize_tensorwise(dt, x, rows, k, k, qn, k, s));
            else CHECK_OK(ql_quantize_rowwise(dt, x, rows, k, k, qn, k, s));
            CHECK(memcmp(q2, qn, (size_t)(rows * k)) == 0 && memcmp(s2, s, (tw ? 1 : (size_t)rows) * 4) == 0,
                  "%s seed 0 = nearest (%s)", ql_dtype_name(dt), tw ? "tensor-wise" : "row-wise");
        }
        /* a block of rows with sr_idx0 = the rows of the whole */
        ql_int8_qoptions o = sr_opts(0, 0, QL_SR_TORCH_CPU, 99, 0);
        CHECK_OK(ql_quantize_int8(dt, x, rows, k, k, &o, q, k, s));
        o.sr_idx0 = 11 * k;
        CHECK_OK(ql_quantize_int8(dt, (const char *)x + (size_t)(11 * k) * es, 9, k, k, &o, q2, k, s2));
        CHECK(memcmp(q2, q + 11 * k, (size_t)(9 * k)) == 0 && memcmp(s2, s + 11, 9 * 4) == 0,
              "%s rows 11..19 with sr_idx0 = 11·k", ql_dtype_name(dt));
        /* ConvRot with seed 0 = ql_quantize_convrot_weight; with a seed = SR of the rotated rows */
        const int64_t kc = 256;
        ql_int8_qoptions oc = sr_opts(0, 16, QL_SR_TORCH_CPU, 0, 0);
        CHECK_OK(ql_quantize_int8(dt, x, 8, kc, kc, &oc, q, kc, s));
        CHECK_OK(ql_quantize_convrot_weight(dt, x, 8, kc, kc, 16, qn, kc, s2));
        CHECK(memcmp(q, qn, (size_t)(8 * kc)) == 0 && memcmp(s, s2, 8 * 4) == 0, "%s ConvRot seed 0 = nearest",
              ql_dtype_name(dt));
        oc.sr_seed = 5;
        CHECK_OK(ql_quantize_int8(dt, x, 8, kc, kc, &oc, q, kc, s));
        memcpy(xf, x, (size_t)(8 * kc) * es);
        CHECK_OK(ql_rotate(dt, xf, 8, kc, kc, 16));
        ql_int8_qoptions orow = sr_opts(0, 0, QL_SR_TORCH_CPU, 5, 0);
        CHECK_OK(ql_quantize_int8(dt, xf, 8, kc, kc, &orow, q2, kc, s2));
        CHECK(memcmp(q, q2, (size_t)(8 * kc)) == 0 && memcmp(s, s2, 8 * 4) == 0, "%s ConvRot SR = row-wise SR of ql_rotate's rows",
              ql_dtype_name(dt));
    }
    /* unbiased: the mean code over seeds approaches y */
    {
        const float xv[4] = {0.3f, -0.77f, 1.0f, 0.5f};
        double sum[4] = {0};
        float sc;
        int8_t qq[4];
        for (uint64_t seed = 1; seed <= 4000; seed++) {
            ql_int8_qoptions o = sr_opts(0, 0, QL_SR_TORCH_CPU, seed, 0);
            ql_quantize_int8(QL_F32, xv, 1, 4, 4, &o, qq, 4, &sc);
            for (int j = 0; j < 4; j++) sum[j] += qq[j];
        }
        int ok = 1;
        for (int j = 0; j < 4; j++) ok &= fabs(sum[j] / 4000 - xv[j] / sc) < 0.03;
        CHECK(ok, "mean code over 4000 seeds = x/s (%.3f vs %.3f)", sum[0] / 4000, xv[0] / sc);
    }
    /* a NaN row still consumes its draws: the other rows are unchanged */
    {
        float *xx = malloc((size_t)(3 * 64) * 4);
        tu_fill_gauss(QL_F32, xx, 3 * 64, 1.0);
        ql_int8_qoptions o = sr_opts(0, 0, QL_SR_TORCH_CPU, 8, 0);
        CHECK_OK(ql_quantize_int8(QL_F32, xx, 3, 64, 64, &o, q, 64, s));
        xx[64 + 5] = NAN;
        CHECK(ql_quantize_int8(QL_F32, xx, 3, 64, 64, &o, q2, 64, s2) == QL_ERR_NONFINITE, "NaN row reported");
        CHECK(memcmp(q, q2, 64) == 0 && memcmp(q + 128, q2 + 128, 64) == 0 && s2[1] != s2[1], "NaN row: codes 0, scale NaN, others unchanged");
        free(xx);
    }
    /* the CUDA stream is ql_quantize_rowwise_sr; fp32 only */
    {
        tu_fill_gauss(QL_F32, xf, rows * k, 1.0);
        ql_int8_qoptions o = sr_opts(0, 0, QL_SR_CUDA_PCG, 31337, 1000);
        CHECK_OK(ql_quantize_int8(QL_F32, xf, rows, k, k, &o, q, k, s));
        CHECK_OK(ql_quantize_rowwise_sr(xf, rows, k, k, 1000, 31337, q2, k, s2));
        CHECK(memcmp(q, q2, (size_t)(rows * k)) == 0 && memcmp(s, s2, (size_t)rows * 4) == 0, "QL_SR_CUDA_PCG = ql_quantize_rowwise_sr");
        CHECK(ql_quantize_int8(QL_BF16, x, rows, k, k, &o, q, k, s) == QL_ERR_UNSUPPORTED, "QL_SR_CUDA_PCG refuses bf16");
        o.sr_stream = 7;
        CHECK(ql_quantize_int8(QL_F32, xf, rows, k, k, &o, q, k, s) == QL_ERR_INVALID_ARGUMENT, "unknown stream refused");
        ql_int8_qoptions bad = sr_opts(1, 16, QL_SR_TORCH_CPU, 1, 0);
        CHECK(ql_quantize_int8(QL_F32, xf, 4, 256, 256, &bad, q, 256, s) == QL_ERR_INVALID_ARGUMENT,
              "tensor-wise ConvRot refused");
    }
    free(xf), free(q), free(q2), free(qn), free(s), free(s2), free(x);
}

/* ---------------------------------------------------------------- W4A8 */

/* Uniform mode by hand: gs = max(amax(group)/7, 1e-8), code = clamp(floor(w/gs + U), -8, 7) + 8,
 * with U the torch stream of eager's chunk (seed + R0, position (R - R0)·k + col). */
static void test_wxa8_torch(void)
{
    const int64_t k = (int64_t)1 << 20, rows = 5, g = 16; /* chunks of 4 rows: rows 0-3, then 4 */
    const uint64_t seed = 1000;
    float *w = malloc((size_t)(rows * k) * 4), *wr = malloc((size_t)(rows * k) * 4), *u = malloc((size_t)k * 4);
    uint8_t *q = malloc((size_t)(rows * k / 2)), *q2 = malloc((size_t)(rows * k / 2));
    uint8_t *sr = malloc((size_t)(rows * k / g)), *sr2 = malloc((size_t)(rows * k / g));
    float sc[5], sc2[5];
    tu_fill_gauss(QL_F32, w, rows * k, 0.02);
    memcpy(wr, w, (size_t)(rows * k) * 4);
    CHECK_OK(ql_rotate(QL_F32, wr, rows, k, k, 256));
    ql_wxa8_qparams p = {QL_WXA8_UNIFORM, g, 256, NULL, 0};
    ql_wxa8_qoptions o = {0, seed, 0, QL_SR_TORCH_CPU};
    CHECK_OK(ql_wxa8_quantize_ex(QL_F32, w, rows, k, k, &p, &o, q, k / 2, sr, sc, NULL));
    int ok = 1;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t r0 = r - r % 4;
        CHECK_OK(ql_torch_rand(seed + (uint64_t)r0, QL_F32, (r - r0) * k, k, u));
        for (int64_t j = 0; j < k; j += g) {
            const float *v = wr + r * k + j;
            float a = 0.0f;
            for (int64_t t = 0; t < g; t++) a = fmaxf(a, fabsf(v[t]));
            float gs = a / 7.0f;
            gs = gs > 1e-8f ? gs : 1e-8f;
            for (int64_t t = 0; t < g; t++) {
                float c = floorf(v[t] / gs + u[j + t]);
                c = c < -8 ? -8 : c > 7 ? 7 : c;
                const int code = (int)c + 8, col = (int)(j + t);
                const uint8_t b = q[r * (k / 2) + col / 2];
                ok &= ((col & 1) ? b >> 4 : b & 15) == code;
            }
        }
    }
    CHECK(ok, "uniform W4A8 SR codes: eager's chunks (4 rows of 2^20), seed + first row");
    /* rows 2..4 alone (sr_idx0 = 2k): the same bytes, across the chunk boundary */
    o.sr_idx0 = 2 * k;
    CHECK_OK(ql_wxa8_quantize_ex(QL_F32, w + 2 * k, 3, k, k, &p, &o, q2, k / 2, sr2, sc2, NULL));
    CHECK(memcmp(q2, q + k, (size_t)(3 * k / 2)) == 0 && memcmp(sc2, sc + 2, 3 * 4) == 0, "rows 2..4 with sr_idx0 = 2·K");
    o.sr_idx0 = 2 * k + 1;
    CHECK(ql_wxa8_quantize_ex(QL_F32, w, 1, k, k, &p, &o, q2, k / 2, sr2, sc2, NULL) == QL_ERR_INVALID_ARGUMENT,
          "torch stream: sr_idx0 not a row start refused");
    /* seed 0 = nearest whatever the stream; the codebook and 6-bit modes keep the nearest scales */
    const int64_t ks = 512, rs = 12;
    float lut[16];
    for (int i = 0; i < 16; i++) lut[i] = -1.0f + (float)i * (2.0f / 15.0f);
    const ql_wxa8_mode modes[3] = {QL_WXA8_CODEBOOK, QL_WXA8_ASYM, QL_WXA8_6BIT};
    for (int m = 0; m < 3; m++) {
        const int bits = modes[m] == QL_WXA8_6BIT ? 6 : 4;
        const int64_t rb = bits == 6 ? ks * 3 / 4 : ks / 2;
        ql_wxa8_qparams pm = {modes[m], 16, 256, modes[m] == QL_WXA8_CODEBOOK ? lut : NULL, 0};
        float *corr = malloc((size_t)(rs * ks / 16) * 4), *corr2 = malloc((size_t)(rs * ks / 16) * 4);
        float sm[12], sm2[12];
        ql_wxa8_qoptions on = {0, 0, 0, QL_SR_TORCH_CPU}, os = {0, 77, 0, QL_SR_TORCH_CPU};
        CHECK_OK(ql_wxa8_quantize_ex(QL_F32, w, rs, ks, ks, &pm, &on, q, rb, sr, sm, corr));
        CHECK_OK(ql_wxa8_quantize(QL_F32, w, rs, ks, ks, &pm, q2, rb, sr2, sm2, corr2));
        CHECK(memcmp(q, q2, (size_t)(rs * rb)) == 0, "mode %d: seed 0 = nearest", (int)modes[m]);
        CHECK_OK(ql_wxa8_quantize_ex(QL_F32, w, rs, ks, ks, &pm, &os, q2, rb, sr2, sm2, corr2));
        CHECK(memcmp(sr, sr2, (size_t)(rs * ks / 16)) == 0 && memcmp(sm, sm2, (size_t)rs * 4) == 0 &&
                  memcmp(q, q2, (size_t)(rs * rb)) != 0,
              "mode %d: SR keeps the scales and moves codes", (int)modes[m]);
        free(corr), free(corr2);
    }
    free(w), free(wr), free(u), free(q), free(q2), free(sr), free(sr2);
}

int main(void)
{
    tu_init("test_torch_sr");
    test_mt19937();
    test_rand();
    test_randint();
    test_int8_exact();
    test_int8_properties();
    test_wxa8_torch();
    return tu_finish();
}
