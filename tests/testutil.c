#include "testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

int tu_passed, tu_failed;
uint64_t tu_seed;
static uint64_t state;
static const char *test_name;

void tu_init(const char *name)
{
    test_name = name;
    setvbuf(stdout, NULL, _IOLBF, 0); /* a test killed by a timeout still shows how far it got */
    /* The suites run small shapes on 2-3 threads to exercise every split of
     * the work; the single-thread route for tiny layers would take most of
     * them, so it is off here (0 = never) and tested on its own
     * (test_linear: test_serial_route). */
    setenv("QLINEAR_SERIAL_WORK", "0", 0);
    const char *s = getenv("QL_TEST_SEED");
    tu_seed = s && *s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) ^ ((uint64_t)clock() << 20));
    state = tu_seed;
    printf("%s: seed %llu (rerun with QL_TEST_SEED=%llu)\n", name, (unsigned long long)tu_seed,
           (unsigned long long)tu_seed);
}

uint64_t tu_next(void)
{ /* splitmix64 */
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double tu_uniform(void) { return (double)(tu_next() >> 11) * 0x1.0p-53; }

double tu_gauss(void)
{
    double u = tu_uniform(), v = tu_uniform();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

int64_t tu_range(int64_t lo, int64_t hi) { return lo + (int64_t)(tu_next() % (uint64_t)(hi - lo + 1)); }

void tu_fill_gauss(ql_dtype dt, void *p, int64_t n, double sigma)
{
    for (int64_t i = 0; i < n; i++) {
        float v = (float)(tu_gauss() * sigma);
        if (dt == QL_F32) ((float *)p)[i] = v;
        else if (dt == QL_F16) ((uint16_t *)p)[i] = ql_fp32_to_fp16(v);
        else ((uint16_t *)p)[i] = ql_fp32_to_bf16(v);
    }
}

void tu_check(int ok, const char *file, int line, const char *fmt, ...)
{
    if (ok) {
        tu_passed++;
        return;
    }
    tu_failed++;
    if (tu_failed > 50) return;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s:%d: ", file, line);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

int tu_finish(void)
{
    printf("%s: %d passed, %d failed (seed %llu)\n", test_name, tu_passed, tu_failed, (unsigned long long)tu_seed);
    return tu_failed ? 1 : 0;
}

int tu_isas(ql_isa out[32])
{
    ql_isa best_first[32];
    int n = ql_isa_list(best_first, 32);
    if (n > 32) n = 32;
    for (int i = 0; i < n; i++) out[i] = best_first[n - 1 - i];
    return n;
}
