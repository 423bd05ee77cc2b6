/* oneDNN matmul adapter (C API): weights reordered once into the layout the
 * primitive prefers (prepacked), as a serving framework would. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peers.h"

int peer_openblas_available(void);
const char *peer_openblas_info(void);
void peer_openblas_threads(int t);
void *peer_openblas_create(int64_t m, int64_t n, int64_t k, const float *w);
int peer_openblas_run(void *p, const float *x, float *y);

struct peer {
    peer_kind kind;
    void *impl;
    size_t wbytes;
};

#ifdef QL_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>

typedef struct {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t mm;
    dnnl_memory_t src, wei, dst;
} dnnl_peer;

#define DNNL_TRY(call)                                                          \
    do {                                                                        \
        dnnl_status_t s_ = (call);                                              \
        if (s_ != dnnl_success) {                                               \
            snprintf(err, errlen, "oneDNN: %s failed (status %d)", #call, (int)s_); \
            goto fail;                                                          \
        }                                                                       \
    } while (0)

static void dnnl_peer_free(dnnl_peer *p)
{
    if (!p) return;
    if (p->mm) dnnl_primitive_destroy(p->mm);
    if (p->src) dnnl_memory_destroy(p->src);
    if (p->wei) dnnl_memory_destroy(p->wei);
    if (p->dst) dnnl_memory_destroy(p->dst);
    if (p->stream) dnnl_stream_destroy(p->stream);
    if (p->eng) dnnl_engine_destroy(p->eng);
    free(p);
}

static dnnl_peer *dnnl_create(peer_kind kind, int64_t m, int64_t n, int64_t k, const float *wf, const int8_t *ws,
                              size_t *wbytes, char *err, size_t errlen)
{
    dnnl_peer *p = calloc(1, sizeof *p);
    dnnl_primitive_desc_t pd = NULL, rpd = NULL;
    dnnl_primitive_t reorder = NULL;
    dnnl_memory_t user_w = NULL;
    void *wconv = NULL;
    if (!p) return NULL;
    dnnl_data_type_t st = kind == PEER_ONEDNN_INT8 ? dnnl_u8 : kind == PEER_ONEDNN_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_data_type_t wt = kind == PEER_ONEDNN_INT8 ? dnnl_s8 : st;
    dnnl_data_type_t dt = kind == PEER_ONEDNN_INT8 ? dnnl_s32 : st;
    DNNL_TRY(dnnl_engine_create(&p->eng, dnnl_cpu, 0));
    DNNL_TRY(dnnl_stream_create(&p->stream, p->eng, dnnl_stream_default_flags));
    dnnl_dims_t sd = {m, k}, wd = {k, n}, dd = {m, n};
    dnnl_memory_desc_t smd, wmd_any, wmd_user, dmd;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&smd, 2, sd, st, dnnl_ab));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wmd_any, 2, wd, wt, dnnl_format_tag_any));
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wmd_user, 2, wd, wt, dnnl_ba)); /* W [N,K] row-major = [K,N] "ba" */
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dmd, 2, dd, dt, dnnl_ab));
    dnnl_matmul_desc_t md;
    DNNL_TRY(dnnl_matmul_desc_init(&md, &smd, &wmd_any, NULL, &dmd));
    DNNL_TRY(dnnl_primitive_desc_create(&pd, &md, NULL, p->eng, NULL));
    const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    DNNL_TRY(dnnl_primitive_create(&p->mm, pd));
    /* the user's weight in its own dtype, then reordered into the packed layout */
    size_t es = kind == PEER_ONEDNN_INT8 ? 1 : kind == PEER_ONEDNN_BF16 ? 2 : 4;
    wconv = malloc((size_t)(n * k) * es);
    if (!wconv) { snprintf(err, errlen, "out of memory"); goto fail; }
    if (kind == PEER_ONEDNN_INT8) memcpy(wconv, ws, (size_t)(n * k));
    else if (kind == PEER_ONEDNN_BF16)
        for (int64_t i = 0; i < n * k; i++) {
            uint32_t u;
            memcpy(&u, &wf[i], 4);
            u += 0x7fffu + ((u >> 16) & 1u);
            ((uint16_t *)wconv)[i] = (uint16_t)(u >> 16);
        }
    else memcpy(wconv, wf, (size_t)(n * k) * 4);
    DNNL_TRY(dnnl_memory_create(&user_w, &wmd_user, p->eng, wconv));
    DNNL_TRY(dnnl_memory_create(&p->wei, wmd, p->eng, DNNL_MEMORY_ALLOCATE));
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &wmd_user, p->eng, wmd, p->eng, NULL));
    DNNL_TRY(dnnl_primitive_create(&reorder, rpd));
    dnnl_exec_arg_t rargs[2] = {{DNNL_ARG_FROM, user_w}, {DNNL_ARG_TO, p->wei}};
    DNNL_TRY(dnnl_primitive_execute(reorder, p->stream, 2, rargs));
    DNNL_TRY(dnnl_stream_wait(p->stream));
    *wbytes = dnnl_memory_desc_get_size(wmd);
    DNNL_TRY(dnnl_memory_create(&p->src, &smd, p->eng, DNNL_MEMORY_NONE));
    DNNL_TRY(dnnl_memory_create(&p->dst, &dmd, p->eng, DNNL_MEMORY_NONE));
    dnnl_primitive_destroy(reorder);
    dnnl_primitive_desc_destroy(rpd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(user_w);
    free(wconv);
    return p;
fail:
    if (reorder) dnnl_primitive_destroy(reorder);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (user_w) dnnl_memory_destroy(user_w);
    free(wconv);
    dnnl_peer_free(p);
    return NULL;
}

static int dnnl_run(dnnl_peer *p, const void *x, void *y)
{
    if (dnnl_memory_set_data_handle(p->src, (void *)x) != dnnl_success) return 1;
    if (dnnl_memory_set_data_handle(p->dst, y) != dnnl_success) return 1;
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->src}, {DNNL_ARG_WEIGHTS, p->wei}, {DNNL_ARG_DST, p->dst}};
    if (dnnl_primitive_execute(p->mm, p->stream, 3, args) != dnnl_success) return 1;
    return dnnl_stream_wait(p->stream) != dnnl_success;
}

static const char *dnnl_info(void)
{
    static char buf[128];
    const dnnl_version_t *v = dnnl_version();
    snprintf(buf, sizeof buf, "oneDNN %d.%d.%d (%s)", v->major, v->minor, v->patch, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime");
    return buf;
}
static const char *dnnl_isa(void)
{
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "oneDNN sse41";
    case dnnl_cpu_isa_avx: return "oneDNN avx";
    case dnnl_cpu_isa_avx2: return "oneDNN avx2";
    case dnnl_cpu_isa_avx512_mic: return "oneDNN avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "oneDNN avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "oneDNN avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "oneDNN avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "oneDNN avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "oneDNN avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni: return "oneDNN avx2_vnni";
    default: return "oneDNN (isa ?)";
    }
}
#define HAVE_DNNL 1
#else
#define HAVE_DNNL 0
#endif

int peer_available(peer_kind kind)
{
    if (kind == PEER_OPENBLAS_F32) return peer_openblas_available();
    return HAVE_DNNL;
}

const char *peer_info(peer_kind kind)
{
    if (kind == PEER_OPENBLAS_F32) return peer_openblas_info();
#if HAVE_DNNL
    return dnnl_info();
#else
    return "oneDNN not found at build time";
#endif
}

const char *peer_isa(peer_kind kind)
{
    static char buf[96];
    if (kind == PEER_OPENBLAS_F32) {
        const char *core = strstr(peer_openblas_info(), "core ");
        snprintf(buf, sizeof buf, "OpenBLAS %s", core ? core : "");
        return buf;
    }
#if HAVE_DNNL
    return dnnl_isa();
#else
    return "-";
#endif
}

void peer_set_threads(int threads)
{
    peer_openblas_threads(threads);
    omp_set_num_threads(threads); /* oneDNN's OpenMP runtime */
}

peer *peer_create(peer_kind kind, int64_t m, int64_t n, int64_t k, const float *w_f32, const int8_t *w_s8, char *err,
                  size_t errlen)
{
    peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->kind = kind;
    if (kind == PEER_OPENBLAS_F32) {
        p->impl = peer_openblas_create(m, n, k, w_f32);
        p->wbytes = (size_t)(n * k) * 4;
    }
#if HAVE_DNNL
    else p->impl = dnnl_create(kind, m, n, k, w_f32, w_s8, &p->wbytes, err, errlen);
#else
    else snprintf(err, errlen, "oneDNN not found at build time");
#endif
    if (!p->impl) {
        if (kind == PEER_OPENBLAS_F32) snprintf(err, errlen, "OpenBLAS not available");
        free(p);
        return NULL;
    }
    return p;
}

int peer_run(peer *p, const void *x, void *y)
{
    if (p->kind == PEER_OPENBLAS_F32) return peer_openblas_run(p->impl, x, y);
#if HAVE_DNNL
    return dnnl_run(p->impl, x, y);
#else
    return 1;
#endif
}

size_t peer_weight_bytes(const peer *p) { return p ? p->wbytes : 0; }

void peer_destroy(peer *p)
{
    if (!p) return;
    if (p->kind == PEER_OPENBLAS_F32) free(p->impl);
#if HAVE_DNNL
    else dnnl_peer_free(p->impl);
#endif
    free(p);
}
