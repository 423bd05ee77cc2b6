#include "cpu/phase_trace.h"

#ifdef QL_TRACE_PHASES
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* Sums per (m, n, k, threads, prologue or not), in ms. */
typedef struct {
    int64_t m, n, k;
    int threads, has_pre;
    int64_t seen, calls; /* calls seen; timed (the first is left out: a cold start) */
    double fork;     /* first thread started, after the call began */
    double pre_max;  /* the slowest thread's prologue */
    double pre_mean; /* the mean thread's */
    double released; /* barrier passed (the last thread), after the first start */
    double gemm_max; /* the last block done, after the barrier */
    double gemm_mean;
    double join;     /* the region's end after the last block */
} pt_row;

#define PT_ROWS 256
static pt_row rows[PT_ROWS];
static int nrows;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void report(void)
{
    if (!nrows) return;
    fprintf(stderr, "\nqlinear phase trace (ms a call; the blocked int8 driver):\n"
                    "%6s %6s %6s %3s %3s %7s | %6s %8s %8s %8s %8s %8s %6s\n",
            "m", "n", "k", "thr", "pre", "calls", "fork", "pre_max", "pre_avg", "release", "gemm_max", "gemm_avg", "join");
    for (int i = 0; i < nrows; i++) {
        const pt_row *r = &rows[i];
        if (!r->calls) continue;
        const double c = (double)r->calls;
        fprintf(stderr, "%6lld %6lld %6lld %3d %3d %7lld | %6.4f %8.4f %8.4f %8.4f %8.4f %8.4f %6.4f\n", (long long)r->m,
                (long long)r->n, (long long)r->k, r->threads, r->has_pre, (long long)r->calls, r->fork / c, r->pre_max / c,
                r->pre_mean / c, r->released / c, r->gemm_max / c, r->gemm_mean / c, r->join / c);
    }
}

void ql_phase_trace_begin(ql_phase_trace *pt, int threads)
{
    pt->threads = threads < QL_PT_THREADS ? threads : QL_PT_THREADS;
    for (int t = 0; t < pt->threads; t++) pt->t[t][QL_PT_START] = 0; /* a thread the team did not get stays 0 */
    pt->t0 = omp_get_wtime();
}

void ql_phase_trace_mark(ql_phase_trace *pt, int t, int point)
{
    if (t < QL_PT_THREADS) pt->t[t][point] = omp_get_wtime();
}

void ql_phase_trace_end(ql_phase_trace *pt, int64_t m, int64_t n, int64_t k, int has_pre)
{
    const double t1 = omp_get_wtime();
    int nt = 0;
    while (nt < pt->threads && pt->t[nt][QL_PT_START] > 0) nt++; /* the team's size */
    if (!nt) return;
    double first = 1e300, pre_max = 0, pre_sum = 0, rel = 0, end_max = 0, gemm_sum = 0;
    for (int t = 0; t < nt; t++) {
        const double *x = pt->t[t];
        if (x[QL_PT_START] < first) first = x[QL_PT_START];
    }
    for (int t = 0; t < nt; t++) {
        const double *x = pt->t[t];
        const double pre = x[QL_PT_PRE] - first;
        if (pre > pre_max) pre_max = pre;
        pre_sum += x[QL_PT_PRE] - x[QL_PT_START];
        if (x[QL_PT_BARRIER] - first > rel) rel = x[QL_PT_BARRIER] - first;
        if (x[QL_PT_END] > end_max) end_max = x[QL_PT_END];
        gemm_sum += x[QL_PT_END] - x[QL_PT_BARRIER];
    }
    const double gemm_max = end_max - (first + rel);
    pthread_mutex_lock(&lock);
    static int registered;
    if (!registered) registered = !atexit(report);
    int i = 0;
    while (i < nrows && !(rows[i].m == m && rows[i].n == n && rows[i].k == k && rows[i].threads == nt &&
                          rows[i].has_pre == has_pre))
        i++;
    if (i < PT_ROWS) {
        if (i == nrows) rows[nrows++] = (pt_row){m, n, k, nt, has_pre, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        pt_row *r = &rows[i];
        if (!r->seen++) goto out;
        r->calls++;
        r->fork += 1e3 * (first - pt->t0);
        r->pre_max += 1e3 * pre_max;
        r->pre_mean += 1e3 * pre_sum / nt;
        r->released += 1e3 * rel;
        r->gemm_max += 1e3 * gemm_max;
        r->gemm_mean += 1e3 * gemm_sum / nt;
        r->join += 1e3 * (t1 - end_max);
    }
out:
    pthread_mutex_unlock(&lock);
}
#else
typedef int ql_phase_trace_off; /* ISO C: no empty translation unit */
#endif
