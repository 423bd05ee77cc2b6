"""What a ComfyUI user gets per linear, on the CPU: comfy-kitchen's
int8_linear through the qlinear backend against the same call through
comfy-kitchen's eager backend (what ComfyUI runs for INT8 layers on a CPU
without qlinear) and PyTorch's own F.linear in bf16 and fp32, layer by layer
over a profile's shapes, in one process, the paths alternating round by
round; then the dispatch overhead per call at M = 1.

    python3 -m qlinear_bench.comfy [--profile anima|qwen3-te] [--m 1024] [--reps 5] [--threads N]
                                   [--dtype bf16|fp32] [--paths LIST] [--calls N] [--json FILE]
    python3 -m qlinear_bench.comfy --device cuda [--profile ...] [--m 1024] [--reps 5] [--paths LIST]
    python3 -m qlinear_bench.comfy [--device cuda] --input-act gelu_tanh,swiglu,rms_norm [--profile ...] [--m ...]

--device cuda: the same on a GPU, where ComfyUI's alternative is comfy-kitchen's
own CUDA backend (ck-cuda, its compiled kernels) besides eager and PyTorch
bf16, and W4A8 layers (w4a8_int8_linear, 4-bit codebook codes, group 16)
through qlinear (codes kept packed on the GPU) and through comfy-kitchen
(whose CUDA backend hands W4A8 to eager code); bf16 activations, each
sample a run of calls between two CUDA events.

--input-act: the input activations of comfy-kitchen's int8_linear
(input_act = gelu_tanh, swiglu with the input twice as wide, rms_norm with a
norm weight and eps 1e-6), per shape: the layer alone, the layer with the
activation fused (through qlinear), PyTorch's op (comfy-kitchen's
apply_input_act) then the layer, and the same fused call through the backend
a user has without qlinear (comfy-kitchen's CUDA backend on a GPU, eager on a
CPU), where it takes the call.

Weights: random int8 ConvRot codes (group 256) with per-row scales; the
float peers get the dequantized weights. Totals weight each shape by its
count in the profile (the model's whole set of linears, once each).
"""
import argparse
import os
import sys
import time

from .report import median, write_json

PROFILES = {  # (N, K, count): the shapes of tools/bench.c's profiles
    "anima": (1024, [(2048, 2048, 168), (256, 2048, 84), (6144, 256, 84), (2048, 1024, 56), (8192, 2048, 28),
                     (2048, 8192, 28)]),
    "qwen3-te": (256, [(2048, 1024, 28), (1024, 1024, 56), (1024, 2048, 28), (3072, 1024, 56), (1024, 3072, 28)]),
}
ACTS = ("gelu_tanh", "swiglu", "rms_norm")
PATHS = ["ck-qlinear", "ck-eager", "torch-bf16", "torch-fp32", "torch-int-mm"]
NOTES = {
    "ck-qlinear": "comfy_kitchen.int8_linear (ConvRot G=256) through the qlinear backend (registry, weight cache, C)",
    "ck-eager": "comfy_kitchen.int8_linear (ConvRot G=256) through comfy-kitchen's eager backend (torch._int_mm)",
    "torch-bf16": "torch.nn.functional.linear, bf16 weights and activations",
    "torch-fp32": "torch.nn.functional.linear, fp32 weights and activations",
    "torch-int-mm": "torch._int_mm alone on int8 operands (eager's GEMM without its rotation, quantization and "
                    "scaling: a floor for eager, not a linear)",
}


def _parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m qlinear_bench.comfy", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="anima", choices=sorted(PROFILES))
    p.add_argument("--m", type=int, default=None, help="rows (tokens); default: the profile's (anima 1024)")
    p.add_argument("--reps", type=int, default=5, help="timed rounds (median)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="activations in and out")
    p.add_argument("--paths", default=None, help="comma-separated, from: " + ", ".join(PATHS)
                   + " (--device cuda: " + ", ".join(CUDA_PATHS) + "; the default: all of them)")
    p.add_argument("--calls", type=int, default=3000, help="calls per entry point in the M = 1 overhead test")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--host-cost", action="store_true",
                   help="instead: the host's time a call, piece by piece (registry, the backend's op, its fast "
                        "path, the C call, torch.empty, PyTorch's F.linear), the GPU left to run behind")
    p.add_argument("--input-act", metavar="LIST", default=None,
                   help="time the fused input activations instead: a comma-separated list from " + ", ".join(ACTS))
    a = p.parse_args(argv)
    if a.input_act is not None:
        a.input_act = [x for x in a.input_act.split(",") if x]
        bad = [x for x in a.input_act if x not in ACTS]
        if bad or not a.input_act:
            p.error(f"--input-act: unknown activation(s) {', '.join(bad) or '(none given)'}; choose from {', '.join(ACTS)}")
    allowed = CUDA_PATHS if a.device == "cuda" else PATHS
    a.paths = [x for x in (a.paths or ",".join(allowed)).split(",") if x]
    bad = [x for x in a.paths if x not in allowed]
    if bad:
        p.error(f"unknown path(s) {', '.join(bad)} for --device {a.device}; choose from {', '.join(allowed)}")
    if a.m is None:
        a.m = 1 if a.host_cost else PROFILES[a.profile][0]
    return a


def _version(dist):
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def _openmp_runtimes():
    """The OpenMP runtime libraries mapped into this process."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "omp" in line.rsplit("/", 1)[-1]}
    except OSError:
        return ["(unknown: no /proc/self/maps)"]
    return sorted(libs) or ["none"]


def _layer(torch, n, k, g):
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    s = torch.rand(n, 1, generator=g) * 2e-4 + 1e-4
    b = torch.randn(n, generator=g) * 0.02
    return q, s, b


def _backend(register):
    """comfy_kitchen, its registry and the qlinear backend's state (register:
    put it first in the priority), or None (said why) where it is unavailable."""
    import comfy_kitchen as ck
    from comfy_kitchen.registry import registry

    import qlinear.comfy as qc
    st = qc.register() if register else qc.state()
    if not st["available"]:
        print(f"qlinear.comfy: the backend is unavailable: {st['reason']}", file=sys.stderr)
        return None
    return ck, registry, st


def run(a):
    import torch
    torch.set_num_threads(a.threads)
    import qlinear
    got = _backend(False)
    if got is None:
        return 2
    ck, registry, st = got
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    print(f"qlinear comfy bench: profile {a.profile}, M = {a.m}, {a.dtype} activations in and out, {a.threads} threads "
          f"(torch.get_num_threads() = {torch.get_num_threads()}), {a.reps} rounds (median), seed {a.seed}")
    print(f"torch {torch.__version__}, comfy-kitchen {_version('comfy-kitchen')}, qlinear {qlinear.version()} "
          f"({st['library']}, ISA {st['isa']}); priority {st['priority']}")
    print("OpenMP runtimes mapped in this process (one: qlinear and PyTorch share its thread pool): "
          + ", ".join(_openmp_runtimes()))
    for p in a.paths:
        print(f"  {p:<11} {NOTES[p]}")
    from qlinear.comfy import _ops
    # every row times a lone layer called again and again on one input: the
    # prologue cache would serve every call after the first, so it is off
    # here and measured on its own (shared_input) below
    cache_was, _ops.HAS_PROLOGUE_CACHE = _ops.HAS_PROLOGUE_CACHE, False
    g = torch.Generator().manual_seed(a.seed)
    rows = []
    shapes = PROFILES[a.profile][1]
    for n, k, count in shapes:
        q, s, b = _layer(torch, n, k, g)
        x = torch.randn(a.m, k, generator=g).to(dt)
        bb = b.to(dt)
        fns = {}
        if "ck-qlinear" in a.paths:
            fns["ck-qlinear"] = lambda q=q, s=s, x=x, bb=bb: ck.int8_linear(x, q, s, bb, dt, True, 256)
        if "ck-eager" in a.paths:
            def eager(q=q, s=s, x=x, bb=bb):
                with registry.use_backend("eager"):
                    return ck.int8_linear(x, q, s, bb, dt, True, 256)
            fns["ck-eager"] = eager
        if "torch-bf16" in a.paths or "torch-fp32" in a.paths:
            w = torch.ops.comfy_kitchen.dequantize_int8_convrot_weight(q, s, 256)  # the float model the codes stand for
        if "torch-bf16" in a.paths:
            wb, xb, b16 = w.to(torch.bfloat16), x.to(torch.bfloat16), b.to(torch.bfloat16)
            fns["torch-bf16"] = lambda wb=wb, xb=xb, b16=b16: torch.nn.functional.linear(xb, wb, b16)
        if "torch-fp32" in a.paths:
            xf = x.float()
            fns["torch-fp32"] = lambda w=w, xf=xf, b=b: torch.nn.functional.linear(xf, w, b)
        if "torch-int-mm" in a.paths:
            x8 = torch.randint(-127, 128, (a.m, k), dtype=torch.int8, generator=g)
            wt = q.t().contiguous()
            fns["torch-int-mm"] = lambda x8=x8, wt=wt: torch._int_mm(x8, wt)
        if "ck-qlinear" in fns and "ck-eager" in fns:  # the same call, two backends: the same numbers
            y1, y0 = fns["ck-qlinear"](), fns["ck-eager"]()
            rel = float((y1.double() - y0.double()).norm() / y0.double().norm())
        else:
            rel = float("nan")
        times = {p: [] for p in fns}
        with torch.no_grad():
            for f in fns.values():
                f()
            for _ in range(a.reps):
                for p, f in fns.items():
                    t0 = time.perf_counter()
                    f()
                    times[p].append((time.perf_counter() - t0) * 1e3)
        med = {p: median(v) for p, v in times.items()}
        rows.append({"n": n, "k": k, "count": count, "ms": med, "rel_l2_qlinear_vs_eager": rel})
        line = "  ".join(f"{p} {med[p]:9.3f}" for p in fns)
        print(f"  {n:>5}x{k:<5} x{count:<3} ms: {line}   rel-L2 qlinear/eager {rel:.2e}")
    tot = {p: sum(r["ms"][p] * r["count"] for r in rows) for p in rows[0]["ms"]}
    print(f"\nweighted totals over the profile's {sum(c for _, _, c in shapes)} linears at M = {a.m}:")
    for p, t in tot.items():
        rel = "  ".join(f"{t / tot[o]:.2f}x {o}" for o in tot if o != p)
        print(f"  {p:<11} {t:10.1f} ms   ({rel})")
    if "ck-qlinear" in tot and "ck-eager" in tot:
        print(f"ck.int8_linear through qlinear: {tot['ck-eager'] / tot['ck-qlinear']:.2f}x faster than through eager"
              + (f", {tot['torch-bf16'] / tot['ck-qlinear']:.2f}x PyTorch bf16 F.linear's speed" if "torch-bf16" in tot
                 else ""))
    ov = overhead(torch, ck, a, dt)
    _ops.HAS_PROLOGUE_CACHE = cache_was
    sh = shared_input(torch, ck, a, dt, shapes[0]) if "ck-qlinear" in a.paths and cache_was else None
    if a.json:
        write_json(a.json, {"profile": a.profile, "m": a.m, "dtype": a.dtype, "threads": a.threads, "reps": a.reps,
                            "torch": torch.__version__, "shapes": rows, "totals_ms": tot, "overhead": ov,
                            "shared_input": sh})
    return 0


def shared_input(torch, ck, a, dt, shape):
    """Three layers of the profile's first shape called one by one on one
    input (ComfyUI's q, k, v), through qlinear with the prologue cache and
    without it, the two alternating round by round: the input quantized once
    against three times (a fresh input each round, so no round reuses the last
    one's codes)."""
    from qlinear.comfy import _ops
    n, k, _ = shape
    g = torch.Generator().manual_seed(a.seed + 2)
    layers = [_layer(torch, n, k, g) for _ in range(3)]
    xs = [torch.randn(a.m, k, generator=g).to(dt) for _ in range(a.reps + 1)]
    times = {True: [], False: []}
    with torch.no_grad():
        for r, x in enumerate(xs):
            for on in (False, True):
                _ops.HAS_PROLOGUE_CACHE = on
                _ops.prologue_cache_release()
                t0 = time.perf_counter()
                for q, s, b in layers:
                    ck.int8_linear(x, q, s, None, dt, True, 256)
                if r:  # the first round warms up
                    times[on].append((time.perf_counter() - t0) * 1e3)
    _ops.HAS_PROLOGUE_CACHE = True
    off, on = median(times[False]), median(times[True])
    print(f"\nthree {n}x{k} layers on one input (q, k, v), M = {a.m}: {off:.3f} ms with a prologue per layer, "
          f"{on:.3f} ms with the prologue cache ({off / on:.3f}x)")
    return {"n": n, "k": k, "ms_per_layer_prologue": off, "ms_prologue_cache": on}


def _interleaved_us(fns, calls, warm, sync=lambda: None):
    """Median µs a call of each entry point: warm calls each, then `calls`
    calls each in chunks of 100, entries interleaved chunk by chunk, every
    call timed on its own on the host clock; sync() after the warm-up and
    after each chunk (a GPU's queue drained outside the timed calls)."""
    clock = time.perf_counter_ns
    times = {nm: [] for nm in fns}
    for f in fns.values():
        for _ in range(warm):
            f()
    sync()
    for _ in range(max(1, calls // 100)):
        for nm, f in fns.items():
            rec = times[nm].append
            for _ in range(100):
                t0 = clock()
                f()
                rec(clock() - t0)
            sync()
    return {nm: median(v) / 1e3 for nm, v in times.items()}


def overhead(torch, ck, a, dt):
    """Per call at M = 1: ck.int8_linear through the registry to qlinear
    (dispatch, constraints, weight cache, binding, C) against the C call with
    prepared arguments on the same packed layer; each call timed on its own,
    the two interleaved in chunks of 100, medians."""
    from qlinear.comfy import _ops
    out = []
    print(f"\ndispatch overhead at M = 1 ({a.dtype}), median of {a.calls} calls each:")
    g = torch.Generator().manual_seed(a.seed + 1)
    for n, k in ((256, 256), (2048, 2048)):
        q, s, b = _layer(torch, n, k, g)
        x = torch.randn(1, k, generator=g).to(dt)
        bb = b.to(dt)
        ck.int8_linear(x, q, s, bb, dt, True, 256)
        e = _ops.weights.get(q, ("int8", 256), (s,), None)
        lin = e.layer
        y = torch.empty(1, n, dtype=dt)
        code = _ops.CODE[dt]
        ffi = lin._ffi
        epi = ffi.new("ql_epilogue *")
        bias_f32 = bb.float()
        if _ops.HAS_EPI_BIAS:
            epi.bias = ffi.cast("const float *", bias_f32.data_ptr())
        fwd, args = lin._fwd_int, (lin._ptr, x.data_ptr(), code, 1, k, y.data_ptr(), code, n, epi)
        fns = {"ck.int8_linear -> qlinear": lambda: ck.int8_linear(x, q, s, bb, dt, True, 256),
               "ql_linear_forward, prepared args": lambda: fwd(*args)}
        med = _interleaved_us(fns, a.calls, warm=100)
        over = med["ck.int8_linear -> qlinear"] - med["ql_linear_forward, prepared args"]
        print(f"  {n}x{k}: " + ", ".join(f"{nm} {v:.1f} us" for nm, v in med.items()) + f"; overhead {over:.1f} us")
        out.append({"n": n, "k": k, "median_us": med, "overhead_us": over})
    return out


def _device_ready(torch, a):
    """False (said why) where --device cuda has no GPU; else the backend set up
    for the device (CUDA tensors served, or the CPU's thread count)."""
    if a.device == "cuda":
        if not torch.cuda.is_available():
            print("qlinear comfy bench: --device cuda, but torch sees no CUDA device", file=sys.stderr)
            return False
        os.environ.setdefault("QLINEAR_COMFY_CUDA", "1")
    else:
        torch.set_num_threads(a.threads)
    return True


CUDA_PATHS = ["ck-qlinear", "ck-cuda", "ck-eager", "torch-bf16", "ck-qlinear-w4a8", "ck-cuda-w4a8", "ck-eager-w4a8"]
CUDA_NOTES = {
    "ck-qlinear": "comfy_kitchen.int8_linear (ConvRot G=256) through the qlinear backend's CUDA layers",
    "ck-cuda": "comfy_kitchen.int8_linear (ConvRot G=256) through comfy-kitchen's CUDA backend (its kernels)",
    "ck-eager": "comfy_kitchen.int8_linear (ConvRot G=256) through comfy-kitchen's eager backend (torch._int_mm)",
    "torch-bf16": "torch.nn.functional.linear, bf16 weights and activations (cuBLAS)",
    "ck-qlinear-w4a8": "comfy_kitchen.w4a8_int8_linear (4-bit codebook, group 16, ConvRot G=256) through qlinear "
                       "(codes packed on the GPU)",
    "ck-cuda-w4a8": "comfy_kitchen.w4a8_int8_linear through comfy-kitchen's CUDA backend",
    "ck-eager-w4a8": "comfy_kitchen.w4a8_int8_linear through comfy-kitchen's eager backend (decode per call, "
                     "then torch._int_mm)",
}


def _cuda_backend_ok(registry, name, op, kw):
    """None if comfy-kitchen's backend `name` takes this call, else why not."""
    try:
        with registry.use_backend(name):
            pass
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    r = registry.validate_backend_for_call(name, op, kw)
    return None if r.success else str(r)


def run_cuda(a):
    import torch
    if not torch.cuda.is_available():
        print("qlinear comfy bench: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    os.environ.setdefault("QLINEAR_COMFY_CUDA", "1")
    import comfy_kitchen as ck
    from comfy_kitchen.registry import registry

    import qlinear
    import qlinear.comfy as qc
    st = qc.register()
    dev = torch.device("cuda")
    dt = torch.bfloat16
    ffi, lib = qlinear._lib.load()
    name = ffi.new("char[]", 256)
    lib.ql_cuda_device_name(torch.cuda.current_device(), name, 256)
    print(f"qlinear comfy bench (GPU): profile {a.profile}, M = {a.m}, bf16 activations in and out, {a.reps} rounds "
          f"(median), seed {a.seed}; device {ffi.string(name).decode()}")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), comfy-kitchen {_version('comfy-kitchen')}, "
          f"qlinear {qlinear.version()} ({st['library']}); qlinear serves {', '.join(st['devices'])}; "
          f"priority {st['priority']}")
    from qlinear.comfy import _ops
    cache_was, _ops.HAS_PROLOGUE_CACHE = _ops.HAS_PROLOGUE_CACHE, False  # lone layers (as the CPU rows)
    g = torch.Generator().manual_seed(a.seed)
    backend = {"ck-qlinear": "qlinear", "ck-cuda": "cuda", "ck-eager": "eager", "ck-qlinear-w4a8": "qlinear",
               "ck-cuda-w4a8": "cuda", "ck-eager-w4a8": "eager"}
    paths = list(a.paths)
    rows, shapes = [], PROFILES[a.profile][1]
    for n, k, count in shapes:
        q, s, b = _layer(torch, n, k, g)
        x = (torch.randn(1, a.m, k, generator=g)).to(dev, dt)
        qd, sd, bd = q.to(dev), s.to(dev), b.to(dev, dt)
        w = torch.ops.comfy_kitchen.dequantize_int8_convrot_weight(q, s, 256)  # the float model of the codes
        with registry.use_backend("qlinear"):  # the CPU quantizer (the same codes as eager's)
            w4 = ck.quantize_w4a8_int8_weight(w, group_size=16, convrot_groupsize=256)
        w4d = [None if t is None else t.to(dev) for t in w4]
        kw8 = dict(x=x, weight=qd, weight_scale=sd, bias=bd, out_dtype=dt, convrot=True, convrot_groupsize=256)
        kw4 = dict(x=x, qdata=w4d[0], s_rel=w4d[1], s_channel=w4d[2], correction=w4d[3], codebook=w4d[4], bias=bd,
                   group_size=16, convrot_groupsize=256, out_dtype=dt)
        fns = {}
        for p in paths:
            if p == "torch-bf16":
                wb = w.to(dev, dt)
                fns[p] = lambda wb=wb: torch.nn.functional.linear(x, wb, bd)
                continue
            op, kw = ("w4a8_int8_linear", kw4) if p.endswith("w4a8") else ("int8_linear", kw8)
            why = _cuda_backend_ok(registry, backend[p], op, kw)
            if why:
                if not rows:
                    print(f"  {p}: left out ({why})")
                continue
            fns[p] = (lambda f=getattr(ck, op), kw=kw: f(**kw), backend[p])
        prio = list(registry._priority)

        def prefer(f):
            """The path's function; its backend first in the registry's priority (as a
            ComfyUI user's would be: no use_backend() around each call)."""
            if isinstance(f, tuple):
                f, bk = f
                registry.set_priority([bk] + [b for b in prio if b != bk])
            return f
        with torch.no_grad():
            outs = {p: prefer(f)().float() for p, f in fns.items()}  # warm-up: packs each weight once
        ref8, ref4 = outs.get("ck-eager"), outs.get("ck-eager-w4a8")
        rel = {p: float((y - (ref4 if p.endswith("w4a8") else ref8)).norm() / (ref4 if p.endswith("w4a8") else
                                                                              ref8).norm())
               for p, y in outs.items() if p != "torch-bf16" and (ref4 if p.endswith("w4a8") else ref8) is not None}
        iters = max(3, min(200, int(2e9 / max(1, 2 * a.m * n * k))))
        times = {p: [] for p in fns}
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.no_grad():
            for _ in range(a.reps):
                for p, f in fns.items():
                    f = prefer(f)
                    torch.cuda.synchronize()
                    ev0.record()
                    for _ in range(iters):
                        f()
                    ev1.record()
                    ev1.synchronize()
                    times[p].append(ev0.elapsed_time(ev1) / iters)
        registry.set_priority(prio)
        med = {p: median(v) for p, v in times.items()}
        rows.append({"n": n, "k": k, "count": count, "ms": med, "rel_l2_vs_eager": rel, "iters": iters})
        line = "  ".join(f"{p} {med[p]:8.4f}" for p in fns)
        print(f"  {n:>5}x{k:<5} x{count:<3} ms: {line}")
        print("  " + " " * 16 + "rel-L2 vs eager: " + "  ".join(f"{p} {v:.1e}" for p, v in rel.items()))
    _ops.HAS_PROLOGUE_CACHE = cache_was
    common = [p for p in rows[0]["ms"] if all(p in r["ms"] for r in rows)]
    tot = {p: sum(r["ms"][p] * r["count"] for r in rows) for p in common}
    print(f"\nweighted totals over the profile's {sum(c for _, _, c in shapes)} linears at M = {a.m}:")
    for p, t in tot.items():
        rel = "  ".join(f"{t / tot[o]:.2f}x {o}" for o in tot if o != p)
        print(f"  {p:<16} {t:10.2f} ms   ({rel})")
    host = host_cost_cuda(torch, ck, registry, a, dt, dev)
    if a.json:
        write_json(a.json, {"profile": a.profile, "m": a.m, "device": "cuda", "reps": a.reps,
                            "torch": torch.__version__, "shapes": rows, "totals_ms": tot, "host_us": host})
    return 0


def host_cost_cuda(torch, ck, registry, a, dt, dev, calls=2000):
    """The host's time per call where the GPU's work is short (M = 16,
    2048 x 2048): each path's calls enqueued back to back, the wall time per
    call (the host's cost when it exceeds the GPU's), the qlinear call with
    prepared arguments (ql_linear_forward through the binding) as the floor;
    then where the qlinear path's host time goes (cProfile, own time)."""
    import cProfile
    import pstats
    from qlinear.comfy import _ops
    g = torch.Generator().manual_seed(a.seed + 3)
    q, s, b = _layer(torch, 2048, 2048, g)
    x = torch.randn(1, 16, 2048, generator=g).to(dev, dt)
    qd, sd, bd = q.to(dev), s.to(dev), b.to(dev, dt)
    wb = torch.ops.comfy_kitchen.dequantize_int8_convrot_weight(q, s, 256).to(dev, dt)
    kw = dict(x=x, weight=qd, weight_scale=sd, bias=bd, out_dtype=dt, convrot=True, convrot_groupsize=256)
    fns = {"torch-bf16 F.linear": lambda: torch.nn.functional.linear(x, wb, bd)}
    for name, bk in (("ck.int8_linear -> qlinear", "qlinear"), ("ck.int8_linear -> ck cuda", "cuda")):
        if _cuda_backend_ok(registry, bk, "int8_linear", kw) is None:  # first in the priority while timed
            fns[name] = (lambda: ck.int8_linear(**kw), bk)
    prio = list(registry._priority)
    out = {}
    print(f"\nhost time per call, M = 16, 2048x2048, {calls} calls enqueued back to back (GPU-bound below ~10 us):")
    for name, f in fns.items():
        bk = None
        if isinstance(f, tuple):
            f, bk = f
            registry.set_priority([bk] + [p for p in prio if p != bk])
        with torch.no_grad():
            for _ in range(50):
                f()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            torch.cuda.synchronize()
            out[name] = (time.perf_counter() - t0) / calls * 1e6
        if bk == "qlinear":
            e = _ops.weights.get(qd, ("int8-cuda", 256), (sd,), None)
            lin = e.layer
            y = torch.empty(1, 16, 2048, dtype=dt, device=dev)
            ffi = lin._ffi
            epi = ffi.new("ql_epilogue *")
            b32 = bd.float()
            epi.bias = ffi.cast("const float *", b32.data_ptr())
            args = (lin._ptr, x.data_ptr(), _ops.CODE[dt], 16, 2048, y.data_ptr(), _ops.CODE[dt], 2048, epi)
            fwd = lin._fwd_int
            for _ in range(50):
                fwd(*args)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fwd(*args)
            torch.cuda.synchronize()
            out["ql_linear_forward, prepared args"] = (time.perf_counter() - t0) / calls * 1e6
            prof = cProfile.Profile()
            with torch.no_grad():
                prof.enable()
                for _ in range(calls // 4):
                    f()
                prof.disable()
            torch.cuda.synchronize()
            prof_stats = pstats.Stats(prof)
    registry.set_priority(prio)
    for name, us in out.items():
        print(f"  {name:<36} {us:8.1f} us")
    if "ck.int8_linear -> qlinear" in fns:
        print(f"where ck.int8_linear -> qlinear spends its host time ({calls // 4} calls, cProfile, own time first):")
        prof_stats.sort_stats("tottime").print_stats(14)
    return out


def _timer(torch, dev, reps):
    """ms per call of f: on a GPU a run of calls between two CUDA events, on a
    CPU each call on the wall clock; the median of reps samples."""
    if dev.type == "cuda":
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def sample(f, iters):
            torch.cuda.synchronize()
            ev0.record()
            for _ in range(iters):
                f()
            ev1.record()
            ev1.synchronize()
            return ev0.elapsed_time(ev1) / iters
    else:
        def sample(f, iters):
            t0 = time.perf_counter()
            for _ in range(iters):
                f()
            return (time.perf_counter() - t0) * 1e3 / iters
    return sample


def run_input_acts(a):
    """--input-act: what a fused input activation costs over the layer alone,
    against PyTorch's op followed by the layer (module docstring)."""
    import torch
    dev = torch.device(a.device)
    if not _device_ready(torch, a):
        return 2
    import qlinear
    got = _backend(True)
    if got is None:
        return 2
    ck, registry, _ = got
    from comfy_kitchen.backends._activations import apply_input_act
    from qlinear.comfy import _ops
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    peer = "cuda" if dev.type == "cuda" else "eager"
    print(f"qlinear comfy bench, input activations: profile {a.profile}, M = {a.m}, {a.dtype} in and out, device "
          f"{dev.type}" + ("" if dev.type == "cuda" else f", {a.threads} threads") + f", {a.reps} rounds (median), "
          f"seed {a.seed}; torch {torch.__version__}, comfy-kitchen {_version('comfy-kitchen')}, qlinear "
          f"{qlinear.version()}; fused = int8_linear(input_act=...) through qlinear; op+layer = comfy-kitchen's "
          f"apply_input_act (PyTorch ops), then int8_linear through qlinear; peer = the fused call through "
          f"comfy-kitchen's {peer} backend" + ("; each CPU sample follows an untimed call of the same path" if dev.type == "cpu" else ""))
    cache_was, _ops.HAS_PROLOGUE_CACHE = _ops.HAS_PROLOGUE_CACHE, False  # a lone layer called again and again
    g = torch.Generator().manual_seed(a.seed)
    sample = _timer(torch, dev, a.reps)
    prio = list(registry._priority)

    def first(bk):
        registry.set_priority([bk] + [b for b in prio if b != bk])

    rows = []
    try:
        for n, k, count in PROFILES[a.profile][1]:
            q, s, b = _layer(torch, n, k, g)
            qd, sd, bd = q.to(dev), s.to(dev), b.to(dev, dt)
            iters = 1 if dev.type == "cpu" else max(3, min(200, int(2e9 / max(1, 2 * a.m * n * k))))
            x = torch.randn(a.m, k, generator=g).to(dev, dt)
            base = dict(weight=qd, weight_scale=sd, bias=bd, out_dtype=dt, convrot=True, convrot_groupsize=256)
            row = {"n": n, "k": k, "count": count, "ms": {}, "rel_l2_fused_vs_op_then_layer": {}}
            fns = {"layer": ("qlinear", lambda: ck.int8_linear(x, **base))}
            for act in a.input_act:
                xin = torch.randn(a.m, 2 * k if act == "swiglu" else k, generator=g).to(dev, dt)
                aw = (torch.rand(k, generator=g) + 0.5).to(dev, dt) if act == "rms_norm" else None
                kw = dict(base, x=xin, input_act=act, input_act_weight=aw, input_act_eps=1e-6)
                fns[f"{act} fused"] = ("qlinear", lambda kw=kw: ck.int8_linear(**kw))
                fns[f"{act} op+layer"] = ("qlinear", lambda xin=xin, act=act, aw=aw: ck.int8_linear(
                    apply_input_act(xin, act, aw, 1e-6), **base))
                why = _cuda_backend_ok(registry, peer, "int8_linear", kw) if dev.type == "cuda" else None
                if why is None:
                    fns[f"{act} {peer}"] = (peer, lambda kw=kw: ck.int8_linear(**kw))
                elif not rows:
                    print(f"  {act} through comfy-kitchen's {peer} backend: left out ({why})")
            with torch.no_grad():
                outs = {}
                for p, (bk, f) in fns.items():
                    first(bk)
                    outs[p] = f().double()  # warm-up: packs the weight once
                for act in a.input_act:
                    y0 = outs[f"{act} op+layer"]
                    row["rel_l2_fused_vs_op_then_layer"][act] = float((outs[f"{act} fused"] - y0).norm() / y0.norm())
                times = {p: [] for p in fns}
                for _ in range(a.reps):
                    for p, (bk, f) in fns.items():
                        first(bk)
                        if dev.type == "cpu":
                            f()  # every path timed with its weights and inputs warm, none after another's misses
                        times[p].append(sample(f, iters))
            row["ms"] = {p: median(v) for p, v in times.items()}
            rows.append(row)
            print(f"  {n:>5}x{k:<5} x{count:<3} ms: " + "  ".join(f"{p} {v:.4f}" for p, v in row["ms"].items()))
    finally:
        registry.set_priority(prio)
        _ops.HAS_PROLOGUE_CACHE = cache_was
    tot = {p: sum(r["ms"][p] * r["count"] for r in rows) for p in rows[0]["ms"] if all(p in r["ms"] for r in rows)}
    print(f"\nweighted totals over the profile's {sum(r['count'] for r in rows)} linears at M = {a.m} "
          f"(the layer alone: {tot['layer']:.3f} ms):")
    summary = {}
    for act in a.input_act:
        fu, op = tot[f"{act} fused"], tot[f"{act} op+layer"]
        pe = tot.get(f"{act} {peer}")
        summary[act] = {"fused_ms": fu, "op_then_layer_ms": op, "peer_ms": pe,
                        "fused_over_layer": fu / tot["layer"] - 1, "op_then_layer_over_fused": op / fu}
        print(f"  {act:<9} fused {fu:9.3f} ms ({100 * (fu / tot['layer'] - 1):+.1f} % over the layer alone); "
              f"op+layer {op:9.3f} ms ({op / fu:.2f}x the fused time)"
              + (f"; comfy-kitchen {peer} fused {pe:9.3f} ms ({pe / fu:.2f}x)" if pe is not None else "")
              + f"; rel-L2 fused vs op+layer ≤ {max(r['rel_l2_fused_vs_op_then_layer'][act] for r in rows):.1e}")
    if a.json:
        write_json(a.json, {"profile": a.profile, "m": a.m, "device": dev.type, "dtype": a.dtype, "reps": a.reps,
                            "torch": torch.__version__, "shapes": rows, "totals_ms": tot, "input_act": summary})
    return 0


def run_host_cost(a):
    """--host-cost: where a ComfyUI call's host time goes. Each entry point
    is called --calls times in chunks of 100, each call timed on its own on
    the host clock (no synchronization inside a chunk: a GPU runs the
    kernels behind; the device is synchronized between chunks so its queue
    never fills and blocks a launch), entries interleaved chunk by chunk,
    medians. The pieces nest: ck.int8_linear = the registry's choice and the
    rules + the backend's op; the op = the weight-cache lookup + _fast; _fast
    = torch.empty + epilogue + the C call. Beside them, a pre-norm block's
    call (rms_norm on the input, the gated residual on the output)."""
    import torch
    cuda = a.device == "cuda"
    if not _device_ready(torch, a):
        return 2
    got = _backend(True)
    if got is None:
        return 2
    ck, registry, st = got
    from qlinear.comfy import _ops
    dev = torch.device(a.device)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    m = a.m  # default 1: on a CPU the C call is then small beside the Python around it
    print(f"qlinear comfy bench, host time a call: device {a.device}, M = {m}, {a.dtype}, median of {a.calls} calls "
          f"each (chunks of 100, interleaved); torch {torch.__version__}, comfy-kitchen {_version('comfy-kitchen')}, "
          f"qlinear serves {', '.join(st['devices'])}")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    g = torch.Generator().manual_seed(a.seed)
    out = []
    for n, k in ((256, 256), (2048, 2048)):
        q, s, b = _layer(torch, n, k, g)
        q, s = q.to(dev), s.to(dev)
        bb = b.to(dev, dt)
        x = torch.randn(m, k, generator=g).to(dev, dt)
        wf = torch.randn(n, k, generator=g).to(dev, dt)
        # a pre-norm block's call: rms_norm on the input, the gated residual on the output
        wn = (torch.rand(k, generator=g) + 0.5).to(dev, dt)
        res, rsc = torch.randn(m, n, generator=g).to(dev, dt), torch.randn(n, generator=g).to(dev, dt)
        kw = dict(x=x, weight=q, weight_scale=s, bias=bb, out_dtype=dt, convrot=True, convrot_groupsize=256,
                  input_act=None, input_act_weight=None, input_act_eps=0.0, residual=None, residual_scale=None)
        if registry.get_capable_backend("int8_linear", kw) != "qlinear":
            print(f"  {n}x{k}: the registry does not choose qlinear for this call: left out")
            continue
        e = (_ops._int8_layer_cuda if cuda else _ops._int8_layer)(q, s, 256)
        lin = e.layer
        y = torch.empty(m, n, dtype=dt, device=dev)
        epi = lin._ffi.new("ql_epilogue *")
        b32 = _ops._bias_f32(e, bb, dt)
        if _ops.HAS_EPI_BIAS:
            epi.bias = lin._ffi.cast("const float *", b32.data_ptr())
        code = _ops.CODE[dt]
        args = (lin._ptr, x.data_ptr(), code, m, k, y.data_ptr(), code, n, epi)
        fns = {
            "ck.int8_linear (ComfyUI's call)": lambda: ck.int8_linear(x, q, s, bb, dt, True, 256),
            "the same, rms_norm + residual": lambda: ck.int8_linear(x, q, s, bb, dt, True, 256, input_act="rms_norm",
                                                                    input_act_weight=wn, input_act_eps=1e-6,
                                                                    residual=res, residual_scale=rsc),
            "registry: choose + rules": lambda: registry.get_capable_backend("int8_linear", kw),
            "_ops.int8_linear (the op)": lambda: _ops.int8_linear(x, q, s, bb, dt, True, 256),
            "_fast (entry found)": lambda: _ops._fast(e, x, bb, dt, None, None, 0.0),
            "C call, prepared args": lambda: lin._fwd_int(*args),
            "torch.empty": lambda: torch.empty(m, n, dtype=dt, device=dev),
            "F.linear (PyTorch)": lambda: torch.nn.functional.linear(x, wf, bb),
        }
        with torch.no_grad():
            med = _interleaved_us(fns, a.calls, warm=20, sync=sync)
        print(f"  {n}x{k}:")
        for nm, v in med.items():
            print(f"    {nm:<34} {v:8.1f} us")
        out.append({"n": n, "k": k, "m": m, "median_us": med})
    if a.json:
        write_json(a.json, {"device": a.device, "m": m, "dtype": a.dtype, "calls": a.calls, "torch": torch.__version__,
                            "host_us": out})
    return 0


def main(argv=None):
    a = _parse(sys.argv[1:] if argv is None else argv)
    if a.host_cost:
        return run_host_cost(a)
    if a.input_act:
        return run_input_acts(a)
    return run_cuda(a) if a.device == "cuda" else run(a)


if __name__ == "__main__":
    sys.exit(main())
