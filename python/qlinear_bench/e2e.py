"""End-to-end: one forward step of a diffusion transformer with the anima shapes,
in PyTorch, with its linears as PyTorch fp32 / oneDNN fp32 / bf16 or as qlinear.

    python3 -m qlinear_bench.e2e [--blocks 28] [--tokens 1024] [--paths LIST] [--reps N]
                                 [--threads N] [--json FILE] [--plot FILE.png] [--seed S]
                                 [--quantize REGEX] [--spin] [--malloc-defaults] [--shared-input]
    python3 -m qlinear_bench.e2e --device cuda [--graphs] [--tokens M] [--paths fp32,bf16,w8a8-convrot] ...
    python3 -m qlinear_bench.e2e --overhead [--calls N] [--threads N] [--json FILE]

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

Paths: fp32 (PyTorch; its matmuls go through the BLAS it was built with: MKL
in PyPI's x86 wheels, the system OpenBLAS in Debian's), onednn-fp32
(PyTorch's oneDNN linears, torch.utils.mkldnn), bf16 (the whole model in bf16),
w8a8-convrot (every linear a qlinear.torch.QLinear, activations fp32 in and
out), weight-only (qlinear, int8 weights decoded inside the GEMM), and the
ComfyUI paths: the model in bf16 with every linear an INT8-ConvRot layer called
through comfy_kitchen.int8_linear, as ComfyUI calls it (plain linears: GELU and
gated residuals in PyTorch), dispatched to the qlinear backend (ck-qlinear) or
to comfy-kitchen's eager backend (ck-eager: a ComfyUI CPU user's INT8 step
today). Reported per
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
the rest of the model PyTorch bf16; fc1's GELU as PyTorch's pass after the
layer), and w8a8-convrot+gelu (the same with fc1's GELU in its epilogue).
Attention there is PyTorch's
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
import os
import resource
import sys
import time

from .env import MALLOC_ENV, POOL_ENV, mem_available, pool_config, reexec_for_openblas
from .report import median, plot, write_json

ALL_PATHS = ["fp32", "onednn-fp32", "bf16", "w8a8-convrot", "weight-only", "ck-qlinear", "ck-eager"]
CK_PATHS = {"ck-qlinear", "ck-eager", "ck-cuda"}
CUDA_PATHS = ["fp32", "bf16", "w8a8-convrot", "w8a8-convrot+gelu", "ck-qlinear", "ck-cuda", "ck-eager"]
CUDA_NOTES = {
    "fp32": "PyTorch fp32 on the GPU (TF32 off): the rel-L2 reference",
    "bf16": "PyTorch, whole model in bf16 on the GPU (cuBLAS)",
    "w8a8-convrot": "qlinear W8A8 INT8-ConvRot G=256 linears on the GPU (bf16 in/out), rest PyTorch bf16",
    "w8a8-convrot+gelu": "w8a8-convrot with fc1's GELU in the GEMM's epilogue instead of PyTorch's pass after it",
    "ck-qlinear": "the ComfyUI path on the GPU: comfy_kitchen.int8_linear (INT8-ConvRot G=256) through the qlinear "
                  "backend (QLINEAR_COMFY_CUDA=1), rest PyTorch bf16",
    "ck-cuda": "the ComfyUI GPU path without qlinear: comfy_kitchen.int8_linear through comfy-kitchen's own CUDA "
               "backend (its compiled kernels), rest PyTorch bf16",
    "ck-eager": "comfy_kitchen.int8_linear through comfy-kitchen's eager backend on the GPU (torch._int_mm), "
                "rest PyTorch bf16",
}
TORCH_PATHS = {"fp32", "onednn-fp32", "bf16"}
TORCH_FP32_PATHS = {"fp32", "onednn-fp32"}
NOTES = {
    "fp32": "PyTorch fp32, nn.Linear through the BLAS torch was built with (MKL in PyPI's x86 wheels)",
    "onednn-fp32": "PyTorch fp32, linears as torch.utils.mkldnn (oneDNN) modules",
    "bf16": "PyTorch, whole model in bf16",
    "w8a8-convrot": "qlinear W8A8 INT8-ConvRot G=256 linears (fp32 activations in/out), rest PyTorch fp32",
    "weight-only": "qlinear int8 weights decoded in the GEMM, fp32 activations, rest PyTorch fp32",
    "ck-qlinear": "the ComfyUI path: comfy_kitchen.int8_linear (INT8-ConvRot G=256) through the qlinear backend, "
                  "rest PyTorch bf16",
    "ck-eager": "the ComfyUI path without qlinear: comfy_kitchen.int8_linear through comfy-kitchen's eager backend, "
                "rest PyTorch bf16",
}


def _parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m qlinear_bench.e2e", description=__doc__.split("\n\n")[0])
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


# ----------------------------------------------------------------------------- the DiT step

def run(a):
    """One DiT step per path of a.paths, timed a.reps times: the table, and
    a.json / a.plot when asked for. Imports torch (after the re-exec)."""
    import torch

    torch.set_num_threads(a.threads)
    note = os.environ.get("QL_E2E_NOTE", "")
    paths = ["fp32"] + [p for p in a.paths if p != "fp32"]  # fp32 is the reference of rel-L2
    cuda = a.device == "cuda"
    if any(p in CK_PATHS for p in paths):  # the ComfyUI paths: comfy-kitchen, with the qlinear backend registered
        paths = [p for p in paths if p not in CK_PATHS or _ck_path_ok(p, cuda)]
    if cuda and not torch.cuda.is_available():
        print("qlinear e2e: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    from . import dit
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (the rel-L2 reference)
    _print_setup(torch, dit, a, paths, note)
    steps = Steps(torch, dit, a)
    outs = steps.measure(paths)
    res = steps.res
    best_fp32, fastest = _summarize(res, outs, paths, a)
    _print_results(res, paths, best_fp32, fastest, cuda)
    records = [res[p] for p in paths]
    if a.json:
        write_json(a.json, {"model": {"blocks": a.blocks, "tokens": a.tokens, "text_tokens": a.text_tokens,
                                      "hidden": dit.HIDDEN, "heads": dit.HEADS, "linears": steps.n_lin},
                            "threads": a.threads, "reps": a.reps, "torch": torch.__version__, "note": note,
                            "device": a.device, "graphs": a.graphs, "shared_input": a.shared_input,
                            "best_fp32": best_fp32, "fastest_torch": fastest, "paths": records})
    if a.plot:
        plot(records, a, best_fp32, fastest)
    return 0


def _ck_path_ok(p, cuda):
    """Whether ComfyUI path p can run here (else it says why and is left out):
    on a GPU qlinear serves comfy-kitchen's CUDA tensors once
    QLINEAR_COMFY_CUDA=1 (set here), ck-cuda needs comfy-kitchen's compiled
    CUDA backend."""
    if cuda:
        os.environ.setdefault("QLINEAR_COMFY_CUDA", "1")
    try:
        import qlinear.comfy as qc
        st = qc.register()
        why = None if st["available"] else st["reason"]
        if why is None and cuda and p == "ck-qlinear" and "cuda" not in st["devices"]:
            why = f"qlinear serves no CUDA tensors: {st['cuda']}"
        if why is None and p == "ck-cuda":
            if not cuda:
                why = "a GPU path"
            else:
                from comfy_kitchen.registry import registry
                try:
                    with registry.use_backend("cuda"):
                        pass
                except Exception as e:  # not registered, or its compiled extension did not load
                    why = f"comfy-kitchen's CUDA backend is unavailable ({type(e).__name__}: {e})"
    except ImportError as e:
        why = str(e)
    if why:
        print(f"qlinear e2e: path {p} is left out: {why}")
    return why is None


def _print_setup(torch, dit, a, paths, note):
    """What runs: the model, the versions, the device or the thread setup, each path."""
    import qlinear

    cuda = a.device == "cuda"
    print(f"qlinear e2e: DiT with the anima shapes: {a.blocks} blocks (hidden {dit.HIDDEN}, {dit.HEADS} heads), "
          f"M = {a.tokens} image tokens, {a.text_tokens} text tokens of width {dit.TEXT_DIM}; {16 * a.blocks} linears")
    print(f"torch {torch.__version__}, qlinear {qlinear.version()} ({qlinear.library_path()}, "
          f"through {qlinear._lib.ffi_name()}), "
          f"{a.threads} threads, {a.reps} timed steps per path (median), seed {a.seed}")
    if cuda:
        ffi, lib = qlinear._lib.load()
        name = ffi.new("char[]", 256)
        lib.ql_cuda_device_name(torch.cuda.current_device(), name, 256)
        print(f"device: {ffi.string(name).decode()}; torch CUDA {torch.version.cuda}; "
              + ("each path's step replayed from a CUDA graph" if a.graphs else "eager (each call enqueued by Python)"))
    else:
        print(pool_config(torch, a.threads, note))
    for p in paths:
        print(f"  {p:<13} {(CUDA_NOTES if cuda else NOTES)[p]}")


class Steps:
    """Each path's model, built and warmed up (on a GPU with --graphs: its step
    captured in a CUDA graph), and its timed steps: res[path] collects the step
    and linear times and the page faults of each, measure() returns the outputs."""

    def __init__(self, torch, dit, a):
        self.torch, self.dit, self.a = torch, dit, a
        self.cuda = a.device == "cuda"
        self.dev = "cuda" if self.cuda else "cpu"
        self.n_lin = 16 * a.blocks
        self.inputs = self._inputs()
        self.res = {}

    def _inputs(self):
        """(x, t, ctx) on the device, in fp32 and in bf16: the same numbers for every path."""
        torch, a, dit = self.torch, self.a, self.dit
        g = torch.Generator()
        g.manual_seed(a.seed)
        x = torch.randn(1, a.tokens, dit.HIDDEN, generator=g)
        t = torch.randn(1, dit.HIDDEN, generator=g)
        ctx = torch.randn(1, a.text_tokens, dit.TEXT_DIM, generator=g)
        return {torch.float32: tuple(u.to(self.dev) for u in (x, t, ctx)),
                torch.bfloat16: tuple(u.to(self.dev, torch.bfloat16) for u in (x, t, ctx))}

    def dtype_of(self, p):
        torch = self.torch
        return torch.bfloat16 if p in ("bf16", "ck-qlinear", "ck-eager", "ck-cuda") \
            or (self.cuda and p in ("w8a8-convrot", "w8a8-convrot+gelu")) \
            else torch.float32

    def measure(self, paths):
        """a.reps steps of every path: {path: its output}. The paths interleave
        round by round when every model fits in memory at once (a slow spell of
        the machine then hits all paths); else one path at a time."""
        torch, a = self.torch, self.a
        need = sum(self.dit.model_bytes(p, a.blocks) for p in paths)
        interleave = need < 0.6 * (torch.cuda.mem_get_info()[0] if self.cuda else mem_available())
        print(f"weights of all paths: {need / 2**30:.1f} GiB; "
              + ("paths interleaved round by round" if interleave else "one path after another (not enough memory to "
                                                                        "hold every model at once)"))
        self.res = {p: {"path": p, "step_ms_all": [], "linear_ms_all": [], "minflt_all": []} for p in paths}
        outs = {}
        if interleave:
            models = {p: self.prepare(p) for p in paths}
            for r in range(a.reps):
                for p in paths:
                    outs[p] = self.one_step(p, *models[p])
            del models
        else:
            for p in paths:
                model, timer, graph = self.prepare(p)
                for r in range(a.reps):
                    outs[p] = self.one_step(p, model, timer, graph)
                outs[p] = outs[p].float()
                del model, timer, graph
        return outs

    def prepare(self, p):
        """(model, its LinearTimer, (CUDA graph, its output) or None) of path p, warmed up."""
        torch, a = self.torch, self.a
        t0 = time.perf_counter()
        model = self.dit.build(a.blocks, a.seed, p, a.quantize, self.dev, a.shared_input)
        self.res[p]["build_s"] = time.perf_counter() - t0
        dt = self.dtype_of(p)
        with torch.no_grad():  # warm-up on the real shapes (oneDNN primitives, allocator): two blocks
            xx, tt, cc = self.inputs[dt]
            if p in CK_PATHS:
                # the ComfyUI paths get raw weights on every call: the backend packs each on its
                # first use, once (ComfyUI's first step); that step is timed apart, not in the median
                self.dit.check_ck_backend(model, xx)
                t1 = time.perf_counter()
                model(xx, tt, cc)
                if self.cuda:
                    torch.cuda.synchronize()
                self.res[p]["first_step_s"] = time.perf_counter() - t1
            for blk in model.blocks[:2]:
                xx = blk(xx, tt, cc)
        graph = self._capture(model, dt) if a.graphs else None
        return model, self.dit.LinearTimer(model if graph is None else torch.nn.Module(), self.cuda), graph

    def _capture(self, model, dt):
        """(CUDA graph of one step, its output): a full step on a side stream
        first (lazy initialisations), then the capture."""
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            model(*self.inputs[dt])
        torch.cuda.current_stream().wait_stream(s)
        cg = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(cg):
            y = model(*self.inputs[dt])
        return cg, y

    def one_step(self, p, model, timer, graph=None):
        """One timed step of path p (the graph replayed, with one): its output."""
        torch, res = self.torch, self.res
        dt = self.dtype_of(p)
        timer.reset()
        with torch.no_grad():
            if self.cuda:
                torch.cuda.synchronize()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            if graph is not None:
                graph[0].replay()
                y = graph[1]
            else:
                y = model(*self.inputs[dt])
            if self.cuda:
                torch.cuda.synchronize()
            el = time.perf_counter() - t0
            res[p]["minflt_all"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        timer.finish()
        res[p]["step_ms_all"].append(el * 1e3)
        res[p]["linear_ms_all"].append(timer.total * 1e3 if graph is None else float("nan"))
        assert graph is not None or timer.calls == self.n_lin, (timer.calls, self.n_lin)
        return y.clone() if graph is not None else y


def _summarize(res, outs, paths, a):
    """Medians, rel-L2 against fp32 and the speed-ups into each path's record:
    (PyTorch's best fp32 path, its fastest path of any dtype)."""
    ref = outs["fp32"].double()
    for p in paths:
        r = res[p]
        r["step_ms"] = median(r["step_ms_all"])
        r["linear_ms"] = median(r["linear_ms_all"])
        r["minflt"] = median(r["minflt_all"])
        r["rel_l2"] = float((outs[p].double() - ref).norm() / ref.norm())
        r["blocks"], r["tokens"], r["threads"], r["reps"] = a.blocks, a.tokens, a.threads, a.reps
        r["device"], r["graphs"], r["shared_input"] = a.device, a.graphs, a.shared_input
    torch_paths = [p for p in paths if p in TORCH_PATHS]
    best_fp32 = min((p for p in paths if p in TORCH_FP32_PATHS), key=lambda p: res[p]["step_ms"])
    fastest = min(torch_paths, key=lambda p: res[p]["step_ms"])
    for p in paths:
        r = res[p]
        r["speedup_vs_best_fp32"] = res[best_fp32]["step_ms"] / r["step_ms"]
        r["speedup_vs_fastest_torch"] = res[fastest]["step_ms"] / r["step_ms"]
    return best_fp32, fastest


def _print_results(res, paths, best_fp32, fastest, cuda):
    print(f"\n{'path':<14} {'step ms':>9} {'linears ms':>11} {'share':>6} {'rest ms':>9} "
          f"{'vs ' + best_fp32:>16} {'vs ' + fastest:>16} {'rel-L2 vs fp32':>15} {'faults/step':>12}")
    prec = 2 if cuda else 0
    for p in paths:
        r = res[p]
        print(f"{p:<14} {r['step_ms']:9.{prec}f} {r['linear_ms']:11.{prec}f} {r['linear_ms'] / r['step_ms']:6.0%} "
              f"{r['step_ms'] - r['linear_ms']:9.{prec}f} {r['speedup_vs_best_fp32']:15.2f}x "
              f"{r['speedup_vs_fastest_torch']:15.2f}x {r['rel_l2']:15.3g} {r['minflt']:12.0f}")
    print(f"\nPyTorch's best fp32 path: {best_fp32}; its fastest path of any dtype: {fastest}")
    for p in paths:
        if "first_step_s" in res[p]:
            why = ("through the qlinear backend each weight is packed on its first use" if p == "ck-qlinear"
                   else "the ComfyUI paths' first steps are all timed apart")
            print(f"{p}: its first step took {res[p]['first_step_s']:.1f} s (timed apart: {why})")
    for p in paths:
        if p not in TORCH_PATHS:
            print(f"{p}: {res[p]['speedup_vs_best_fp32']:.2f}x PyTorch's best fp32 ({best_fp32}), "
                  f"{res[p]['speedup_vs_fastest_torch']:.2f}x its fastest ({fastest}), rel-L2 {res[p]['rel_l2']:.3g}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = _parse(argv)
    reexec_for_openblas(argv, a.threads, a.spin, a.malloc_defaults)
    if a.overhead:
        from .overhead import overhead  # imports torch: after the re-exec
        return overhead(a)
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
