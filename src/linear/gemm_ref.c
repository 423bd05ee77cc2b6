#include "core/core.h"

ql_status ql_gemm_s8s8s32_ref(int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda, const int8_t *b,
                              int64_t ldb, int32_t *c, int64_t ldc)
{
    const char *fn = "ql_gemm_s8s8s32_ref";
    QL_TRY(ql_check_matrix(fn, "a", a, m, k, lda));
    QL_TRY(ql_check_matrix(fn, "b", b, n, k, ldb));
    QL_TRY(ql_check_matrix(fn, "c", c, m, n, ldc));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int32_t acc = 0; /* |acc| <= 128*128*K; callers bound K (see ql_linear) */
            for (int64_t p = 0; p < k; p++) acc += (int32_t)a[i * lda + p] * (int32_t)b[j * ldb + p];
            c[i * ldc + j] = acc;
        }
    return QL_OK;
}
