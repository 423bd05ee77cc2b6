"""End-to-end: one forward step of a diffusion transformer with the anima shapes,
in PyTorch, with its linears as PyTorch fp32 / oneDNN fp32 / bf16 or as qlinear.

    python3 -m qlinear.e2e [--blocks 28] [--tokens 1024] [--paths LIST] [--reps N]
                           [--threads N] [--json FILE] [--plot FILE.png] [--seed S]
                           [--quantize REGEX] [--spin] [--malloc-defaults]
    python3 -m qlinear.e2e --device cuda [--graphs] [--tokens M] [--paths fp32,bf16,w8a8-convrot] ...
    python3 -m qlinear.e2e --overhead [--calls N] [--threads N] [--json FILE]

The model (random weights N(0, 0.02²), four input channels ×10 in every
linear): `blocks` transformer blocks of hidden size 2048 with 16 heads; each
has self-attention over the M image tokens (q, k, v, o 2048×2048),
cross-attention to 512 text tokens of width 1024 (q, o 2048×2048; k, v
2048×1024), an MLP 2048→8192→2048 with GELU, and three adaLN-LoRA modulations
(shift, scale, gate) from a [1, 2048] time embedding, each 2048→256→6144: the
448 linears of the `anima` profile at 28 blocks. LayerNorm without affine
before each sub-layer; attention in PyTorch (softmax(q·kᵀ/√d)·v), four heads
at a time, the same code on every path. On the qlinear paths the gated
residual of each sub-layer (x + gate ⊙ y) runs in the output projection's
epilogue (ql_epilogue: the same fp32 operations, no extra passes), and the
MLP's GELU in fc1's (QL_ACTIVATION_GELU: torch.nn.GELU()'s erf form in fp32).

Paths: fp32 (PyTorch; its matmuls go through the system OpenBLAS), onednn-fp32
(PyTorch's oneDNN linears, torch.utils.mkldnn), bf16 (the whole model in bf16),
w8a8-convrot (every linear a qlinear.torch.QLinear, activations fp32 in and
out), weight-only (qlinear, int8 weights decoded inside the GEMM). Reported per
path: median step time, time inside the linears (the rest: attention, norms,
modulation), speed-ups over PyTorch's best fp32 path and its fastest path of
any dtype, and the output's rel-L2 against the fp32 path.

OpenBLAS 0.3.21 (Debian 12) does not know recent CPUs and falls back to its
slowest kernels; as qlinear bench does, this sets OPENBLAS_CORETYPE (and
OPENBLAS_NUM_THREADS = --threads) before OpenBLAS loads, by re-executing
itself once, and says so; on AVX-512 CPUs it sets ATEN_CPU_CAPABILITY=avx512
(PyTorch 1.13 otherwise runs its own ops - softmax, GELU, norms - on its AVX2
kernels). It also makes idle pool workers sleep (POOL_ENV:
OPENBLAS_THREAD_TIMEOUT=4, OMP_WAIT_POLICY=passive; --spin leaves the
runtimes' defaults), the same setup for every path, and prints it. And it
keeps glibc's malloc from mapping each large temporary (attention scores, MLP
activations: tens of MB) fresh and unmapping it after (MALLOC_ENV:
MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ and MALLOC_TOP_PAD_ large; freed
memory is reused instead of faulted in again page by page, ~80 000 minor
faults per block otherwise); --malloc-defaults leaves glibc's defaults. The
minor page faults per step are printed for every path.

--device cuda runs the same model on a GPU: PyTorch fp32 (the rel-L2
reference; TF32 off), PyTorch bf16 (the whole model; the baseline), and
w8a8-convrot (every linear a QLinear on the GPU, bf16 activations in and out,
the rest of the model PyTorch bf16; fc1's GELU unfused, as the CUDA backend
fuses no activation). Attention there is PyTorch's
scaled_dot_product_attention where it exists (torch >= 2.0), the same on every
path; steps are timed between synchronizations, the linears by CUDA events
in the hooks; --graphs captures each path's step once in a CUDA graph and
replays it (no Python or launch cost on either side; no per-linear times).

--overhead times the binding per call at M = 1: QLinear(x), QLinear(x, out=y)
(a reused output buffer), Linear.forward on torch and numpy inputs, against ql_linear_forward called through cffi with
prepared arguments (the C API floor), each call timed on its own, medians; and the same C call
timed right after an untimed QLinear(x, out=y) (a control: whether the wrappers' Python work
between calls slows the next C call), and the wrappers' Python work alone (the same QLinear
with its C function swapped for a no-op).
"""
import argparse
import json
import os
import resource
import sys
import time

ALL_PATHS = ["fp32", "onednn-fp32", "bf16", "w8a8-convrot", "weight-only"]
CUDA_PATHS = ["fp32", "bf16", "w8a8-convrot"]
CUDA_NOTES = {
    "fp32": "PyTorch fp32 on the GPU (TF32 off): the rel-L2 reference",
    "bf16": "PyTorch, whole model in bf16 on the GPU (cuBLAS)",
    "w8a8-convrot": "qlinear W8A8 INT8-ConvRot G=256 linears on the GPU (bf16 in/out), rest PyTorch bf16",
}
TORCH_PATHS = {"fp32", "onednn-fp32", "bf16"}
TORCH_FP32_PATHS = {"fp32", "onednn-fp32"}
NOTES = {
    "fp32": "PyTorch fp32, nn.Linear through OpenBLAS",
    "onednn-fp32": "PyTorch fp32, linears as torch.utils.mkldnn (oneDNN) modules",
    "bf16": "PyTorch, whole model in bf16",
    "w8a8-convrot": "qlinear W8A8 INT8-ConvRot G=256 linears (fp32 activations in/out), rest PyTorch fp32",
    "weight-only": "qlinear int8 weights decoded in the GEMM, fp32 activations, rest PyTorch fp32",
}


def _cpu_flags():
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


def _reexec_for_openblas(argv, threads, spin, malloc_defaults=False):
    """Set OPENBLAS_CORETYPE / OPENBLAS_NUM_THREADS and the pools' idle policy
    before any BLAS or OpenMP runtime loads (environment variables the user set win)."""
    if os.environ.get("QL_E2E_REEXEC"):
        return
    env = dict(os.environ, QL_E2E_REEXEC="1")
    notes = []
    if "OPENBLAS_CORETYPE" not in env:
        flags = _cpu_flags()
        core = "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else None
        if core:
            env["OPENBLAS_CORETYPE"] = core
            notes.append(f"OPENBLAS_CORETYPE={core}")
    if "ATEN_CPU_CAPABILITY" not in env and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= _cpu_flags():
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
    os.execve(sys.executable, [sys.executable, "-m", "qlinear.e2e", *argv], env)


def _pool_config(torch, threads, note):
    """One paragraph: the thread setup every path runs under, and who set it."""
    env = " ".join(f"{v}={os.environ.get(v, '(unset)')}" for v in
                   ("OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY",
                    "OMP_NUM_THREADS") + tuple(v for v, _, _ in MALLOC_ENV))
    lines = [f"threads: torch.set_num_threads({threads}) (ATen and oneDNN on libgomp; qlinear's layers follow "
             f"torch.get_num_threads() = {torch.get_num_threads()}, on the same libgomp pool); {env}"]
    if note:
        lines.append(f"set by qlinear.e2e: {note} (OPENBLAS_CORETYPE: OpenBLAS 0.3.21 falls back to its slowest "
                     "kernels on CPUs it does not know; ATEN_CPU_CAPABILITY: PyTorch's own AVX-512 kernels (softmax, GELU, norms) instead of the AVX2 ones it picks by default; the idle policies keep one pool's spinning workers off the "
                     "cores another pool is running on; --spin leaves them at the runtimes' defaults; MALLOC_*: "
                     "large temporaries reuse heap memory instead of fresh mmaps faulted in page by page, for every "
                     "path alike; --malloc-defaults leaves glibc's defaults)")
    return "\n".join(lines)


def _parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m qlinear.e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=28)
    p.add_argument("--tokens", type=int, default=1024, help="image tokens M (default 1024)")
    p.add_argument("--text-tokens", type=int, default=512)
    p.add_argument("--paths", default=None, help="comma-separated, from: " + ", ".join(ALL_PATHS)
                   + " (--device cuda: " + ", ".join(CUDA_PATHS) + "; the default: all of them)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--graphs", action="store_true", help="--device cuda: replay each step from a CUDA graph")
    p.add_argument("--shared-input", action="store_true",
                   help="layers that read one input (self-attention q/k/v, cross-attention k/v, the three "
                        "modulation down-projections) go through qlinear.torch.forward_shared: one prologue for "
                        "each group on the qlinear path (PyTorch's paths call them one by one either way; eager "
                        "steps time each linear through hooks, so there the layers run one by one too)")
    p.add_argument("--reps", type=int, default=3, help="timed steps per path (median)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quantize", metavar="REGEX",
                   help="qlinear paths: swap only the linears whose role matches (roles: self_attn.q/k/v/o, "
                        "cross_attn.q/k/v/o, mlp.fc1, mlp.fc2, mod0/1/2.down, mod0/1/2.up); to see which layers "
                        "carry the error")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--plot", metavar="FILE.png")
    p.add_argument("--overhead", action="store_true",
                   help="measure the binding's per-call overhead at M = 1 instead")
    p.add_argument("--spin", action="store_true",
                   help="leave the thread pools' idle policy at the runtimes' defaults (spinning workers; "
                        "see POOL_ENV) instead of setting " + " ".join(f"{v}={x}" for v, x, _ in POOL_ENV))
    p.add_argument("--malloc-defaults", action="store_true",
                   help="leave glibc malloc's defaults (each large temporary mmapped fresh) instead of setting "
                        + " ".join(f"{v}={x}" for v, x, _ in MALLOC_ENV))
    p.add_argument("--calls", type=int, default=10000, help="--overhead: timed calls per entry point (median)")
    a = p.parse_args(argv)
    allowed = CUDA_PATHS if a.device == "cuda" else ALL_PATHS
    a.paths = [x for x in (a.paths or ",".join(allowed)).split(",") if x]
    bad = [x for x in a.paths if x not in allowed]
    if bad:
        p.error(f"unknown path(s) {', '.join(bad)} for --device {a.device}; choose from {', '.join(allowed)}")
    if a.graphs and a.device != "cuda":
        p.error("--graphs needs --device cuda")
    if min(a.blocks, a.tokens, a.text_tokens, a.reps, a.threads, a.calls) < 1:
        p.error("--blocks, --tokens, --text-tokens, --reps, --threads and --calls must be positive")
    return a


# ----------------------------------------------------------------------------- the model

HIDDEN, HEADS, TEXT_DIM, MLP, LORA = 2048, 16, 1024, 8192, 256


def build(torch, nn, blocks, seed, path, quantize=None, device="cpu", shared=False):
    """The model for one path. Weights are drawn layer by layer from per-layer
    seeds (every path gets the same numbers) and converted at once, so the
    peak memory is the path's model plus one fp32 layer. `quantize` (a regex
    on the layer's role, e.g. "mlp.fc2" or "mod.*up"): on the qlinear paths,
    only the matching linears become qlinear, the others stay PyTorch fp32
    (bf16 on a GPU). device "cuda": the model on the GPU (see the module's
    docstring). shared: layers that read one input go through
    qlinear.torch.forward_shared (the same numbers on every path)."""
    import re

    import qlinear.torch as qt

    counter = [0]
    sel = re.compile(quantize) if quantize else None
    sdpa = getattr(nn.functional, "scaled_dot_product_attention", None) if device != "cpu" else None

    def gated_residual(lin, h, x, gate):
        """x + gate ⊙ lin(h): on a qlinear layer inside its epilogue (the same two
        fp32 roundings, no extra passes over [M, 2048]), else in PyTorch."""
        if isinstance(lin, qt.QLinear):
            return lin(h, residual=x, residual_scale=gate)
        return x + gate * lin(h)

    try:  # in place (ATen's softmax reads each row before writing it); else a fresh tensor
        torch._softmax(torch.zeros(1, 2), -1, False, out=torch.empty(1, 2))

        def _softmax_(s):
            torch._softmax(s, -1, False, out=s)
    except (AttributeError, TypeError, RuntimeError):
        def _softmax_(s):
            s.copy_(torch.softmax(s, -1))

    def make(k, n, role, bias=True, act=None):
        g = torch.Generator()
        g.manual_seed(seed * 1_000_003 + counter[0])
        counter[0] += 1
        lin = torch.nn.utils.skip_init(nn.Linear, k, n, bias=bias)  # every value is drawn below
        with torch.no_grad():
            lin.weight.normal_(0.0, 0.02, generator=g)
            lin.weight[:, torch.randperm(k, generator=g)[:4]] *= 10.0
            if bias:
                lin.bias.normal_(0.0, 0.02, generator=g)
        if device != "cpu":
            if path == "w8a8-convrot" and not (sel and not sel.search(role)):
                return qt.QLinear.from_linear(lin, format="int8-convrot", device=device)
            return lin.to(device=device, dtype=torch.float32 if path == "fp32" else torch.bfloat16)
        if path == "onednn-fp32":
            from torch.utils import mkldnn as mk
            return mk.MkldnnLinear(lin, torch.float32)
        if path in ("w8a8-convrot", "weight-only") and sel and not sel.search(role):
            return lin
        if path == "w8a8-convrot":
            return qt.QLinear.from_linear(lin, format="int8-convrot", activation=act)
        if path == "weight-only":
            return qt.QLinear.from_linear(lin, format="int8-convrot", kind="weight-only", activation=act)
        if path == "bf16":
            return lin.to(torch.bfloat16)
        return lin

    class Attention(nn.Module):
        def __init__(self, ctx_dim, name):
            super().__init__()
            self.q, self.k, self.v, self.o = (make(HIDDEN if r in "qo" else ctx_dim, HIDDEN, f"{name}.{r}")
                                              for r in "qkvo")

        def forward(self, x, ctx, residual, gate):
            """residual + gate ⊙ o(attention(x, ctx)), four heads at a time (every
            path alike): softmax(q·kᵀ/√d)·v with the 1/√d inside the GEMM (alpha),
            the [4, M, T] scores reused from group to group (16 MB at M = T =
            1024, where all 16 heads at once were 64 MB), the softmax in place,
            and each head's output written straight into its columns (no
            transposed copies). Measured against the one-call version (M = 1024,
            2 threads): fp32 113 -> 85 ms self-, 62 -> 48 ms cross-attention;
            bf16 115 -> 108 and 55 -> 54 ms (one head at a time was slower in
            bf16)."""
            b, m, _ = x.shape
            t = ctx.shape[1]
            d, g = HIDDEN // HEADS, 4
            if not shared:
                q, k, v = self.q(x), self.k(ctx), self.v(ctx)
            elif x is ctx:
                q, k, v = qt.forward_shared([self.q, self.k, self.v], x)
            else:
                q = self.q(x)
                k, v = qt.forward_shared([self.k, self.v], ctx)
            if sdpa is not None:  # on a GPU: PyTorch's fused attention, every path alike
                heads = [u.view(b, -1, HEADS, d).transpose(1, 2) for u in (q, k, v)]
                o = sdpa(*heads).transpose(1, 2).reshape(b, m, HIDDEN)
                return gated_residual(self.o, o, residual, gate)
            o = torch.empty(b, m, HEADS, d, dtype=q.dtype)
            s = torch.empty(g, m, t, dtype=q.dtype)
            for i in range(b):
                qh, kh = q[i].view(m, HEADS, d).transpose(0, 1), k[i].view(t, HEADS, d).transpose(0, 1)
                vh, oh = v[i].view(t, HEADS, d).transpose(0, 1), o[i].transpose(0, 1)
                for h in range(0, HEADS, g):
                    torch.baddbmm(s, qh[h:h + g], kh[h:h + g].transpose(1, 2), beta=0, alpha=d ** -0.5, out=s)
                    _softmax_(s)
                    torch.bmm(s, vh[h:h + g], out=oh[h:h + g])
            o = o.view(b, m, HIDDEN)
            return gated_residual(self.o, o, residual, gate)

    class Modulation(nn.Module):  # adaLN-LoRA: shift, scale, gate from the time embedding
        def __init__(self, i):
            super().__init__()
            self.down, self.up = make(HIDDEN, LORA, f"mod{i}.down", bias=False), \
                make(LORA, 3 * HIDDEN, f"mod{i}.up", bias=False)

        def forward(self, t, down=None):
            """down: this module's down(t), when the block computed it with the others'"""
            return self.up(self.down(t) if down is None else down).unsqueeze(1).chunk(3, dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.cross_attn = Attention(HIDDEN, "self_attn"), Attention(TEXT_DIM, "cross_attn")
            # on the qlinear paths fc1 computes gelu(fc1(h)) in its epilogue
            self.fc1, self.fc2 = make(HIDDEN, MLP, "mlp.fc1", act="gelu"), make(MLP, HIDDEN, "mlp.fc2")
            self.mods = nn.ModuleList([Modulation(i) for i in range(3)])

        def forward(self, x, t, ctx):
            t = nn.functional.silu(t)
            downs = qt.forward_shared([mod.down for mod in self.mods], t) if shared else [None] * 3
            for i, mod in enumerate(self.mods):
                shift, scale, gate = mod(t, downs[i])
                h = torch.addcmul(shift, nn.functional.layer_norm(x, (HIDDEN,), eps=1e-6), 1 + scale)
                if i == 0:
                    x = self.self_attn(h, h, x, gate)
                elif i == 1:
                    x = self.cross_attn(h, ctx, x, gate)
                else:
                    u = self.fc1(h)
                    if getattr(self.fc1, "activation", None) != "gelu":
                        u = nn.functional.gelu(u)
                    x = gated_residual(self.fc2, u, x, gate)
            return x

    class DiT(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(blocks)])

        def forward(self, x, t, ctx):
            for blk in self.blocks:
                x = blk(x, t, ctx)
            return x

    model = DiT().eval()
    return model


def linear_modules(model):
    import qlinear.torch as qt
    from torch import nn
    from torch.utils import mkldnn as mk
    return [m for m in model.modules() if isinstance(m, (nn.Linear, qt.QLinear, mk.MkldnnLinear))]


class LinearTimer:
    """Time spent inside the linear modules, through forward hooks (on a GPU:
    CUDA events recorded on the stream around each linear, read by finish()
    after the step's synchronization)."""

    def __init__(self, model, cuda=False):
        self.total, self._t0, self.calls = 0.0, 0.0, 0
        self._cuda, self._events = cuda, []
        self._handles = []
        for m in linear_modules(model):
            self._handles.append(m.register_forward_pre_hook(self._pre))
            self._handles.append(m.register_forward_hook(self._post))

    def _event(self):
        import torch
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def _pre(self, mod, inp):
        if self._cuda:
            self._events.append(self._event())
        else:
            self._t0 = time.perf_counter()

    def _post(self, mod, inp, out):
        if self._cuda:
            self._events.append(self._event())
        else:
            self.total += time.perf_counter() - self._t0
        self.calls += 1

    def finish(self):
        if self._cuda:
            ev = self._events
            self.total = sum(ev[i].elapsed_time(ev[i + 1]) for i in range(0, len(ev), 2)) / 1e3
            self._events = []

    def reset(self):
        self.total, self.calls, self._events = 0.0, 0, []


def _median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _mem_available():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _model_bytes(path, blocks):
    per_block = 4 * 2048 * 2048 + 2 * 2048 * 2048 + 2 * 2048 * 1024 + 2 * 8192 * 2048 + 3 * (256 * 2048 + 6144 * 256)
    per = {"fp32": 4, "onednn-fp32": 4, "bf16": 2, "w8a8-convrot": 1, "weight-only": 1}[path]
    return per_block * blocks * per


# ----------------------------------------------------------------------------- the benchmark

def run(a):
    import numpy as np
    import torch
    from torch import nn

    import qlinear

    torch.set_num_threads(a.threads)
    note = os.environ.get("QL_E2E_NOTE", "")
    paths = ["fp32"] + [p for p in a.paths if p != "fp32"]  # fp32 is the reference of rel-L2
    n_lin = 16 * a.blocks
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("qlinear e2e: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    print(f"qlinear e2e: DiT with the anima shapes: {a.blocks} blocks (hidden {HIDDEN}, {HEADS} heads), "
          f"M = {a.tokens} image tokens, {a.text_tokens} text tokens of width {TEXT_DIM}; {n_lin} linears")
    print(f"torch {torch.__version__}, qlinear {qlinear.version()} ({qlinear.library_path()}, "
          f"through {qlinear._lib.ffi_name()}), "
          f"{a.threads} threads, {a.reps} timed steps per path (median), seed {a.seed}")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (the rel-L2 reference)
        name = qlinear._lib.load()[0].new("char[]", 256)
        qlinear._lib.load()[1].ql_cuda_device_name(torch.cuda.current_device(), name, 256)
        print(f"device: {qlinear._lib.load()[0].string(name).decode()}; torch CUDA {torch.version.cuda}; "
              + ("each path's step replayed from a CUDA graph" if a.graphs else "eager (each call enqueued by Python)"))
    else:
        print(_pool_config(torch, a.threads, note))
    for p in paths:
        print(f"  {p:<13} {(CUDA_NOTES if cuda else NOTES)[p]}")
    g = torch.Generator()
    g.manual_seed(a.seed)
    x = torch.randn(1, a.tokens, HIDDEN, generator=g)
    t = torch.randn(1, HIDDEN, generator=g)
    ctx = torch.randn(1, a.text_tokens, TEXT_DIM, generator=g)
    dev = "cuda" if cuda else "cpu"
    inputs = {torch.float32: tuple(u.to(dev) for u in (x, t, ctx)),
              torch.bfloat16: tuple(u.to(dev, torch.bfloat16) for u in (x, t, ctx))}

    def dtype_of(p):
        return torch.bfloat16 if p == "bf16" or (cuda and p == "w8a8-convrot") else torch.float32

    # Interleave the paths round by round when every model fits in memory at once
    # (a slow spell of the machine then hits all paths); else one path at a time.
    need = sum(_model_bytes(p, a.blocks) for p in paths)
    interleave = need < 0.6 * (torch.cuda.mem_get_info()[0] if cuda else _mem_available())
    print(f"weights of all paths: {need / 2**30:.1f} GiB; "
          + ("paths interleaved round by round" if interleave else "one path after another (not enough memory to "
                                                                    "hold every model at once)"))
    res = {p: {"path": p, "step_ms_all": [], "linear_ms_all": [], "minflt_all": []} for p in paths}
    outs = {}

    def one_step(p, model, timer, graph=None):
        dt = dtype_of(p)
        timer.reset()
        with torch.no_grad():
            if cuda:
                torch.cuda.synchronize()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            if graph is not None:
                graph[0].replay()
                y = graph[1]
            else:
                y = model(*inputs[dt])
            if cuda:
                torch.cuda.synchronize()
            el = time.perf_counter() - t0
            res[p]["minflt_all"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        timer.finish()
        res[p]["step_ms_all"].append(el * 1e3)
        res[p]["linear_ms_all"].append(timer.total * 1e3 if graph is None else float("nan"))
        assert graph is not None or timer.calls == n_lin, (timer.calls, n_lin)
        return y.clone() if graph is not None else y

    def prepare(p):
        t0 = time.perf_counter()
        model = build(torch, nn, a.blocks, a.seed, p, a.quantize, dev, a.shared_input)
        res[p]["build_s"] = time.perf_counter() - t0
        dt = dtype_of(p)
        with torch.no_grad():  # warm-up on the real shapes (oneDNN primitives, allocator): two blocks
            xx, tt, cc = inputs[dt]
            for blk in model.blocks[:2]:
                xx = blk(xx, tt, cc)
        graph = None
        if a.graphs:  # a full step on a side stream first (lazy initialisations), then the capture
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.no_grad(), torch.cuda.stream(s):
                model(*inputs[dt])
            torch.cuda.current_stream().wait_stream(s)
            cg = torch.cuda.CUDAGraph()
            with torch.no_grad(), torch.cuda.graph(cg):
                y = model(*inputs[dt])
            graph = (cg, y)
        return model, LinearTimer(model if graph is None else nn.Module(), cuda), graph

    if interleave:
        models = {p: prepare(p) for p in paths}
        for r in range(a.reps):
            for p in paths:
                outs[p] = one_step(p, *models[p])
        del models
    else:
        for p in paths:
            model, timer, graph = prepare(p)
            for r in range(a.reps):
                outs[p] = one_step(p, model, timer, graph)
            outs[p] = outs[p].float()
            del model, timer, graph

    ref = outs["fp32"].double()
    for p in paths:
        r = res[p]
        r["step_ms"] = _median(r["step_ms_all"])
        r["linear_ms"] = _median(r["linear_ms_all"])
        r["minflt"] = _median(r["minflt_all"])
        r["rel_l2"] = float((outs[p].double() - ref).norm() / ref.norm())
        r["blocks"], r["tokens"], r["threads"], r["reps"] = a.blocks, a.tokens, a.threads, a.reps
        r["device"], r["graphs"], r["shared_input"] = a.device, a.graphs, a.shared_input
    torch_paths = [p for p in paths if p in TORCH_PATHS]
    best_fp32 = min((p for p in paths if p in TORCH_FP32_PATHS), key=lambda p: res[p]["step_ms"])
    fastest = min(torch_paths, key=lambda p: res[p]["step_ms"])
    print(f"\n{'path':<14} {'step ms':>9} {'linears ms':>11} {'share':>6} {'rest ms':>9} "
          f"{'vs ' + best_fp32:>16} {'vs ' + fastest:>16} {'rel-L2 vs fp32':>15} {'faults/step':>12}")
    prec = 2 if cuda else 0
    for p in paths:
        r = res[p]
        r["speedup_vs_best_fp32"] = res[best_fp32]["step_ms"] / r["step_ms"]
        r["speedup_vs_fastest_torch"] = res[fastest]["step_ms"] / r["step_ms"]
        print(f"{p:<14} {r['step_ms']:9.{prec}f} {r['linear_ms']:11.{prec}f} {r['linear_ms'] / r['step_ms']:6.0%} "
              f"{r['step_ms'] - r['linear_ms']:9.{prec}f} {r['speedup_vs_best_fp32']:15.2f}x "
              f"{r['speedup_vs_fastest_torch']:15.2f}x {r['rel_l2']:15.3g} {r['minflt']:12.0f}")
    print(f"\nPyTorch's best fp32 path: {best_fp32}; its fastest path of any dtype: {fastest}")
    for p in paths:
        if p not in TORCH_PATHS:
            print(f"{p}: {res[p]['speedup_vs_best_fp32']:.2f}x PyTorch's best fp32 ({best_fp32}), "
                  f"{res[p]['speedup_vs_fastest_torch']:.2f}x its fastest ({fastest}), rel-L2 {res[p]['rel_l2']:.3g}")
    records = [res[p] for p in paths]
    if a.json:
        _write_json(a.json, {"model": {"blocks": a.blocks, "tokens": a.tokens, "text_tokens": a.text_tokens,
                                       "hidden": HIDDEN, "heads": HEADS, "linears": n_lin},
                             "threads": a.threads, "reps": a.reps, "torch": torch.__version__, "note": note,
                             "device": a.device, "graphs": a.graphs, "shared_input": a.shared_input,
                             "best_fp32": best_fp32, "fastest_torch": fastest, "paths": records})
    if a.plot:
        plot(records, a, best_fp32, fastest)
    return 0


def plot(records, a, best_fp32, fastest):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["path"] for r in records]
    lin = [r["linear_ms"] / 1e3 for r in records]
    rest = [(r["step_ms"] - r["linear_ms"]) / 1e3 for r in records]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(names, lin, label="linears", color="#4c72b0")
    ax.bar(names, rest, bottom=lin, label="rest (attention, norms, modulation)", color="#dd8452")
    for i, r in enumerate(records):
        ax.text(i, r["step_ms"] / 1e3, f"{r['speedup_vs_fastest_torch']:.2f}x", ha="center", va="bottom")
    ax.set_ylabel("seconds per step")
    ax.set_title(f"DiT step, {a.blocks} blocks, M = {a.tokens}, {a.threads} threads "
                 f"(labels: speed-up over {fastest})")
    ax.legend()
    fig.tight_layout()
    tmp = a.plot + ".tmp.png"
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, a.plot)
    print(f"wrote {a.plot}")


# ----------------------------------------------------------------------------- binding overhead

def overhead(a):
    """Per-call cost of the Python entry points beyond the C call, at M = 1:
    each call timed on its own (perf_counter_ns), the entry points interleaved
    in chunks of 100 calls, medians over all calls."""
    import numpy as np
    import torch

    import qlinear
    import qlinear.torch as qt

    torch.set_num_threads(a.threads)
    print(f"binding overhead at M = 1 (fp32 in and out), qlinear {qlinear.version()}, torch {torch.__version__}; "
          f"median of {a.calls} calls each, interleaved in chunks of 100")
    print(_pool_config(torch, a.threads, os.environ.get("QL_E2E_NOTE", "")))
    ffi, lib = qlinear._lib.load()
    clock = time.perf_counter_ns
    out = []
    for n, k in ((256, 256), (2048, 2048)):
        g = torch.Generator()
        g.manual_seed(a.seed)
        lin = torch.nn.Linear(k, n)
        q = qt.QLinear.from_linear(lin)
        x = torch.randn(1, k, generator=g)
        xn = x.numpy()
        y, yo = torch.empty(1, n), torch.empty(1, n)  # yo: a reused output buffer
        # the binding's own work: the same wrapper with its C function a no-op
        qn = qt.QLinear.from_linear(lin)
        qn.linear._fwd_int = lambda *args: 0
        fwd, args = q.linear._fwd_int, (q.linear._ptr, x.data_ptr(), 0, 1, k, y.data_ptr(), 0, n, ffi.NULL)
        fns = {
            "cffi call of ql_version() (the FFI floor)": lib.ql_version,
            "C API: ql_linear_forward, prepared args": lambda: fwd(*args),
            # control: the same C call, each right after an untimed wrapper call (does
            # the wrappers' Python work between calls slow the next C call?)
            "C API after an untimed QLinear(x, out=y)": (lambda: q(x, out=yo), lambda: fwd(*args)),
            "qlinear.torch.QLinear(x)": lambda: q(x),
            "qlinear.torch.QLinear(x, out=y)": lambda: q(x, out=yo),
            "qlinear.Linear.forward(torch x)": lambda: q.linear.forward(x),
            "qlinear.Linear.forward(numpy x)": lambda: q.linear.forward(xn),
            "torch nn.Linear(x) (for scale)": lambda: lin(x),
            "Python work alone: QLinear(x)": lambda: qn(x),
            "Python work alone: QLinear(x, out=y)": lambda: qn(x, out=yo),
        }
        assert torch.equal(q(x), q.linear.forward(x)) and np.array_equal(q.linear.forward(xn), q(x).numpy())
        fwd(*args)
        assert torch.equal(y, q(x))
        times = {name: [] for name in fns}
        with torch.no_grad():
            fns = {name: fn if isinstance(fn, tuple) else (None, fn) for name, fn in fns.items()}
            for pre, fn in fns.values():
                for _ in range(200):
                    fn()
            for _ in range(max(1, a.calls // 100)):
                for name, (pre, fn) in fns.items():
                    rec = times[name].append
                    for _ in range(100):
                        if pre is not None:
                            pre()
                        t0 = clock()
                        fn()
                        rec(clock() - t0)
        med = {name: _median(v) / 1e3 for name, v in times.items()}
        base = med["C API: ql_linear_forward, prepared args"]
        print(f"\n{n}x{k}, M = 1:")
        for name in fns:
            extra = f"  (+{med[name] - base:.1f} us over the C API)" if name.startswith("qlinear") else ""
            print(f"  {name:<42} {med[name]:9.2f} us{extra}")
        out.append({"n": n, "k": k, "threads": a.threads, "calls": len(times[name]),
                    "median_us": med, "overhead_us": {nm: med[nm] - base for nm in fns if nm.startswith("qlinear")},
                    "python_only_us": {nm: med[nm] for nm in fns if nm.startswith("Python work")}})
    if a.json:
        _write_json(a.json, {"overhead": out})
    return 0


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
    print(f"wrote {path}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = _parse(argv)
    _reexec_for_openblas(argv, a.threads, a.spin, a.malloc_defaults)
    return overhead(a) if a.overhead else run(a)


if __name__ == "__main__":
    sys.exit(main())
