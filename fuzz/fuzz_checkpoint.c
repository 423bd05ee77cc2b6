/* libFuzzer target for the checkpoint reader: any byte string must be either
 * accepted (and then every tensor, metadata entry and layer is readable and
 * consistent) or refused with a one-line message naming the input. Built
 * only with -DQL_BUILD_FUZZ=ON (clang). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ql_checkpoint *c = NULL;
    ql_status st = ql_checkpoint_open_memory(size ? data : NULL, size, "fuzz", &c);
    if (st != QL_OK) {
        const char *m = ql_last_error();
        if (c != NULL || strncmp(m, "fuzz: ", 6) != 0 || strchr(m, '\n') != NULL) abort();
        return 0;
    }
    /* Accepted: walk everything and check the invariants the reader promises. */
    uint64_t covered = 0;
    for (int64_t i = 0; i < ql_checkpoint_tensor_count(c); i++) {
        ql_tensor_info t;
        if (ql_checkpoint_tensor(c, i, &t) != QL_OK) abort();
        if (t.offset + t.bytes > size || t.offset < 8 + ql_checkpoint_header_bytes(c)) abort();
        if (ql_checkpoint_find(c, t.name) != i) abort();
        uint64_t bits = (uint64_t)t.numel * (uint64_t)ql_st_dtype_bits(t.dtype);
        if (bits / 8 != t.bytes) abort();
        /* Touch the first and last byte. */
        volatile uint8_t sink = 0;
        if (t.bytes) sink ^= ((const uint8_t *)t.data)[0] ^ ((const uint8_t *)t.data)[t.bytes - 1];
        (void)sink;
        covered += t.bytes;
    }
    if (8 + ql_checkpoint_header_bytes(c) + covered != size) abort();
    for (int64_t i = 0; i < ql_checkpoint_metadata_count(c); i++) {
        const char *k, *v;
        if (ql_checkpoint_metadata(c, i, &k, &v) != QL_OK || ql_checkpoint_metadata_get(c, k) == NULL) abort();
    }
    for (int64_t i = 0; i < ql_checkpoint_layer_count(c); i++) {
        ql_layer_info l;
        if (ql_checkpoint_layer(c, i, &l) != QL_OK || ql_checkpoint_find_layer(c, l.prefix) != i) abort();
        ql_linear_desc d;
        if (l.supported) {
            if (ql_checkpoint_linear_desc(c, l.prefix, QL_LINEAR_W8A8, &d) != QL_OK) abort();
            if (l.bits) { /* W4A8/W6A8: the descriptor passes the library's checks and decodes */
                if (d.wxa8.n != l.n || d.wxa8.k != l.k || d.wxa8.bits != l.bits || ql_wxa8_check(&d.wxa8) != QL_OK) abort();
                if (l.n * l.k <= 65536) {
                    int8_t *g = malloc((size_t)(l.n * l.k) + 1);
                    if (!g || ql_wxa8_decode(&d.wxa8, g, l.k) != QL_OK) abort();
                    free(g);
                }
                continue;
            }
            /* The descriptor must pass the library's own checks. */
            if (d.int8.n != l.n || d.int8.k != l.k || (d.int8.n_scale != 1 && d.int8.n_scale != d.int8.n)) abort();
            volatile float s = d.int8.n_scale > 0 ? d.int8.scale[d.int8.n_scale - 1] : 0.0f;
            (void)s;
        }
    }
    ql_checkpoint_close(c);
    return 0;
}
