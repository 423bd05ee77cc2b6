/* The prologue cache (qlinear.h: ql_prologue_cache): layers run one at a
 * time on one input through a cache give the bits of separate forwards; the
 * second and later layers hit (the prologue skipped), and anything in the
 * key — pointer, m, ldx, dtype, rotation group, input activation, kernel
 * layout, generation — makes a miss; forwards it cannot serve (unmerged
 * LoRA, over one chunk of rows) leave it as it was; forward_shared's CPU
 * path (an internal cache) equals separate forwards. Every ISA this CPU
 * runs, small-M and blocked row counts, 1 and 2 threads, x in fp32, bf16
 * and fp16, K off the 64-block. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct layer {
    int8_t *q;
    float *sw, *bias;
    ql_linear *lin;
} layer;

static void make_layer(ql_context *ctx, int64_t n, int64_t k, int64_t group, layer *L)
{
    L->q = malloc((size_t)(n * k));
    L->sw = malloc((size_t)n * sizeof(float));
    L->bias = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n * k; i++) L->q[i] = (int8_t)tu_range(-127, 127);
    for (int64_t i = 0; i < n; i++) {
        L->sw[i] = (float)(1e-3 * (0.5 + tu_uniform()));
        L->bias[i] = (float)(0.1 * tu_gauss());
    }
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .n = n, .k = k};
    d.int8 = (ql_int8_weight){n, k, L->q, k, L->sw, n, group, L->bias, QL_F32};
    L->lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &L->lin));
}

static void free_layer(layer *L)
{
    ql_linear_destroy(L->lin);
    free(L->q);
    free(L->sw);
    free(L->bias);
}

/* y through epi, against y without any cache, bit for bit */
static int same_as_plain(layer *L, const void *x, ql_dtype xdt, int64_t m, int64_t ldx, int64_t n,
                         const ql_epilogue *epi)
{
    float *a = malloc((size_t)(m * n) * sizeof(float)), *b = malloc((size_t)(m * n) * sizeof(float));
    ql_epilogue plain = epi ? *epi : (ql_epilogue){0};
    plain.prologue_cache = NULL;
    CHECK_OK(ql_linear_forward(L->lin, x, xdt, m, ldx, a, QL_F32, n, epi));
    CHECK_OK(ql_linear_forward(L->lin, x, xdt, m, ldx, b, QL_F32, n, &plain));
    const int same = memcmp(a, b, (size_t)(m * n) * sizeof(float)) == 0;
    free(a);
    free(b);
    return same;
}

static void stats(const ql_prologue_cache *c, int64_t *h, int64_t *mi) { ql_prologue_cache_stats(c, h, mi); }

static void run_case(ql_isa isa, int threads, ql_dtype xdt, int64_t m, int64_t k, int64_t group)
{
    ql_context *ctx = NULL;
    CHECK_OK(ql_context_create(&ctx));
    CHECK_OK(ql_context_set_isa(ctx, isa));
    CHECK_OK(ql_context_set_threads(ctx, threads));
    const int64_t n = 40, ldx = k + 3;
    layer A, B;
    make_layer(ctx, n, k, group, &A);
    make_layer(ctx, n + 24, k, group, &B);
    const size_t es = ql_dtype_size(xdt);
    char *x = malloc((size_t)(m * ldx) * es * 2);
    tu_fill_gauss(xdt, x, m * ldx * 2, 1.0);
    ql_prologue_cache *pc = NULL;
    CHECK_OK(ql_prologue_cache_create(&pc));
    ql_epilogue e = {.prologue_cache = pc, .prologue_generation = 7};
    int64_t h, mi;
    const char *isan = ql_isa_name(isa);
    CHECK(same_as_plain(&A, x, xdt, m, ldx, n, &e), "%s t%d %s m=%lld k=%lld: first layer through the cache", isan,
          threads, ql_dtype_name(xdt), (long long)m, (long long)k);
    stats(pc, &h, &mi);
    CHECK(h == 0 && mi == 1, "%s: first forward a miss (%lld hits, %lld misses)", isan, (long long)h, (long long)mi);
    CHECK(same_as_plain(&B, x, xdt, m, ldx, n + 24, &e), "%s t%d m=%lld: second layer from the cache", isan, threads,
          (long long)m);
    stats(pc, &h, &mi);
    CHECK(h == 1 && mi == 1, "%s m=%lld: second layer a hit (%lld, %lld)", isan, (long long)m, (long long)h, (long long)mi);
    /* the key: each of these must miss, and still give the plain bits */
    struct {
        const char *what;
        const void *x;
        int64_t m, ldx;
        uint64_t gen;
        int act;
    } miss[] = {
        {"another generation", x, m, ldx, 8, 0},
        {"another pointer", x + ldx * es, m > 1 ? m - 1 : m, ldx, 8, 0},
        {"another m", x, m > 1 ? m - 1 : m + 1, ldx, 8, 0},
        {"another ldx", x, m, ldx + 1, 8, 0},
        {"an input activation", x, m, ldx, 8, QL_INPUT_ACT_GELU_TANH},
    };
    for (size_t i = 0; i < sizeof miss / sizeof miss[0]; i++) {
        ql_epilogue f = {.prologue_cache = pc, .prologue_generation = miss[i].gen, .input_act = miss[i].act};
        int64_t h0, m0;
        stats(pc, &h0, &m0);
        CHECK(same_as_plain(&A, miss[i].x, xdt, miss[i].m, miss[i].ldx, n, &f), "%s: %s, plain bits", isan, miss[i].what);
        stats(pc, &h, &mi);
        CHECK(h == h0 && mi == m0 + 1, "%s m=%lld: %s misses (%lld, %lld)", isan, (long long)m, miss[i].what,
              (long long)(h - h0), (long long)(mi - m0));
        CHECK(same_as_plain(&B, miss[i].x, xdt, miss[i].m, miss[i].ldx, n + 24, &f), "%s: %s, hit bits", isan,
              miss[i].what);
        stats(pc, &h, &mi);
        CHECK(h == h0 + 1, "%s: %s, then a hit", isan, miss[i].what);
    }
    /* an unmerged LoRA bypasses it, unchanged */
    const int64_t rank = 4;
    float *down = malloc((size_t)(rank * k) * 4), *up = malloc((size_t)((n + 24) * rank) * 4);
    tu_fill_gauss(QL_F32, down, rank * k, 0.05);
    tu_fill_gauss(QL_F32, up, (n + 24) * rank, 0.05);
    const ql_lora_desc ld = {rank, down, QL_F32, k, up, QL_F32, rank, 0.5};
    CHECK_OK(ql_linear_add_lora(B.lin, &ld, NULL));
    int64_t h0, m0;
    stats(pc, &h0, &m0);
    CHECK(same_as_plain(&B, x, xdt, m, ldx, n + 24, &(ql_epilogue){.prologue_cache = pc, .prologue_generation = 8,
                                                                       .input_act = QL_INPUT_ACT_GELU_TANH}),
          "%s: LoRA layer through the cache", isan);
    stats(pc, &h, &mi);
    CHECK(h == h0 && mi == m0, "%s: a LoRA forward leaves the cache alone", isan);
    /* ...and the held activation is still the one before it */
    CHECK(same_as_plain(&A, x, xdt, m, ldx, n, &(ql_epilogue){.prologue_cache = pc, .prologue_generation = 8,
                                                              .input_act = QL_INPUT_ACT_GELU_TANH}),
          "%s: hit after the LoRA forward", isan);
    stats(pc, &h, &mi);
    CHECK(h == h0 + 1, "%s: the activation before the LoRA forward still served", isan);
    ql_prologue_cache_clear(pc);
    CHECK(same_as_plain(&A, x, xdt, m, ldx, n, &(ql_epilogue){.prologue_cache = pc, .prologue_generation = 8,
                                                              .input_act = QL_INPUT_ACT_GELU_TANH}),
          "%s: after clear", isan);
    stats(pc, &h, &mi);
    CHECK(mi == m0 + 1, "%s: clear makes the next forward miss", isan);
    /* forward_shared (an internal cache on the CPU) against separate forwards */
    float *y0 = malloc((size_t)(m * n) * 4), *y1 = malloc((size_t)(m * (n + 24)) * 4);
    float *z0 = malloc((size_t)(m * n) * 4), *z1 = malloc((size_t)(m * (n + 24)) * 4);
    ql_linear *both[2] = {A.lin, B.lin};
    void *ys[2] = {y0, y1};
    const int64_t ldys[2] = {n, n + 24};
    CHECK_OK(ql_linear_forward_shared(both, 2, x, xdt, m, ldx, ys, QL_F32, ldys, NULL));
    CHECK_OK(ql_linear_forward(A.lin, x, xdt, m, ldx, z0, QL_F32, n, NULL));
    CHECK_OK(ql_linear_forward(B.lin, x, xdt, m, ldx, z1, QL_F32, n + 24, NULL));
    CHECK(!memcmp(y0, z0, (size_t)(m * n) * 4) && !memcmp(y1, z1, (size_t)(m * (n + 24)) * 4),
          "%s t%d m=%lld: forward_shared equals separate forwards", isan, threads, (long long)m);
    free(y0), free(y1), free(z0), free(z1), free(down), free(up);
    ql_prologue_cache_destroy(pc);
    free(x);
    free_layer(&A);
    free_layer(&B);
    ql_context_destroy(ctx);
}

/* Two contexts on different ISAs share a cache: the kernel layout is in the
 * key, so the second misses instead of reading the other packing. */
static void run_layouts(const ql_isa *isas, int nisa)
{
    if (nisa < 2) return;
    ql_context *c0 = NULL, *c1 = NULL;
    CHECK_OK(ql_context_create(&c0));
    CHECK_OK(ql_context_create(&c1));
    CHECK_OK(ql_context_set_isa(c0, isas[0]));
    CHECK_OK(ql_context_set_isa(c1, isas[nisa - 1]));
    const int64_t m = 50, k = 512, n = 32;
    layer A, B;
    make_layer(c0, n, k, 256, &A);
    make_layer(c1, n, k, 256, &B);
    float *x = malloc((size_t)(m * k) * 4);
    tu_fill_gauss(QL_F32, x, m * k, 1.0);
    ql_prologue_cache *pc = NULL;
    CHECK_OK(ql_prologue_cache_create(&pc));
    ql_epilogue e = {.prologue_cache = pc, .prologue_generation = 1};
    CHECK(same_as_plain(&A, x, QL_F32, m, k, n, &e), "layouts: first");
    CHECK(same_as_plain(&B, x, QL_F32, m, k, n, &e), "layouts: %s after %s", ql_isa_name(isas[nisa - 1]),
          ql_isa_name(isas[0]));
    int64_t h, mi;
    stats(pc, &h, &mi);
    CHECK(h == 0 && mi == 2, "layouts: %s and %s packings do not share (%lld hits)", ql_isa_name(isas[0]),
          ql_isa_name(isas[nisa - 1]), (long long)h);
    ql_prologue_cache_destroy(pc);
    free(x);
    free_layer(&A);
    free_layer(&B);
    ql_context_destroy(c0);
    ql_context_destroy(c1);
}

/* Over one chunk of rows (12288): the cache is bypassed. */
static void run_tall(void)
{
    ql_context *ctx = NULL;
    CHECK_OK(ql_context_create(&ctx));
    const int64_t m = 12289, k = 64, n = 8;
    layer A;
    make_layer(ctx, n, k, 64, &A);
    float *x = malloc((size_t)(m * k) * 4);
    tu_fill_gauss(QL_F32, x, m * k, 1.0);
    ql_prologue_cache *pc = NULL;
    CHECK_OK(ql_prologue_cache_create(&pc));
    ql_epilogue e = {.prologue_cache = pc};
    CHECK(same_as_plain(&A, x, QL_F32, m, k, n, &e), "tall: plain bits");
    int64_t h, mi;
    stats(pc, &h, &mi);
    CHECK(h == 0 && mi == 0, "tall: m = %lld over one chunk bypasses the cache", (long long)m);
    ql_prologue_cache_destroy(pc);
    ql_prologue_cache_stats(NULL, &h, &mi);
    CHECK(h == 0 && mi == 0, "stats of NULL");
    ql_prologue_cache_destroy(NULL);
    CHECK(ql_prologue_cache_create(NULL) == QL_ERR_INVALID_ARGUMENT, "create(NULL) refused");
    free(x);
    free_layer(&A);
    ql_context_destroy(ctx);
}

int main(void)
{
    tu_init("test_prologue_cache");
    ql_isa isas[32];
    const int nisa = tu_isas(isas);
    const ql_dtype dts[] = {QL_F32, QL_BF16, QL_F16};
    const int64_t ms[] = {1, 3, 77, 200};
    for (int i = 0; i < nisa; i++)
        for (int t = 1; t <= 2; t++)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                const ql_dtype dt = dts[(size_t)tu_range(0, 2)];
                const int64_t k = mi % 2 ? 320 : 256 * tu_range(1, 3), group = k % 256 ? 64 : 256;
                run_case(isas[i], t, dt, ms[mi], k, group);
            }
    run_layouts(isas, nisa);
    run_tall();
    return tu_finish();
}
