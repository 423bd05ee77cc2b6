/* probe_amx_overlap: whether AVX-512 arithmetic (the prologue's kind:
 * permutes, adds, subtracts, multiplies on zmm registers) runs in the shadow
 * of AMX tile multiplies on the same core. Three register-only loops, each
 * timed as the minimum over rounds: TDPBSSD alone (4 a step, 2x2 C tiles,
 * the library kernel's step with its operands already in tiles), vector
 * work alone (V units a step, a unit = the prologue's two in-register FWHT
 * stages on 8 independent vectors, ~104 instructions), and both in one loop. If the
 * combined loop takes max(tiles, vector) a step, a kernel that interleaves
 * the next rows' prologue with the current tiles' products hides it; if it
 * takes their sum, it does not. One thread, then every thread at once (the
 * all-core power state). Not a test.
 *   probe_amx_overlap [threads=all] [steps=200000]
 * Needs AMX (exits 0 with a note elsewhere). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/registry.h"
#include "cpu/x86/simd512.h"
#include "cpu/x86/x86.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    uint8_t palette, start;
    uint8_t pad[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* steps of: `tiles` ? 4 TDPBSSD : none, and v vector units; returns ns a step */
static double loop(int tiles, int v, long steps, float *sink)
{
    const __m512 norm = _mm512_set1_ps(0.0625f);
    __m512 r0 = _mm512_set1_ps(1.0f), r1 = _mm512_set1_ps(2.0f), r2 = _mm512_set1_ps(3.0f), r3 = _mm512_set1_ps(4.0f);
    __m512 r4 = _mm512_set1_ps(5.0f), r5 = _mm512_set1_ps(6.0f), r6 = _mm512_set1_ps(7.0f), r7 = _mm512_set1_ps(8.0f);
    const double t0 = now_s();
    for (long s = 0; s < steps; s++) {
        if (tiles) {
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            _tile_dpbssd(2, 5, 6);
            _tile_dpbssd(3, 5, 7);
        }
        for (int u = 0; u < v; u++) {
            r0 = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(r0, norm)));
            r1 = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(r1, norm)));
            r2 = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(r2, norm)));
            r3 = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(r3, norm)));
            r4 = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(r4, norm)));
            r5 = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(r5, norm)));
            r6 = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(r6, norm)));
            r7 = ql512_fwht_s4(ql512_fwht_s1(_mm512_mul_ps(r7, norm)));
            __asm__ volatile("" : "+v"(r0), "+v"(r1), "+v"(r2), "+v"(r3), "+v"(r4), "+v"(r5), "+v"(r6), "+v"(r7));
        }
    }
    const double dt = now_s() - t0;
    *sink += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(r0, r1), _mm512_add_ps(r2, r3)),
                                                _mm512_add_ps(_mm512_add_ps(r4, r5), _mm512_add_ps(r6, r7))));
    return 1e9 * dt / (double)steps;
}

static void tiles_setup(void)
{
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    _Alignas(64) static _Thread_local int8_t buf[16 * 64];
    for (int i = 0; i < 16 * 64; i++) buf[i] = (int8_t)(i * 37 + 11);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf, 64);
}

int main(int argc, char **argv)
{
    const char *why = ql_amx_refusal(ql_cpu());
    if (*why) {
        printf("probe_amx_overlap: no AMX here (%s)\n", why);
        return 0;
    }
    const int all = argc > 1 ? atoi(argv[1]) : omp_get_num_procs();
    const long steps = argc > 2 ? atol(argv[2]) : 200000;
    static const int vs[] = {1, 2, 3, 4, 6}; /* units a step */
    const int counts[2] = {1, all};
    printf("probe_amx_overlap: ns a step (min of 5 rounds); a step = 4 TDPBSSD (2x2 tiles) and/or V units of ~104 zmm "
           "instructions; overlap = combined / max(tiles, vector)\n");
    for (int ci = 0; ci < 2; ci++) {
        const int threads = counts[ci];
        double best[1 + 2 * 5];
        for (int i = 0; i < 11; i++) best[i] = 1e30;
        float sink = 0;
        for (int round = 0; round < 5; round++) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
            {
                tiles_setup();
                double mine[11];
                mine[0] = loop(1, 0, steps, &sink);
                for (int i = 0; i < 5; i++) {
                    mine[1 + 2 * i] = loop(0, vs[i], steps, &sink);
                    mine[2 + 2 * i] = loop(1, vs[i], steps, &sink);
                }
                _tile_release();
                if (omp_get_thread_num() == 0)
                    for (int i = 0; i < 11; i++)
                        if (mine[i] < best[i]) best[i] = mine[i];
            }
        }
        printf("%d thread(s), thread 0: tiles alone %.2f ns a step\n", threads, best[0]);
        for (int i = 0; i < 5; i++) {
            const double t = best[0], v = best[1 + 2 * i], b = best[2 + 2 * i];
            printf("  V=%d (%3d instr.): vector alone %6.2f, both %6.2f ns; overlap %.2f (1.00: hidden; sum/max %.2f)\n", vs[i],
                   104 * vs[i], v, b, b / (t > v ? t : v), (t + v) / (t > v ? t : v));
        }
        if (sink == 12345.0f) printf("%g\n", sink);
    }
    return 0;
}
