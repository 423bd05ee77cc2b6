"""Bar charts of `qlinear bench --json` results, for people who would rather look
than read:

    qlinear bench --json bench.json && python3 -m qlinear.plot bench.json bench.png

One panel per layer shape (N×K, count) with a bar per path (ms per call, the
int8 paths in blue, float paths in grey/orange), and a last panel with the
weighted totals (one pass through every layer of the profile). Uses Debian's
python3-matplotlib; writes the PNG atomically.
"""
import argparse
import json
import math
import os
import sys


def _color(path):
    if path.startswith(("w8a8", "int8", "onednn-int8", "w4a8", "w6a8")):
        return "#4c72b0" if not path.startswith("onednn") else "#8fb0de"
    if "bf16" in path:
        return "#dd8452"
    return "#9a9a9a" if not path.startswith(("openblas", "onednn")) else "#c4c4c4"


def plot(data, out, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = data.get("records") or []
    if not recs:
        raise ValueError("no records in the bench JSON")
    shapes = []
    for r in recs:
        key = (r["n"], r["k"], r["m"], r["count"])
        if key not in shapes:
            shapes.append(key)
    totals = data.get("totals") or {}
    panels = len(shapes) + (1 if totals else 0)
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for i, (n, k, m, count) in enumerate(shapes):
        ax = axes[i // cols][i % cols]
        rs = [r for r in recs if (r["n"], r["k"], r["m"], r["count"]) == (n, k, m, count)]
        ax.bar([r["path"] for r in rs], [r["ms"] for r in rs], color=[_color(r["path"]) for r in rs])
        ax.set_title(f"{n}×{k}, M = {m} (×{count})", fontsize=10)
        ax.set_ylabel("ms per call")
        ax.tick_params(axis="x", labelrotation=60, labelsize=8)
    if totals:
        ax = axes[(panels - 1) // cols][(panels - 1) % cols]
        names = list(totals)
        ax.bar(names, [totals[p] for p in names], color=[_color(p) for p in names])
        ax.set_title("weighted total (one pass)", fontsize=10)
        ax.set_ylabel("ms")
        ax.tick_params(axis="x", labelrotation=60, labelsize=8)
    for j in range(panels, rows * cols):
        axes[j // cols][j % cols].axis("off")
    mach = data.get("machine", {})
    fig.suptitle(title or f"qlinear bench: profile {data.get('profile', '?')}, {data.get('threads', '?')} threads, "
                 f"median of {data.get('reps', '?')} ({mach.get('cpu', '')}, {mach.get('isa', '')})", fontsize=11)
    fig.tight_layout()
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m qlinear.plot", description="Bar charts of qlinear bench --json")
    p.add_argument("json", help="file written by qlinear bench --json")
    p.add_argument("png", help="the chart to write")
    p.add_argument("--title")
    a = p.parse_args(argv)
    try:
        with open(a.json) as f:
            data = json.load(f)
        plot(data, a.png, a.title)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"qlinear.plot: {a.json}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
