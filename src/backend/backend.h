/* The backend interface: what a device backend implements for ql_linear
 * and the bare GEMM. The public API (src/linear) checks every argument once,
 * picks the backend of the context's device and calls it; a backend may still
 * decline a call it cannot do (QL_ERR_UNSUPPORTED, with a message). */
#ifndef QL_BACKEND_H
#define QL_BACKEND_H

#include "core/core.h"

/* What the public layer keeps of a layer a backend created. */
typedef struct ql_layer_facts {
    ql_linear_kind kind; /* the kind it runs as */
    int64_t n, k, group;
} ql_layer_facts;

typedef struct ql_backend {
    const char *name; /* "cpu", "cuda" */
    /* QL_OK when device `index` can run this backend (NULL: any index) */
    ql_status (*check_device)(const char *fn, int index);

    /* a layer from a checked descriptor */
    ql_status (*create)(ql_context *ctx, const ql_linear_desc *d, void **impl, ql_layer_facts *info);
    void (*destroy)(void *impl);
    /* count (>= 1) layers of this backend and one context, sharing K and the
     * rotation group, on one input x; arguments checked, m > 0 */
    ql_status (*forward)(const char *fn, ql_context *ctx, void *const *impls, int count, const void *x, ql_dtype xdt,
                         int64_t m, int64_t ldx, void *const *ys, ql_dtype ydt, const int64_t *ldys,
                         const ql_epilogue *const *epis);
    /* the path a forward of m rows takes ("s8_gemm_12x32c4__avx512vnni small-M", "cuda") */
    void (*describe)(const void *impl, int64_t m, char *buf, size_t len);
    /* the kernel the last forward ran ("" if the backend does not say) */
    const char *(*last_kernel)(const void *impl);
    size_t (*weight_bytes)(const void *impl);

    /* unmerged LoRAs; NULL where the backend has none */
    ql_status (*add_lora)(void *impl, const ql_lora_desc *d, int *id);
    ql_status (*remove_lora)(void *impl, int id);
    int (*lora_count)(const void *impl);
    int64_t (*lora_rank)(const void *impl);

    /* exact C = A·Bᵀ, arguments checked */
    ql_status (*gemm_s8s8s32)(ql_context *ctx, int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                              const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc);
} ql_backend;

extern const ql_backend ql_backend_cpu;  /* src/cpu */
extern const ql_backend ql_backend_cuda; /* src/cuda (refusing every call in a build without nvcc) */

#endif
