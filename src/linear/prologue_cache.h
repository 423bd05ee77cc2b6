/* The prologue cache's state (include/qlinear.h: ql_prologue_cache), kept
 * by the public layer and filled by a backend: the key of the activation it
 * holds and the host buffer of its packed codes, row scales and row sums. */
#ifndef QL_PROLOGUE_CACHE_H
#define QL_PROLOGUE_CACHE_H

#include "core/core.h"

typedef struct ql_prologue_key {
    const void *x;
    ql_dtype xdt;
    int64_t m, ldx, k, group;
    int input_act;
    const void *act_weight;
    ql_dtype act_weight_dtype;
    uint32_t act_eps_bits;
    const void *layout; /* the kernel whose packing the codes follow */
    uint64_t generation;
} ql_prologue_key;

struct ql_prologue_cache {
    ql_prologue_key key;
    bool valid;
    char *buf; /* 64-byte aligned, cap bytes */
    size_t cap;
    int64_t hits, misses;
    uint64_t device_token; /* CUDA: the workspace's token of the codes it holds (the codes stay on the device) */
};

/* The key of a forward of m rows of x with epi's input activation and
 * generation, packed for the kernel `layout`. */
ql_prologue_key ql_prologue_key_of(const ql_epilogue *epi, const void *x, ql_dtype xdt, int64_t m, int64_t ldx,
                                   int64_t k, int64_t group, const void *layout);
bool ql_prologue_key_equal(const ql_prologue_key *a, const ql_prologue_key *b);
/* At least bytes of buffer (contents not kept); false when out of memory
 * (the cache is then empty and unusable for this call). */
bool ql_prologue_cache_reserve(ql_prologue_cache *c, size_t bytes);

#endif
