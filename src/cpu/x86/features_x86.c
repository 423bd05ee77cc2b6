/* x86 features: CPUID leaves 1 and 7 and the OS's XSAVE state (XGETBV). */
#include "cpu/features.h"

#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

void ql_cpu_detect(ql_cpu_features *f)
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
