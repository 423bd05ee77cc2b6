"""qlinear's numpy API against the C command line (bit for bit) and against a
float64 reference of the unquantized layer; error cases."""
import os
import subprocess
import sys

import numpy as np
import pytest

import qlinear
from conftest import ROOT, bf16_bits, bf16_to_f32, rel_l2, run_cli, write_safetensors

# W8A8 vs float64 of the float layer, Gaussian data (weights N(0, 0.02²) with
# four input channels ×10): measured ~1.05e-2 with ConvRot and ~2.8e-2 without
# (the outliers widen every row's range); the bounds docs/NUMERICS.md documents.
BOUND = {"int8-convrot": 2e-2, "int8": 5e-2}


def make_weight(rng, n, k, outliers=4):
    w = rng.normal(0.0, 0.02, (n, k)).astype(np.float32)
    cols = rng.choice(k, outliers, replace=False)
    w[:, cols] *= 10.0
    return w


@pytest.fixture
def float_ckpt(tmp_path, rng):
    """A float checkpoint: two linears (one with bias), a norm, an embedding."""
    t = {
        "blocks.0.attn.q.weight": make_weight(rng, 96, 512),
        "blocks.0.attn.q.bias": rng.normal(0, 0.5, 96).astype(np.float32),
        "blocks.0.mlp.fc.weight": (bf16_bits(make_weight(rng, 64, 256)), "BF16"),
        "blocks.0.norm.weight": rng.normal(1, 0.1, 512).astype(np.float32),
        "blocks.0.odd.weight": make_weight(rng, 16, 100),  # K not a multiple of 256
        "embed.weight": rng.normal(0, 1, (10, 256)).astype(np.float32),
    }
    p = tmp_path / "float.safetensors"
    write_safetensors(p, t, {"made_by": "test_numpy"})
    return p, t


def test_version_and_library():
    assert qlinear.version().count(".") == 2
    assert os.path.isabs(qlinear.library_path())


def test_checkpoint_and_quantize_file(tmp_path, float_ckpt):
    src, t = float_ckpt
    out = tmp_path / "int8.safetensors"
    res = qlinear.quantize_file(src, out, format="int8-convrot")
    assert res["layers_quantized"] == 2  # q (K=512) and fc (K=256); not odd, norm, embed
    assert res["tensors_copied"] == 4 and res["bytes_out"] == out.stat().st_size
    with qlinear.Checkpoint(out) as ck:
        layers = {l.name: l for l in ck.layers()}
        assert set(layers) == {"blocks.0.attn.q", "blocks.0.mlp.fc"}
        q = layers["blocks.0.attn.q"]
        assert (q.format, q.convrot, q.group, q.n, q.k, q.has_bias, q.supported) == \
            ("int8_tensorwise", True, 256, 96, 512, True, True)
        names = {i.name: i for i in ck.tensors()}
        assert q.bytes == sum(names[f"blocks.0.attn.q.{s}"].bytes for s in ("weight", "weight_scale", "bias",
                                                                             "comfy_quant"))
        assert names["blocks.0.attn.q.weight"].dtype == "I8" and names["blocks.0.attn.q.weight"].shape == (96, 512)
        np.testing.assert_array_equal(ck.tensor("blocks.0.norm.weight"), t["blocks.0.norm.weight"])
        np.testing.assert_array_equal(ck.tensor("blocks.0.odd.weight"), t["blocks.0.odd.weight"])
        assert ck.metadata() == {"made_by": "test_numpy"}
        cq = bytes(ck.tensor("blocks.0.attn.q.comfy_quant"))
        assert cq == b'{"format": "int8_tensorwise", "convrot": true, "convrot_groupsize": 256}'
        with pytest.raises(qlinear.QlinearError, match="no tensor 'nope'"):
            ck.tensor("nope")
    with pytest.raises(qlinear.QlinearError, match="closed"):
        ck.layers()


@pytest.mark.parametrize("xdt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("odt", ["fp32", "bf16", "fp16"])
def test_forward_equals_cli(tmp_path, float_ckpt, cli, rng, xdt, odt):
    """Python output == `qlinear forward` output, bit for bit, on the same file."""
    src, _ = float_ckpt
    ck_path = tmp_path / "int8.safetensors"
    run_cli(cli, "quantize", src, ck_path, "--format", "int8-convrot")
    for layer, k in (("blocks.0.attn.q", 512), ("blocks.0.mlp.fc", 256), ("blocks.0.odd", 100)):
        x32 = rng.normal(0, 1, (7, k)).astype(np.float32)
        x32[3] = 0.0  # a zero row
        x = {"fp32": x32, "fp16": x32.astype(np.float16), "bf16": bf16_bits(x32)}[xdt]
        xin = tmp_path / "x.safetensors"
        write_safetensors(xin, {"x": (x, "BF16") if xdt == "bf16" else x})
        yout = tmp_path / f"y_{layer}.safetensors"
        run_cli(cli, "forward", ck_path, layer, xin, yout, "--out-dtype", odt)
        with qlinear.Checkpoint(yout) as yck:
            y_cli = yck.tensor("y")
        lin = qlinear.Linear.from_checkpoint(ck_path, layer)
        assert lin.kind == ("dense" if layer == "blocks.0.odd" else "w8a8")
        y_py = lin.forward(x, out_dtype=odt)
        assert y_py.dtype == y_cli.dtype and y_py.shape == y_cli.shape
        assert y_py.tobytes() == y_cli.tobytes(), f"{layer} {xdt}->{odt}: differs from the CLI"


def _ref64(x, w, b=None):
    y = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    return y + b if b is not None else y


@pytest.mark.parametrize("fmt", ["int8-convrot", "int8"])
@pytest.mark.parametrize("xdt", ["fp32", "bf16", "fp16"])
def test_from_weight_vs_float64(rng, fmt, xdt):
    n, k = 80, 768
    w = make_weight(rng, n, k)
    b = rng.normal(0, 0.1, n).astype(np.float32)
    lin = qlinear.Linear.from_weight(w, format=fmt, bias=b)
    assert (lin.n, lin.k, lin.format, lin.kind) == (n, k, fmt, "w8a8")
    x32 = rng.normal(0, 1, (3, 5, k)).astype(np.float32)
    x = {"fp32": x32, "fp16": x32.astype(np.float16), "bf16": bf16_bits(x32)}[xdt]
    xf = {"fp32": x32, "fp16": x.astype(np.float32), "bf16": bf16_to_f32(x)}[xdt]
    y = lin(x)
    assert y.shape == (3, 5, n) and y.dtype == x.dtype
    yf = bf16_to_f32(y) if xdt == "bf16" else y.astype(np.float32)
    err = rel_l2(yf, _ref64(xf, w, b))
    print(f"{fmt} {xdt}: rel-L2 vs float64 {err:.4g}")
    assert 1e-4 < err < BOUND[fmt]  # quantized (not a float path by mistake), and within the bound
    if fmt == "int8":  # the rotation is what tames the outlier channels
        rot = qlinear.Linear.from_weight(w, format="int8-convrot", bias=b)(x)
        assert rel_l2(bf16_to_f32(rot) if xdt == "bf16" else rot.astype(np.float32), _ref64(xf, w, b)) < err


def test_kinds_and_dense(rng):
    n, k = 48, 256
    w = make_weight(rng, n, k)
    x = rng.normal(0, 1, (9, k)).astype(np.float32)
    ref = _ref64(x, w)
    ys = {kind: qlinear.Linear.from_weight(w, kind=kind)(x) for kind in ("w8a8", "weight-only", "dequant")}
    dense = qlinear.Linear.from_weight(w, format="float")(x)
    assert rel_l2(dense, ref) < 1e-6
    assert rel_l2(ys["w8a8"], ref) < BOUND["int8-convrot"]
    # weight-only keeps activations in float: smaller error than w8a8
    assert rel_l2(ys["weight-only"], ref) < rel_l2(ys["w8a8"], ref)
    assert rel_l2(ys["dequant"], ref) < BOUND["int8-convrot"]


def test_shapes_and_strides(rng):
    n, k = 40, 256
    lin = qlinear.Linear.from_weight(make_weight(rng, n, k))
    x = rng.normal(0, 1, (4, 6, k)).astype(np.float32)
    full = lin(x)
    # leading shapes and strided rows give the same rows as contiguous input
    np.testing.assert_array_equal(lin(x[:, ::2]), full[:, ::2])
    np.testing.assert_array_equal(lin(x[1]), full[1])
    np.testing.assert_array_equal(lin(x[2, 3]), full[2, 3])  # 1-D: one row
    assert lin(x[:, :0]).shape == (4, 0, n)  # M = 0
    assert lin(np.empty((0, k), np.float32)).shape == (0, n)
    big = np.zeros((5, 2 * k), np.float32)
    big[:, :k] = x[0, :5]
    np.testing.assert_array_equal(lin(big[:, :k]), full[0, :5])  # row stride 2K
    # thread count does not change results
    lin1 = qlinear.Linear.from_weight(make_weight(np.random.default_rng(1), n, k), threads=1)
    lin2 = qlinear.Linear.from_weight(make_weight(np.random.default_rng(1), n, k), threads=2)
    np.testing.assert_array_equal(lin1(x), lin2(x))


def test_nonfinite(rng):
    k = 256
    w = make_weight(rng, 8, k)
    lin = qlinear.Linear.from_weight(w)
    x = rng.normal(0, 1, (3, k)).astype(np.float32)
    x[1, 5] = np.nan
    y = lin(x)
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()
    w[2, 3] = np.inf
    with pytest.raises(qlinear.QlinearError, match="row 2") as e:
        qlinear.Linear.from_weight(w)
    assert e.value.status == "non-finite value"


def test_bad_input(rng, tmp_path):
    k = 256
    lin = qlinear.Linear.from_weight(make_weight(rng, 8, k))
    x = rng.normal(0, 1, (4, k)).astype(np.float32)
    with pytest.raises(TypeError, match="float64"):
        lin(x.astype(np.float64))
    with pytest.raises(TypeError, match="int8"):
        lin(x.astype(np.int8))
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        lin(x.tolist())
    with pytest.raises(TypeError, match="byte order"):
        lin(x.astype(">f4"))
    with pytest.raises(qlinear.QlinearError, match=r"last dimension must be K = 256"):
        lin(x[:, :255])
    with pytest.raises(qlinear.QlinearError, match="contiguous"):
        lin(np.asfortranarray(x))
    with pytest.raises(qlinear.QlinearError, match="not evenly spaced"):
        lin(np.zeros((3, 4, 2 * k), np.float32)[:, :, :k][:, ::1][:, :3])  # rows of two strides
    with pytest.raises(qlinear.QlinearError, match="scalar"):
        lin(np.array(1.0, np.float32))
    with pytest.raises(TypeError, match="out_dtype"):
        lin(x, out_dtype="int8")
    unaligned = np.zeros(4 * k + 2, np.uint8)[2:].view(np.float32).reshape(1, k)
    with pytest.raises(qlinear.QlinearError, match="aligned"):
        lin(unaligned)
    with pytest.raises(qlinear.QlinearError, match="K must be a multiple|multiple of"):
        qlinear.Linear.from_weight(make_weight(rng, 8, 100), format="int8-convrot")
    with pytest.raises(qlinear.QlinearError, match="format 'int4'"):
        qlinear.Linear.from_weight(make_weight(rng, 8, k), format="int4")
    with pytest.raises(qlinear.QlinearError, match="kind 'fast'"):
        qlinear.Linear.from_weight(make_weight(rng, 8, k), kind="fast")
    # files: missing, truncated, not safetensors; the message names the file
    with pytest.raises(qlinear.QlinearError, match="nope.safetensors"):
        qlinear.Checkpoint(tmp_path / "nope.safetensors")
    p = tmp_path / "t.safetensors"
    write_safetensors(p, {"a.weight": make_weight(rng, 8, k)})
    data = p.read_bytes()
    p.write_bytes(data[: len(data) - 10])
    with pytest.raises(qlinear.QlinearError, match="t.safetensors") as e:
        qlinear.Checkpoint(p)
    assert e.value.status == "format error"
    with pytest.raises(qlinear.QlinearError, match="format 'fp8'"):
        qlinear.quantize_file(p, tmp_path / "o.safetensors", format="fp8")
    with pytest.raises(qlinear.QlinearError, match="t.safetensors"):
        qlinear.quantize_file(p, tmp_path / "o.safetensors")
    assert not (tmp_path / "o.safetensors").exists()


def test_context_stream_pointer():
    """A CUDA stream handed to a context (an int, 0 the default stream)
    reaches the library as a pointer through either binding (cffi takes
    neither an int nor None for a void *); a CPU context only records it."""
    from qlinear._context import Context
    ctx = Context(1)
    for s in (7, 0, 0x7F00DEADBEE8, 0):
        ctx.use_stream(s)
        assert ctx.stream == s


def test_missing_library(tmp_path):
    """No library: a QlinearError that says how to build it or point at it."""
    code = ("import qlinear\n"
            "try:\n    qlinear.version()\nexcept qlinear.QlinearError as e:\n    print('ERR', e)\n")
    env = dict(os.environ, QLINEAR_LIBRARY=str(tmp_path / "libqlinear.so"), PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERR qlinear: cannot load libqlinear"), r.stdout
    assert "QLINEAR_LIBRARY" in r.stdout and "cmake" in r.stdout


def test_header_constants():
    """The enum values and limits the package uses are read from qlinear.h, and
    are the binding's own (cffi's or the ctypes one's)."""
    import qlinear._lib as L
    _, lib = L.load()
    names = [n for n in vars(L.C) if n.startswith("QL_")]
    assert {"QL_OK", "QL_ERR_FORMAT", "QL_F32", "QL_BF16", "QL_ISA_AUTO", "QL_LINEAR_W8A8", "QL_ACTIVATION_GELU",
            "QL_QUANT_INT8_CONVROT", "QL_SHARED_MAX", "QL_VERSION_MAJOR"} <= set(names)
    assert [(n, getattr(L.C, n)) for n in names] == [(n, getattr(lib, n)) for n in names]
    src = "typedef enum e {\n A,\n B = 0x5,\n C,\n D = B\n} e;\n#define QL_N 16\nint f(e x);"
    assert L.header_constants(src) == {"QL_N": 16, "A": 0, "B": 5, "C": 6, "D": 5}
    with pytest.raises(AttributeError, match="defines no constant QL_NOPE"):
        L.C.QL_NOPE


def test_missing_header(tmp_path):
    """No header where the binding looks: importing the package fails and says where to point it."""
    env = dict(os.environ, QLINEAR_HEADER=str(tmp_path / "qlinear.h"), PYTHONPATH=str(ROOT / "python"))
    r = subprocess.run([sys.executable, "-c", "import qlinear"], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    assert "QlinearError: qlinear: " in r.stderr and "header qlinear.h" in r.stderr, r.stderr
    assert "QLINEAR_HEADER=" in r.stderr


def test_ctypes_binding_without_cffi(tmp_path, rng):
    """Where cffi cannot be imported the package loads through ctypes and
    gives the same bits as this process's binding (cffi, or ctypes when the
    suite runs with QLINEAR_FFI=ctypes); the checkpoint API works there too."""
    w = make_weight(rng, 40, 512)
    x = rng.standard_normal((7, 512)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    np.save(tmp_path / "w.npy", w), np.save(tmp_path / "x.npy", x), np.save(tmp_path / "b.npy", b)
    ck = tmp_path / "c.safetensors"
    write_safetensors(ck, {"l.weight": w, "l.bias": b})
    code = ("import sys; sys.modules['cffi'] = None\n"
            "import numpy as np, qlinear, qlinear._lib as L\n"
            f"d = {str(tmp_path)!r}\n"
            "w, x, b = (np.load(f'{d}/{n}.npy') for n in 'wxb')\n"
            "lin = qlinear.Linear.from_weight(w, bias=b)\n"
            "np.save(f'{d}/y.npy', lin.forward(x))\n"
            "qlinear.quantize_file(f'{d}/c.safetensors', f'{d}/q.safetensors')\n"
            "with qlinear.Checkpoint(f'{d}/q.safetensors') as ck:\n"
            "    print([(l.name, l.n, l.k) for l in ck.layers()], ck.tensor('l.weight').shape)\n"
            "    np.save(f'{d}/yc.npy', qlinear.Linear.from_checkpoint(ck, 'l').forward(x))\n"
            "print(L.ffi_name())\n")
    env = {k: v for k, v in os.environ.items() if k != "QLINEAR_FFI"}
    env["PYTHONPATH"] = str(ROOT / "python")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[('l', 40, 512)] (40, 512)", "ctypes"], r.stdout
    here = qlinear.Linear.from_weight(w, bias=b).forward(x)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy").view(np.uint32), here.view(np.uint32))
    np.testing.assert_array_equal(np.load(tmp_path / "yc.npy").view(np.uint32), here.view(np.uint32))
