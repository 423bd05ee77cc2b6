/* probe_amx: what bounds the AMX int8 tile kernel (ukernel_amx.c), on one
 * core and on all of them. The 32×32 tile call runs over packed operands
 * under different loop structures (the library's blocked driver, and
 * explicit ones that keep one operand's K slice in L1), each timed as the
 * minimum over reps (a shared host only ever adds time), configurations
 * interleaved within each round; beside them the tile unit's register-only
 * rate on zero operands and on random ones (peak.c says why they differ).
 * Not a test: it prints GOP/s and the share of the random-operand rate.
 *   probe_amx [threads=1[,2,...]] [rounds=3] [shape MxNxK ...]
 * With several thread counts, a short list of structures per count.
 * Needs AMX (exits 0 with a note elsewhere). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "peak.h"
#include "cpu/gemm.h"
#include "cpu/registry.h"
#include "cpu/x86/x86.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void epi_none(void *arg, const int32_t *c, int nr, int64_t m0, int64_t n0, int mr_eff, int nr_eff)
{
    (void)arg, (void)c, (void)nr, (void)m0, (void)n0, (void)mr_eff, (void)nr_eff;
}

typedef struct {
    const ql_s8_kernel *kern;
    const int8_t *pa;
    const ql_packed_b *pb;
    int64_t m, k4, mpanels;
} problem;

/* kind 'a': a K slice of one activation panel in L1 against nb weight
 * panels (their partial sums nb tiles, L1), the block of nb weight panels
 * (L2) against every activation panel; 'b': the mirror, a weight panel's K
 * slice in L1 against na activation panels. Threads split the weight
 * panels. kc4 = K slice in k4 rows. */
static void run_explicit(const problem *p, char kind, int64_t kc4, int64_t nbk, int threads)
{
    const int64_t k4 = p->k4, npanels = p->pb->panels, mp = p->mpanels;
    const int64_t a_panel = k4 * 32 * 4, b_panel = k4 * 32 * 4;
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t j0 = npanels * t / nt, j1 = npanels * (t + 1) / nt;
        _Alignas(64) static _Thread_local int32_t cbuf[32 * 1024];
        ql_s8_begin(p->kern);
        if (kind == 'a') {
            for (int64_t jb = j0; jb < j1; jb += nbk) {
                const int64_t je = jb + nbk < j1 ? jb + nbk : j1;
                for (int64_t ip = 0; ip < mp; ip++)
                    for (int64_t pc = 0; pc < k4; pc += kc4) {
                        const int64_t kc = k4 - pc < kc4 ? k4 - pc : kc4;
                        for (int64_t jp = jb; jp < je; jp++)
                            p->kern->tile(kc, p->pa + ip * a_panel + pc * 128, p->pb->data + jp * b_panel + pc * 128,
                                          cbuf + (jp - jb) * 1024, pc > 0);
                    }
            }
        } else {
            for (int64_t jp = j0; jp < j1; jp++)
                for (int64_t ib = 0; ib < mp; ib += nbk) {
                    const int64_t ie = ib + nbk < mp ? ib + nbk : mp;
                    for (int64_t pc = 0; pc < k4; pc += kc4) {
                        const int64_t kc = k4 - pc < kc4 ? k4 - pc : kc4;
                        for (int64_t ip = ib; ip < ie; ip++)
                            p->kern->tile(kc, p->pa + ip * a_panel + pc * 128, p->pb->data + jp * b_panel + pc * 128,
                                          cbuf + (ip - ib) * 1024, pc > 0);
                    }
                }
        }
    }
}

/* The tile call on one L1-resident K slice, again and again (per thread). */
static void run_l1(const problem *p, int64_t kc4, int threads, int64_t calls)
{
#pragma omp parallel num_threads(threads)
    {
        _Alignas(64) static _Thread_local int32_t cbuf[1024];
        ql_s8_begin(p->kern);
        for (int64_t i = 0; i < calls; i++) p->kern->tile(kc4, p->pa, p->pb->data, cbuf, 0);
    }
}

typedef struct {
    char kind; /* 'l': the library's driver; 'a', 'b': run_explicit; '1': L1 */
    int64_t kc, nb;
} config;

int main(int argc, char **argv)
{
    int tlist[16], nt = 0;
    for (const char *c = argc > 1 ? argv[1] : "1"; *c && nt < 16;) {
        tlist[nt++] = atoi(c);
        while (*c && *c != ',') c++;
        if (*c == ',') c++;
    }
    const bool curve = nt > 1;
    const int rounds = argc > 2 ? atoi(argv[2]) : 3;
    const ql_cpu_kernels *kt = ql_cpu_kernels_for(QL_ISA_AMX);
    if (!kt->supported(ql_cpu())) {
        printf("probe_amx: no AMX here (%s)\n", kt->refusal(ql_cpu()));
        return 0;
    }
    const ql_s8_kernel *kern = &ql_s8_amx[31];
    static const char *dflt[] = {"1024x2048x2048", "1024x8192x2048", "1024x2048x8192", "1024x6144x256"};
    const char **shapes = argc > 3 ? (const char **)argv + 3 : dflt;
    const int nshapes = argc > 3 ? argc - 3 : 4;
    const config cfgs[] = {{'l', 0, 0},    {'1', 512, 0},   {'1', 256, 0},  {'1', 128, 0},   {'a', 2048, 4}, {'a', 2048, 2},  {'a', 1024, 4},
                           {'a', 512, 4},  {'a', 512, 8},   {'a', 256, 8},  {'a', 256, 16},  {'b', 2048, 4},
                           {'b', 1024, 4}, {'b', 512, 8},   {'b', 512, 16}, {'b', 256, 16},  {'b', 256, 32},
                           {'a', 1024, 8}, {'b', 1024, 8}};
    const int ncfg = (int)(sizeof cfgs / sizeof cfgs[0]);
    printf("probe_amx: %d rounds, min over reps; tile rates (registers) sampled per round\n", rounds);
    for (int ti = 0; ti < nt; ti++)
    for (int s = 0; s < nshapes; s++) {
        const int threads = tlist[ti] > 0 ? tlist[ti] : 1;
        long m, n, k;
        if (sscanf(shapes[s], "%ldx%ldx%ld", &m, &n, &k) != 3) continue;
        int8_t *a = malloc((size_t)(m * k)), *w = malloc((size_t)(n * k));
        srand(7);
        for (long i = 0; i < m * k; i++) a[i] = (int8_t)(rand() % 255 - 127);
        for (long i = 0; i < n * k; i++) w[i] = (int8_t)(rand() % 255 - 127);
        int32_t *rowsum = malloc(sizeof(int32_t) * (size_t)m);
        void *pa = ql_aligned_alloc(ql_packed_a_bytes(kern, m, k));
        ql_pack_a_s8(kern, a, m, k, k, pa, rowsum);
        ql_packed_b pb;
        if (ql_pack_b_s8(kern, w, n, k, k, &pb) != QL_OK) return 1;
        const problem p = {kern, pa, &pb, m, pb.k4, ql_panels(m, 32)};
        const double ops = 2.0 * (double)m * (double)n * (double)k;
        double best[32], peak_best = 0, zero_best = 0;
        for (int c = 0; c < ncfg; c++) best[c] = 1e30;
        for (int r = 0; r < rounds; r++) {
            const double pk = ql_bench_amx_rate_gops(threads, 250000, 1), pz = ql_bench_amx_rate_gops(threads, 250000, 0);
            if (pk > peak_best) peak_best = pk;
            if (pz > zero_best) zero_best = pz;
            for (int c = 0; c < ncfg; c++) {
                const config *g = &cfgs[c];
                if (curve && !(c <= 2 || (g->kind == 'a' && g->kc == 2048 && g->nb == 4))) continue;
                if ((g->kind == 'a' || g->kind == 'b' || g->kind == '1') && g->kc / 4 > p.k4 && g->kc != 2048) continue;
                const int reps = 7;
                for (int i = 0; i < reps; i++) {
                    double t0 = now_s(), ops_i = ops;
                    if (g->kind == 'l') ql_gemm_s8_run(threads, kern, pa, m, &pb, epi_none, NULL);
                    else if (g->kind == '1') {
                        const int64_t kc4 = g->kc / 4 < p.k4 ? g->kc / 4 : p.k4, calls = 300;
                        run_l1(&p, kc4, threads, calls);
                        ops_i = 2.0 * 32 * 32 * (double)(kc4 * 4) * (double)calls * threads;
                    } else
                        run_explicit(&p, g->kind, g->kc / 4 < p.k4 ? g->kc / 4 : p.k4, g->nb, threads);
                    const double dt = now_s() - t0, rate = ops_i / dt;
                    if (1.0 / rate < best[c]) best[c] = 1.0 / rate;
                }
            }
        }
        printf("%ldx%ldx%ld, %d thread(s): tile rate (registers, best of rounds) random operands %.0f GOP/s, zero %.0f\n", m,
               n, k, threads, peak_best, zero_best);
        for (int c = 0; c < ncfg; c++) {
            if (best[c] >= 1e29) continue;
            const config *g = &cfgs[c];
            const double gops = 1e-9 / best[c];
            if (g->kind == 'l') printf("  library driver            %8.0f GOP/s %5.1f%%  (%.3f ms)\n", gops, 100 * gops / peak_best, ops * best[c] * 1e3);
            else if (g->kind == '1') printf("  one K slice in L1 kc %-5ld%8.0f GOP/s %5.1f%%\n", (long)g->kc, gops, 100 * gops / peak_best);
            else printf("  %c-slice kc %-5ld n%c %-3ld    %8.0f GOP/s %5.1f%%  (%.3f ms)\n", g->kind, (long)g->kc, g->kind == 'a' ? 'b' : 'a',
                        (long)g->nb, gops, 100 * gops / peak_best, ops * best[c] * 1e3);
        }
        fflush(stdout);
        ql_packed_b_free(&pb);
        ql_aligned_free(pa);
        free(a), free(w), free(rowsum);
    }
    return 0;
}
