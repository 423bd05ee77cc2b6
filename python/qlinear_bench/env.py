"""The process environment every path of the benchmark runs under, the same
for all: OpenBLAS's core type and threads, the thread pools' idle policy
(POOL_ENV), glibc malloc's settings (MALLOC_ENV), set by re-executing the
process once before any BLAS or OpenMP runtime loads; and what the machine
has (CPU flags, available memory)."""
import os
import sys

def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# The thread pools in the process: PyTorch's ATen, oneDNN and qlinear all run
# on libgomp (one pool, shared); Debian's torch does its fp32 matmuls in
# OpenBLAS's own pthread pool. Idle workers of either pool spin (OpenBLAS's
# for ~2^28 cycles after each call, libgomp's for a while after each parallel
# region), so on a 2-core machine whichever pool runs next shares its cores
# with the other's spinning workers. Every path here mixes both pools (the
# attention matmuls go through OpenBLAS on every path), so the harness makes
# both pools' idle workers sleep at once; the wake-up costs ~10-50 µs per call
# or region, far below the milliseconds each one runs at M = 1024.
POOL_ENV = (
    ("OPENBLAS_THREAD_TIMEOUT", "4", "OpenBLAS workers sleep right after each call instead of spinning"),
    ("OMP_WAIT_POLICY", "passive", "libgomp workers (PyTorch, oneDNN, qlinear) sleep at the end of each region"),
)


# glibc malloc, the same for every path: large blocks come from the heap (no
# mmap per allocation; the mmap threshold itself cannot be raised past 32 MiB)
# and freed memory stays there for the next step. 1 GiB of top pad / trim
# threshold: the heap grows in large steps and does not shrink between steps.
MALLOC_ENV = (
    ("MALLOC_MMAP_MAX_", "0", "no mmap per large allocation: tensors come from the heap"),
    ("MALLOC_TRIM_THRESHOLD_", str(1 << 30), "freed memory stays in the heap for the next step"),
    ("MALLOC_TOP_PAD_", str(1 << 26), "the heap grows in 64 MiB steps"),
)


def reexec_for_openblas(argv, threads, spin, malloc_defaults=False):
    """Set OPENBLAS_CORETYPE / OPENBLAS_NUM_THREADS and the pools' idle policy
    before any BLAS or OpenMP runtime loads (environment variables the user set win)."""
    if os.environ.get("QL_E2E_REEXEC"):
        return
    env = dict(os.environ, QL_E2E_REEXEC="1")
    notes = []
    if "OPENBLAS_CORETYPE" not in env:
        flags = cpu_flags()
        core = "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None
        if core:
            env["OPENBLAS_CORETYPE"] = core
            notes.append(f"OPENBLAS_CORETYPE={core}")
    if "ATEN_CPU_CAPABILITY" not in env and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= cpu_flags():
        # PyTorch 1.13 picks its AVX2 kernels even on AVX-512 CPUs; its AVX-512 ones (built in Debian's
        # torch) run softmax ~1.6-2.6x faster here, GELU ~1.1-1.5x (every path alike)
        env["ATEN_CPU_CAPABILITY"] = "avx512"
        notes.append("ATEN_CPU_CAPABILITY=avx512")
    if "OPENBLAS_NUM_THREADS" not in env:
        env["OPENBLAS_NUM_THREADS"] = str(threads)
        notes.append(f"OPENBLAS_NUM_THREADS={threads}")
    if not spin:
        for var, val, _ in POOL_ENV:
            if var not in env:
                env[var] = val
                notes.append(f"{var}={val}")
    if not malloc_defaults:
        for var, val, _ in MALLOC_ENV:
            if var not in env:
                env[var] = val
                notes.append(f"{var}={val}")
    env["QL_E2E_NOTE"] = " ".join(notes)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "qlinear_bench.e2e", *argv], env)


def pool_config(torch, threads, note):
    """One paragraph: the thread setup every path runs under, and who set it."""
    env = " ".join(f"{v}={os.environ.get(v, '(unset)')}" for v in
                   ("OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY",
                    "OMP_NUM_THREADS") + tuple(v for v, _, _ in MALLOC_ENV))
    lines = [f"threads: torch.set_num_threads({threads}) (ATen and oneDNN on libgomp; qlinear's layers follow "
             f"torch.get_num_threads() = {torch.get_num_threads()}, on the same libgomp pool); {env}"]
    if note:
        lines.append(f"set by qlinear_bench.e2e: {note} (OPENBLAS_CORETYPE: OpenBLAS 0.3.21 falls back to its slowest "
                     "kernels on CPUs it does not know; ATEN_CPU_CAPABILITY: PyTorch's own AVX-512 kernels (softmax, GELU, norms) instead of the AVX2 ones it picks by default; the idle policies keep one pool's spinning workers off the "
                     "cores another pool is running on; --spin leaves them at the runtimes' defaults; MALLOC_*: "
                     "large temporaries reuse heap memory instead of fresh mmaps faulted in page by page, for every "
                     "path alike; --malloc-defaults leaves glibc's defaults)")
    return "\n".join(lines)


def mem_available():
    """MemAvailable of /proc/meminfo in bytes (0 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
