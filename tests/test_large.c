/* An input of more than 2^31 elements (bf16 X of [2^20 + 3, 2048], 4 GiB):
 * every index and offset is 64-bit, so rows past the 2^31-element mark come
 * out exactly as the same rows computed on their own. Also a strided view
 * (ldx > K) of the same buffer. Skipped with a message if the memory cannot
 * be had. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

int main(void)
{
    tu_init("test_large");
    const int64_t m = ((int64_t)1 << 20) + 3, k = 2048, n = 8;
    printf("  x: bf16 [%lld, %lld] = %lld elements (2^31 = %lld)\n", (long long)m, (long long)k, (long long)(m * k),
           (long long)1 << 31);
    uint16_t *x = malloc((size_t)(m * k) * 2);
    uint16_t *y = malloc((size_t)(m * n) * 2);
    if (!x || !y) {
        printf("  skip: cannot allocate 4 GiB\n");
        free(x);
        free(y);
        CHECK(1, "skipped");
        return tu_finish();
    }
    /* cheap deterministic fill: a per-row random scale times a hash pattern */
    for (int64_t r = 0; r < m; r++) {
        float s = (float)(0.5 + tu_uniform());
        for (int64_t j = 0; j < k; j++) {
            uint32_t h = (uint32_t)((uint64_t)(r * k + j) * 2654435761u) >> 8;
            x[r * k + j] = ql_fp32_to_bf16(s * ((float)(h & 0xffff) / 32768.0f - 1.0f));
        }
    }
    int8_t q[8 * 2048];
    float sw[8];
    for (int i = 0; i < n * k; i++) q[i] = (int8_t)(tu_next() & 0xff);
    for (int i = 0; i < n; i++) sw[i] = 1e-3f * (float)(1 + i);
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    ql_linear_desc d = {.kind = QL_LINEAR_W8A8, .int8 = {n, k, q, k, sw, n, 256, NULL, QL_F32}};
    ql_linear *lin;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    CHECK_OK(ql_linear_forward(lin, x, QL_BF16, m, k, y, QL_BF16, n, NULL));
    /* rows around the 2^31-element boundary and at the very end */
    const int64_t rows[] = {0, ((int64_t)1 << 20) - 1, (int64_t)1 << 20, ((int64_t)1 << 20) + 1, m - 1};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        uint16_t one[8], ref[8];
        CHECK_OK(ql_linear_forward(lin, x + rows[i] * k, QL_BF16, 1, k, one, QL_BF16, n, NULL));
        CHECK_OK(ql_int8_linear_ref(&d.int8, x + rows[i] * k, QL_BF16, 1, k, ref, QL_BF16, n, NULL));
        CHECK(!memcmp(one, y + rows[i] * n, sizeof one) && !memcmp(ref, one, sizeof one),
              "row %lld differs between the 4 GiB call, a 1-row call and the reference", (long long)rows[i]);
    }
    /* a strided view: rows 2j of x as a [m/2, k] matrix with ldx = 2k */
    const int64_t mh = m / 2;
    CHECK_OK(ql_linear_forward(lin, x, QL_BF16, mh, 2 * k, y, QL_BF16, n, NULL));
    for (size_t i = 0; i < 3; i++) {
        int64_t r = i == 0 ? 0 : i == 1 ? ((int64_t)1 << 19) : mh - 1;
        uint16_t one[8];
        CHECK_OK(ql_linear_forward(lin, x + 2 * r * k, QL_BF16, 1, k, one, QL_BF16, n, NULL));
        CHECK(!memcmp(one, y + r * n, sizeof one), "strided row %lld differs", (long long)r);
    }
    ql_linear_destroy(lin);
    ql_context_destroy(ctx);
    free(x);
    free(y);
    return tu_finish();
}
