/* Hostile and valid checkpoint files, generated at run time, shared by
 * test_format (library) and test_format_cli (the qlinear command). */
#ifndef QL_TEST_FORMAT_CASES_H
#define QL_TEST_FORMAT_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "qlinear.h"

typedef struct hostile_case {
    const char *id;
    ql_status status;   /* what ql_checkpoint_open must return */
    const char *expect; /* a substring its message must contain */
} hostile_case;

int hc_count(void);
const hostile_case *hc_get(int i);
/* The file image of case i (random parts from tu_next()); caller frees. */
unsigned char *hc_build(int i, size_t *size);

/* Raw builder: tensors given as name, dtype text, shape text (JSON) and
 * data (NULL: random bytes), laid out back to back in the given order. */
typedef struct raw_tensor {
    const char *name, *dtype, *shape;
    uint64_t bytes;
    const void *data;
} raw_tensor;
unsigned char *raw_file(const raw_tensor *t, int n, const char *meta_json, size_t *size);

int write_file(const char *path, const void *data, size_t size);
unsigned char *read_file(const char *path, size_t *size);
/* A fresh temporary folder (mkdtemp); removed by rm_tree. */
char *make_temp_dir(const char *tag);
void rm_tree(const char *dir);

/* "dir/name" in one of 64 rotating buffers (valid for the next 63 calls). */
char *fc_path(const char *dir, const char *name);

#endif
