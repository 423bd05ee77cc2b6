"""The binding's per-call cost at M = 1 (python3 -m qlinear_bench.e2e --overhead):
QLinear and Linear.forward against ql_linear_forward called with prepared
arguments (see the e2e module's docstring)."""
import os
import time

from .env import pool_config
from .report import median, write_json


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
    print(pool_config(torch, a.threads, os.environ.get("QL_E2E_NOTE", "")))
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
        f32 = qlinear._lib.C.QL_F32
        fwd, args = q.linear._fwd_int, (q.linear._ptr, x.data_ptr(), f32, 1, k, y.data_ptr(), f32, n, ffi.NULL)
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
        med = {name: median(v) / 1e3 for name, v in times.items()}
        base = med["C API: ql_linear_forward, prepared args"]
        print(f"\n{n}x{k}, M = 1:")
        for name in fns:
            extra = f"  (+{med[name] - base:.1f} us over the C API)" if name.startswith("qlinear") else ""
            print(f"  {name:<42} {med[name]:9.2f} us{extra}")
        out.append({"n": n, "k": k, "threads": a.threads, "calls": len(times[name]),
                    "median_us": med, "overhead_us": {nm: med[nm] - base for nm in fns if nm.startswith("qlinear")},
                    "python_only_us": {nm: med[nm] for nm in fns if nm.startswith("Python work")}})
    if a.json:
        write_json(a.json, {"overhead": out})
    return 0
