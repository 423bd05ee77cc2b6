"""The end-to-end benchmark and the bench plot, run small: they work, their
JSON says what the README says, their numbers are sane (not timed)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli


def _run(args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, **kw)
    return r


def _has_comfy_kitchen():
    try:
        import torch
        if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 7):
            return False
        import comfy_kitchen  # noqa: F401
        return True
    except ImportError:
        return False


def test_comfy_bench_small(tmp_path):
    """qlinear_bench.comfy on one small profile: it runs, the qlinear and eager
    paths agree, its JSON has every path and the overhead (not timed)."""
    if not _has_comfy_kitchen():
        pytest.skip("needs torch >= 2.7 and comfy-kitchen")
    js = tmp_path / "comfy.json"
    r = _run(["qlinear_bench.comfy", "--profile", "qwen3-te", "--m", "20", "--reps", "1", "--calls", "100",
              "--threads", "2", "--json", str(js)], timeout=600)
    assert r.returncode == 0, r.stderr
    assert "OpenMP runtimes" in r.stdout and "dispatch overhead" in r.stdout
    d = json.loads(js.read_text())
    assert len(d["shapes"]) == 5 and set(d["totals_ms"]) == {"ck-qlinear", "ck-eager", "torch-bf16", "torch-fp32",
                                                              "torch-int-mm"}
    for row in d["shapes"]:
        assert row["rel_l2_qlinear_vs_eager"] < 1e-2 and all(v > 0 for v in row["ms"].values())
    assert all(o["overhead_us"] == o["overhead_us"] for o in d["overhead"])  # a number, not NaN
    sh = d["shared_input"]  # three layers on one input, with and without the prologue cache
    assert sh["n"] == 2048 and sh["k"] == 1024 and sh["ms_per_layer_prologue"] > 0 and sh["ms_prologue_cache"] > 0
    assert "prologue cache" in r.stdout


def test_comfy_host_cost(tmp_path):
    """--host-cost: every piece of a ComfyUI call timed, in its JSON (not timed
    against anything: the pieces are positive numbers and the nesting holds
    for the one that must: the registry's part is below the whole call)."""
    if not _has_comfy_kitchen():
        pytest.skip("needs torch >= 2.7 and comfy-kitchen")
    js = tmp_path / "host.json"
    r = _run(["qlinear_bench.comfy", "--host-cost", "--calls", "100", "--threads", "1", "--json", str(js)], timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(js.read_text())
    assert d["device"] == "cpu" and d["m"] == 1 and [(o["n"], o["k"]) for o in d["host_us"]] == [(256, 256), (2048, 2048)]
    for o in d["host_us"]:
        med = o["median_us"]
        assert len(med) == 8 and all(v > 0 for v in med.values())
        assert med["registry: choose + rules"] < med["ck.int8_linear (ComfyUI's call)"]
    assert "C call, prepared args" in r.stdout


def test_e2e_small(tmp_path):
    js, png = tmp_path / "e2e.json", tmp_path / "e2e.png"
    r = _run(["qlinear_bench.e2e", "--blocks", "1", "--tokens", "24", "--text-tokens", "8", "--reps", "1",
              "--threads", "2", "--json", str(js), "--plot", str(png)], timeout=600)
    assert r.returncode == 0, r.stderr
    assert "OPENBLAS_CORETYPE" in r.stdout
    assert "MALLOC_MMAP_MAX_=0" in r.stdout  # the allocator setting, the same for every path, printed
    d = json.loads(js.read_text())
    assert d["model"] == {"blocks": 1, "tokens": 24, "text_tokens": 8, "hidden": 2048, "heads": 16, "linears": 16}
    recs = {p["path"]: p for p in d["paths"]}
    ck = {"ck-qlinear", "ck-eager"} if _has_comfy_kitchen() else set()
    assert set(recs) == {"fp32", "onednn-fp32", "bf16", "w8a8-convrot", "weight-only"} | ck
    for p in recs.values():
        assert 0 < p["linear_ms"] < p["step_ms"] and p["reps"] == 1
        assert p["minflt"] >= 0 and len(p["minflt_all"]) == 1
    assert recs["fp32"]["rel_l2"] == 0.0
    assert recs["onednn-fp32"]["rel_l2"] < 1e-5  # the same model in fp32, another GEMM
    assert 1e-4 < recs["w8a8-convrot"]["rel_l2"] < 3e-2
    assert recs["weight-only"]["rel_l2"] < recs["w8a8-convrot"]["rel_l2"]
    if ck:  # the ComfyUI paths: one model, two backends, nearly the same numbers (bf16, ConvRot)
        assert abs(recs["ck-qlinear"]["rel_l2"] - recs["ck-eager"]["rel_l2"]) < 1e-3
        assert 1e-4 < recs["ck-qlinear"]["rel_l2"] < 5e-2 and recs["ck-qlinear"]["first_step_s"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = _run(["qlinear_bench.e2e", "--paths", "fp32,fp8"])
    assert bad.returncode != 0 and "unknown path(s) fp8" in bad.stderr


def test_e2e_overhead(tmp_path):
    """--overhead runs and writes its JSON with every entry point (not timed: no figure is asserted)."""
    js = tmp_path / "ov.json"
    r = _run(["qlinear_bench.e2e", "--overhead", "--calls", "100", "--threads", "2", "--json", str(js)], timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(js.read_text())["overhead"]
    assert [(x["n"], x["k"]) for x in d] == [(256, 256), (2048, 2048)]
    for x in d:
        med = x["median_us"]
        assert set(x["python_only_us"]) == {"Python work alone: QLinear(x)", "Python work alone: QLinear(x, out=y)"}
        assert all(v > 0 for v in med.values())
        assert set(x["overhead_us"]) >= {"qlinear.torch.QLinear(x)", "qlinear.torch.QLinear(x, out=y)"}


def test_bench_plot(tmp_path, cli):
    js, png = tmp_path / "bench.json", tmp_path / "bench.png"
    run_cli(cli, "bench", "--shape", "256x512", "--m", "8", "--reps", "1", "--paths", "fp32,w8a8-convrot,int8-gemm",
            "--json", js)
    r = _run(["qlinear.plot", str(js), str(png)])
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "broken.json").write_text('{"records": []}')
    r = _run(["qlinear.plot", str(tmp_path / "broken.json"), str(tmp_path / "x.png")])
    assert r.returncode == 1 and "no records" in r.stderr and not (tmp_path / "x.png").exists()


def test_bench_int8_peer_checked(tmp_path, cli):
    """The bench checks the int8 peer's int32 sums against exact ones on its
    sampled rows (all 8 rows here, every column) and reports the count that
    differ, consistently in the JSON and the table."""
    js = tmp_path / "bench.json"
    r = run_cli(cli, "bench", "--shape", "256x512", "--m", "8", "--reps", "1", "--paths", "int8-gemm,onednn-int8",
                "--json", js)
    recs = [x for x in json.loads(js.read_text())["records"] if x["path"] == "onednn-int8"]
    if not recs:
        pytest.skip("the bench was built without oneDNN")
    rec = recs[0]
    assert rec["int32_checked"] == 8 * 256
    assert 0 <= rec["int32_inexact"] <= rec["int32_checked"]
    row = [ln for ln in r.stdout.splitlines() if " onednn-int8 " in ln and "peer:" not in ln and "oneDNN" in ln]
    assert row and ("INEXACT" in row[0]) == (rec["int32_inexact"] > 0), row


def test_thread_curve_small(tmp_path):
    """qlinear_bench.threads at 1 and 2 threads on one small profile: one bench
    run per count, every path's total and the sampled peak reported, fp32 not
    run (the first path named is the baseline); not timed."""
    cli = os.environ.get("QLINEAR_CLI", str(ROOT / "build" / "qlinear"))
    js = tmp_path / "threads.json"
    r = _run(["qlinear_bench.threads", "--cli", cli, "--profile", "qwen3-te", "--m", "3", "--paths",
              "int8-gemm,w8a8-convrot", "--threads", "1,2", "--reps", "1", "--json", str(js)], timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(js.read_text())
    assert d["counts"] == [1, 2] and d["paths"] == ["int8-gemm", "w8a8-convrot"]
    for t in ("1", "2"):
        row = d["rows"][t]
        assert set(row["totals"]) == {"int8-gemm", "w8a8-convrot"} and all(v > 0 for v in row["totals"].values())
        assert not any(s.endswith("/fp32") for s in row["shapes"]) and len(row["shapes"]) == 10
    assert "thread scaling" in r.stdout and " 1.00x)" in r.stdout
    bad = _run(["qlinear_bench.threads", "--cli", cli, "--threads", "0"])
    assert bad.returncode != 0 and ">= 1" in bad.stderr


def test_bench_input_acts(tmp_path, cli):
    """The bench's input-activation paths (asked for by name, not in the
    default set): each fused layer's output equals its own pass followed by
    the layer, bit for bit, on an odd row count; the JSON says so too."""
    js = tmp_path / "bench.json"
    acts = ("gelu_tanh", "swiglu", "rms_norm")
    paths = ["w8a8-convrot"] + [f"{w}-{a}" for w in ("in", "op") for a in acts]
    r = run_cli(cli, "bench", "--shape", "256x512", "--m", "5", "--reps", "1", "--threads", "2", "--paths",
                ",".join(paths), "--json", js)
    for a in acts:
        line = [ln for ln in r.stdout.splitlines() if f"input activation {a} fused:" in ln and "weighted" not in ln]
        assert line and "outputs bit-identical" in line[0], (a, line)
    recs = {x["path"]: x for x in json.loads(js.read_text())["records"]}
    assert set(paths) <= set(recs)
    assert all(recs[f"op-{a}"]["same_as_fused"] is True for a in acts)
    assert "same_as_fused" not in recs["in-gelu_tanh"]
    plain = run_cli(cli, "bench", "--shape", "256x512", "--m", "2", "--reps", "1")
    assert " w8a8-convrot " in plain.stdout and "in-gelu_tanh" not in plain.stdout  # not a default path
