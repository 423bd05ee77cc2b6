"""Thread scaling of `qlinear bench`: the same profile and paths at 1, 2, 4,
... threads (up to the machine's cores), one `qlinear bench` run per count,
and per path the weighted total, its speed-up over one thread, and beside it
the speed-up of the int8 dot-product loop the bench samples in the same
rounds (the machine's own scaling: frequency and shared resources). Needs
only the standard library (the lent machine has no numpy):

    python3 -m qlinear_bench.threads [--cli build/qlinear] [--profile anima] [--m 1024]
        [--paths w8a8-convrot,int8-gemm] [--threads 1,2,4,8,16] [--reps 3] [--json FILE]

A path that leaves fp32 out is timed against the first path named (the
bench's --paths rule), so no fp32 layer runs at one thread.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def default_counts():
    n = os.cpu_count() or 1
    out, t = [], 1
    while t < n:
        out.append(t)
        t *= 2
    return out + [n]


def run_bench(cli, profile, m, paths, threads, reps, env_extra=None):
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "bench.json")
        cmd = [cli, "bench", "--profile", profile, "--m", str(m), "--paths", paths, "--threads", str(threads),
               "--reps", str(reps), "--json", js]
        env = dict(os.environ, **(env_extra or {}))
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        if r.returncode != 0:
            sys.exit(f"qlinear_bench.threads: {' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
        with open(js) as f:
            return json.load(f)


def summarize(doc):
    """Weighted totals per path, the count-weighted mean of the sampled int8
    peak, and the ISA and kernels that ran."""
    recs = doc["records"]
    peak_w, peak_sum = 0.0, 0.0
    for r in recs:
        if r.get("int8_peak_gops"):
            peak_sum += r["int8_peak_gops"] * r["count"]
            peak_w += r["count"]
    kernels = sorted({r["kernel"] for r in recs if r.get("kernel")})
    return {"totals": doc["totals"], "peak_gops": peak_sum / peak_w if peak_w else 0.0,
            "isa": doc["machine"]["isa"], "kernels": kernels,
            "shapes": {f'{r["n"]}x{r["k"]}/{r["path"]}': r["ms"] for r in recs}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default=os.environ.get("QLINEAR_CLI", "build/qlinear"))
    ap.add_argument("--profile", default="anima")
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--paths", default="w8a8-convrot,int8-gemm")
    ap.add_argument("--threads", default=None, help="comma list (default 1, 2, 4, ... up to the cores)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    counts = [int(t) for t in a.threads.split(",")] if a.threads else default_counts()
    if any(t < 1 for t in counts):
        sys.exit("qlinear_bench.threads: --threads wants counts >= 1")
    rows = {}
    for t in counts:
        print(f"  {a.profile} M={a.m}, {t} thread(s) ...", file=sys.stderr, flush=True)
        rows[t] = summarize(run_bench(a.cli, a.profile, a.m, a.paths, t, a.reps))
    base = counts[0]
    paths = [p for p in a.paths.split(",") if all(p in rows[t]["totals"] for t in counts)]
    print(f"thread scaling: profile {a.profile}, M = {a.m}, ISA {rows[base]['isa']}, weighted totals (ms), "
          f"speed-up over {base} thread(s) in brackets, median of {a.reps} rounds per count")
    head = f"{'threads':>8}" + "".join(f"{p:>26}" for p in paths) + f"{'int8 peak GOP/s':>26}"
    print(head)
    for t in counts:
        r = rows[t]
        cells = "".join(f"{r['totals'][p]:>16.1f} ({rows[base]['totals'][p] / r['totals'][p]:5.2f}x)" for p in paths)
        pk = r["peak_gops"]
        pk0 = rows[base]["peak_gops"]
        peak = f"{pk:>16.0f} ({pk / pk0:5.2f}x)" if pk and pk0 else f"{'-':>26}"
        print(f"{t:>8}{cells}{peak}")
    print("kernels: " + "; ".join(rows[counts[-1]]["kernels"]))
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"profile": a.profile, "m": a.m, "paths": paths, "counts": counts,
                       "rows": {str(t): rows[t] for t in counts}}, f, indent=1)
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
