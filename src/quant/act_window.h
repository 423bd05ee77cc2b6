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
/* The result bits for input bits b, where the closed forms give them; else
 * -1 - (the window's index of b). Integer arithmetic only, so that host and
 * device compute the same bits. */
static inline QL_ACT_WIN_HD int32_t ql_act_window_rule(uint32_t b)
{
    const uint32_t e = (b >> 7) & 0xff, d = e - QL_ACT_WIN_E0;
    if (d < 16) return -1 - (int32_t)(((b >> 15) << 11) | (d << 7) | (b & 127));
    if (e > QL_ACT_WIN_E0) return b >> 15 ? (e == 0xff ? 0xffc0 : 0x8000) : (int32_t)b;
    /* x/2 rounded to nearest-even: an exponent less, or (e <= 1, where the
     * magnitude's bits count units of 2^-133) the magnitude halved */
    const uint32_t mag = b & 0x7fff;
    const uint32_t half = e >= 2 ? mag - 128 : (mag >> 1) + (mag & (mag >> 1) & 1);
    return (int32_t)((b & 0x8000) | half);
}

#endif
