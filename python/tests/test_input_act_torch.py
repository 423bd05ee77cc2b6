"""The C input activations (ql_epilogue.input_act) against PyTorch's CPU
F.gelu(approximate="tanh"), F.silu(gate) * up and F.rms_norm, and the whole
W8A8 linear against comfy-kitchen's eager int8_linear(input_act=...).

The activation rows are read through the public API: a dense fp32 layer
whose weight is the identity returns its activated input exactly (a chain
of fp32 FMAs adding exact zeros; only the sign of a zero is lost). The
bit-identical fractions are printed (pytest -s); the asserted floors hold on
x86-64 (docs/NUMERICS.md §11: rms_norm and, with 16-bit dtypes, swiglu are
bit for bit; gelu_tanh and fp32 silu differ where PyTorch's vectorized
tanhf / expf round differently from qlinear's own, act_math.h)."""
import platform

import pytest

torch = pytest.importorskip("torch", minversion="2.7")
F = torch.nn.functional

from qlinear import Linear  # noqa: E402
from qlinear._lib import C, load  # noqa: E402
from qlinear._linear import forward_int  # noqa: E402

CODES = {torch.float32: C.QL_F32, torch.float16: C.QL_F16, torch.bfloat16: C.QL_BF16}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
X86 = platform.machine().lower() in ("x86_64", "amd64")


def epilogue(act, w=None, eps=0.0, bias=None):
    ffi, _ = load()
    e = ffi.new("ql_epilogue *")
    e.input_act = act
    if w is not None:
        e.input_act_weight = ffi.cast("void *", w.data_ptr())
        e.input_act_weight_dtype = CODES[w.dtype]
    e.input_act_eps = eps
    if bias is not None:
        e.bias = ffi.cast("float *", bias.data_ptr())
    return e


def forward(lin, x, y, e):
    _, lib = load()
    st = forward_int()(lin._ptr, x.data_ptr(), CODES[x.dtype], x.shape[0], x.stride(0), y.data_ptr(), CODES[y.dtype],
                       y.stride(0), e)
    assert st == 0, load()[0].string(lib.ql_last_error()).decode()
    return y


def c_act(x, act, k, w=None, eps=0.0):
    lin = Linear.from_weight(torch.eye(k), format="float", kind="dense")
    return forward(lin, x, torch.empty(x.shape[0], k, dtype=x.dtype), epilogue(act, w, eps))


def identical(a, b):
    a, b = a.float(), b.float()
    return ((a == b) | (a.isnan() & b.isnan())).float().mean().item()


@pytest.fixture
def gen(rng):
    g = torch.Generator()
    g.manual_seed(int(rng.integers(1 << 62)))
    return g


@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_rows_vs_torch(gen, dtype):
    k = 1024
    x = (torch.randn(256, k, generator=gen) * 3).to(dtype)
    gelu = identical(c_act(x, C.QL_INPUT_ACT_GELU_TANH, k), F.gelu(x, approximate="tanh"))
    x2 = (torch.randn(256, 2 * k, generator=gen) * 2).to(dtype)
    gate, up = x2.chunk(2, dim=-1)
    swiglu = identical(c_act(x2, C.QL_INPUT_ACT_SWIGLU, k), F.silu(gate).mul_(up))
    rms = []
    for kk, eps in ((1024, 0.0), (3072, 1e-6), (77, 1e-5), (5, 0.0)):
        xr = (torch.randn(128, kk, generator=gen) * torch.rand(128, 1, generator=gen) * 10).to(dtype)
        w = (1 + 0.3 * torch.randn(kk, generator=gen)).to(torch.bfloat16)
        rms.append(identical(c_act(xr, C.QL_INPUT_ACT_RMS_NORM, kk, w, eps),
                             F.rms_norm(xr, (kk,), weight=w.to(dtype), eps=eps)))
    print(f"{dtype}: bit-identical to torch: gelu_tanh {gelu:.4f}, swiglu {swiglu:.4f}, rms_norm {min(rms):.4f}")
    if X86:  # PyTorch's summation order reproduced is its x86-64 one (8 fp32 lanes)
        assert min(rms) == 1.0
    assert gelu > (0.99 if dtype != torch.float32 else 0.85)
    assert swiglu > (0.999 if dtype != torch.float32 else 0.9)


@pytest.mark.parametrize("dtype", DTYPES)
def test_activation_special_values(dtype):
    """±Inf, NaN, ±0, huge and tiny values, one per row (K = 1)."""
    v = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e30, -1e30, 1e-30, -1e-30, 3.0, -10.0,
                      -90.0]).to(dtype)
    x = v.reshape(-1, 1).contiguous()
    assert identical(c_act(x, C.QL_INPUT_ACT_GELU_TANH, 1), F.gelu(x, approximate="tanh")) == 1.0
    x2 = torch.stack([v, torch.full_like(v, 2.0)], dim=1).contiguous()  # gate | up
    t = F.silu(x2[:, :1]).mul_(x2[:, 1:])
    assert identical(c_act(x2, C.QL_INPUT_ACT_SWIGLU, 1), t) == 1.0
    w = torch.tensor([1.5], dtype=dtype)
    for eps in (0.0, 1e-6):  # a zero row with eps 0 is NaN in both
        assert identical(c_act(x, C.QL_INPUT_ACT_RMS_NORM, 1, w, eps), F.rms_norm(x, (1,), weight=w, eps=eps)) == 1.0


def test_int8_linear_vs_comfy_kitchen(gen):
    """ql_linear_forward with input_act and a per-call bias against eager
    int8_linear (no rotation: eager rotates by a matmul, §2)."""
    eager = pytest.importorskip("comfy_kitchen.backends.eager.quantization")
    k, n, m = 512, 96, 40
    w = torch.randn(n, k, generator=gen) * 0.02
    q, s = eager.quantize_int8_rowwise(w)
    ffi, _ = load()
    desc = ffi.new("ql_linear_desc *")
    desc.kind = C.QL_LINEAR_W8A8
    qc, sc = q.contiguous(), s.reshape(-1).contiguous()
    desc.int8.n, desc.int8.k, desc.int8.ldq, desc.int8.n_scale = n, k, k, n
    desc.int8.q, desc.int8.scale = ffi.cast("int8_t *", qc.data_ptr()), ffi.cast("float *", sc.data_ptr())
    lin = Linear._create(desc, None, None, "int8", 0, False)
    for dtype in DTYPES:
        bias = torch.randn(n, generator=gen).to(dtype)
        bias32 = bias.float().contiguous()
        aw = (1 + 0.3 * torch.randn(k, generator=gen)).to(dtype)
        for name, code, cols in (("gelu_tanh", C.QL_INPUT_ACT_GELU_TANH, k), ("swiglu", C.QL_INPUT_ACT_SWIGLU, 2 * k),
                                 ("rms_norm", C.QL_INPUT_ACT_RMS_NORM, k)):
            x = (torch.randn(m, cols, generator=gen) * 2).to(dtype)
            want = eager.int8_linear(x, q, s, bias, dtype, input_act=name,
                                     input_act_weight=aw if name == "rms_norm" else None, input_act_eps=1e-6)
            e = epilogue(code, aw if name == "rms_norm" else None, 1e-6, bias32)
            got = forward(lin, x, torch.empty(m, n, dtype=dtype), e)
            frac = identical(got, want)
            print(f"int8_linear {name} {dtype}: {frac:.4f} of outputs bit-identical to comfy-kitchen eager")
            if name == "rms_norm" and X86:
                assert frac == 1.0
            assert frac > 0.95
