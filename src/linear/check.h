/* Argument checks of the public linear API, done once before a backend is
 * called; messages name the function and the argument. */
#ifndef QL_LINEAR_CHECK_H
#define QL_LINEAR_CHECK_H

#include "core/core.h"

ql_status ql_check_int8_weight(const char *fn, const ql_int8_weight *w);
ql_status ql_check_forward_args(const char *fn, int64_t n, int64_t k, const void *x, ql_dtype x_dtype, int64_t m,
                                int64_t ldx, const void *y, ql_dtype y_dtype, int64_t ldy, const ql_epilogue *epi);
/* Everything ql_linear_create checks of a descriptor before a backend sees it. */
ql_status ql_check_linear_desc(const char *fn, const ql_linear_desc *d);

#endif
