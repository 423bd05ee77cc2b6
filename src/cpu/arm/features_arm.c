/* AArch64 features: the kernel's hwcaps on Linux, sysctl on macOS. */
#include "cpu/features.h"

#if defined(__APPLE__)
#include <sys/sysctl.h>

/* macOS reports each architecture feature as an integer sysctl (absent on
 * older systems: then the feature is taken as missing). */
static bool apple_feature(const char *name)
{
    int v = 0;
    size_t len = sizeof v;
    return sysctlbyname(name, &v, &len, NULL, 0) == 0 && v != 0;
}

void ql_cpu_detect(ql_cpu_features *f)
{
    f->neon = true; /* every Apple arm64 CPU */
    f->asimdhp = apple_feature("hw.optional.arm.FEAT_FP16");
    f->dotprod = apple_feature("hw.optional.arm.FEAT_DotProd");
    f->i8mm = apple_feature("hw.optional.arm.FEAT_I8MM");
    f->bf16 = apple_feature("hw.optional.arm.FEAT_BF16");
}
#elif defined(__linux__)
#include <sys/auxv.h>

/* The kernel's hwcaps (asm/hwcap.h values, spelled out for old headers). */
#define QL_HWCAP_ASIMD (1ul << 1)
#define QL_HWCAP_ASIMDHP (1ul << 10)
#define QL_HWCAP_ASIMDDP (1ul << 20)
#define QL_HWCAP2_I8MM (1ul << 13)
#define QL_HWCAP2_BF16 (1ul << 14)

void ql_cpu_detect(ql_cpu_features *f)
{
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    f->neon = (hw & QL_HWCAP_ASIMD) != 0;
    f->asimdhp = f->neon && (hw & QL_HWCAP_ASIMDHP);
    f->dotprod = f->neon && (hw & QL_HWCAP_ASIMDDP);
    f->i8mm = f->neon && (hw2 & QL_HWCAP2_I8MM);
    f->bf16 = f->neon && (hw2 & QL_HWCAP2_BF16);
}
#else
void ql_cpu_detect(ql_cpu_features *f) { (void)f; }
#endif
