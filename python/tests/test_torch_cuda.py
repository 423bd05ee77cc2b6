"""qlinear.torch on a GPU (the CUDA backend through PyTorch): every output
bit-identical to the same layer on the CPU (itself tested against float64 and
the reference quantizer), on torch's current stream; errors for tensors on the
wrong device, numpy inputs, and what the GPU does not run. Skipped without a
CUDA device; without one, asking for it is a clear error."""
import pytest
import torch
from torch import nn

import qlinear
from qlinear.torch import QLinear, quantize_module
from test_torch import gen, make_linear  # noqa: F401  (gen is a fixture)


def _devices():
    _, lib = qlinear._lib.load()
    return lib.ql_cuda_device_count() if torch.cuda.is_available() else 0


cuda = pytest.mark.skipif(_devices() == 0, reason="skipped: no CUDA device (torch or libqlinear)")


@pytest.fixture(autouse=True)
def _exact_prologue(monkeypatch):
    """Bit for bit needs the prologue that rotates in the CPU's order
    (test_cuda holds the tensor-core rotation to issue #25's rule)."""
    monkeypatch.setenv("QLINEAR_CUDA_PROLOGUE", "exact")


@pytest.mark.skipif(_devices() > 0, reason="a CUDA device is present")
def test_no_device_is_an_error():
    with pytest.raises(qlinear.QlinearError, match="CUDA"):
        QLinear.from_linear(nn.Linear(256, 16), device="cuda")


def _bits(t):
    return t.cpu().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same(got, want):
    """Bit for bit, any NaN equal to any NaN (as test_cuda: payloads are not part of the contract)."""
    g, w = got.cpu(), want.cpu()
    return g.shape == w.shape and bool(((_bits(g) == _bits(w)) | (torch.isnan(g.float()) & torch.isnan(w.float()))).all())


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 512), (3, 77, 512), (513, 512)])
def test_cuda_equals_cpu(gen, dtype, shape):
    lin = make_linear(gen, 512, 96, dtype=dtype)
    cpu, gpu = QLinear.from_linear(lin), QLinear.from_linear(lin.cuda())
    assert gpu.linear.device == "cuda:0" and cpu.linear.device == "cpu"
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    with torch.no_grad():
        want, got = cpu(x), gpu(x.cuda())
    assert got.device.type == "cuda" and got.dtype == dtype and got.shape == want.shape
    assert _same(got, want)
    # rows at a stride (the general path) and a reused output buffer
    wide = (torch.randn(shape[0] if len(shape) == 2 else 5, 640, generator=gen)).to(dtype)
    xs = wide[:, :512]
    out = torch.empty(xs.shape[0], 96, dtype=dtype, device="cuda")
    with torch.no_grad():
        got = gpu(wide.cuda()[:, :512], out=out)
        want = cpu(xs)
    assert got is out and _same(out, want)


@cuda
def test_cuda_residual_stream_and_nonfinite(gen):
    lin = make_linear(gen, 1024, 256, dtype=torch.bfloat16)
    cpu, gpu = QLinear.from_linear(lin), QLinear.from_linear(lin, device="cuda")
    h = torch.randn(2, 33, 1024, generator=gen).bfloat16()
    h[1, 3, 7] = float("nan")  # a non-finite row: NaN out, the others untouched
    res = torch.randn(2, 33, 256, generator=gen).bfloat16()
    gate = torch.randn(1, 1, 256, generator=gen).bfloat16()
    s = torch.cuda.Stream()
    with torch.no_grad():
        want = cpu(h, residual=res, residual_scale=gate)
        with torch.cuda.stream(s):  # queued on torch's current stream, behind the copies
            hg, rg, gg = h.cuda(), res.cuda(), gate.cuda()
            got = gpu(hg, residual=rg, residual_scale=gg)
            plain = gpu(hg)
        s.synchronize()
    assert _same(got, want)
    assert _same(plain, cpu(h))
    assert torch.isnan(plain[1, 3].float()).all() and not torch.isnan(plain[0].float()).any()


@cuda
def test_cuda_two_streams(gen):
    """Layers of one device share the context's activation workspace: calls
    from two streams, queued back to back, must not overlap on it."""
    lins = [make_linear(gen, 2048, 2048 + 512 * i, dtype=torch.bfloat16) for i in range(2)]
    cpu = [QLinear.from_linear(l) for l in lins]
    gpu = [QLinear.from_linear(l, device="cuda") for l in lins]
    xs = [torch.randn(4096, 2048, generator=gen).bfloat16() for _ in range(2)]
    xg = [x.cuda() for x in xs]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    with torch.no_grad():
        for r in range(3):
            for i in range(2):
                with torch.cuda.stream(streams[i]):
                    outs.append(gpu[i](xg[i]))
    torch.cuda.synchronize()
    with torch.no_grad():
        want = [cpu[i](xs[i]) for i in range(2)]
    for j, y in enumerate(outs):
        assert _same(y, want[j % 2])


@cuda
def test_cuda_quantize_module(gen):
    model = nn.Sequential(make_linear(gen, 512, 768), make_linear(gen, 768, 256, bias=False)).bfloat16()
    ref = nn.Sequential(*(nn.Linear(m.in_features, m.out_features, bias=m.bias is not None) for m in model))
    ref.load_state_dict(model.state_dict())
    model.cuda()
    rep = quantize_module(model, format="int8")
    assert rep.swapped == ["0", "1"] and all(m.linear.device == "cuda:0" for m in model)
    quantize_module(ref.bfloat16(), format="int8")
    x = torch.randn(4, 10, 512, generator=gen).bfloat16()
    with torch.no_grad():
        assert _same(model(x.cuda()), ref(x))
    rep = quantize_module(nn.Sequential(make_linear(gen, 256, 8)).cuda(), kind="weight-only")
    assert rep.swapped == [] and "CPU only" in rep.skipped[0][1]


@cuda
def test_cuda_gelu_equals_cpu(gen):
    """The output GELU fused into the GPU's epilogue (bf16: its table; fp32:
    the function itself): bit-identical to the same layer with its GELU on
    the CPU, with the layer's bias, on values that reach GELU's tails
    (|y| > 16), tiny values and zero rows."""
    for dtype in (torch.bfloat16, torch.float32):
        lin = make_linear(gen, 512, 300, dtype=dtype)
        x = (torch.randn(37, 512, generator=gen) * 40).to(dtype)
        x[3] = 0
        x[5] *= 1e-6
        cpu = QLinear.from_linear(lin, activation="gelu")
        gpu = QLinear.from_linear(lin.cuda(), activation="gelu")
        with torch.no_grad():
            want, got = cpu(x), gpu(x.cuda())
        torch.cuda.synchronize()
        assert _same(got, want)
        assert want.abs().max() > 16 and (want < 0).any()


@cuda
def test_cuda_bad_input(gen):
    gpu = QLinear.from_linear(make_linear(gen, 256, 16), device="cuda")
    x = torch.randn(4, 256, generator=gen)
    with pytest.raises(qlinear.QlinearError, match="is on cpu but the layer is on cuda:0"):
        gpu(x)
    with pytest.raises(TypeError, match="numpy"):
        gpu.linear.forward(x.numpy())
    with pytest.raises(qlinear.QlinearError, match="is on cuda:0 but the layer is on cpu"):
        QLinear.from_linear(make_linear(gen, 256, 16))(x.cuda())
    with pytest.raises(qlinear.QlinearError):
        QLinear.from_linear(make_linear(gen, 256, 16), device="cuda", kind="weight-only")
    with pytest.raises(qlinear.QlinearError, match="K = 256"):
        gpu(x.cuda()[:, :128])
    model = nn.Sequential(gpu)
    assert model.cuda() is model and model.half() is model  # no move
    with pytest.raises(qlinear.QlinearError, match="QLinear on cuda:0 cannot move to cpu"):
        model.cpu()


@cuda
def test_cuda_forward_shared(gen):
    """q, k, v of one input on the GPU through one prologue
    (ql_linear_forward_shared): each output bit-identical to the same layer on
    the CPU; twice in a row, the second group reading the first's output (its
    prologue must wait for the first group's GEMMs), on a side stream."""
    from qlinear.torch import forward_shared
    lins = [make_linear(gen, 512, n, dtype=torch.bfloat16) for n in (512, 96, 1040)]
    cpu = [QLinear.from_linear(l) for l in lins]
    gpu = [QLinear.from_linear(l.cuda()) for l in lins]
    x = (torch.randn(2, 300, 512, generator=gen) * 3).to(torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(s):
        got = forward_shared(gpu, x.cuda())
        got2 = forward_shared(gpu, got[0])
    s.synchronize()
    with torch.no_grad():
        want = [q(x) for q in cpu]
        want2 = [q(want[0]) for q in cpu]
    assert all(_same(g, w) for g, w in zip(got + got2, want + want2))


@cuda
def test_cuda_graph_capture_after_eager_calls(gen):
    """Eager calls on a side stream, then a CUDA graph captured (on torch's own
    capture stream) and replayed: the change of stream must not make the
    capture wait on uncaptured work (CUDA invalidates such a capture); the
    replay's outputs are the CPU's. The whole-step e2e with --graphs does this."""
    from qlinear.torch import forward_shared
    lins = [make_linear(gen, 1024, n, dtype=torch.bfloat16) for n in (1024, 256)]
    cpu = [QLinear.from_linear(l) for l in lins]
    gpu = [QLinear.from_linear(l, device="cuda") for l in lins]
    x = torch.randn(300, 1024, generator=gen).bfloat16()
    xg = x.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        gpu[1](gpu[0](xg))
        forward_shared(gpu, xg)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        y = gpu[1](gpu[0](xg))
        ys = forward_shared(gpu, xg)
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        want = cpu[1](cpu[0](x))
        want_s = [q(x) for q in cpu]
    assert _same(y, want) and all(_same(a, b) for a, b in zip(ys, want_s))


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 5, 300])
def test_cuda_lora_equals_cpu(gen, dtype, m):
    """Linear.add_lora on a GPU layer (factors read on the host): the GPU's
    outputs equal the CPU layer's with the same LoRAs, bit for bit, and
    removing one restores the other's; GPU factors are refused."""
    lin = make_linear(gen, 512, 96, dtype=dtype)
    cpu, gpu = QLinear.from_linear(lin), QLinear.from_linear(lin.cuda())
    downs = [torch.randn(r, 512, generator=gen) * 0.05 for r in (8, 24)]
    ups = [torch.randn(96, r, generator=gen) * 0.05 for r in (8, 24)]
    ids = {}
    for layer in (cpu, gpu):
        ids[layer] = [layer.linear.add_lora(d, u, strength=s, alpha=4.0) for d, u, s in zip(downs, ups, (0.7, 1.3))]
    x = (torch.randn(m, 512, generator=gen) * 2).to(dtype)
    with torch.no_grad():
        assert _same(gpu(x.cuda()), cpu(x))
        for layer in (cpu, gpu):
            layer.linear.remove_lora(ids[layer][0])
        assert gpu.linear.lora_rank == 24
        assert _same(gpu(x.cuda()), cpu(x))
    with pytest.raises(qlinear.QlinearError, match="read on the host"):
        gpu.linear.add_lora(downs[0].cuda(), ups[0])
