/* An independent numeric model for tests: rounding to a binary format of
 * given precision in long double (64-bit mantissa), RNE. */
#ifndef QL_TEST_MODEL_H
#define QL_TEST_MODEL_H

#include <math.h>

#include "qlinear.h"

/* Round v to a format with `mant` stored mantissa bits, minimum normal
 * exponent `emin` and largest finite value `maxv`; ties to even. */
static inline long double model_round(long double v, int mant, int emin, long double maxv)
{
    if (isnan(v) || isinf(v) || v == 0) return v;
    int e;
    frexpl(v, &e); /* v = f · 2^e, 0.5 <= |f| < 1 */
    e -= 1;        /* v = g · 2^e, 1 <= |g| < 2 */
    if (e < emin) e = emin;
    long double quantum = ldexpl(1.0L, e - mant);
    long double r = nearbyintl(v / quantum) * quantum;
    long double half_ulp_over = maxv + ldexpl(1.0L, (int)(logbl(maxv)) - mant - 1);
    if (fabsl(r) >= half_ulp_over || fabsl(r) > maxv) return v > 0 ? INFINITY : -INFINITY;
    return r;
}

static inline long double model_round_dtype(ql_dtype dt, long double v)
{
    switch (dt) {
    /* exact hex limits: a decimal literal is off by far more than 2^-113
     * where long double is IEEE quad (AArch64) */
    case QL_F32: return model_round(v, 23, -126, 0x1.fffffep+127L);
    case QL_F16: return model_round(v, 10, -14, 0x1.ffcp+15L);
    default: return model_round(v, 7, -126, 0x1.fep+127L);
    }
}

static inline float model_tiny(ql_dtype dt) { return dt == QL_F16 ? 6.103515625e-05f : 1.17549435e-38f; }

/* The eager row-wise quantizer, modelled independently in long double. */
static inline void model_quantize_row(ql_dtype dt, const float *v, long k, signed char *q, float *scale)
{
    long double a = 0;
    for (long j = 0; j < k; j++) a = fabsl((long double)v[j]) > a ? fabsl((long double)v[j]) : a;
    long double s = model_round_dtype(QL_F32, a / 127.0L);
    if (s < 1e-30L) s = (long double)1e-30f;
    long double st = model_round_dtype(dt, s);
    if (st == 0) st = model_tiny(dt);
    for (long j = 0; j < k; j++) {
        long double y = model_round_dtype(dt, model_round_dtype(QL_F32, (long double)v[j] / st));
        long double r = nearbyintl(y);
        q[j] = (signed char)(r > 127 ? 127 : r < -128 ? -128 : r);
    }
    *scale = (float)s;
}

#endif
