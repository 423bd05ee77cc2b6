#include "core/core.h"

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
