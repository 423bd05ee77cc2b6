/* The GELU epilogue (QL_ACTIVATION_GELU) against float64 x·Φ(x) =
 * x·erfc(-x/√2)/2, on fresh random values (a printed seed) and the edges:
 * ±0, subnormals, the tail where the result itself is subnormal or 0,
 * |x| around the 15 cut-off, huge values, ±Inf and NaN; for every output
 * dtype and every ISA this CPU runs, each ISA equal to the generic (scalar
 * twin) bit for bit. The values reach the activation through a dense fp32
 * linear with K = 1 and unit weights, so each one lands in every column
 * (all vector lanes and the scalar tails); the GELU input is that same
 * linear's output without the activation. Bound: |y - ref| <= 6 fp32 ulps
 * of ref, plus half an ulp of the output dtype (its final rounding). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "quant/epilogue.h"
#include "testutil.h"

/* every ISA this CPU runs, generic first (tu_isas: the registry walked) */
static ql_isa isas[32];
static int n_isas;
static const ql_dtype dts[] = {QL_F32, QL_BF16, QL_F16};

static double gelu64(double x) { return x * 0.5 * erfc(-x / sqrt(2.0)); }

/* Spacing of dtype dt at |r| (its subnormal step below the normal range). */
static double ulp_dt(ql_dtype dt, double r)
{
    const int p = dt == QL_F32 ? 24 : dt == QL_BF16 ? 8 : 11, emin = dt == QL_F16 ? -14 : -126;
    int e;
    frexp(fabs(r), &e); /* |r| in [2^(e-1), 2^e) */
    if (r == 0 || e - 1 < emin) return ldexp(1.0, emin - p + 1);
    return ldexp(1.0, e - p);
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The inputs: the edges, then random values of four kinds. */
static int64_t make_inputs(float *x, int64_t cap)
{
    static const float edges[] = {0.0f, 1e-45f, 1e-40f, 0x1.fffffcp-127f, 0x1p-126f, 1e-30f, 1e-10f, 1e-4f, 0.5f,
                                  1.0f, 2.0f, 3.0f, 5.3f, 9.0f, 10.0f, 13.0f, 14.0f, 14.2f, 14.5f, 14.9f, 15.0f,
                                  0x1.000002p+4f, 15.5f, 16.0f, 20.0f, 1e10f, 65504.0f, 70000.0f, 3e38f, FLT_MAX,
                                  INFINITY};
    int64_t n = 0;
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        x[n++] = edges[i];
        x[n++] = -edges[i];
    }
    x[n++] = NAN;
    x[n++] = -NAN;
    for (int64_t i = 0; n < cap; i++) {
        switch (i % 4) {
        case 0: x[n++] = (float)(3.0 * tu_gauss()); break;
        case 1: x[n++] = (float)(32.0 * tu_uniform() - 16.0); break;
        case 2: x[n++] = bits_f32((uint32_t)tu_next()); break; /* any pattern: every binade, NaNs */
        default: x[n++] = bits_f32((uint32_t)tu_next() & 0x807fffffu); break; /* ±subnormals */
        }
    }
    return n;
}

static void check_dtype(ql_context *ctx, ql_dtype dt, const float *x, int64_t m, void *ref_bits)
{
    const int64_t n = 19;
    float w[19];
    for (int j = 0; j < n; j++) w[j] = 1.0f;
    ql_linear_desc d = {.kind = QL_LINEAR_DENSE, .n = n, .k = 1, .weight = w, .ld_weight = 1, .weight_dtype = QL_F32,
                        .compute_dtype = QL_F32};
    ql_linear *lin = NULL;
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    if (!lin) return;
    const size_t es = ql_dtype_size(dt), bytes = (size_t)(m * n) * es;
    void *pre = malloc(bytes), *y = malloc(bytes);
    ql_epilogue gelu = {.activation = QL_ACTIVATION_GELU};
    CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, 1, pre, dt, n, NULL));
    CHECK_OK(ql_linear_forward(lin, x, QL_F32, m, 1, y, dt, n, &gelu));
    int64_t bad = 0, first = -1;
    double worst = 0;
    for (int64_t i = 0; i < m * n; i++) {
        const double in = ql_load_f(dt, pre, i), out = ql_load_f(dt, y, i), r = gelu64(in);
        int ok;
        if (isnan(r)) ok = isnan(out);
        else if (isinf(ql_round_to(dt, (float)r))) ok = out == ql_round_to(dt, (float)r);
        else {
            const double err = fabs(out - r), bound = 6 * ulp_dt(QL_F32, r) + (dt == QL_F32 ? 0 : 0.5 * ulp_dt(dt, r));
            ok = err <= bound;
            if (dt == QL_F32 && err / ulp_dt(QL_F32, r) > worst) worst = err / ulp_dt(QL_F32, r);
        }
        if (!ok && bad++ == 0) first = i;
    }
    const ql_isa isa = ql_context_isa(ctx);
    CHECK(bad == 0, "%s %s: %lld of %lld GELU outputs off float64, first gelu(%a) = %a, float64 %a",
          ql_isa_name(isa), ql_dtype_name(dt), (long long)bad, (long long)(m * n),
          first >= 0 ? ql_load_f(dt, pre, first) : 0.0, first >= 0 ? ql_load_f(dt, y, first) : 0.0,
          first >= 0 ? gelu64(ql_load_f(dt, pre, first)) : 0.0);
    if (dt == QL_F32) printf("  %s fp32: max error %.2f ulp over %lld values\n", ql_isa_name(isa), worst, (long long)(m * n));
    if (isa == QL_ISA_GENERIC) memcpy(ref_bits, y, bytes);
    else {
        int64_t diff = -1;
        for (int64_t i = 0; i < m * n && diff < 0; i++) {
            const float a = ql_load_f(dt, y, i), b = ql_load_f(dt, ref_bits, i);
            if (memcmp(&a, &b, 4) != 0 && !(isnan(a) && isnan(b))) diff = i;
        }
        CHECK(diff < 0, "%s %s: differs from the generic GELU at %lld (gelu(%a) = %a vs %a)", ql_isa_name(isa),
              ql_dtype_name(dt), (long long)diff, diff >= 0 ? ql_load_f(dt, pre, diff) : 0.0,
              diff >= 0 ? ql_load_f(dt, y, diff) : 0.0, diff >= 0 ? ql_load_f(dt, ref_bits, diff) : 0.0);
    }
    free(pre);
    free(y);
    ql_linear_destroy(lin);
}

/* The bf16 table form (the CUDA bf16 epilogues' GELU): every one of the
 * 65 536 bf16 inputs equals the function rounded to bf16, bit for bit
 * (NaN for NaN); and the table's own range is not wider than it needs to
 * be for that (the x/2 rule holds just below it, and fails somewhere below
 * 2^-8, so the range bound is a real choice). */
static void check_bf16_table(void)
{
    uint16_t *lut = malloc(QL_GELU_LUT_SIZE * sizeof(uint16_t));
    ql_gelu_bf16_lut_fill(lut);
    int64_t bad = 0, first = -1;
    for (uint32_t h = 0; h < 65536; h++) {
        const uint16_t want = ql_fp32_to_bf16(ql_gelu_f32(ql_bf16_to_fp32((uint16_t)h)));
        const uint16_t got = ql_gelu_bf16_bits((uint16_t)h, lut);
        const int nan_w = (want & 0x7fffu) > 0x7f80u, nan_g = (got & 0x7fffu) > 0x7f80u;
        if (nan_w != nan_g || (!nan_w && want != got)) {
            if (bad++ == 0) first = h;
        }
    }
    CHECK(bad == 0, "bf16 GELU table: %lld of 65536 inputs differ, first x = %a: %a, want %a", (long long)bad,
          first >= 0 ? ql_bf16_to_fp32((uint16_t)first) : 0.0,
          first >= 0 ? ql_bf16_to_fp32(ql_gelu_bf16_bits((uint16_t)first, lut)) : 0.0,
          first >= 0 ? ql_gelu_f32(ql_bf16_to_fp32((uint16_t)first)) : 0.0);
    /* the halving rule does not hold from 2^-8 up (the x² term matters there): the table is needed */
    int64_t halving_fails = 0;
    for (uint32_t a = 119u << 7; a < QL_GELU_LUT_HI; a++)
        for (uint32_t s = 0; s < 2; s++) {
            const uint16_t h = (uint16_t)(a | s << 15);
            halving_fails += ql_fp32_to_bf16(ql_gelu_f32(ql_bf16_to_fp32(h))) != (uint16_t)(h - 0x80u);
        }
    CHECK(halving_fails > 0, "bf16 GELU: x/2 everywhere above 2^-8 too (the table is not needed)");
    printf("  bf16 GELU table: all 65536 inputs equal the function (%d entries; x/2 wrong on %lld inputs above 2^-8)\n",
           (int)QL_GELU_LUT_SIZE, (long long)halving_fails);
    free(lut);
}

int main(void)
{
    tu_init("test_gelu");
    check_bf16_table();
    n_isas = tu_isas(isas);
    const int64_t m = 4099;
    float *x = malloc((size_t)m * 4);
    make_inputs(x, m);
    void *ref[3];
    for (int di = 0; di < 3; di++) ref[di] = malloc((size_t)m * 19 * 4);
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    for (int i = 0; i < n_isas; i++) {
        if (!ql_isa_supported(isas[i])) continue;
        CHECK_OK(ql_context_set_isa(ctx, isas[i]));
        CHECK_OK(ql_context_set_threads(ctx, 1 + (int)(i % 2)));
        for (int di = 0; di < 3; di++) check_dtype(ctx, dts[di], x, m, ref[di]);
    }
    /* torch's conventions at the edges, exactly */
    CHECK_OK(ql_context_set_isa(ctx, QL_ISA_GENERIC));
    const float edge_in[] = {0.0f, -0.0f, INFINITY, -INFINITY, -20.0f, 20.0f};
    float w = 1.0f, out[6];
    ql_linear_desc d = {.kind = QL_LINEAR_DENSE, .n = 1, .k = 1, .weight = &w, .ld_weight = 1, .weight_dtype = QL_F32,
                        .compute_dtype = QL_F32};
    ql_linear *lin = NULL;
    ql_epilogue gelu = {.activation = QL_ACTIVATION_GELU};
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    if (lin) CHECK_OK(ql_linear_forward(lin, edge_in, QL_F32, 6, 1, out, QL_F32, 1, &gelu));
    CHECK(out[0] == 0 && out[1] == 0 && out[2] == INFINITY && isnan(out[3]) && out[4] == 0 && signbit(out[4]) &&
              out[5] == 20.0f,
          "GELU edges: 0 -> %a, -0 -> %a, Inf -> %a, -Inf -> %a, -20 -> %a, 20 -> %a", out[0], out[1], out[2], out[3],
          out[4], out[5]);
    ql_linear_destroy(lin);
    ql_context_destroy(ctx);
    for (int di = 0; di < 3; di++) free(ref[di]);
    free(x);
    return tu_finish();
}
