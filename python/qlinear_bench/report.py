"""What the benchmark reports: medians, JSON files (written atomically), and
the e2e bar chart (matplotlib)."""
import json
import os


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
    print(f"wrote {path}")


def plot(records, a, best_fp32, fastest):
    """Seconds per step of each path, linears and the rest stacked, labelled
    with the speed-up over PyTorch's fastest path; written to a.plot."""
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
