/* x86 features: CPUID leaves 1, 7 and 0x1D and the OS's XSAVE state (XGETBV);
 * for AMX also Linux's per-process permission to use the tile data, asked
 * once, the first time the amx table is (ql_amx_refusal). */
#include "cpu/features.h"
#include "cpu/x86/x86.h"

#include <cpuid.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

void ql_cpu_detect(ql_cpu_features *f)
{
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d))
        f->vendor = b == 0x756e6547u ? QL_VENDOR_INTEL /* "Genu" */ : b == 0x68747541u ? QL_VENDOR_AMD /* "Auth" */ : QL_VENDOR_OTHER;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    {
        const int base = (int)((a >> 8) & 15), model = (int)((a >> 4) & 15);
        f->family = base == 15 ? base + (int)((a >> 20) & 255) : base;
        f->model = base == 6 || base == 15 ? model | (int)((a >> 16) & 15) << 4 : model;
    }
    bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    f->fma = (c >> 12) & 1;
    f->f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = xgetbv0();
    bool os_ymm = (xcr0 & 0x6) == 0x6;
    f->os_avx512 = os_ymm && (xcr0 & 0xe0) == 0xe0;
    if (!os_ymm) { f->fma = f->f16c = false; return; }
    const unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = (b >> 5) & 1;
    f->avx512f = f->os_avx512 && ((b >> 16) & 1);
    f->avx512bw = f->avx512f && ((b >> 30) & 1);
    f->avx512vl = f->avx512f && ((b >> 31) & 1);
    f->avx512dq = f->avx512f && ((b >> 17) & 1);
    f->avx512vnni = f->avx512f && ((c >> 11) & 1);
    f->avx512vbmi = f->avx512f && ((c >> 1) & 1);
#if defined(__x86_64__) /* the tile instructions exist in 64-bit mode only */
    f->amx_tile = (d >> 24) & 1;
    f->amx_int8 = f->amx_tile && ((d >> 25) & 1);
    f->amx_bf16 = f->amx_tile && ((d >> 22) & 1);
    f->os_amx = (xcr0 & (3ull << 17)) == (3ull << 17); /* XTILECFG, XTILEDATA */
#endif
    __cpuid_count(7, 1, a, b, c, d);
    f->avxvnni = f->avx2 && ((a >> 4) & 1);
    f->avx512bf16 = f->avx512f && ((a >> 5) & 1);
    if (f->amx_tile && max_leaf >= 0x1D) { /* the tile palettes: the kernel uses palette 1 */
        __cpuid_count(0x1D, 0, a, b, c, d);
        if (a >= 1) {
            __cpuid_count(0x1D, 1, a, b, c, d);
            /* EBX[31:16] tile names, EBX[15:0] bytes per row, ECX[15:0] rows */
            f->amx_palette = (b >> 16) >= 8 && (b & 0xFFFF) >= 64 && (c & 0xFFFF) >= 16;
        }
    }
}

/* ---- AMX: the verdict and the permission */

bool ql_amx_judge(const ql_amx_probe *p, char *why, size_t len)
{
    const char *r = NULL;
    char buf[160];
    if (!p->avx512) r = "this CPU lacks the AVX-512 subset (F, BW, VL, DQ, VNNI) of amx's prologue and epilogue";
    else if (!p->tile || !p->int8) r = "CPUID reports no AMX-TILE and AMX-INT8 (leaf 7 EDX bits 24, 25)";
    else if (!p->palette) r = "CPUID leaf 0x1D does not report tile palette 1 as 8 tiles of 16 rows x 64 bytes";
    else if (!p->os)
        r = "the OS does not enable the AMX tile state (XCR0 bits 17-18, XTILECFG/XTILEDATA; Linux 5.16 or newer does)";
    else if (p->hook_deny) r = "the AMX permission request was refused (simulated: QLINEAR_AMX_DENY is set, a test hook)";
    else if (p->perm_errno == ENOSYS) r = "AMX needs Linux's arch_prctl(ARCH_REQ_XCOMP_PERM), which this OS does not have";
    else if (p->perm_errno != 0) {
        snprintf(buf, sizeof buf,
                 "Linux refused AMX tile data to this process: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed "
                 "with errno %d (%s)",
                 p->perm_errno, strerror(p->perm_errno));
        r = buf;
    }
    if (len) snprintf(why, len, "%s", r ? r : "");
    return r == NULL;
}

/* The permission, once per process; Linux grants it to every thread of the
 * process, and saves a thread's tiles (8 KiB more per context switch) from
 * its first tile instruction on. */
#define QL_ARCH_REQ_XCOMP_PERM 0x1023
#define QL_XFEATURE_XTILEDATA 18
static int request_tile_data(void)
{
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    errno = 0;
    if (syscall(SYS_arch_prctl, QL_ARCH_REQ_XCOMP_PERM, QL_XFEATURE_XTILEDATA) == 0) return 0;
    return errno ? errno : EPERM;
#else
    return ENOSYS;
#endif
}

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static char amx_why[224];
static bool amx_ok;

static void amx_decide(void)
{
    const ql_cpu_features *f = ql_cpu();
    const char *deny = getenv("QLINEAR_AMX_DENY");
    ql_amx_probe p = {f->avx512vnni && f->avx512bw && f->avx512vl && f->avx512dq && f->fma && f->f16c,
                      f->amx_tile, f->amx_int8, f->amx_palette, f->os_amx, deny && *deny && strcmp(deny, "0") != 0, 0};
    /* ask only when nothing else stands in the way (the request changes the
     * process: larger signal frames, sigaltstack minimums) */
    if (p.avx512 && p.tile && p.int8 && p.palette && p.os && !p.hook_deny) p.perm_errno = request_tile_data();
    amx_ok = ql_amx_judge(&p, amx_why, sizeof amx_why);
}

const char *ql_amx_refusal(const ql_cpu_features *f)
{
    (void)f; /* the registry's features, which ql_cpu() returns */
    pthread_once(&amx_once, amx_decide);
    return amx_ok ? "" : amx_why;
}
