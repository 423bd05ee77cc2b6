/* The generic twin of the LoRA t-row requantization (lora.h). */
#include "cpu/generic/generic.h"

int32_t ql_lora_t_row_generic(const int32_t *cb, int mr, int nr, int kb, int aes, const uint8_t *perm, int i, int64_t rt,
                              int64_t rpad, int32_t corr, int8_t *tp, int32_t *scratch, int32_t *sum)
{
    int32_t *tv = scratch;
    int8_t *tq = (int8_t *)(tv + rpad);
    int32_t amax = 0;
    for (int64_t c = 0; c < rt; c++) {
        const int32_t v = cb[((c / nr) * mr + i) * nr + c % nr] - corr;
        tv[c] = v;
        amax = (v < 0 ? -v : v) > amax ? (v < 0 ? -v : v) : amax;
    }
    const double inv = amax ? 127.0 / (double)amax : 0.0;
    int32_t s = 0;
    /* rne by the 1.5·2^52 trick (exact for |v| <= 127; no libm call, so the loop vectorizes) */
    for (int64_t c = 0; c < rt; c++) {
        const double v = ((double)tv[c] * inv + 0x1.8p52) - 0x1.8p52;
        tq[c] = (int8_t)(int32_t)v;
        s += tq[c];
    }
    for (int64_t c = rt; c < rpad; c++) tq[c] = 0;
    *sum = s;
    /* block b of the row: position q holds element b·kb + perm[q], the order U was packed in */
    for (int64_t b = 0; b < rpad / kb; b++) {
        const int8_t *src = tq + b * kb;
        if (aes == 2) {
            int16_t *dst = (int16_t *)tp + (b * mr + i) * kb;
            for (int q = 0; q < kb; q++) dst[q] = src[perm[q]];
        } else {
            int8_t *dst = tp + (b * mr + i) * kb;
            for (int q = 0; q < kb; q++) dst[q] = src[perm[q]];
        }
    }
    return amax;
}
