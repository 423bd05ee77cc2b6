/* Float dtypes: the check every entry point uses, and ql_convert. */
#include "core/core.h"

bool ql_is_float_dtype(ql_dtype dt) { return dt == QL_F32 || dt == QL_F16 || dt == QL_BF16; }

ql_status ql_check_float_dtype(const char *fn, const char *name, ql_dtype dt)
{
    if (!ql_is_float_dtype(dt))
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: %s dtype %s is not supported (fp32, fp16 or bf16)", fn, name,
                       ql_dtype_name(dt));
    return QL_OK;
}

ql_status ql_convert(const void *src, ql_dtype sdt, void *dst, ql_dtype ddt, int64_t n)
{
    QL_TRY(ql_check_float_dtype("ql_convert", "src_dtype", sdt));
    QL_TRY(ql_check_float_dtype("ql_convert", "dst_dtype", ddt));
    if (n < 0 || n > QL_MAX_ELEMENTS) return ql_fail(QL_ERR_INVALID_ARGUMENT, "ql_convert: n = %lld is out of range", (long long)n);
    if (n == 0) return QL_OK;
    QL_CHECK_PTR("ql_convert", src);
    QL_CHECK_PTR("ql_convert", dst);
    for (int64_t i = 0; i < n; i++) ql_store_f(ddt, dst, i, ql_load_f(sdt, src, i));
    return QL_OK;
}
