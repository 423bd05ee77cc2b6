/* fp32 <-> bf16 / fp16 conversions against an independent long-double
 * rounding model and (where the CPU has them) the hardware conversions:
 * F16C on x86, FCVT on AArch64. */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "cpu/features.h"
#include "model.h"
#include "testutil.h"

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_fp16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
__attribute__((target("f16c"))) static float hw_fp32(uint16_t h) { return _cvtsh_ss(h); }
static int hw_half(void) { return ql_cpu()->f16c; }
#elif defined(__aarch64__)
/* FCVT, in the default rounding mode (nearest even), subnormals kept */
static uint16_t hw_fp16(float f) { __fp16 h = (__fp16)f; uint16_t u; memcpy(&u, &h, 2); return u; }
static float hw_fp32(uint16_t u) { __fp16 h; memcpy(&h, &u, 2); return (float)h; }
static int hw_half(void) { return 1; }
#else
static uint16_t hw_fp16(float f) { (void)f; return 0; }
static float hw_fp32(uint16_t u) { (void)u; return 0; }
static int hw_half(void) { return 0; }
#endif

static float bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void check_one(float f)
{
    uint16_t b = ql_fp32_to_bf16(f), h = ql_fp32_to_fp16(f);
    if (isnan(f)) {
        CHECK(isnan(ql_bf16_to_fp32(b)) && isnan(ql_fp16_to_fp32(h)), "NaN %a not kept as NaN", f);
        return;
    }
    long double mb = model_round_dtype(QL_BF16, f), mh = model_round_dtype(QL_F16, f);
    float gb = ql_bf16_to_fp32(b), gh = ql_fp16_to_fp32(h);
    CHECK((long double)gb == mb && signbit(gb) == signbit(f), "bf16(%a) = %a, model %La", f, gb, mb);
    CHECK((long double)gh == mh && signbit(gh) == signbit(f), "fp16(%a) = %a, model %La", f, gh, mh);
    if (hw_half()) CHECK(h == hw_fp16(f), "fp16(%a) = 0x%04x, hardware 0x%04x", f, h, hw_fp16(f));
}

int main(void)
{
    tu_init("test_dtype");
    /* every fp16 and bf16 pattern round-trips exactly (NaN stays NaN) */
    for (uint32_t u = 0; u < 65536; u++) {
        float fh = ql_fp16_to_fp32((uint16_t)u), fb = ql_bf16_to_fp32((uint16_t)u);
        if (isnan(fh)) CHECK(isnan(ql_fp16_to_fp32(ql_fp32_to_fp16(fh))), "fp16 NaN 0x%04x", u);
        else CHECK(ql_fp32_to_fp16(fh) == u, "fp16 0x%04x round trip", u);
        if (isnan(fb)) CHECK(isnan(ql_bf16_to_fp32(ql_fp32_to_bf16(fb))), "bf16 NaN 0x%04x", u);
        else CHECK(ql_fp32_to_bf16(fb) == u, "bf16 0x%04x round trip", u);
        if (hw_half() && !isnan(fh)) CHECK(memcmp(&fh, &(float){hw_fp32((uint16_t)u)}, 4) == 0, "fp16->fp32 0x%04x vs hardware", u);
    }
    /* edges: ties, subnormals, overflow thresholds, Inf, NaN */
    const float edges[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 65536.0f,
                           6.103515625e-05f, 6.0975552e-05f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                           8.940697e-08f, 1.0f + 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f + 0x1p-9f,
                           3.389531e38f, 3.4028235e38f, 1.17549435e-38f, 1e-40f, -1e-45f, 1e-30f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) check_one(edges[i]);
    for (uint32_t e = 0; e < 256; e++) /* every exponent, mantissas near the rounding points */
        for (uint32_t lo = 0; lo < 64; lo++) {
            check_one(bits((e << 23) | (0x8000u - 32 + lo)));
            check_one(bits((e << 23) | (0x1000u - 32 + lo) | 0x400000u));
            check_one(bits(0x80000000u | (e << 23) | (0x18000u - 32 + lo)));
        }
    for (int i = 0; i < 2000000; i++) check_one(bits((uint32_t)tu_next()));
    /* ql_convert checks its dtypes and agrees with the scalar conversions */
    float src[37], back[37];
    uint16_t mid[37];
    for (int i = 0; i < 37; i++) src[i] = (float)tu_gauss() * 100.0f;
    CHECK_OK(ql_convert(src, QL_F32, mid, QL_BF16, 37));
    CHECK_OK(ql_convert(mid, QL_BF16, back, QL_F32, 37));
    int same = 1;
    for (int i = 0; i < 37; i++) same &= back[i] == ql_bf16_to_fp32(ql_fp32_to_bf16(src[i]));
    CHECK(same, "ql_convert fp32->bf16->fp32 disagrees with the scalar conversion");
    CHECK(ql_convert(src, QL_I8, mid, QL_F32, 3) == QL_ERR_UNSUPPORTED, "ql_convert accepted int8 as a float dtype");
    CHECK(ql_convert(src, QL_F32, mid, QL_F16, -1) == QL_ERR_INVALID_ARGUMENT, "ql_convert accepted n = -1");
    CHECK(ql_convert(NULL, QL_F32, mid, QL_F16, 3) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "src"),
          "ql_convert NULL src: %s", ql_last_error());
    return tu_finish();
}
