/* Aligned allocations and the context's reusable scratch arena. */
#include "core/core.h"

#include <stdlib.h>

void *ql_aligned_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    bytes = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    return p;
}

void ql_aligned_free(void *p) { free(p); }

void *ql_scratch_acquire(ql_context *ctx, size_t bytes, bool *from_arena)
{
    *from_arena = false;
    if (__atomic_exchange_n(&ctx->arena_busy, 1, __ATOMIC_ACQUIRE)) return ql_aligned_alloc(bytes);
    if (ctx->arena_bytes < bytes) {
        ql_aligned_free(ctx->arena);
        ctx->arena = ql_aligned_alloc(bytes);
        ctx->arena_bytes = ctx->arena ? bytes : 0;
        if (!ctx->arena) {
            __atomic_store_n(&ctx->arena_busy, 0, __ATOMIC_RELEASE);
            return NULL;
        }
    }
    *from_arena = true;
    return ctx->arena;
}

void ql_scratch_release(ql_context *ctx, void *p, bool from_arena)
{
    if (from_arena) __atomic_store_n(&ctx->arena_busy, 0, __ATOMIC_RELEASE);
    else ql_aligned_free(p);
}
