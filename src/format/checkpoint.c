/* Checkpoints: the safetensors container (safetensors.c) with its quantized
 * layers found on top of it (layers.c). Each part frees what it made. */
#include "format.h"

#include <stdlib.h>

/* A checkpoint named `path` with nothing read yet; NULL: out of memory. */
static ql_checkpoint *checkpoint_new(const char *path)
{
    ql_checkpoint *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

/* Parse the container in c->base, then find its layers. */
static ql_status finish_open(ql_checkpoint *c, ql_checkpoint **out)
{
    ql_status st = ql_st_parse(c);
    if (st == QL_OK) st = ql_layers_discover(c);
    if (st != QL_OK) {
        ql_checkpoint_close(c);
        return st;
    }
    *out = c;
    return QL_OK;
}

ql_status ql_checkpoint_open(const char *path, ql_checkpoint **out)
{
    const char *fn = "ql_checkpoint_open";
    QL_CHECK_PTR(fn, out);
    *out = NULL;
    QL_CHECK_PTR(fn, path);
    ql_checkpoint *c = checkpoint_new(path);
    if (!c) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    ql_status st = ql_st_map_file(c);
    if (st != QL_OK) {
        ql_checkpoint_close(c);
        return st;
    }
    return finish_open(c, out);
}

ql_status ql_checkpoint_open_memory(const void *data, size_t size, const char *label, ql_checkpoint **out)
{
    const char *fn = "ql_checkpoint_open_memory";
    QL_CHECK_PTR(fn, out);
    *out = NULL;
    if (size > 0) QL_CHECK_PTR(fn, data);
    ql_checkpoint *c = checkpoint_new(label ? label : "(memory)");
    if (!c) return ql_fail(QL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    c->base = data;
    c->size = size;
    return finish_open(c, out);
}

void ql_checkpoint_close(ql_checkpoint *c)
{
    if (!c) return;
    ql_layers_free(c);
    ql_st_release(c);
    free(c->path);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
