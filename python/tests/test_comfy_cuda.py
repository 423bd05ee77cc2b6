"""qlinear.comfy on a GPU (QLINEAR_COMFY_CUDA=1): int8_linear on CUDA tensors
through qlinear's CUDA layers, against comfy-kitchen's eager backend on the
same GPU. Skipped without a GPU, or with a libqlinear built without CUDA."""
import os

import pytest

torch = pytest.importorskip("torch")
if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 7):
    pytest.skip(f"comfy-kitchen needs torch >= 2.7 (this is {torch.__version__})", allow_module_level=True)
pytest.importorskip("comfy_kitchen")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import qlinear.comfy as qc  # noqa: E402
from comfy_kitchen.registry import registry  # noqa: E402

from test_comfy import assert_matches_eager, call, int8_weight, selected  # noqa: E402


@pytest.fixture(autouse=True)
def _cuda_on(monkeypatch):
    # the prologue that rotates in the CPU's order, whose codes assert_matches_eager recomputes on the host
    # (test_cuda holds the tensor-core rotation, QLINEAR_CUDA_PROLOGUE=mma, to issue #25's rule)
    monkeypatch.setenv("QLINEAR_CUDA_PROLOGUE", "exact")
    old = os.environ.get("QLINEAR_COMFY_CUDA")
    os.environ["QLINEAR_COMFY_CUDA"] = "1"
    st = qc.register()
    if "cuda" not in st["devices"]:
        pytest.skip(f"qlinear serves no CUDA here: {st['cuda']}")
    yield
    if old is None:
        del os.environ["QLINEAR_COMFY_CUDA"]
    else:
        os.environ["QLINEAR_COMFY_CUDA"] = old
    qc.register()


@pytest.mark.parametrize("dtype", [torch.bfloat16])
@pytest.mark.parametrize("convrot", [False, True])
def test_int8_linear_cuda_matches_eager(dtype, convrot, gen):
    for m, k, n in ((1, 256, 64), (77, 1024, 130), (300, 2048, 512)):
        x = (torch.randn(m, k, generator=gen) * 3).to(dtype)
        q, s = int8_weight(n, k, gen)
        b = torch.randn(n, generator=gen).to(dtype)
        xd, qd, sd, bd = x.cuda(), q.cuda(), s.cuda(), b.cuda()
        kw = dict(x=xd, weight=qd, weight_scale=sd, bias=bd, out_dtype=dtype, convrot=convrot, convrot_groupsize=256)
        assert selected("int8_linear", **kw) == "qlinear"
        y, ref = call("qlinear", "int8_linear", **kw), call("eager", "int8_linear", **kw)
        assert y.device == xd.device
        assert_matches_eager(y.cpu(), ref.cpu(), x, q, s, 256 if convrot else 0, dtype, b)
        from qlinear.comfy import _ops
        assert _ops.CUDA_EPI_BIAS[0], "the library refused the per-call bias on CUDA (added in PyTorch instead)"


def test_cuda_declines_what_it_does_not_serve(gen):
    q, s = int8_weight(32, 256, gen)
    x = torch.randn(3, 256, generator=gen).cuda()
    kw = dict(x=x, weight=q, weight_scale=s)  # the weight on the host, x on the GPU
    assert not registry.validate_backend_for_call("qlinear", "int8_linear", kw).success
    assert not registry.validate_backend_for_call("qlinear", "quantize_int8_rowwise", dict(x=x)).success
    for dt in (torch.float16, torch.float32):  # bf16 activations only on the GPU
        qd, sd = q.cuda(), s.cuda()
        kw = dict(x=x.to(dt), weight=qd, weight_scale=sd)
        assert not registry.validate_backend_for_call("qlinear", "int8_linear", kw).success


def test_prologue_cache_qkv_cuda(gen):
    """q, k, v through qlinear's CUDA layers one by one on one x: the first
    quantizes x, the next two reuse the codes in the GPU workspace (the
    thread's prologue cache records 2 hits, 1 miss), every output with the
    bits of a forward without the cache; an in-place write to x misses."""
    from qlinear.comfy import _ops
    if not _ops.HAS_PROLOGUE_CACHE:
        pytest.skip("no prologue cache in this library")
    k = 512
    x = (torch.randn(300, k, generator=gen) * 2).to(torch.bfloat16).cuda()
    layers = [int8_weight(n, k, gen) for n in (256, 96, 1040)]
    kws = [dict(x=x, weight=q.cuda(), weight_scale=s.cuda(), out_dtype=torch.bfloat16, convrot=True,
                convrot_groupsize=256) for q, s in layers]
    want = []
    for kw in kws:
        _ops.prologue_cache_release()
        want.append(call("qlinear", "int8_linear", **kw))
    _ops.prologue_cache_release()
    h0, m0 = _ops.prologue_cache_stats()
    got = [call("qlinear", "int8_linear", **kw) for kw in kws]
    h1, m1 = _ops.prologue_cache_stats()
    assert (h1 - h0, m1 - m0) == (2, 1), f"q, k, v: {h1 - h0} hits, {m1 - m0} misses"
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    x.mul_(0.5)
    y = call("qlinear", "int8_linear", **kws[1])
    assert _ops.prologue_cache_stats() == (h1, m1 + 1)
    _ops.prologue_cache_release()
    assert torch.equal(y, call("qlinear", "int8_linear", **kws[1])) and not torch.equal(y, want[1])


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_int8_linear_cuda_residual_fused(out_dtype, gen, monkeypatch):
    """A pre-norm block's call on the GPU (residual + residual_scale ⊙ y in
    a 16-bit output dtype) is answered by the one-C-call path with the
    residual in the layer's epilogue, and equals the same call without it
    followed by comfy-kitchen's own apply_residual, bit for bit (the product
    of two 16-bit values is exact in fp32: the epilogue rounds as addcmul)."""
    from qlinear.comfy import _ops
    seen = []  # (a residual was passed, the one-C-call path answered)
    real = _ops._fast

    def spy(*a):
        y = real(*a)
        seen.append((len(a) > 7 and a[7] is not None, y is not None))
        return y
    monkeypatch.setattr(_ops, "_fast", spy)
    for m, k, n, act in ((1, 256, 64, None), (77, 1024, 130, "gelu_tanh"), (300, 2048, 512, None)):
        x = (torch.randn(m, k, generator=gen) * 2).to(torch.bfloat16).cuda()
        q, s = int8_weight(n, k, gen)
        kw = dict(x=x, weight=q.cuda(), weight_scale=s.cuda(), bias=torch.randn(n, generator=gen).to(out_dtype).cuda(),
                  out_dtype=out_dtype, convrot=True, convrot_groupsize=256, input_act=act)
        res = torch.randn(m, n, generator=gen).to(out_dtype).cuda()
        rs = torch.randn(n, generator=gen).to(out_dtype).cuda()
        seen.clear()
        y = call("qlinear", "int8_linear", **kw, residual=res, residual_scale=rs)
        assert seen == [(True, True)], f"M={m}: the residual call did not take the one-C-call path ({seen})"
        want = _ops._acts()[1](call("qlinear", "int8_linear", **kw), res, rs)
        assert y.dtype == out_dtype and torch.equal(y, want), f"M={m} act={act}: differs from the layer then addcmul"


@pytest.mark.parametrize("act", ["gelu_tanh", "swiglu", "rms_norm"])
@pytest.mark.parametrize("convrot", [False, True])
def test_int8_linear_cuda_input_act_fused(act, convrot, gen, monkeypatch):
    """input_act on CUDA runs in the layer's prologue (the library's fused
    activation: no PyTorch pass over x first) and matches comfy-kitchen's
    eager act-then-linear on the same GPU within comfy-kitchen's own
    tolerance for a fused input activation (relative Frobenius error < 5 %;
    qlinear's exp/tanh (act_math.h) and PyTorch's CUDA ones may differ in the last ulp, which moves
    an int8 code now and then)."""
    from qlinear.comfy import _ops
    if act not in _ops.FUSED_ACTS:
        pytest.skip(f"{act} is not fused by this library")
    fused, applied = [], []  # the library's fused call answered; PyTorch's activation ran first
    real_fast, real_fused, real_acts = _ops._fast, _ops._cuda_fused_act, _ops._acts

    def spy(real):
        def f(*a, **kw):
            y = real(*a, **kw)
            fused.append(y is not None)
            return y
        return f

    def acts():
        apply, residual = real_acts()

        def spy_apply(*a, **kw):
            applied.append(True)
            return apply(*a, **kw)
        return [spy_apply, residual]
    # the one-C-call path (_fast) or, where it declines, the general one (_cuda_fused_act)
    monkeypatch.setattr(_ops, "_fast", spy(real_fast))
    monkeypatch.setattr(_ops, "_cuda_fused_act", spy(real_fused))
    monkeypatch.setattr(_ops, "_acts", acts)
    dtype = torch.bfloat16
    width = 2 if act == "swiglu" else 1
    for m, k, n in ((1, 256, 64), (77, 1024, 130), (300, 2048, 512)):
        x = (torch.randn(m, width * k, generator=gen) * 2).to(dtype).cuda()
        x[m // 2, 3] = 40.0  # an outlier
        q, s = int8_weight(n, k, gen)
        w = (torch.rand(k, generator=gen) + 0.5).to(dtype).cuda() if act == "rms_norm" else None
        b = torch.randn(n, generator=gen).to(dtype).cuda()
        kw = dict(x=x, weight=q.cuda(), weight_scale=s.cuda(), bias=b, out_dtype=dtype, convrot=convrot,
                  convrot_groupsize=256, input_act=act, input_act_weight=w, input_act_eps=1e-6)
        assert selected("int8_linear", **kw) == "qlinear"
        fused.clear()
        y = call("qlinear", "int8_linear", **kw)
        assert fused and fused[-1] and not applied, f"{act}: the library did not fuse it ({fused}, {applied})"
        ref = call("eager", "int8_linear", **kw)
        assert y.shape == ref.shape and y.dtype == ref.dtype and y.device == x.device
        assert torch.isfinite(y).all()
        rel = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
        assert rel < 0.05, f"{act} M={m} K={k} N={n} convrot={convrot}: relative error {rel:.3e}"


@pytest.mark.parametrize("mode", ["codebook", "uniform", "6bit", "asym"])
@pytest.mark.parametrize("packed", [True, False])
def test_w4a8_linear_cuda_matches_eager(mode, packed, gen, monkeypatch):
    """w4a8_int8_linear on CUDA tensors through qlinear's CUDA layer (codes
    kept packed on the GPU, or decoded once to int8) against comfy-kitchen's
    eager on the same GPU: the int8 GEMM after a rotation under the rule of
    int8_linear; asymmetric layers (eager's float linear of the dequantized
    weight, dequantized once here by eager's own code on the GPU) bit for
    bit. Shapes: 1 row, a tail of M and N, K of several rotation groups."""
    from test_comfy import LUT, MODES, eager_w4a8
    from qlinear.comfy import _ops
    monkeypatch.setattr(_ops, "PACKED", [packed])
    dtype = torch.bfloat16
    g = 32 if mode == "6bit" else 16
    for m, k, n in ((1, 512, 64), (77, 1024, 130), (300, 768, 96)):
        w = torch.randn(n, k, generator=gen).to(dtype)
        kwq = dict(weight=w, group_size=g, convrot_groupsize=256, codebook_tensor=LUT if mode == "codebook" else None,
                   scale_search=mode == "6bit") | MODES[mode]
        qd, sr, sc, cr, cb = call("eager", "quantize_w4a8_int8_weight", **kwq)
        x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
        bias = torch.randn(n, generator=gen).to(dtype)
        cuda = [None if t is None else t.cuda() for t in (x, qd, sr, sc, cb, cr, bias)]
        kw = dict(x=cuda[0], qdata=cuda[1], s_rel=cuda[2], s_channel=cuda[3], codebook=cuda[4], correction=cuda[5],
                  bias=cuda[6], group_size=g, convrot_groupsize=256, out_dtype=dtype)
        assert selected("w4a8_int8_linear", **kw) == "qlinear"
        y, ref = call("qlinear", "w4a8_int8_linear", **kw), call("eager", "w4a8_int8_linear", **kw)
        assert y.device == kw["x"].device and y.shape == ref.shape and y.dtype == ref.dtype
        if mode == "asym":
            assert torch.equal(y, ref)
        else:
            grid = eager_w4a8._dequant_int4_grouped_to_int8(qd, sr, cb, g)
            assert_matches_eager(y.cpu(), ref.cpu(), x, grid, sc, 256, dtype, bias)
        if mode != "asym":  # served by qlinear's CUDA layer, not by a fallback
            e = _ops._wxa8_layer_cuda(kw["qdata"], kw["s_rel"], kw["s_channel"], kw["codebook"], g, 256)
            assert e.failed is None and e.layer.device == str(kw["x"].device)
            assert e.layer.kind == ("wxa8-packed" if packed else "w8a8")


def test_w4a8_linear_cuda_input_act_and_residual(gen):
    """The W4A8 CUDA path takes the same input activation (fused) and
    residual as int8_linear, within comfy-kitchen's tolerance for a fused
    input activation (relative Frobenius error < 5 %)."""
    from test_comfy import MODES
    dtype = torch.bfloat16
    n, k, m = 160, 512, 33
    w = torch.randn(n, k, generator=gen).to(dtype)
    qd, sr, sc, cr, cb = call("eager", "quantize_w4a8_int8_weight", weight=w, group_size=16, convrot_groupsize=256,
                              **MODES["uniform"])
    x = (torch.randn(m, 2 * k, generator=gen) * 2).to(dtype).cuda()
    res = torch.randn(m, n, generator=gen).to(dtype).cuda()
    rs = torch.rand(n, generator=gen).to(dtype).cuda()
    kw = dict(x=x, qdata=qd.cuda(), s_rel=sr.cuda(), s_channel=sc.cuda(), group_size=16, convrot_groupsize=256,
              out_dtype=dtype, input_act="swiglu", residual=res, residual_scale=rs)
    assert selected("w4a8_int8_linear", **kw) == "qlinear"
    y, ref = call("qlinear", "w4a8_int8_linear", **kw), call("eager", "w4a8_int8_linear", **kw)
    assert y.shape == ref.shape and torch.isfinite(y).all()
    rel = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 0.05, f"relative error {rel:.3e}"


def test_w4a8_cuda_declines_mixed_devices(gen):
    from test_comfy import MODES
    w = torch.randn(64, 256, generator=gen)
    qd, sr, sc, cr, cb = call("eager", "quantize_w4a8_int8_weight", weight=w, group_size=16, convrot_groupsize=256,
                              **MODES["uniform"])
    x = torch.randn(3, 256, generator=gen).to(torch.bfloat16).cuda()
    kw = dict(x=x, qdata=qd, s_rel=sr.cuda(), s_channel=sc.cuda(), group_size=16)  # codes on the host
    assert not registry.validate_backend_for_call("qlinear", "w4a8_int8_linear", kw).success
    kw = dict(x=x.float(), qdata=qd.cuda(), s_rel=sr.cuda(), s_channel=sc.cuda(), group_size=16)  # fp32 x on the GPU
    assert not registry.validate_backend_for_call("qlinear", "w4a8_int8_linear", kw).success
