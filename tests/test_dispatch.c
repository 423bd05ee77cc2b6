/* Run-time dispatch: the ISA (and so the kernel) a context picks on this CPU,
 * and QLINEAR_ISA / ql_context_set_isa forcing: every ISA the CPU has is
 * accepted, every other one refused with a clear message.
 *   test_dispatch [EXPECTED_ISA]
 * With an expected ISA (the cross build passes the one each qemu CPU model
 * must pick: cortex-a57 -> neon, neoverse-n1 -> neondot, max -> neonbf16),
 * the pick must be exactly that one, and exactly the ISAs up to it are
 * available. Each ISA names its int8 kernel and the kernel of a dense
 * bf16-compute layer (BFMMLA only with neonbf16): a specification written out
 * independently of the tables (an ISA not in it is still tested by every
 * other test, which walk the registry). */
#include <stdlib.h>
#include <string.h>

#include "cpu/registry.h"
#include "testutil.h"

/* The ISA ladder of each architecture, lowest first, and the kernel each
 * ISA must run (written out here, independently of the library's tables). */
typedef struct {
    ql_isa isa;
    const char *kernel, *bf16; /* int8 GEMM; dense bf16 layer */
} rung;
static const rung arm[] = {{QL_ISA_GENERIC, "s8_gemm_4x8c4__generic", "f32_gemm_4x16__generic"},
                           {QL_ISA_NEON, "s8_gemm_4x8c4__neon", "f32_gemm_8x8__neon"},
                           {QL_ISA_NEONDOT, "s8_gemm_8x12c4__neondot", "f32_gemm_8x8__neon"},
                           {QL_ISA_I8MM, "s8_gemm_8x12c8__i8mm", "f32_gemm_8x8__neon"},
                           {QL_ISA_NEONBF16, "s8_gemm_8x12c8__i8mm", "bf16_gemm_8x8c4__neonbf16"}};
static const rung x86[] = {{QL_ISA_GENERIC, "s8_gemm_4x8c4__generic", "f32_gemm_4x16__generic"},
                           {QL_ISA_AVX2, "s8_gemm_6x16c2__avx2", "f32_gemm_6x16__avx2"},
                           {QL_ISA_AVXVNNI, "s8_gemm_6x16c4__avxvnni", "f32_gemm_6x16__avx2"},
                           {QL_ISA_AVX512VNNI, "s8_gemm_12x32c4__avx512vnni", "f32_gemm_12x32__avx512"},
                           {QL_ISA_AVX512BF16, "s8_gemm_12x32c4__avx512vnni", "bf16_gemm_12x32c2__avx512bf16"},
                           {QL_ISA_AMX, "s8_gemm_32x32c4__amx", "bf16_gemm_32x32c2__amx"}};
enum { n_arm = sizeof arm / sizeof arm[0], n_x86 = sizeof x86 / sizeof x86[0] };

/* The kernel a dense bf16-compute layer of a context on `isa` runs (blocked path). */
static void bf16_kernel(ql_context *ctx, char *buf, size_t len)
{
    static float w[4 * 8];
    ql_linear_desc d = {.kind = QL_LINEAR_DENSE, .n = 4, .k = 8, .weight = w, .ld_weight = 8, .weight_dtype = QL_F32,
                        .compute_dtype = QL_BF16};
    ql_linear *lin = NULL;
    snprintf(buf, len, "(none)");
    CHECK_OK(ql_linear_create(ctx, &d, &lin));
    if (lin) ql_linear_describe(lin, 100, buf, len);
    ql_linear_destroy(lin);
}

/* Whether this core's VDPBF16PS is slower than its FMAs (written out here:
 * Intel family 6, Sapphire Rapids 0x8F and Emerald Rapids 0xCF), or what
 * QLINEAR_BF16_DOT says. */
static int slow_dot(void)
{
    const char *force = getenv("QLINEAR_BF16_DOT");
    if (force && (!strcmp(force, "vdpbf16ps") || !strcmp(force, "fma"))) return !strcmp(force, "fma");
    const ql_cpu_features *f = ql_cpu();
    return f->vendor == QL_VENDOR_INTEL && f->family == 6 && (f->model == 0x8F || f->model == 0xCF);
}

/* Whether a list of names (commas or spaces between) holds name itself. */
static int names_token(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ',' || p[-1] == ' ') && (p[n] == '\0' || p[n] == ',' || p[n] == ' ')) return 1;
    return 0;
}

int main(int argc, char **argv)
{
    tu_init("test_dispatch");
#if defined(__aarch64__)
    const int on_arm = 1;
#else
    const int on_arm = 0;
#endif
    const rung *own = on_arm ? arm : x86, *other = on_arm ? x86 : arm;
    const int n_own = on_arm ? n_arm : n_x86, n_other = on_arm ? n_x86 : n_arm;
    const ql_isa best = ql_isa_best();
    printf("  best ISA: %s (kernel %s)\n", ql_isa_name(best), ql_cpu_kernels_for(best)->s8->name);
    if (argc > 1) CHECK(!strcmp(ql_isa_name(best), argv[1]), "this CPU picks %s; expected %s", ql_isa_name(best), argv[1]);

    /* the default context takes the best ISA */
    unsetenv("QLINEAR_ISA");
    ql_context *ctx;
    CHECK_OK(ql_context_create(&ctx));
    CHECK(ql_context_isa(ctx) == best, "default context ISA %s, best %s", ql_isa_name(ql_context_isa(ctx)), ql_isa_name(best));

    int best_rung = -1;
    for (int i = 0; i < n_own; i++) {
        const ql_isa isa = own[i].isa;
        const int have = ql_isa_supported(isa);
        if (have) best_rung = i;
        /* the ladder is monotone: no ISA without the ones below it (x86 AVX-VNNI and AVX512-VNNI are siblings) */
        if (on_arm && i > 0 && have) CHECK(ql_isa_supported(own[i - 1].isa), "%s without %s", ql_isa_name(isa), ql_isa_name(own[i - 1].isa));
        setenv("QLINEAR_ISA", ql_isa_name(isa), 1);
        ql_context *c = NULL;
        const ql_status st = ql_context_create(&c);
        if (have) {
            CHECK(st == QL_OK && ql_context_isa(c) == isa, "QLINEAR_ISA=%s refused on a CPU that has it: %s", ql_isa_name(isa), ql_last_error());
            CHECK(!strcmp(ql_cpu_kernels_for(isa)->s8->name, own[i].kernel), "%s runs %s, expected %s", ql_isa_name(isa),
                  ql_cpu_kernels_for(isa)->s8->name, own[i].kernel);
            CHECK(ql_cpu_kernels_for(isa)->s8->isa ==
                      (isa == QL_ISA_NEONBF16 ? QL_ISA_I8MM : isa == QL_ISA_AVX512BF16 ? QL_ISA_AVX512VNNI : isa),
                  "%s's kernel says ISA %s",
                  ql_isa_name(isa), ql_isa_name(ql_cpu_kernels_for(isa)->s8->isa));
            char kb[96];
            bf16_kernel(c, kb, sizeof kb);
            /* amx with avx512bf16 hidden (QLINEAR_DISABLE): the fp32 kernel, as on
             * avx512vnni; without AMX-BF16 (or amx_bf16 hidden): avx512bf16's;
             * avx512bf16's on a core whose VDPBF16PS is slower than its FMAs: the fp32 kernel */
            const char *want = own[i].bf16;
            if (isa == QL_ISA_AMX && !ql_isa_supported(QL_ISA_AVX512BF16)) want = "f32_gemm_12x32__avx512";
            else if (isa == QL_ISA_AMX && !ql_cpu()->amx_bf16) want = "bf16_gemm_12x32c2__avx512bf16";
            if (!strcmp(want, "bf16_gemm_12x32c2__avx512bf16") && slow_dot()) want = "f32_gemm_12x32__avx512";
            CHECK(!strcmp(kb, want), "%s: a dense bf16 layer runs %s, expected %s", ql_isa_name(isa), kb, want);
            CHECK_OK(ql_context_set_isa(ctx, isa));
        } else {
            CHECK(st == QL_ERR_UNSUPPORTED && strstr(ql_last_error(), "does not support") && strstr(ql_last_error(), ql_isa_name(isa)) &&
                      !strchr(ql_last_error(), '\n'),
                  "QLINEAR_ISA=%s on a CPU without it: status %d, message '%s'", ql_isa_name(isa), (int)st, ql_last_error());
            CHECK(ql_context_set_isa(ctx, isa) == QL_ERR_UNSUPPORTED, "ql_context_set_isa(%s) accepted", ql_isa_name(isa));
            const char *why = ql_isa_refusal(isa);
            CHECK(*why && !strchr(why, '\n') && strstr(ql_last_error(), why), "%s refused: reason '%s', message '%s'",
                  ql_isa_name(isa), why, ql_last_error());
        }
        if (have) CHECK(!*ql_isa_refusal(isa), "%s is supported but ql_isa_refusal says '%s'", ql_isa_name(isa), ql_isa_refusal(isa));
        ql_context_destroy(c);
        printf("  %-10s %s%s\n", ql_isa_name(isa), have ? "available" : "refused: ", have ? "" : ql_isa_refusal(isa));
    }
    if (argc > 1) {
        int want = -1;
        for (int i = 0; i < n_own; i++) want = strcmp(ql_isa_name(own[i].isa), argv[1]) ? want : i;
        CHECK(want >= 0 && best_rung == want, "ISAs available up to %s, expected exactly up to %s",
              best_rung >= 0 ? ql_isa_name(own[best_rung].isa) : "none", argv[1]);
    }
    /* the other architecture's ISAs are never available; unknown names are refused */
    for (int i = 1; i < n_other; i++) {
        CHECK(!ql_isa_supported(other[i].isa), "%s reported on this architecture", ql_isa_name(other[i].isa));
        CHECK(strstr(ql_isa_refusal(other[i].isa), "another architecture") != NULL, "%s: refusal '%s'", ql_isa_name(other[i].isa),
              ql_isa_refusal(other[i].isa));
        setenv("QLINEAR_ISA", ql_isa_name(other[i].isa), 1);
        ql_context *c = NULL;
        CHECK(ql_context_create(&c) == QL_ERR_UNSUPPORTED && c == NULL, "QLINEAR_ISA=%s accepted", ql_isa_name(other[i].isa));
    }
    /* ql_isa_list: the supported ISAs, best first, generic last */
    ql_isa list[32];
    const int nl = ql_isa_list(list, 32);
    CHECK(nl >= 1 && nl <= 32 && list[0] == best && list[nl - 1] == QL_ISA_GENERIC && ql_isa_list(NULL, 0) == nl,
          "ql_isa_list: %d ISAs, first %s", nl, nl > 0 ? ql_isa_name(list[0]) : "-");
    for (int i = 0; i < nl; i++) CHECK(ql_isa_supported(list[i]), "ql_isa_list names %s, which is not supported", ql_isa_name(list[i]));
    /* QLINEAR_DISABLE: every ISA it names is hidden (and never the best) */
    const char *off = getenv("QLINEAR_DISABLE");
    if (off) {
        printf("  QLINEAR_DISABLE=%s\n", off);
        for (int i = 1; i < n_own; i++)
            if (names_token(off, ql_isa_name(own[i].isa))) {
                CHECK(!ql_isa_supported(own[i].isa) && best != own[i].isa &&
                          !strcmp(ql_isa_refusal(own[i].isa), "hidden by QLINEAR_DISABLE"),
                      "QLINEAR_DISABLE=%s: %s still available (or refused for '%s')", off, ql_isa_name(own[i].isa),
                      ql_isa_refusal(own[i].isa));
            }
    }
    setenv("QLINEAR_ISA", "sve2", 1);
    ql_context *c = NULL;
    CHECK(ql_context_create(&c) == QL_ERR_INVALID_ARGUMENT && strstr(ql_last_error(), "neondot"),
          "QLINEAR_ISA=sve2: %s", ql_last_error());
    unsetenv("QLINEAR_ISA");
    ql_context_destroy(ctx);
    return tu_finish();
}
