#include "core.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char ql_error_message[512];

ql_status ql_fail(ql_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ql_error_message, sizeof ql_error_message, fmt, ap);
    va_end(ap);
    return status;
}

const char *ql_last_error(void) { return ql_error_message; }

const char *ql_status_string(ql_status status)
{
    switch (status) {
    case QL_OK: return "ok";
    case QL_ERR_INVALID_ARGUMENT: return "invalid argument";
    case QL_ERR_UNSUPPORTED: return "unsupported";
    case QL_ERR_OUT_OF_MEMORY: return "out of memory";
    case QL_ERR_NONFINITE: return "non-finite value";
    case QL_ERR_IO: return "i/o error";
    case QL_ERR_FORMAT: return "format error";
    }
    return "unknown status";
}

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

bool ql_is_float_dtype(ql_dtype dt) { return dt == QL_F32 || dt == QL_F16 || dt == QL_BF16; }

ql_status ql_check_float_dtype(const char *fn, const char *name, ql_dtype dt)
{
    if (!ql_is_float_dtype(dt))
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: %s dtype %s is not supported (fp32, fp16 or bf16)", fn, name,
                       ql_dtype_name(dt));
    return QL_OK;
}
