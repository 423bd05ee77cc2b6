/* The shared argument check of matrix views. */
#include "core/core.h"

ql_status ql_check_matrix(const char *fn, const char *name, const void *p, int64_t rows, int64_t cols, int64_t ld)
{
    if (rows < 0 || cols < 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s has negative shape [%lld, %lld]", fn, name, (long long)rows,
                       (long long)cols);
    if (rows > QL_MAX_ELEMENTS || cols > QL_MAX_ELEMENTS || (cols > 0 && rows > QL_MAX_ELEMENTS / cols))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s shape [%lld, %lld] is absurdly large (> 2^48 elements)", fn,
                       name, (long long)rows, (long long)cols);
    if (rows > 1 && ld < cols)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s row stride %lld is smaller than its %lld columns", fn, name,
                       (long long)ld, (long long)cols);
    if (ld > QL_MAX_ELEMENTS || (rows > 0 && ld > 0 && rows - 1 > QL_MAX_ELEMENTS / ld))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s row stride %lld is absurdly large", fn, name, (long long)ld);
    if (rows > 0 && cols > 0 && p == NULL) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, name);
    return QL_OK;
}
