/* fp32 <-> fp16 / bf16 conversions, bit-exact: round-to-nearest-even,
 * subnormals, ±Inf, NaN (quietened, never turned into Inf). */
/* (plain functions of the public header: the inline loads and stores of
 * core.h build on them, so nothing here depends on core.h) */
#include <string.h>

#include "qlinear.h"

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ql_fp32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep sign, quiet */
    u += 0x7fffu + ((u >> 16) & 1u);                                              /* RNE; overflows to Inf */
    return (uint16_t)(u >> 16);
}

float ql_bf16_to_fp32(uint16_t x) { return bits_f32((uint32_t)x << 16); }

uint16_t ql_fp32_to_fp16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf (and Inf) */
    if (a >= 0x38800000u) {                                   /* normal fp16 range: >= 2^-14 */
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    if (a < 0x33000000u) return sign; /* < 2^-25: rounds to zero (exact tie 2^-25 goes to even 0) */
    /* Subnormal fp16: value = m · 2^-24 with m in [0, 1024]. */
    uint32_t e = a >> 23;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14 + 113 - e - 1 ... shift so that result is in units of 2^-24 */
    /* value = mant · 2^(e-150); units 2^-24 -> mant · 2^(e-126) -> shift right by 126-e */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

float ql_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f; /* m · 2^-24, exact */
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

const char *ql_dtype_name(ql_dtype dt)
{
    switch (dt) {
    case QL_F32: return "fp32";
    case QL_F16: return "fp16";
    case QL_BF16: return "bf16";
    case QL_I8: return "int8";
    case QL_U8: return "uint8";
    case QL_I32: return "int32";
    }
    return "unknown";
}

size_t ql_dtype_size(ql_dtype dt)
{
    switch (dt) {
    case QL_F32: case QL_I32: return 4;
    case QL_F16: case QL_BF16: return 2;
    case QL_I8: case QL_U8: return 1;
    }
    return 0;
}

float ql_dtype_tiny(ql_dtype dt)
{
    switch (dt) {
    case QL_F16: return 6.103515625e-05f; /* 2^-14 */
    default: return 1.17549435e-38f;     /* 2^-126, fp32 and bf16 */
    }
}
