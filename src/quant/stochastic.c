/* Stochastic rounding as comfy-kitchen's CUDA int8 quantizers do it
 * (docs/FORMATS.md §4.2): reproducible from a seed, element by element. */
#include <math.h>

#include "quant/quant.h"

uint32_t ql_pcg_hash(uint32_t x)
{
    const uint32_t state = x * 747796405u + 2891336453u;
    const uint32_t word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

float ql_sr_noise(int64_t idx, uint64_t seed)
{
    const uint64_t key = (uint64_t)idx + seed;
    const uint32_t folded = (uint32_t)key ^ (uint32_t)(key >> 32);
    return (float)(ql_pcg_hash(folded) >> 8) * 0x1p-24f; /* exact: 24 bits */
}

/* ComfyUI's string_to_seed: bitwise CRC-32 (poly 0xEDB88320, init and final
 * xor 0xFFFFFFFF) over the key's characters; Python feeds ord(c), a code
 * point, so the UTF-8 is decoded first (ASCII keys: plain CRC-32). */
uint32_t ql_crc32_key(const char *key)
{
    uint32_t crc = 0xFFFFFFFFu;
    const unsigned char *s = (const unsigned char *)(key ? key : "");
    while (*s) {
        uint32_t cp = *s++;
        int extra = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : cp >= 0xC0 ? 1 : 0;
        if (extra) cp &= 0x3Fu >> extra;
        for (; extra > 0 && (*s & 0xC0) == 0x80; extra--) cp = (cp << 6) | (*s++ & 0x3Fu);
        crc ^= cp;
        for (int b = 0; b < 8; b++) crc = (crc & 1u) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
    }
    return crc ^ 0xFFFFFFFFu;
}

float ql_sr_scale(float absmax)
{
    return fmaxf(fminf(absmax, 3.40282347e38f) * (1.0f / 127.0f), 1.0e-30f);
}

int8_t ql_sr_code(float v, float s, int64_t idx, uint64_t seed)
{
    const float y = v / s;
    const float q = seed ? floorf(y + ql_sr_noise(idx, seed)) : nearbyintf(y);
    return (int8_t)(q > 127.0f ? 127.0f : q < -128.0f ? -128.0f : q);
}
