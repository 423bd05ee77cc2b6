/* The registry: every ISA with its name and, where this build has its
 * kernels, its table, best first. Adding an ISA is one line here (and its
 * table in its architecture's folder). The only place that chooses among
 * ISAs; everything else takes a table. */
#include "cpu/registry.h"

#include <pthread.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#define QL_X86_TABLE(t) &t
#else
#define QL_X86_TABLE(t) NULL
#endif
#if defined(__aarch64__)
#define QL_ARM_TABLE(t) &t
#else
#define QL_ARM_TABLE(t) NULL
#endif

extern const ql_cpu_kernels ql_cpu_kernels_generic, ql_cpu_kernels_avx2, ql_cpu_kernels_avxvnni,
    ql_cpu_kernels_avx512vnni, ql_cpu_kernels_amx, ql_cpu_kernels_neon, ql_cpu_kernels_neondot, ql_cpu_kernels_i8mm,
    ql_cpu_kernels_neonbf16, ql_cpu_kernels_avx512bf16;

typedef struct entry {
    ql_isa isa;
    const char *name;
    const ql_cpu_kernels *table; /* NULL: another architecture's */
} entry;

static const entry registry[] = {
    {QL_ISA_NEONBF16, "neonbf16", QL_ARM_TABLE(ql_cpu_kernels_neonbf16)},
    {QL_ISA_I8MM, "i8mm", QL_ARM_TABLE(ql_cpu_kernels_i8mm)},
    {QL_ISA_NEONDOT, "neondot", QL_ARM_TABLE(ql_cpu_kernels_neondot)},
    {QL_ISA_NEON, "neon", QL_ARM_TABLE(ql_cpu_kernels_neon)},
    {QL_ISA_AMX, "amx", QL_X86_TABLE(ql_cpu_kernels_amx)},
    {QL_ISA_AVX512BF16, "avx512bf16", QL_X86_TABLE(ql_cpu_kernels_avx512bf16)},
    {QL_ISA_AVX512VNNI, "avx512vnni", QL_X86_TABLE(ql_cpu_kernels_avx512vnni)},
    {QL_ISA_AVXVNNI, "avxvnni", QL_X86_TABLE(ql_cpu_kernels_avxvnni)},
    {QL_ISA_AVX2, "avx2", QL_X86_TABLE(ql_cpu_kernels_avx2)},
    {QL_ISA_GENERIC, "generic", &ql_cpu_kernels_generic},
};
#define QL_ENTRIES ((int)(sizeof registry / sizeof registry[0]))

/* ---- features and QLINEAR_DISABLE */

static ql_cpu_features features;
static bool disabled[QL_ENTRIES];
static ql_cpu_kernels resolved[QL_ENTRIES];
static const ql_cpu_kernels *built[QL_ENTRIES]; /* resolved tables of this build, best first */
static int built_count;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* A table over its base (kernels.h): the base's entries where t leaves them NULL (or 0). */
static ql_cpu_kernels over_base(const ql_cpu_kernels *t)
{
    if (!t->base) return *t;
    ql_cpu_kernels r = over_base(t->base);
    r.isa = t->isa;
    r.base = t->base;
    r.supported = t->supported;
    r.refusal = t->refusal;
    if (t->tune) r.tune = t->tune; /* which runs its base's tuning itself, if it wants it */
#define QL_OVER(field) if (t->field) r.field = t->field
    QL_OVER(s8); QL_OVER(s8_rows); QL_OVER(s8_rows_max); QL_OVER(small_m); QL_OVER(s8_decoded); QL_OVER(s8_int8_a);
    QL_OVER(prologue); QL_OVER(w8a8_epilogue); QL_OVER(wxa8_decode); QL_OVER(wxa8_rows); QL_OVER(wxa8_rows_ok);
    QL_OVER(wxa8_rows_max); QL_OVER(lora_t_row); QL_OVER(f32); QL_OVER(bf16);
    QL_OVER(wo_bf16); QL_OVER(f32_epilogue); QL_OVER(rows_to_f32); QL_OVER(quantize_rows); QL_OVER(sr_row);
    QL_OVER(lowrank_add); QL_OVER(input_act_row);
    QL_OVER(s8_blocking.mc); QL_OVER(s8_blocking.nc); QL_OVER(s8_blocking.kc);
    QL_OVER(f32_blocking.mc); QL_OVER(f32_blocking.nc); QL_OVER(f32_blocking.kc);
#undef QL_OVER
    return r;
}

/* An entry left NULL (or 0) is the base's (over_base), then the generic table's. */
static ql_cpu_kernels resolve(const ql_cpu_kernels *t, const ql_cpu_kernels *g)
{
    ql_cpu_kernels r = over_base(t);
#define QL_FILL(field) if (!r.field) r.field = g->field
    QL_FILL(s8); QL_FILL(s8_rows_max); QL_FILL(small_m); QL_FILL(prologue); QL_FILL(w8a8_epilogue);
    QL_FILL(wxa8_decode); QL_FILL(lora_t_row); QL_FILL(f32); QL_FILL(bf16); QL_FILL(f32_epilogue);
    QL_FILL(rows_to_f32); QL_FILL(quantize_rows); QL_FILL(sr_row); QL_FILL(lowrank_add); QL_FILL(input_act_row);
    QL_FILL(s8_blocking.mc); QL_FILL(s8_blocking.nc); QL_FILL(s8_blocking.kc);
    QL_FILL(f32_blocking.mc); QL_FILL(f32_blocking.nc); QL_FILL(f32_blocking.kc);
#undef QL_FILL
    if (!r.s8_decoded) r.s8_decoded = r.s8;
    if (!r.s8_int8_a) r.s8_int8_a = r.s8;
    return r;
}

/* QLINEAR_DISABLE: a list (commas or spaces) of ISA names to hide, and
 * "avx512bf16", "avx512vbmi" or "amx_bf16" to hide that feature (so the
 * paths of CPUs without it run on any machine that has the rest). */
static void apply_disable(const char *off)
{
    if (!off) return;
    if (strstr(off, "avx512bf16")) features.avx512bf16 = false;
    if (strstr(off, "avx512vbmi")) features.avx512vbmi = false;
    if (strstr(off, "amx_bf16")) features.amx_bf16 = false;
    char tok[32];
    for (const char *p = off; *p;) {
        size_t n = strcspn(p, ", ");
        if (n > 0 && n < sizeof tok) {
            memcpy(tok, p, n);
            tok[n] = '\0';
            for (int i = 0; i < QL_ENTRIES; i++)
                if (!strcmp(tok, registry[i].name) && registry[i].isa != QL_ISA_GENERIC) disabled[i] = true;
        }
        p += n;
        p += strspn(p, ", ");
    }
}

static int index_of(ql_isa isa);

/* Whether this CPU runs the table of registry entry i (before ensure()). */
static bool runs(int i)
{
    return i >= 0 && registry[i].table && !disabled[i] &&
           (registry[i].table->supported == NULL || registry[i].table->supported(&features));
}

static void init(void)
{
    ql_cpu_detect(&features);
    apply_disable(getenv("QLINEAR_DISABLE"));
    const ql_cpu_kernels *g = &ql_cpu_kernels_generic;
    for (int i = 0; i < QL_ENTRIES; i++) {
        if (!registry[i].table) continue;
        resolved[i] = resolve(registry[i].table, g);
        if (resolved[i].tune) resolved[i].tune(&resolved[i], &features);
        built[built_count++] = &resolved[i];
    }
    /* a float kernel of another ISA that this CPU does not run (amx's
     * VDPBF16PS kernels with avx512bf16 hidden): the table's fp32 kernel,
     * as on avx512vnni */
    for (int i = 0; i < QL_ENTRIES; i++) {
        if (!registry[i].table) continue;
        ql_cpu_kernels *r = &resolved[i];
        if (r->bf16->isa != r->isa && r->bf16->kb == 2 && !runs(index_of(r->bf16->isa))) r->bf16 = r->f32;
        if (r->wo_bf16 && r->wo_bf16->isa != r->isa && !runs(index_of(r->wo_bf16->isa))) r->wo_bf16 = NULL;
    }
}

static void ensure(void) { pthread_once(&once, init); }

const ql_cpu_features *ql_cpu(void)
{
    ensure();
    return &features;
}

static int index_of(ql_isa isa)
{
    for (int i = 0; i < QL_ENTRIES; i++)
        if (registry[i].isa == isa) return i;
    return -1;
}

/* ---- lookups */

const ql_cpu_kernels *ql_cpu_kernels_for(ql_isa isa)
{
    ensure();
    const int i = index_of(isa);
    return i >= 0 && registry[i].table ? &resolved[i] : NULL;
}

int ql_cpu_kernels_count(void)
{
    ensure();
    return built_count;
}

const ql_cpu_kernels *ql_cpu_kernels_at(int i)
{
    ensure();
    return i >= 0 && i < built_count ? built[i] : NULL;
}

const ql_cpu_kernels *ql_cpu_kernels_default(void)
{
    ql_isa isa = ql_isa_best();
    const char *env = getenv("QLINEAR_ISA");
    ql_isa want;
    if (env && ql_isa_from_name(env, &want) && want != QL_ISA_AUTO && ql_isa_supported(want)) isa = want;
    return ql_cpu_kernels_for(isa);
}

/* ---- the public ISA functions */

const char *ql_isa_name(ql_isa isa)
{
    if (isa == QL_ISA_AUTO) return "auto";
    const int i = index_of(isa);
    return i >= 0 ? registry[i].name : "unknown";
}

bool ql_isa_from_name(const char *name, ql_isa *out)
{
    if (!strcmp(name, "auto")) {
        *out = QL_ISA_AUTO;
        return true;
    }
    for (int i = 0; i < QL_ENTRIES; i++)
        if (!strcmp(name, registry[i].name)) {
            *out = registry[i].isa;
            return true;
        }
    return false;
}

static char names[256];
static void fill_names(void)
{
    /* generic first, then each architecture from its oldest ISA up */
    strcpy(names, "auto");
    for (int i = QL_ENTRIES - 1; i >= 0; i--) {
        strcat(names, ", ");
        strcat(names, registry[i].name);
    }
}

const char *ql_isa_names(void)
{
    static pthread_once_t names_once = PTHREAD_ONCE_INIT;
    pthread_once(&names_once, fill_names);
    return names;
}

int ql_isa_supported(ql_isa isa)
{
    if (isa == QL_ISA_AUTO) return 1;
    ensure();
    const int i = index_of(isa);
    if (i < 0 || !registry[i].table || disabled[i]) return 0;
    return registry[i].table->supported == NULL || registry[i].table->supported(&features);
}

const char *ql_isa_refusal(ql_isa isa)
{
    if (ql_isa_supported(isa)) return "";
    const int i = index_of(isa);
    if (i < 0) return "not an ISA of this library";
    if (!registry[i].table) return "an ISA of another architecture (its kernels are not in this build)";
    if (disabled[i]) return "hidden by QLINEAR_DISABLE";
    const char *why = registry[i].table->refusal ? registry[i].table->refusal(&features) : NULL;
    return why && *why ? why : "this CPU lacks its instructions";
}

ql_isa ql_isa_best(void)
{
    for (int i = 0; i < QL_ENTRIES; i++)
        if (ql_isa_supported(registry[i].isa)) return registry[i].isa;
    return QL_ISA_GENERIC;
}

int ql_isa_list(ql_isa *out, int capacity)
{
    int n = 0;
    for (int i = 0; i < QL_ENTRIES; i++)
        if (ql_isa_supported(registry[i].isa)) {
            if (out && n < capacity) out[n] = registry[i].isa;
            n++;
        }
    return n;
}
