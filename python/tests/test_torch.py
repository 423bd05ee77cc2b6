"""qlinear.torch: QLinear against float64 of the unquantized nn.Linear,
quantize_module's selection, load_comfy round trips, threads, error cases."""
import math

import numpy as np
import pytest
import torch
from torch import nn

import qlinear
from qlinear.torch import QLinear, load_comfy, quantize_module
from conftest import rel_l2, run_cli, write_safetensors

BOUND = 2e-2  # W8A8 ConvRot vs float64 (docs/NUMERICS.md; measured ~1.1e-2 on this data)


def make_linear(gen, k, n, bias=True, dtype=torch.float32):
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0.0, 0.02, generator=gen)
        lin.weight[:, torch.randperm(k, generator=gen)[:4]] *= 10.0  # outlier input channels
        if bias:
            lin.bias.normal_(0.0, 0.1, generator=gen)
    return lin.to(dtype)


@pytest.fixture
def gen(rng):
    g = torch.Generator()
    g.manual_seed(int(rng.integers(1 << 62)))
    return g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_qlinear_vs_float64(gen, dtype):
    ref_lin = make_linear(gen, 1024, 192, dtype=dtype)  # weights read in their dtype
    q = QLinear.from_linear(ref_lin)
    x = torch.randn(2, 9, 1024, generator=gen).to(dtype)  # [B, T, K]
    with torch.no_grad():
        y = q(x)
        ref = x.double() @ ref_lin.weight.double().T + ref_lin.bias.double()
    assert y.dtype == dtype and y.shape == (2, 9, 192) and y.grad_fn is None
    err = rel_l2(y.double().numpy(), ref.numpy())
    print(f"{dtype}: rel-L2 vs float64 {err:.4g}")
    assert 1e-4 < err < BOUND
    # the same as the numpy API on the same weight (one library path)
    lin = qlinear.Linear.from_weight(ref_lin.weight.detach().to(dtype), bias=ref_lin.bias.detach().to(dtype))
    assert torch.equal(lin(x), y)


def test_qlinear_strided_and_edges(gen):
    q = QLinear.from_linear(make_linear(gen, 512, 64))
    x = torch.randn(3, 8, 512, generator=gen)
    full = q(x)
    assert torch.equal(q(x[:, ::2]), full[:, ::2])  # strided rows are read in place
    with pytest.raises(qlinear.QlinearError, match="not evenly spaced"):
        q(x[:, ::3])  # rows no single stride reaches
    assert torch.equal(q(x[1, 2]), full[1, 2])  # 1-D input
    assert q(x[:, :0]).shape == (3, 0, 64)  # M = 0
    wide = torch.zeros(4, 1024)
    wide[:, :512] = x[0, :4]
    assert torch.equal(q(wide[:, :512]), full[0, :4])
    # the module is usable under autograd mode; outputs carry no history
    y = q(x.requires_grad_())
    assert not y.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fast_path_equals_general_path(gen, dtype):
    """The per-call fast path (contiguous input, output in its dtype) and the
    general one (strided rows, a tensor subclass, an explicit out_dtype) give
    the same bits, through QLinear and qlinear.Linear, torch and numpy."""
    q = QLinear.from_linear(make_linear(gen, 512, 96))
    x = torch.randn(2, 5, 512, generator=gen).to(dtype)
    fast = q(x)
    pad = torch.zeros(2, 5, 768, dtype=dtype)
    pad[..., :512] = x
    assert torch.equal(q(pad[..., :512]), fast)  # rows at a stride of 768
    assert torch.equal(q(nn.Parameter(x, requires_grad=False)), fast)  # a subclass of Tensor
    assert torch.equal(q.linear.forward(x), fast)
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    assert torch.equal(q.linear.forward(x, out_dtype=name), fast)
    assert torch.equal(q(x.reshape(10, 512)), fast.reshape(10, 96))
    xn = x.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else x.numpy()
    want = fast.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else fast.numpy()
    assert np.array_equal(q.linear.forward(xn), want)
    ro = xn.copy()
    ro.setflags(write=False)  # read-only arrays are read in place too
    assert np.array_equal(q.linear.forward(ro), want)
    assert np.array_equal(q.linear.forward(xn, out_dtype=name), want)
    assert np.array_equal(q.linear.forward(np.pad(xn, ((0, 0), (0, 0), (0, 256)))[..., :512]), want)  # strided rows
    assert q.linear.forward(xn[:0]).shape == (0, 5, 96)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_out_buffer(gen, dtype):
    """out=: the same bits written into a given buffer (fast and general path,
    torch and numpy, strided rows), the buffer returned; a wrong shape, dtype,
    kind or an overlap with x is an error, never a silent copy."""
    q = QLinear.from_linear(make_linear(gen, 512, 96))
    x = torch.randn(3, 512, generator=gen).to(dtype)
    want = q(x)
    out = torch.full((3, 96), float("nan"), dtype=dtype)
    assert q(x, out=out) is out and torch.equal(out, want)
    out.fill_(7)
    assert q.linear.forward(x, out=out) is out and torch.equal(out, want)
    wide = torch.zeros(3, 160, dtype=dtype)  # rows at a stride of 160: the general path
    assert torch.equal(q(x, out=wide[:, :96]), want) and torch.equal(wide[:, 96:], torch.zeros(3, 64, dtype=dtype))
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    if dtype != torch.bfloat16:
        yn = np.empty((3, 96), x.numpy().dtype)
        assert q.linear.forward(x.numpy(), out=yn) is yn and np.array_equal(yn, want.numpy())
    yf = torch.empty(3, 96)  # another output dtype through out_dtype
    assert torch.equal(q.linear.forward(x, out_dtype="fp32", out=yf), q.linear.forward(x, out_dtype="fp32"))
    with pytest.raises(qlinear.QlinearError, match="out has shape"):
        q(x, out=torch.empty(3, 95, dtype=dtype))
    other = torch.float16 if dtype != torch.float16 else torch.float32
    with pytest.raises(qlinear.QlinearError, match="is not out_dtype"):
        q.linear.forward(x, out_dtype=name, out=torch.empty(3, 96, dtype=other))
    with pytest.raises(TypeError):
        q(x, out=np.empty((3, 96), np.float32))
    buf = torch.zeros(3, 512 + 96, dtype=dtype)
    buf[:, :512] = x
    with pytest.raises(qlinear.QlinearError, match="overlaps x"):
        q(buf[:, :512], out=buf[:, 416:512])
    same = torch.zeros(1, 512, dtype=dtype)
    q96 = QLinear.from_linear(make_linear(gen, 512, 512))
    with pytest.raises(qlinear.QlinearError, match="overlaps x"):
        q96(same, out=same)  # contiguous, fast-path shape: still refused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gated_residual(gen, dtype):
    """residual=, residual_scale=: residual + scale ⊙ y in the layer's epilogue.
    fp32: the same bits as PyTorch's `r + g * y` (one product, one sum, each
    rounded); 16-bit outputs: float64 of r + g·y rounded once to the dtype
    (within one unit in the last place). In place (out=residual) gives the same;
    mismatched pieces are refused with a message."""
    q = QLinear.from_linear(make_linear(gen, 512, 96))
    x = torch.randn(2, 3, 512, generator=gen).to(dtype)
    r = torch.randn(2, 3, 96, generator=gen).to(dtype)
    g = torch.randn(1, 1, 3 * 96, generator=gen).to(dtype).chunk(3, dim=-1)[1]  # a strided view, as adaLN's gate
    y = q(x)
    z = q(x, residual=r, residual_scale=g)
    if dtype == torch.float32:
        assert torch.equal(z, r + g * y)
    else:
        want = (r.double() + g.double() * y.double()).to(dtype).double()
        ulp = want.abs().clamp_min(1e-30) * (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10)
        assert ((z.double() - want).abs() <= ulp).all()
    inplace = r.clone()
    assert q(x, out=inplace, residual=inplace, residual_scale=g) is inplace and torch.equal(inplace, z)
    if dtype == torch.float32:
        zn = q.linear.forward(x.numpy(), residual=r.numpy(), residual_scale=g.numpy())
        assert np.array_equal(zn, z.numpy())
    with pytest.raises(qlinear.QlinearError, match="go together"):
        q(x, residual=r)
    with pytest.raises(qlinear.QlinearError, match="residual has shape"):
        q(x, residual=r[:, :2], residual_scale=g)
    with pytest.raises(qlinear.QlinearError, match="residual_scale has shape"):
        q(x, residual=r, residual_scale=torch.ones(96, 2, dtype=dtype)[:, 0])
    other = torch.float16 if dtype != torch.float16 else torch.float32
    with pytest.raises(qlinear.QlinearError, match="not the output dtype"):
        q(x, residual=r.to(other), residual_scale=g)
    with pytest.raises(qlinear.QlinearError, match="overlaps residual_scale"):
        buf = r.clone().view(-1)
        q(x[:1, :1], out=buf[:96].view(1, 1, 96), residual=r[:1, :1], residual_scale=buf[:96])
    with pytest.raises(qlinear.QlinearError, match="without being it"):
        big = torch.zeros(7, 96, dtype=dtype)
        q(x.view(6, 512), out=big[1:], residual=big[:6], residual_scale=g)
    with pytest.raises(TypeError):
        q(x, residual=r.numpy() if dtype == torch.float32 else [1.0], residual_scale=g)


def test_threads_follow_torch(gen):
    q = QLinear.from_linear(make_linear(gen, 512, 256))
    x = torch.randn(64, 512, generator=gen)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        y1 = q(x)
        assert q.linear.threads == 1
        torch.set_num_threads(2)
        y2 = q(x)
        assert q.linear.threads == 2
        assert torch.equal(y1, y2)
    finally:
        torch.set_num_threads(before)
    fixed = QLinear.from_linear(make_linear(gen, 512, 256), threads=1)
    fixed(x)
    assert fixed.linear.threads == 1


class Block(nn.Module):
    def __init__(self, gen):
        super().__init__()
        self.norm = nn.LayerNorm(512)
        self.q = make_linear(gen, 512, 512)
        self.small = make_linear(gen, 100, 512)  # K not a multiple of 256
        self.mlp = nn.Sequential(make_linear(gen, 512, 1024, bias=False), nn.GELU(), make_linear(gen, 1024, 512))
        self.conv = nn.Conv1d(4, 4, 3)

    def forward(self, x):
        h = self.q(self.norm(x))
        return x + self.mlp(h)


class Net(nn.Module):
    def __init__(self, gen):
        super().__init__()
        self.blocks = nn.ModuleList([Block(gen), Block(gen)])
        self.head = make_linear(gen, 512, 10)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def test_quantize_module_selection(gen):
    net = Net(gen)
    x = torch.randn(5, 512, generator=gen)
    with torch.no_grad():
        ref = net.double()(x.double())
        net.float()
    rep = quantize_module(net)
    eligible = {f"blocks.{i}.{m}" for i in range(2) for m in ("q", "mlp.0", "mlp.2")} | {"head"}
    assert set(rep.swapped) == eligible
    assert {n for n, _ in rep.skipped} == {"blocks.0.small", "blocks.1.small"}
    for name, mod in net.named_modules():
        if name in eligible:
            assert isinstance(mod, QLinear), name
        elif name.endswith("small"):
            assert type(mod) is nn.Linear
    assert isinstance(net.blocks[0].conv, nn.Conv1d)
    with torch.no_grad():
        assert rel_l2(net(x).double().numpy(), ref.numpy()) < 2 * BOUND
    # include / exclude
    net2 = Net(gen)
    rep2 = quantize_module(net2, include=r"^blocks\.1\.", exclude=r"mlp\.2$")
    assert set(rep2.swapped) == {"blocks.1.q", "blocks.1.mlp.0"}
    assert ("blocks.1.mlp.2", "excluded by 'mlp\\\\.2$'") in rep2.skipped
    assert type(net2.head) is nn.Linear and type(net2.blocks[0].q) is nn.Linear
    # plain int8 takes any K
    net3 = Net(gen)
    assert len(quantize_module(net3, format="int8").swapped) == 9
    assert "swapped 9 linear layers" in repr(quantize_module(Net(gen), format="int8"))


def test_load_comfy_round_trip(tmp_path, gen, cli):
    """A state dict saved as safetensors, quantized by `qlinear quantize`,
    loaded into a fresh model: the same outputs, bit for bit, as quantizing
    the original model in memory."""
    net = Net(gen)
    prefix = "model.diffusion_model."
    sd = {prefix + k: v.detach().numpy() for k, v in net.state_dict().items()}
    write_safetensors(tmp_path / "float.safetensors", sd)
    run_cli(cli, "quantize", tmp_path / "float.safetensors", tmp_path / "int8.safetensors", "--format",
            "int8-convrot")
    fresh = Net(gen)  # other random weights
    rep = load_comfy(fresh, tmp_path / "int8.safetensors")
    eligible = {f"blocks.{i}.{m}" for i in range(2) for m in ("q", "mlp.0", "mlp.2")} | {"head"}
    assert set(rep.swapped) == eligible
    assert set(rep.swapped) == {n for n, m in fresh.named_modules() if isinstance(m, QLinear)}
    # float tensors (norms, the K=100 linears, conv) come from the file
    assert "blocks.0.norm.weight" in rep.loaded and "blocks.1.small.weight" in rep.loaded
    assert torch.equal(fresh.blocks[1].norm.weight, net.blocks[1].norm.weight)
    assert torch.equal(fresh.blocks[0].small.weight, net.blocks[0].small.weight)
    assert not rep.skipped and not rep.unused
    quantize_module(net)
    x = torch.randn(7, 512, generator=gen)
    with torch.no_grad():
        assert torch.equal(fresh(x), net(x))
    # a model whose shapes differ: a clear error
    other = Net(gen)
    other.blocks[0].q = nn.Linear(512, 256)
    with pytest.raises(qlinear.QlinearError, match=r"blocks.0.q' is 512x512 but the model's 'blocks.0.q' is 256x512"):
        load_comfy(other, tmp_path / "int8.safetensors")


def test_bad_input_torch(gen):
    q = QLinear.from_linear(make_linear(gen, 256, 16))
    x = torch.randn(4, 256, generator=gen)
    model = nn.Sequential(q, nn.Linear(16, 8))
    assert model.to(torch.bfloat16) is model and model.cpu() is model  # no move: allowed (any input dtype)
    with pytest.raises(qlinear.QlinearError, match="a QLinear on cpu cannot move to meta"):
        model.to("meta")  # a device move is refused at once, not at the first forward
    with pytest.raises(qlinear.QlinearError, match="is on meta but the layer is on cpu"):
        q(torch.empty(4, 256, device="meta"))  # the same check refuses CUDA tensors on a CPU layer
    with pytest.raises(TypeError, match="float64"):
        q(x.double())
    with pytest.raises(TypeError, match="int32"):
        q(x.int())
    with pytest.raises(TypeError, match="torch tensor"):
        q(x.numpy())
    with pytest.raises(qlinear.QlinearError, match="contiguous"):
        q(torch.randn(256, 4).T)
    with pytest.raises(qlinear.QlinearError, match="K = 256"):
        q(x[:, :128])
    with pytest.raises(TypeError, match="nn.Linear"):
        QLinear.from_linear(nn.Conv1d(2, 2, 1))
    with pytest.raises(qlinear.QlinearError, match="multiple"):
        QLinear.from_linear(nn.Linear(100, 4))


def _gelu64(y):
    """float64 x·Φ(x) = x·erfc(-x/√2)/2 (torch.nn.GELU()'s definition)."""
    y = y.double()
    return y * 0.5 * torch.special.erfc(-y / 2 ** 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gelu_activation(gen, dtype):
    """activation="gelu": gelu(x·Wᵀ + b) in the epilogue, on the layer's own
    pre-activation output: fp32 within 6 ulps of float64 (the library's
    bound), 16-bit outputs within one unit of the dtype of float64 rounded,
    and equal to PyTorch's GELU up to that GELU's own fp32 error; the fused
    residual applies after it; fast, general and module paths agree."""
    lin = make_linear(gen, 512, 200, dtype=dtype)
    q = QLinear.from_linear(lin, activation="gelu")
    assert q.activation == "gelu" and "activation=gelu" in repr(q)
    x = (3 * torch.randn(3, 7, 512, generator=gen)).to(dtype)
    pre = q.linear(x)
    y = q(x)
    assert y.dtype == dtype and y.shape == pre.shape
    ref = _gelu64(pre)
    if dtype == torch.float32:
        # 6 fp32 ulps of ref (the spacing at |ref|, as NUMERICS §5 and test_gelu.c count them)
        _, e = torch.frexp(ref.abs())
        tol = 6 * torch.ldexp(torch.ones_like(ref), (e - 24).clamp_min(-149)) + 1e-44
        assert ((y.double() - ref).abs() <= tol).all()
        # PyTorch's own fp32 GELU is the looser one: up to 1.2e-6 absolute (torch 2.15's
        # vectorized erf near |x| = 3.4, measured on a 2e6-point grid against float64)
        t = nn.GELU()(pre).double()
        assert ((y.double() - t).abs() <= 4 * torch.finfo(torch.float32).eps * t.abs() + 2e-6).all()
    else:
        step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
        want = ref.to(dtype).double()
        assert ((y.double() - want).abs() <= want.abs().clamp_min(1e-30) * step).all()
        # PyTorch's 16-bit GELU (fp16: through fp32, torch 1.13 has none on the CPU): within a
        # unit, or its erf's ~1e-7 absolute error in the tail
        t = nn.GELU()(pre if dtype == torch.bfloat16 else pre.float()).to(dtype)
        assert ((y.double() - t.double()).abs() <= t.double().abs() * step + 2e-6).all()
        print(f"{dtype}: {(y == t).double().mean():.4f} of the outputs equal PyTorch's GELU")
    assert torch.equal(q.linear.forward(x, activation="gelu"), y)
    assert torch.equal(torch.from_numpy(q.linear.forward(x.float().numpy(), activation="gelu")),
                       q.linear.forward(x.float(), activation="gelu"))
    buf = torch.empty_like(y)
    assert q(x, out=buf) is buf and torch.equal(buf, y)
    assert torch.equal(q(x[:, :3].contiguous()), y[:, :3])  # another shape through the fast path
    r = torch.randn(y.shape, generator=gen).to(dtype)
    g = torch.randn(200, generator=gen).to(dtype)
    z = q(x, residual=r, residual_scale=g)
    if dtype == torch.float32:
        assert torch.equal(z, r + g * y)
    with pytest.raises(qlinear.QlinearError, match="activation 'relu'"):
        q.linear.forward(x, activation="relu")


def test_quantize_module_fuse_gelu(gen):
    """fuse_gelu=True: each swapped Linear directly followed by nn.GELU() in
    an nn.Sequential takes the GELU over; the model's output stays that of
    the unfused quantized model up to GELU rounding differences."""
    net = Net(gen)
    x = torch.randn(5, 512, generator=gen)
    with torch.no_grad():
        ref = net.double()(x.double())
        net.float()
    plain = Net(gen)
    plain.load_state_dict(net.state_dict())
    quantize_module(plain)
    rep = quantize_module(net, fuse_gelu=True)
    assert set(rep.fused) == {"blocks.0.mlp.0", "blocks.1.mlp.0"} and "2 with their GELU fused" in repr(rep)
    for i in range(2):
        assert net.blocks[i].mlp[0].activation == "gelu" and type(net.blocks[i].mlp[1]) is nn.Identity
        assert plain.blocks[i].mlp[0].activation is None and type(plain.blocks[i].mlp[1]) is nn.GELU
    with torch.no_grad():
        # the fused layer alone: the unfused layer's output through GELU,
        # within the library GELU's accuracy (<= 5.8 ulp, test_gelu) of float64
        h = torch.randn(7, 512, generator=gen)
        yf = net.blocks[0].mlp[0](h).double().numpy()
        yu = plain.blocks[0].mlp[0](h).double().numpy()
        g = yu * 0.5 * np.vectorize(math.erfc)(-yu / math.sqrt(2.0))
        tol = 8 * np.spacing(np.abs(g).astype(np.float32)).astype(np.float64)
        assert np.all(np.abs(yf - g) <= tol), float(np.max(np.abs(yf - g) / tol))
        y, yp = net(x), plain(x)
    # Whole model: a GELU rounding that differs from PyTorch's can move an
    # activation code of the next layer by one step, so the two models differ
    # by part of the quantization noise (measured up to 3.7e-3 over 100 seeds; without the
    # fused GELU they would differ by O(1)); both stay within the bound.
    assert rel_l2(y.double().numpy(), yp.double().numpy()) < BOUND / 2
    assert rel_l2(y.double().numpy(), ref.numpy()) < 2 * BOUND


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_shared(gen, dtype):
    """forward_shared: q, k, v on one input through ql_linear_forward_shared,
    each output the same bits as the layer's own call; layers that do not
    match (another K, a GELU layer, an nn.Linear, a hook) run one by one, with
    the same results as calling them."""
    from qlinear.torch import forward_shared
    qs = [QLinear.from_linear(make_linear(gen, 512, n, dtype=dtype)) for n in (96, 512, 17)]
    x = (torch.randn(3, 41, 512, generator=gen) * 2).to(dtype)
    with torch.no_grad():
        want = [q(x) for q in qs]
        got = forward_shared(qs, x)
        assert len(got) == 3
        bits = torch.int16 if dtype != torch.float32 else torch.int32
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == dtype and torch.equal(g.view(bits), w.view(bits))
        assert [t.shape for t in forward_shared(qs, x[:0])] == [(0, 41, n) for n in (96, 512, 17)]
        other = QLinear.from_linear(make_linear(gen, 256, 8, dtype=dtype))
        gelu = QLinear.from_linear(make_linear(gen, 512, 8, dtype=dtype), activation="gelu")
        dense = make_linear(gen, 512, 8, dtype=dtype)
        for group in ([qs[0], gelu], [qs[0], dense]):
            assert all(torch.equal(g, layer(x)) for g, layer in zip(forward_shared(group, x), group))
        calls = []
        h = qs[1].register_forward_hook(lambda *a: calls.append(1))
        forward_shared(qs, x)
        h.remove()
        assert calls == [1]  # a hooked layer goes through its module
        with pytest.raises(qlinear.QlinearError, match="K = 256"):
            forward_shared([qs[0], other], x)  # a K = 256 layer on a K = 512 input: its own call refuses it
