/* libFuzzer target for the LoRA file reader (src/format/lora_file.c): the
 * input, repaired into a well-formed safetensors image (fuzz_st.h), is the
 * LoRA file; it is matched against a fixed base (lora_base.h: int8,
 * ConvRot, W4A8, W6A8, BF16 and F32 layers under every known prefix, an
 * ambiguous kohya pair) and against itself as the base (so fuzzed base names
 * reach the key tables too). A refusal must be one line naming the LoRA
 * file; an accepted plan must keep every promise of ql_lora_module (the
 * layer exists with that N and K, the tensors are the module's down / up /
 * alpha with matching shapes, one module per layer, every tensor either in a
 * module or listed unmatched), and ql_lora_module_load must fill the
 * matrices or name a NaN/Inf. Built only with -DQL_BUILD_FUZZ=ON (clang). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora_base.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REQUIRE(cond)                                                                                                \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            fprintf(stderr, "fuzz_lora: %s:%d: %s fails (module '%s')\n", __FILE__, __LINE__, #cond, cur_module);     \
            abort();                                                                                                 \
        }                                                                                                            \
    } while (0)

static const char *cur_module = "";
static ql_checkpoint *fixed_base;
static unsigned char *fixed_image;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    size_t n = 0;
    fixed_image = fz_lora_base(&n);
    if (ql_checkpoint_open_memory(fixed_image, n, "base", &fixed_base) != QL_OK) {
        fprintf(stderr, "fuzz_lora: the fixed base does not open: %s\n", ql_last_error());
        abort();
    }
    return 0;
}

static int is_float(ql_st_dtype d) { return d == QL_ST_F32 || d == QL_ST_F16 || d == QL_ST_BF16; }

static int has_suffix(const char *name, const char *module, const char *suffix)
{
    size_t m = strlen(module);
    return !strncmp(name, module, m) && !strcmp(name + m, suffix);
}

static void check_module(const ql_checkpoint *base, const ql_checkpoint *lc, const ql_lora_module *m)
{
    REQUIRE(m->layer && m->module);
    cur_module = m->module;
    /* The layer: a supported quantized layer, or a 2-D float P.weight. */
    int64_t li = ql_checkpoint_find_layer(base, m->layer);
    if (m->quantized) {
        ql_layer_info l;
        REQUIRE(li >= 0 && ql_checkpoint_layer(base, li, &l) == QL_OK && l.supported && l.n == m->n && l.k == m->k);
    } else {
        size_t len = strlen(m->layer);
        char *wn = malloc(len + 8);
        REQUIRE(wn);
        memcpy(wn, m->layer, len);
        memcpy(wn + len, ".weight", 8);
        ql_tensor_info w;
        int64_t wi = ql_checkpoint_find(base, wn);
        free(wn);
        REQUIRE(wi >= 0 && ql_checkpoint_tensor(base, wi, &w) == QL_OK && is_float(w.dtype) && w.ndim == 2);
        REQUIRE(w.shape[0] == m->n && w.shape[1] == m->k);
    }
    /* Its tensors. */
    ql_tensor_info d, u;
    REQUIRE(ql_checkpoint_tensor(lc, m->down, &d) == QL_OK && ql_checkpoint_tensor(lc, m->up, &u) == QL_OK);
    int kohya = has_suffix(d.name, m->module, ".lora_down.weight");
    REQUIRE(kohya ? has_suffix(u.name, m->module, ".lora_up.weight")
                  : has_suffix(d.name, m->module, ".lora_A.weight") && has_suffix(u.name, m->module, ".lora_B.weight"));
    REQUIRE(is_float(d.dtype) && is_float(u.dtype) && d.ndim == 2 && u.ndim == 2);
    REQUIRE(m->rank > 0 && d.shape[0] == m->rank && d.shape[1] == m->k && u.shape[0] == m->n && u.shape[1] == m->rank);
    REQUIRE(m->has_alpha == (m->alpha >= 0) && isfinite(m->alpha_value));
    if (m->alpha >= 0) {
        ql_tensor_info a;
        REQUIRE(ql_checkpoint_tensor(lc, m->alpha, &a) == QL_OK && has_suffix(a.name, m->module, ".alpha"));
        REQUIRE(a.numel == 1 && a.ndim <= 1 && (is_float(a.dtype) || a.dtype == QL_ST_F64));
    } else {
        REQUIRE(m->alpha_value == (double)m->rank);
    }
    double s = ql_lora_scale(1.0, m->alpha_value, m->has_alpha, m->rank);
    REQUIRE(!isnan(s));
    /* The matrices (their bytes are in the file, so this is bounded by it). */
    float *down = malloc((size_t)(m->rank * m->k) * sizeof(float) + 1);
    float *up = malloc((size_t)(m->n * m->rank) * sizeof(float) + 1);
    REQUIRE(down && up);
    ql_status st = ql_lora_module_load(lc, m, down, up);
    if (st != QL_OK) {
        REQUIRE(st == QL_ERR_NONFINITE);
        fz_check_refusal("lora", NULL);
    } else {
        for (int64_t i = 0; i < m->rank * m->k; i++) REQUIRE(isfinite(down[i]));
        for (int64_t i = 0; i < m->n * m->rank; i++) REQUIRE(isfinite(up[i]));
    }
    free(down), free(up);
    cur_module = "";
}

static void check_plan(const ql_checkpoint *base, const ql_checkpoint *lc)
{
    ql_lora_plan *p = NULL;
    if (ql_lora_plan_create(base, lc, &p) != QL_OK) {
        fz_check_refusal("lora", p);
        return;
    }
    const int64_t nm = ql_lora_plan_module_count(p), nu = ql_lora_plan_unmatched_count(p);
    REQUIRE(nm > 0 && ql_lora_plan_module(p, nm) == NULL && ql_lora_plan_module(p, -1) == NULL);
    REQUIRE(ql_lora_plan_unmatched(p, nu) == NULL);
    int64_t used = nu;
    for (int64_t i = 0; i < nm; i++) {
        const ql_lora_module *m = ql_lora_plan_module(p, i);
        REQUIRE(m);
        check_module(base, lc, m);
        used += 2 + (m->alpha >= 0);
        for (int64_t j = 0; j < i; j++) REQUIRE(strcmp(ql_lora_plan_module(p, j)->layer, m->layer) != 0);
    }
    for (int64_t i = 0; i < nu; i++) {
        const char *u = ql_lora_plan_unmatched(p, i);
        REQUIRE(u && ql_checkpoint_find(lc, u) >= 0);
    }
    REQUIRE(used == ql_checkpoint_tensor_count(lc));
    ql_lora_plan_destroy(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n = 0;
    unsigned char *img = fz_repair(data, size, &n);
    const unsigned char *file = img ? img : data;
    if (!img) n = size;
    ql_checkpoint *lc = NULL;
    if (ql_checkpoint_open_memory(n ? file : NULL, n, "lora", &lc) != QL_OK) {
        fz_check_refusal("lora", lc);
    } else {
        check_plan(fixed_base, lc);
        check_plan(lc, lc);
        ql_checkpoint_close(lc);
    }
    free(img);
    return 0;
}
