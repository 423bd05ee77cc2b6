/* A diagnostic build's timing of the blocked int8 driver (cmake
 * -DQL_TRACE_PHASES=ON): each call's parallel region is timed per thread at
 * four points (its start, the prologue done, the barrier passed, its last
 * block done) and the calls are summed per shape, each shape's first call
 * left out (its cold start); the table goes to stderr at exit. Without
 * the option every hook is an empty inline function. */
#ifndef QL_CPU_PHASE_TRACE_H
#define QL_CPU_PHASE_TRACE_H

#include <stdint.h>

enum { QL_PT_START, QL_PT_PRE, QL_PT_BARRIER, QL_PT_END, QL_PT_POINTS };
#define QL_PT_THREADS 256

#ifdef QL_TRACE_PHASES
typedef struct ql_phase_trace {
    double t0;                             /* before the region */
    double t[QL_PT_THREADS][QL_PT_POINTS]; /* per thread */
    int threads;
} ql_phase_trace;
void ql_phase_trace_begin(ql_phase_trace *pt, int threads);
void ql_phase_trace_mark(ql_phase_trace *pt, int t, int point);
void ql_phase_trace_end(ql_phase_trace *pt, int64_t m, int64_t n, int64_t k, int has_pre);
#else
typedef struct ql_phase_trace {
    char unused;
} ql_phase_trace;
static inline void ql_phase_trace_begin(ql_phase_trace *pt, int threads) { (void)pt, (void)threads; }
static inline void ql_phase_trace_mark(ql_phase_trace *pt, int t, int point) { (void)pt, (void)t, (void)point; }
static inline void ql_phase_trace_end(ql_phase_trace *pt, int64_t m, int64_t n, int64_t k, int has_pre)
{
    (void)pt, (void)m, (void)n, (void)k, (void)has_pre;
}
#endif

#endif
