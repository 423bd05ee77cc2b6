/* Load one layer of a checkpoint, run it on a deterministic bf16 input with
 * the fast path, and check the result against the library's reference
 * implementation of the same layer (bit for bit).
 *
 *   run_layer CKPT LAYER [M]
 *
 * Built against an installed qlinear with pkg-config or CMake (see
 * examples/CMakeLists.txt and README.md). */
#include <qlinear.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what)
{
    fprintf(stderr, "run_layer: %s: %s\n", what, ql_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: run_layer CKPT LAYER [M]\n");
        return 2;
    }
    const int64_t m = argc > 3 ? atoll(argv[3]) : 4;
    printf("qlinear %s (header %d.%d.%d), best ISA %s\n", ql_version(), QL_VERSION_MAJOR, QL_VERSION_MINOR,
           QL_VERSION_PATCH, ql_isa_name(ql_isa_best()));

    ql_checkpoint *ckpt = NULL;
    ql_context *ctx = NULL;
    ql_linear *lin = NULL;
    ql_linear_desc d;
    if (ql_checkpoint_open(argv[1], &ckpt) != QL_OK) return fail("open");
    if (ql_context_create(&ctx) != QL_OK) return fail("context");
    if (ql_checkpoint_linear_desc(ckpt, argv[2], QL_LINEAR_W8A8, &d) != QL_OK) return fail("layer");
    if (ql_linear_create(ctx, &d, &lin) != QL_OK) return fail("pack");
    printf("layer %s: %lld x %lld, ConvRot group %lld, packed weight %zu bytes\n", argv[2], (long long)d.n,
           (long long)d.k, (long long)d.int8.convrot_group, ql_linear_weight_bytes(lin));

    const int64_t n = d.n, k = d.k;
    uint16_t *x = malloc((size_t)(m * k) * 2), *y = malloc((size_t)(m * n) * 2), *yref = malloc((size_t)(m * n) * 2);
    if (!x || !y || !yref) return 1;
    for (int64_t i = 0; i < m * k; i++) /* a fixed pattern in [-1, 1) */
        x[i] = ql_fp32_to_bf16((float)((i * 2654435761u) % 2048) / 1024.0f - 1.0f);
    if (ql_linear_forward(lin, x, QL_BF16, m, k, y, QL_BF16, n, NULL) != QL_OK) return fail("forward");
    if (ql_int8_linear_ref(&d.int8, x, QL_BF16, m, k, yref, QL_BF16, n, NULL) != QL_OK) return fail("reference");

    double sum = 0.0;
    for (int64_t i = 0; i < m * n; i++) sum += ql_bf16_to_fp32(y[i]);
    printf("y[0][0..3] = %g %g %g %g, sum %.6g\n", ql_bf16_to_fp32(y[0]), ql_bf16_to_fp32(y[1 % n]),
           ql_bf16_to_fp32(y[2 % n]), ql_bf16_to_fp32(y[3 % n]), sum);
    const int same = memcmp(y, yref, (size_t)(m * n) * 2) == 0;
    printf("fast path equals the reference bit for bit: %s\n", same ? "yes" : "NO");

    free(x);
    free(y);
    free(yref);
    ql_linear_destroy(lin);
    ql_context_destroy(ctx);
    ql_checkpoint_close(ckpt);
    return same ? 0 : 1;
}
