/* The closed forms of the bf16 input-activation tables outside their
 * window (act_table.h's ql_act_window_bf16), for host and device: a header
 * of its own because the CUDA prologue includes it without the library's C
 * headers. */
#ifndef QL_ACT_WINDOW_H
#define QL_ACT_WINDOW_H

#include <stdint.h>

#define QL_ACT_WIN_E0 118 /* the first biased exponent with entries (2^-9) */
#define QL_ACT_WIN_ENTRIES 4096

#if defined(__CUDACC__)
#define QL_ACT_WIN_HD __host__ __device__
#else
#define QL_ACT_WIN_HD
#endif
/* Input bits b: the window's index of b, clamped into the window where b
 * lies outside it (the entry is then loaded and ignored: no branch); and
 * the closed form's result bits, which apply where ql_act_window_in(b) is
 * false. Integer arithmetic only, so that host and device compute the same
 * bits. */
static inline QL_ACT_WIN_HD uint32_t ql_act_window_index(uint32_t b)
{
    const int32_t d = (int32_t)((b >> 7) & 0xff) - QL_ACT_WIN_E0;
    const uint32_t dc = (uint32_t)(d < 0 ? 0 : d > 15 ? 15 : d);
    return ((b >> 15) << 11) | (dc << 7) | (b & 127);
}
static inline QL_ACT_WIN_HD int ql_act_window_in(uint32_t b)
{
    return (uint32_t)(((b >> 7) & 0xff) - QL_ACT_WIN_E0) < 16;
}
static inline QL_ACT_WIN_HD uint32_t ql_act_window_closed(uint32_t b)
{
    const uint32_t e = (b >> 7) & 0xff, mag = b & 0x7fff;
    /* below: x/2 rounded to nearest-even, an exponent less, or (e <= 1, where
     * the magnitude's bits count units of 2^-133) the magnitude halved */
    const uint32_t half = (b & 0x8000) | (e >= 2 ? mag - 128 : (mag >> 1) + (mag & (mag >> 1) & 1));
    /* above: x, or -0 for x < 0 (NaN for -Inf and NaN) */
    const uint32_t high = b >> 15 ? (e == 0xff ? 0xffc0u : 0x8000u) : b;
    return e < QL_ACT_WIN_E0 ? half : high;
}

#endif
