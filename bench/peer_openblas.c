/* OpenBLAS sgemm adapter. */
#include <stdio.h>
#include <stdlib.h>

#include "peers.h"

#ifdef QL_HAVE_OPENBLAS
#include <cblas.h>

typedef struct {
    int64_t m, n, k;
    const float *w;
} openblas_peer;

int peer_openblas_available(void) { return 1; }
const char *peer_openblas_info(void)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "OpenBLAS %s, core %s", openblas_get_config(), openblas_get_corename());
    return buf;
}
void peer_openblas_threads(int t) { openblas_set_num_threads(t); }
void *peer_openblas_create(int64_t m, int64_t n, int64_t k, const float *w)
{
    openblas_peer *p = malloc(sizeof *p);
    if (p) *p = (openblas_peer){m, n, k, w};
    return p;
}
int peer_openblas_run(void *pp, const float *x, float *y)
{
    openblas_peer *p = pp;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)p->m, (int)p->n, (int)p->k, 1.0f, x, (int)p->k, p->w,
                (int)p->k, 0.0f, y, (int)p->n);
    return 0;
}
#else
int peer_openblas_available(void) { return 0; }
const char *peer_openblas_info(void) { return "OpenBLAS not found at build time"; }
void peer_openblas_threads(int t) { (void)t; }
void *peer_openblas_create(int64_t m, int64_t n, int64_t k, const float *w) { (void)m; (void)n; (void)k; (void)w; return NULL; }
int peer_openblas_run(void *p, const float *x, float *y) { (void)p; (void)x; (void)y; return 1; }
#endif
