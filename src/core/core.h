/* Internal core services shared by every layer: errors, dtypes, memory,
 * CPU features, threads. Not part of the public API. */
#ifndef QL_CORE_H
#define QL_CORE_H

#include "qlinear.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define QL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define QL_LIKELY(x) __builtin_expect(!!(x), 1)
#define QL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define QL_PRINTF(a, b)
#define QL_LIKELY(x) (x)
#define QL_UNLIKELY(x) (x)
#endif

/* Record a one-line message for ql_last_error() and return status. */
ql_status ql_fail(ql_status status, const char *fmt, ...) QL_PRINTF(2, 3);

/* Argument checks that name the function and argument in the message. */
#define QL_CHECK_PTR(fn, p)                                                                       \
    do {                                                                                          \
        if (QL_UNLIKELY((p) == NULL)) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, #p); \
    } while (0)
#define QL_TRY(expr)                        \
    do {                                    \
        ql_status ql_try_s_ = (expr);       \
        if (ql_try_s_ != QL_OK) return ql_try_s_; \
    } while (0)

/* Largest element count any single tensor may have (2^48): keeps every
 * product of sizes and strides far from int64 overflow. */
#define QL_MAX_ELEMENTS ((int64_t)1 << 48)

/* int32 accumulators stay exact while 128·128·K < 2^31 (and 255·128·K for
 * the u8·s8 VNNI trick): K <= 65536. */
#define QL_MAX_K 65536

/* Validate a [rows, cols] matrix view with row stride ld. */
ql_status ql_check_matrix(const char *fn, const char *name, const void *p, int64_t rows, int64_t cols, int64_t ld);
bool ql_is_float_dtype(ql_dtype dt);
ql_status ql_check_float_dtype(const char *fn, const char *name, ql_dtype dt);

/* Element load/store for float dtypes. */
static inline float ql_load_f(ql_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case QL_F32: return ((const float *)p)[i];
    case QL_F16: return ql_fp16_to_fp32(((const uint16_t *)p)[i]);
    default: return ql_bf16_to_fp32(((const uint16_t *)p)[i]);
    }
}
static inline void ql_store_f(ql_dtype dt, void *p, int64_t i, float v)
{
    switch (dt) {
    case QL_F32: ((float *)p)[i] = v; break;
    case QL_F16: ((uint16_t *)p)[i] = ql_fp32_to_fp16(v); break;
    default: ((uint16_t *)p)[i] = ql_fp32_to_bf16(v); break;
    }
}
/* Round an fp32 value to dtype and back (the value a dtype tensor would hold). */
static inline float ql_round_to(ql_dtype dt, float v)
{
    switch (dt) {
    case QL_F32: return v;
    case QL_F16: return ql_fp16_to_fp32(ql_fp32_to_fp16(v));
    default: return ql_bf16_to_fp32(ql_fp32_to_bf16(v));
    }
}
/* Smallest positive normal value of a float dtype (torch.finfo(T).tiny). */
float ql_dtype_tiny(ql_dtype dt);

static inline const void *ql_row_cptr(ql_dtype dt, const void *base, int64_t row, int64_t ld)
{
    return (const char *)base + (size_t)(row * ld) * ql_dtype_size(dt);
}
static inline void *ql_row_ptr(ql_dtype dt, void *base, int64_t row, int64_t ld)
{
    return (char *)base + (size_t)(row * ld) * ql_dtype_size(dt);
}

/* 64-byte aligned allocation; NULL on failure (or size 0 -> a valid pointer). */
void *ql_aligned_alloc(size_t bytes);
void ql_aligned_free(void *p);

struct ql_context {
    int threads;
    ql_isa isa;
    /* A reusable workspace for per-call buffers (packed activations, ...):
     * saves the page faults of fresh multi-megabyte allocations on every
     * call. Taken with an atomic flag; a concurrent caller on the same
     * context gets a private allocation instead. */
    void *arena;
    size_t arena_bytes;
    int arena_busy;
    /* where linears run: the device, its index, the caller's stream (a
     * cudaStream_t for CUDA) and the device backend's per-context state
     * (freed by device_state_free) */
    ql_device device;
    int device_index;
    void *device_stream;
    void *device_state;
    void (*device_state_free)(void *state);
    /* rows up to which the CPU small-M path runs; -1: the measured default
     * per ISA (QLINEAR_SMALL_M overrides it, to measure the crossover) */
    int64_t small_m;
    /* work (M·N·K multiply-adds) below which a CPU forward runs on the calling
     * thread alone; -1: the measured default (QLINEAR_SERIAL_WORK overrides
     * it, 0 = never) */
    int64_t serial_work;
    /* the W8A8 prologue's hand-over to the blocked GEMM: false, per row
     * panel (a block starts once its rows are packed); true, one barrier
     * (QLINEAR_PROLOGUE_SYNC=barrier, to measure the difference) */
    bool prologue_barrier;
};

/* A 64-byte aligned buffer of `bytes` for one call; release with the same
 * *from_arena. NULL on failure. */
void *ql_scratch_acquire(ql_context *ctx, size_t bytes, bool *from_arena);
void ql_scratch_release(ql_context *ctx, void *p, bool from_arena);

#endif
