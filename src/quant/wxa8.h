/* W4A8 / W6A8 building blocks shared by the reference API, the linear's
 * decoders and the checkpoint code. */
#ifndef QL_WXA8_H
#define QL_WXA8_H

#include <math.h>

#include "quant/quant.h"

/* Bytes of one packed row of k codes: k/2 (4 bits) or 3k/4 (6 bits). */
static inline int64_t ql_wxa8_row_bytes(int bits, int64_t k) { return bits == 6 ? k / 2 + k / 4 : k / 2; }

/* The reference's decode of one value: clamp(rne(v · s), -127, 127), fp32
 * product (v, s finite). */
static inline int8_t ql_wxa8_grid(float v, float s)
{
    float x = v * s;
    x = x < -256.0f ? -256.0f : x > 256.0f ? 256.0f : x;
    x = rintf(x);
    return (int8_t)(x < -127.0f ? -127.0f : x > 127.0f ? 127.0f : x);
}

/* group_size rule: 4-bit: >= 4 and divides 16 or is a multiple of 16;
 * 6-bit: a multiple of 16. */
bool ql_wxa8_group_ok(int bits, int64_t group);
/* value(code) for every code: codebook[c], c - 8 (uniform) or c - 32. */
void ql_wxa8_values(const ql_wxa8_weight *w, float *values);
/* The file layout of one row (docs/FORMATS.md §5.2 step 6, §5.6). */
void ql_wxa8_unpack_row(int bits, const uint8_t *row, int64_t k, uint8_t *codes);
void ql_wxa8_pack_row(int bits, const uint8_t *codes, int64_t k, uint8_t *row);
/* fp32 s_rel of (row, group). */
float ql_wxa8_s_rel(const ql_wxa8_weight *w, int64_t row, int64_t g);
/* The reference's fixed 16-entry LUT. */
void ql_wxa8_fixed_lut(float cb[16]);

#endif
