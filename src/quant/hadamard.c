#include "quant/quant.h"

#include <math.h>

bool ql_group_valid(int64_t g)
{
    if (g < 4 || g > 65536) return false;
    while (g > 1) {
        if (g % 4) return false;
        g /= 4;
    }
    return true;
}

ql_status ql_check_group(const char *fn, int64_t group, int64_t k)
{
    if (!ql_group_valid(group))
        return ql_fail(QL_ERR_UNSUPPORTED, "%s: ConvRot group size %lld is not a power of 4 in [4, 65536]", fn,
                       (long long)group);
    if (k % group != 0)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: K = %lld is not a multiple of the ConvRot group size %lld", fn,
                       (long long)k, (long long)group);
    return QL_OK;
}

ql_status ql_hadamard(int64_t group, float *h)
{
    if (!ql_group_valid(group))
        return ql_fail(QL_ERR_UNSUPPORTED, "ql_hadamard: group size %lld is not a power of 4 in [4, 65536]",
                       (long long)group);
    QL_CHECK_PTR("ql_hadamard", h);
    if (group > 4096) return ql_fail(QL_ERR_UNSUPPORTED, "ql_hadamard: a %lld x %lld matrix is too large to build", (long long)group, (long long)group);
    static const int h4[4][4] = {{1, 1, 1, -1}, {1, 1, -1, 1}, {1, -1, 1, 1}, {-1, 1, 1, 1}};
    float norm = 1.0f / sqrtf((float)group); /* exact: group = 4^p, so sqrt = 2^p */
    for (int64_t i = 0; i < group; i++)
        for (int64_t j = 0; j < group; j++) {
            int sign = 1;
            for (int64_t a = i, b = j, g = group; g > 1; g /= 4, a /= 4, b /= 4) sign *= h4[a % 4][b % 4];
            h[i * group + j] = (float)sign * norm;
        }
    return QL_OK;
}

void ql_fwht_f32(float *v, int64_t group)
{
    int p = 0;
    for (int64_t g = group; g > 1; g /= 4) p++;
    float norm = ldexpf(1.0f, -p);
    for (int64_t i = 0; i < group; i++) v[i] *= norm;
    for (int64_t s = 1; s < group; s *= 4)
        for (int64_t base = 0; base < group; base += 4 * s)
            for (int64_t j = base; j < base + s; j++) {
                float a = v[j], b = v[j + s], c = v[j + 2 * s], d = v[j + 3 * s];
                float t0 = a + b, t1 = c + d, t2 = a - b, t3 = c - d;
                v[j] = t0 + t3;
                v[j + s] = t0 - t3;
                v[j + 2 * s] = t1 + t2;
                v[j + 3 * s] = t1 - t2;
            }
}

void ql_load_row_rotated(ql_dtype dtype, const void *src, int64_t k, int64_t group, float *dst)
{
    for (int64_t j = 0; j < k; j++) dst[j] = ql_load_f(dtype, src, j);
    if (group <= 0) return;
    for (int64_t g0 = 0; g0 < k; g0 += group) ql_fwht_f32(dst + g0, group);
    if (dtype != QL_F32)
        for (int64_t j = 0; j < k; j++) dst[j] = ql_round_to(dtype, dst[j]);
}

ql_status ql_rotate(ql_dtype dtype, void *x, int64_t rows, int64_t k, int64_t ldx, int64_t group)
{
    QL_TRY(ql_check_float_dtype("ql_rotate", "dtype", dtype));
    QL_TRY(ql_check_matrix("ql_rotate", "x", x, rows, k, ldx));
    QL_TRY(ql_check_group("ql_rotate", group, k));
    if (rows == 0 || k == 0) return QL_OK;
    float *buf = ql_aligned_alloc((size_t)k * sizeof(float));
    if (!buf) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_rotate: cannot allocate a row of %lld floats", (long long)k);
    for (int64_t r = 0; r < rows; r++) {
        void *row = ql_row_ptr(dtype, x, r, ldx);
        ql_load_row_rotated(dtype, row, k, group, buf);
        for (int64_t j = 0; j < k; j++) ql_store_f(dtype, row, j, buf[j]);
    }
    ql_aligned_free(buf);
    return QL_OK;
}
