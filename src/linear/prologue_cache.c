#include "linear/prologue_cache.h"

#include <stdlib.h>
#include <string.h>

ql_status ql_prologue_cache_create(ql_prologue_cache **out)
{
    QL_CHECK_PTR("ql_prologue_cache_create", out);
    *out = calloc(1, sizeof **out);
    if (!*out) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_prologue_cache_create: out of memory");
    return QL_OK;
}

void ql_prologue_cache_destroy(ql_prologue_cache *c)
{
    if (!c) return;
    ql_aligned_free(c->buf);
    free(c);
}

void ql_prologue_cache_stats(const ql_prologue_cache *c, int64_t *hits, int64_t *misses)
{
    if (hits) *hits = c ? c->hits : 0;
    if (misses) *misses = c ? c->misses : 0;
}

void ql_prologue_cache_clear(ql_prologue_cache *c)
{
    if (c) c->valid = false;
}

ql_prologue_key ql_prologue_key_of(const ql_epilogue *epi, const void *x, ql_dtype xdt, int64_t m, int64_t ldx,
                                   int64_t k, int64_t group, const void *layout)
{
    ql_prologue_key key;
    memset(&key, 0, sizeof key);
    key.x = x;
    key.xdt = xdt;
    key.m = m;
    key.ldx = ldx;
    key.k = k;
    key.group = group;
    key.layout = layout;
    if (epi) {
        key.input_act = epi->input_act;
        if (epi->input_act) {
            key.act_weight = epi->input_act_weight;
            key.act_weight_dtype = epi->input_act_weight_dtype;
            memcpy(&key.act_eps_bits, &epi->input_act_eps, 4);
        }
        key.generation = epi->prologue_generation;
    }
    return key;
}

bool ql_prologue_key_equal(const ql_prologue_key *a, const ql_prologue_key *b)
{
    return a->x == b->x && a->xdt == b->xdt && a->m == b->m && a->ldx == b->ldx && a->k == b->k &&
           a->group == b->group && a->input_act == b->input_act && a->act_weight == b->act_weight &&
           a->act_weight_dtype == b->act_weight_dtype && a->act_eps_bits == b->act_eps_bits && a->layout == b->layout &&
           a->generation == b->generation;
}

bool ql_prologue_cache_reserve(ql_prologue_cache *c, size_t bytes)
{
    c->valid = false;
    if (c->cap >= bytes) return true;
    ql_aligned_free(c->buf);
    c->buf = ql_aligned_alloc(bytes);
    c->cap = c->buf ? bytes : 0;
    return c->buf != NULL;
}
