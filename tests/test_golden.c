/* Reproduce the reference implementation's own outputs (tests/data, or shared/golden):
 * comfy-kitchen eager quantize_int8_rowwise / _tensorwise, ConvRot weight
 * quantization (G = 256, 64), its rotation and dequantization, and the
 * Hadamard matrices. Row-wise and tensor-wise must match bit for bit; after a
 * rotation the reference's matmul sums in another order than our FWHT, so
 * rotated values may differ by an ulp and codes by ±1 (rarely). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "testutil.h"

typedef struct {
    char *data;
    size_t size, base;
    json_t *header;
} stfile;

static int st_open(stfile *f, const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    fseek(fp, 0, SEEK_END);
    f->size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->data = malloc(f->size);
    if (fread(f->data, 1, f->size, fp) != f->size) { fclose(fp); return 0; }
    fclose(fp);
    uint64_t n;
    memcpy(&n, f->data, 8);
    f->header = json_loadb(f->data + 8, (size_t)n, 0, NULL);
    f->base = 8 + (size_t)n;
    return f->header != NULL;
}

/* Tensor by name: data pointer, dtype string, element count. */
static const void *st_get(stfile *f, const char *name, const char **dtype, int64_t *numel)
{
    json_t *t = json_object_get(f->header, name);
    if (!t) return NULL;
    *dtype = json_string_value(json_object_get(t, "dtype"));
    json_t *shape = json_object_get(t, "shape");
    *numel = 1;
    for (size_t i = 0; i < json_array_size(shape); i++) *numel *= json_integer_value(json_array_get(shape, i));
    return f->data + f->base + json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
}

static stfile files[2];
static const void *get(const char *name, const char **dtype, int64_t *numel)
{
    for (int i = 0; i < 2; i++) {
        const void *p = st_get(&files[i], name, dtype, numel);
        if (p) return p;
    }
    return NULL;
}

static ql_dtype dtype_of(const char *s) { return !strcmp(s, "F32") ? QL_F32 : !strcmp(s, "F16") ? QL_F16 : QL_BF16; }

static int ulp_diff(ql_dtype dt, float a, float b)
{
    if (a == b || (isnan(a) && isnan(b))) return 0;
    if (dt == QL_F32) {
        int32_t ia, ib;
        memcpy(&ia, &a, 4);
        memcpy(&ib, &b, 4);
        int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia, ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
        int64_t d = oa > ob ? oa - ob : ob - oa;
        return d > 1000000 ? 1000000 : (int)d;
    }
    uint16_t ha = dt == QL_F16 ? ql_fp32_to_fp16(a) : ql_fp32_to_bf16(a);
    uint16_t hb = dt == QL_F16 ? ql_fp32_to_fp16(b) : ql_fp32_to_bf16(b);
    return abs((int)ha - (int)hb);
}

/* Float sums in another order: equal within one ulp of the dtype at b plus
 * 2^-16 of the row's largest magnitude (fp32 cancellation). */
static int close_in_row(ql_dtype dt, float a, float b, float rowmax)
{
    if (ulp_diff(dt, a, b) <= 1) return 1;
    return fabsf(a - b) <= 0x1p-16f * rowmax + (dt == QL_F32 ? 0.0f : fabsf(b) * (dt == QL_F16 ? 0x1p-10f : 0x1p-7f));
}

static float row_absmax(ql_dtype dt, const void *p, int64_t r, int64_t k)
{
    float m = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        float v = fabsf(ql_load_f(dt, p, r * k + j));
        if (isfinite(v) && v > m) m = v;
    }
    return m;
}

static void check_case(json_t *c)
{
    const char *id = json_string_value(json_object_get(c, "id"));
    json_t *shape = json_object_get(c, "shape");
    const int64_t n = json_integer_value(json_array_get(shape, 0)), k = json_integer_value(json_array_get(shape, 1));
    char name[128];
    const char *wdt;
    int64_t numel;
    snprintf(name, sizeof name, "%s.W", id);
    const void *w = get(name, &wdt, &numel);
    CHECK(w && numel == n * k, "%s: W missing", id);
    if (!w) return;
    const ql_dtype dt = dtype_of(wdt);
    int8_t *q = malloc((size_t)(n * k));
    float *scale = malloc((size_t)n * sizeof(float)), *deq = malloc((size_t)(n * k) * sizeof(float));
    void *rot = malloc((size_t)(n * k) * 4);
    const int64_t bad_row = json_integer_value(json_object_get(c, "seed")) && !strcmp(json_string_value(json_object_get(c, "kind")), "near_max") ? 3 : -1;
    (void)bad_row;

    /* row-wise: bit-exact */
    const char *sdt, *qdt;
    ql_status st = ql_quantize_rowwise(dt, w, n, k, k, q, k, scale);
    CHECK(st == QL_OK, "%s: rowwise status %s (%s)", id, ql_status_string(st), ql_last_error());
    snprintf(name, sizeof name, "%s.rowwise.codes", id);
    const int8_t *gq = get(name, &qdt, &numel);
    snprintf(name, sizeof name, "%s.rowwise.scale", id);
    const float *gs = get(name, &sdt, &numel);
    if (gq && gs) {
        int64_t dq = 0, ds = 0;
        for (int64_t i = 0; i < n * k; i++) dq += q[i] != gq[i];
        for (int64_t i = 0; i < n; i++) ds += memcmp(&scale[i], &gs[i], 4) != 0;
        CHECK(dq == 0 && ds == 0, "%s: rowwise differs: %lld codes, %lld scales", id, (long long)dq, (long long)ds);
    }
    /* tensor-wise: bit-exact */
    snprintf(name, sizeof name, "%s.tensorwise.codes", id);
    gq = get(name, &qdt, &numel);
    snprintf(name, sizeof name, "%s.tensorwise.scale", id);
    gs = get(name, &sdt, &numel);
    if (gq && gs) {
        float s1;
        st = ql_quantize_tensorwise(dt, w, n, k, k, q, k, &s1);
        CHECK(st == QL_OK, "%s: tensorwise status %s", id, ql_status_string(st));
        int64_t dq = 0;
        for (int64_t i = 0; i < n * k; i++) dq += q[i] != gq[i];
        CHECK(dq == 0 && memcmp(&s1, gs, 4) == 0, "%s: tensorwise differs: %lld codes, scale %a vs %a", id,
              (long long)dq, s1, gs[0]);
    }
    /* ConvRot, G = 256 and 64 */
    for (int gi = 0; gi < 2; gi++) {
        const int64_t g = gi == 0 ? 256 : 64;
        snprintf(name, sizeof name, "%s.convrot%lld.codes", id, (long long)g);
        gq = get(name, &qdt, &numel);
        if (!gq) continue;
        snprintf(name, sizeof name, "%s.convrot%lld.scale", id, (long long)g);
        gs = get(name, &sdt, &numel);
        const char *rdt, *ddt;
        snprintf(name, sizeof name, "%s.convrot%lld.W_rot", id, (long long)g);
        const void *grot = get(name, &rdt, &numel);
        snprintf(name, sizeof name, "%s.convrot%lld.dequant", id, (long long)g);
        const void *gdeq = get(name, &ddt, &numel);

        /* rotation: within 1 ulp of the dtype, except where the reference overflowed */
        memcpy(rot, w, (size_t)(n * k) * ql_dtype_size(dt));
        CHECK_OK(ql_rotate(dt, rot, n, k, k, g));
        int64_t rot_exact = 0, rot_far = 0, rot_inf_match = 0;
        for (int64_t i = 0; grot && i < n * k; i++) {
            float a = ql_load_f(dt, rot, i), b = ql_load_f(dt, grot, i);
            if (isinf(b)) { rot_inf_match += isinf(a) && signbit(a) == signbit(b); continue; }
            rot_exact += a == b;
            if (!close_in_row(dt, a, b, row_absmax(dt, grot, i / k, k))) rot_far++;
        }
        CHECK(rot_far == 0, "%s G=%lld: %lld rotated values differ by more than 1 ulp + 2^-16 of the row max", id, (long long)g, (long long)rot_far);

        st = ql_quantize_convrot_weight(dt, w, n, k, k, g, q, k, scale);
        int64_t code_flip = 0, code_far = 0, scale_far = 0, bad_rows = 0, nonfinite_ref_rows = 0;
        for (int64_t r = 0; r < n; r++) {
            if (!isfinite(gs[r])) { /* the reference overflowed while rotating this row */
                nonfinite_ref_rows++;
                bad_rows += isnan(scale[r]);
                continue;
            }
            if (fabsf(scale[r] - gs[r]) > 0x1p-20f * gs[r]) scale_far++;
            for (int64_t j = 0; j < k; j++) {
                int d = abs(q[r * k + j] - gq[r * k + j]);
                code_flip += d == 1;
                code_far += d > 1;
            }
        }
        CHECK(code_far == 0 && scale_far == 0, "%s G=%lld: %lld codes off by >1, %lld scales off by >2^-20 relative", id,
              (long long)g, (long long)code_far, (long long)scale_far);
        CHECK(code_flip * 1000 <= n * k, "%s G=%lld: %lld ±1 code flips (more than 0.1%%)", id, (long long)g,
              (long long)code_flip);
        if (nonfinite_ref_rows)
            CHECK(st == QL_ERR_NONFINITE && bad_rows == nonfinite_ref_rows,
                  "%s G=%lld: reference overflowed in %lld rows; expected QL_ERR_NONFINITE and NaN scales", id,
                  (long long)g, (long long)nonfinite_ref_rows);
        else
            CHECK(st == QL_OK, "%s G=%lld: status %s", id, (long long)g, ql_status_string(st));

        /* dequantization of the reference's own codes: fp32 un-rotation, then
         * cast; within 1 ulp of the output dtype (summation order). */
        if (gdeq) {
            ql_dtype odt = dtype_of(ddt);
            void *out = malloc((size_t)(n * k) * 4);
            CHECK_OK(ql_dequantize(gq, n, k, k, gs, n, g, odt, out, k));
            int64_t far = 0, exact = 0, skipped = 0;
            for (int64_t r = 0; r < n; r++) {
                if (!isfinite(gs[r])) { skipped++; continue; }
                float rmax = row_absmax(odt, gdeq, r, k);
                for (int64_t j = 0; j < k; j++) {
                    float a = ql_load_f(odt, out, r * k + j), b = ql_load_f(odt, gdeq, r * k + j);
                    if (!close_in_row(odt, a, b, rmax) && far++ < 3)
                        printf("    %s row %lld col %lld: %.9g vs reference %.9g (row max %.6g)\n", id, (long long)r, (long long)j, a, b, rmax);
                    exact += a == b;
                }
            }
            CHECK(far == 0, "%s G=%lld: %lld dequantized values differ by more than 1 ulp", id, (long long)g, (long long)far);
            printf("  %s %s G=%-3lld rotation exact %s%.4f, code flips %lld/%lld, dequant exact %.4f%s\n", id,
                   ql_dtype_name(dt), (long long)g, grot ? "" : "(no W_rot) ", (double)rot_exact / (double)(n * k), (long long)code_flip,
                   (long long)(n * k), (double)exact / (double)((n - skipped) * k),
                   nonfinite_ref_rows ? " (reference overflowed in a row: NaN scale + QL_ERR_NONFINITE here)" : "");
            free(out);
        }
    }
    free(q);
    free(scale);
    free(deq);
    free(rot);
}

int main(void)
{
    tu_init("test_golden");
    const char *dir = getenv("QL_SHARED_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/golden/a_0.safetensors", dir ? dir : "../shared");
    int ok = st_open(&files[0], path);
    snprintf(path, sizeof path, "%s/golden/d_0.safetensors", dir ? dir : "../shared");
    ok = ok && st_open(&files[1], path);
    snprintf(path, sizeof path, "%s/golden/manifest.json", dir ? dir : "../shared");
    json_t *man = json_load_file(path, 0, NULL);
    CHECK(ok && man, "cannot load the golden fixtures under %s", dir ? dir : "../shared");
    if (!ok || !man) return tu_finish();

    json_t *cases = json_object_get(man, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        if (!strcmp(json_string_value(json_object_get(c, "role")), "int8_weight_quant")) check_case(c);
    }
    /* Hadamard matrices: bit-exact */
    for (int64_t g = 4; g <= 256; g *= 4) {
        char name[64];
        const char *dt;
        int64_t numel;
        snprintf(name, sizeof name, "d001.H%lld", (long long)g);
        const float *gh = get(name, &dt, &numel);
        float *h = malloc((size_t)(g * g) * sizeof(float));
        CHECK_OK(ql_hadamard(g, h));
        CHECK(gh && numel == g * g && memcmp(h, gh, (size_t)(g * g) * 4) == 0, "H%lld differs from the reference", (long long)g);
        free(h);
    }
    json_decref(man);
    return tu_finish();
}
