/* Run-time CPU feature detection (x86: cpuid + xgetbv; AArch64: the
 * kernel's hwcaps on Linux, sysctl on macOS), done once. The only global
 * state of the library besides the thread-local error message. */
#include "core.h"

#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(ql_cpu_features *f)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f->fma = (c >> 12) & 1;
    f->f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = xgetbv0();
    bool os_ymm = (xcr0 & 0x6) == 0x6;
    f->os_avx512 = os_ymm && (xcr0 & 0xe0) == 0xe0;
    if (!os_ymm) { f->fma = f->f16c = false; return; }
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = (b >> 5) & 1;
    f->avx512f = f->os_avx512 && ((b >> 16) & 1);
    f->avx512bw = f->avx512f && ((b >> 30) & 1);
    f->avx512vl = f->avx512f && ((b >> 31) & 1);
    f->avx512dq = f->avx512f && ((b >> 17) & 1);
    f->avx512vnni = f->avx512f && ((c >> 11) & 1);
    __cpuid_count(7, 1, a, b, c, d);
    f->avxvnni = f->avx2 && ((a >> 4) & 1);
    f->avx512bf16 = f->avx512f && ((a >> 5) & 1);
}
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>

/* macOS reports each architecture feature as an integer sysctl (absent on
 * older systems: then the feature is taken as missing). */
static bool apple_feature(const char *name)
{
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v != 0;
}

static void detect(ql_cpu_features *f)
{
    f->neon = true; /* every Apple arm64 CPU */
    f->asimdhp = apple_feature("hw.optional.arm.FEAT_FP16");
    f->dotprod = apple_feature("hw.optional.arm.FEAT_DotProd");
    f->i8mm = apple_feature("hw.optional.arm.FEAT_I8MM");
    f->bf16 = apple_feature("hw.optional.arm.FEAT_BF16");
}
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

/* The kernel's hwcaps (asm/hwcap.h values, spelled out for old headers). */
#define QL_HWCAP_ASIMD (1ul << 1)
#define QL_HWCAP_ASIMDHP (1ul << 10)
#define QL_HWCAP_ASIMDDP (1ul << 20)
#define QL_HWCAP2_I8MM (1ul << 13)
#define QL_HWCAP2_BF16 (1ul << 14)

static void detect(ql_cpu_features *f)
{
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    f->neon = (hw & QL_HWCAP_ASIMD) != 0;
    f->asimdhp = f->neon && (hw & QL_HWCAP_ASIMDHP);
    f->dotprod = f->neon && (hw & QL_HWCAP_ASIMDDP);
    f->i8mm = f->neon && (hw2 & QL_HWCAP2_I8MM);
    f->bf16 = f->neon && (hw2 & QL_HWCAP2_BF16);
}
#else
static void detect(ql_cpu_features *f) { (void)f; }
#endif

static ql_cpu_features features;
static int detected; /* benign race: every thread computes the same value */

const ql_cpu_features *ql_cpu(void)
{
    if (!__atomic_load_n(&detected, __ATOMIC_ACQUIRE)) {
        ql_cpu_features f = {0};
        detect(&f);
        /* QLINEAR_DISABLE=avx512bf16 hides that feature, so the paths for CPUs
         * without it (AVX512-VNNI without BF16, e.g. Ice Lake) can be tested
         * on any machine. */
        const char *off = getenv("QLINEAR_DISABLE");
        if (off && strstr(off, "avx512bf16")) f.avx512bf16 = false;
        features = f;
        __atomic_store_n(&detected, 1, __ATOMIC_RELEASE);
    }
    return &features;
}

const char *ql_isa_name(ql_isa isa)
{
    switch (isa) {
    case QL_ISA_AUTO: return "auto";
    case QL_ISA_GENERIC: return "generic";
    case QL_ISA_AVX2: return "avx2";
    case QL_ISA_AVXVNNI: return "avxvnni";
    case QL_ISA_AVX512VNNI: return "avx512vnni";
    case QL_ISA_NEON: return "neon";
    case QL_ISA_NEONDOT: return "neondot";
    case QL_ISA_I8MM: return "i8mm";
    case QL_ISA_NEONBF16: return "neonbf16";
    }
    return "unknown";
}

int ql_isa_supported(ql_isa isa)
{
    const ql_cpu_features *f = ql_cpu();
    switch (isa) {
    case QL_ISA_AUTO: case QL_ISA_GENERIC: return 1;
    case QL_ISA_AVX2: return f->avx2 && f->fma && f->f16c;
    case QL_ISA_AVXVNNI: return f->avxvnni && f->fma && f->f16c;
    case QL_ISA_AVX512VNNI: return f->avx512vnni && f->avx512bw && f->avx512vl && f->avx512dq && f->fma && f->f16c;
    case QL_ISA_NEON: return QL_ARM64 && f->neon;
    case QL_ISA_NEONDOT: return QL_ARM64 && f->neon && f->dotprod;
    case QL_ISA_I8MM: return QL_ARM64 && f->neon && f->dotprod && f->i8mm;
    case QL_ISA_NEONBF16: return QL_ARM64 && f->neon && f->dotprod && f->i8mm && f->bf16;
    }
    return 0;
}

ql_isa ql_isa_best(void)
{
    if (ql_isa_supported(QL_ISA_NEONBF16)) return QL_ISA_NEONBF16;
    if (ql_isa_supported(QL_ISA_I8MM)) return QL_ISA_I8MM;
    if (ql_isa_supported(QL_ISA_NEONDOT)) return QL_ISA_NEONDOT;
    if (ql_isa_supported(QL_ISA_NEON)) return QL_ISA_NEON;
    if (ql_isa_supported(QL_ISA_AVX512VNNI)) return QL_ISA_AVX512VNNI;
    if (ql_isa_supported(QL_ISA_AVXVNNI)) return QL_ISA_AVXVNNI;
    if (ql_isa_supported(QL_ISA_AVX2)) return QL_ISA_AVX2;
    return QL_ISA_GENERIC;
}

void *ql_aligned_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    bytes = (bytes + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    return p;
}

void ql_aligned_free(void *p) { free(p); }
