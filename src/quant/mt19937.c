/* torch's CPU random stream: MT19937 as PyTorch's CPUGeneratorImpl runs it,
 * and the values torch.rand / torch.randint make of its draws (rules
 * measured against torch 2.15, docs/NUMERICS.md §8.1). */
#include "quant/quant.h"

#include <math.h>

enum { MT_N = 624, MT_M = 397 };
#define MT_MATRIX 0x9908B0DFu
#define MT_UPPER 0x80000000u
#define MT_LOWER 0x7FFFFFFFu

void ql_mt19937_seed(ql_mt19937 *g, uint64_t seed)
{
    uint32_t *s = g->state;
    s[0] = (uint32_t)seed; /* torch keeps the 64-bit seed but initializes from its low 32 bits */
    for (uint32_t i = 1; i < MT_N; i++) s[i] = 1812433253u * (s[i - 1] ^ (s[i - 1] >> 30)) + i;
    g->index = MT_N;
}

static inline uint32_t mt_mix(uint32_t a, uint32_t b, uint32_t m)
{
    const uint32_t y = (a & MT_UPPER) | (b & MT_LOWER);
    return m ^ (y >> 1) ^ ((0u - (y & 1u)) & MT_MATRIX);
}

/* The next block of 624 words, in place. The first loop reads only words
 * not yet rewritten, the second only words rewritten by the first: both are
 * free of loop-carried dependences within a vector. */
static void mt_twist(uint32_t *s)
{
    int i;
    for (i = 0; i < MT_N - MT_M; i++) s[i] = mt_mix(s[i], s[i + 1], s[i + MT_M]);
    for (; i < MT_N - 1; i++) s[i] = mt_mix(s[i], s[i + 1], s[i + MT_M - MT_N]);
    s[MT_N - 1] = mt_mix(s[MT_N - 1], s[0], s[MT_M - 1]);
}

static inline uint32_t mt_temper(uint32_t y)
{
    y ^= y >> 11;
    y ^= (y << 7) & 0x9D2C5680u;
    y ^= (y << 15) & 0xEFC60000u;
    y ^= y >> 18;
    return y;
}

uint32_t ql_mt19937_next(ql_mt19937 *g)
{
    if (g->index >= MT_N) {
        mt_twist(g->state);
        g->index = 0;
    }
    return mt_temper(g->state[g->index++]);
}

/* Walk n draws block by block: BODY sees the untempered words w_[0 .. cnt_)
 * of the current block, which are the draws of positions i0_ .. i0_ + cnt_ - 1. */
#define MT_RUNS(g, n, BODY)                                                 \
    do {                                                                    \
        int64_t done_ = 0;                                                  \
        while (done_ < (n)) {                                               \
            if ((g)->index >= MT_N) {                                       \
                mt_twist((g)->state);                                       \
                (g)->index = 0;                                             \
            }                                                               \
            int64_t cnt_ = MT_N - (g)->index;                               \
            if (cnt_ > (n) - done_) cnt_ = (n) - done_;                     \
            const uint32_t *w_ = (g)->state + (g)->index;                   \
            const int64_t i0_ = done_;                                      \
            BODY;                                                           \
            (g)->index += (int32_t)cnt_;                                    \
            done_ += cnt_;                                                  \
        }                                                                   \
    } while (0)

void ql_mt19937_fill(ql_mt19937 *g, uint32_t *out, int64_t n)
{
    MT_RUNS(g, n, for (int64_t t = 0; t < cnt_; t++) out[i0_ + t] = mt_temper(w_[t]));
}

void ql_mt19937_skip(ql_mt19937 *g, int64_t n)
{
    if (n <= 0) return;
    MT_RUNS(g, n, (void)w_; (void)i0_);
}

/* torch.rand: uniform_real_distribution over (r & (2^24 - 1))·2^-24 in fp32,
 * then cast to the tensor's dtype; a reduced-precision result that rounds up
 * to 1 is replaced by 0 (measured: no 1.0 ever appears, and exactly those
 * elements read 0). */
static inline float rand_f32(uint32_t r) { return (float)(r & 0xFFFFFFu) * 0x1p-24f; }

/* The same rounded to `keep` significant bits (bf16 8, fp16 11), nearest
 * even, on the float bits of the 24-bit integer (exact: the scaling by
 * 2^-24 commutes, and fp16's subnormals, below 2^-14, need at most 10 bits). */
static inline float rand_reduced(uint32_t r, int keep)
{
    const int drop = 24 - keep;
    float f = (float)(r & 0xFFFFFFu);
    uint32_t b;
    memcpy(&b, &f, 4);
    b = (b + ((1u << (drop - 1)) - 1u) + ((b >> drop) & 1u)) & ~((1u << drop) - 1u);
    memcpy(&f, &b, 4);
    f *= 0x1p-24f;
    return f == 1.0f ? 0.0f : f;
}

float ql_torch_rand_value(ql_dtype dtype, uint32_t r)
{
    return dtype == QL_F32 ? rand_f32(r) : rand_reduced(r, dtype == QL_BF16 ? 8 : 11);
}

void ql_torch_rand_fill(ql_mt19937 *g, ql_dtype dtype, int64_t n, float *out)
{
    if (dtype == QL_F32) MT_RUNS(g, n, for (int64_t t = 0; t < cnt_; t++) out[i0_ + t] = rand_f32(mt_temper(w_[t])));
    else {
        const int keep = dtype == QL_BF16 ? 8 : 11;
        MT_RUNS(g, n, for (int64_t t = 0; t < cnt_; t++) out[i0_ + t] = rand_reduced(mt_temper(w_[t]), keep));
    }
}

ql_status ql_torch_rand(uint64_t seed, ql_dtype dtype, int64_t skip, int64_t n, float *out)
{
    const char *fn = "ql_torch_rand";
    QL_TRY(ql_check_float_dtype(fn, "dtype", dtype));
    if (skip < 0 || n < 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: skip = %lld and n = %lld must be >= 0", fn, (long long)skip,
                       (long long)n);
    if (n == 0) return QL_OK;
    QL_CHECK_PTR(fn, out);
    ql_mt19937 g;
    ql_mt19937_seed(&g, seed);
    ql_mt19937_skip(&g, skip);
    ql_torch_rand_fill(&g, dtype, n, out);
    return QL_OK;
}

/* torch's random_from_to: 32-bit draws while the range is below 2^28
 * (measured; 64-bit draws, high word first, from 2^28 on). */
#define RANDINT_WIDE ((uint64_t)1 << 28)

ql_status ql_torch_randint(uint64_t seed, int64_t low, int64_t high, int64_t skip, int64_t n, int64_t *out)
{
    const char *fn = "ql_torch_randint";
    if (!(low < high))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: low = %lld must be less than high = %lld", fn, (long long)low,
                       (long long)high);
    if (skip < 0 || n < 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: skip = %lld and n = %lld must be >= 0", fn, (long long)skip,
                       (long long)n);
    if (n == 0) return QL_OK;
    QL_CHECK_PTR(fn, out);
    const uint64_t range = (uint64_t)high - (uint64_t)low;
    ql_mt19937 g;
    ql_mt19937_seed(&g, seed);
    if (range < RANDINT_WIDE) {
        const uint32_t r32 = (uint32_t)range;
        ql_mt19937_skip(&g, skip);
        MT_RUNS(&g, n, for (int64_t t = 0; t < cnt_; t++) out[i0_ + t] = low + (int64_t)(mt_temper(w_[t]) % r32));
    } else {
        ql_mt19937_skip(&g, 2 * skip);
        for (int64_t i = 0; i < n; i++) {
            const uint64_t hi = ql_mt19937_next(&g), lo = ql_mt19937_next(&g);
            out[i] = (int64_t)((uint64_t)low + ((hi << 32) | lo) % range);
        }
    }
    return QL_OK;
}
