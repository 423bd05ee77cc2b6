"""Stochastic rounding from torch's CPU stream against comfy-kitchen's eager
quantizers, bit for bit: torch.rand / torch.randint themselves, the int8
quantizers (row-wise, tensor-wise, ConvRot) and the W4A8/W6A8 weight
quantizer (every mode, eager's row chunks), and the Lloyd-Max codebook fit.

Where eager rotates with a torch matmul (ConvRot), the quantizer is compared
given qlinear's rotation (ql_rotate: the same values on both sides, so the
bytes must be equal) and, end to end, with eager's own rotation (fp32
rotations differ in the last bit, so a few codes may move by one).

Skipped unless torch >= 2.7 and comfy_kitchen import. The rules were measured
on torch 2.15 (docs/NUMERICS.md §8.1); QLINEAR_LIBRARY selects the build."""
import pytest

torch = pytest.importorskip("torch")
if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 7):
    pytest.skip("torch >= 2.7 needed", allow_module_level=True)
EQ = pytest.importorskip("comfy_kitchen.backends.eager.quantization")
W = pytest.importorskip("comfy_kitchen.backends.eager.w4a8_int8")
from comfy_kitchen.tensor.w4a8_packed import _FIXED_LUT  # noqa: E402

from qlinear import _lib  # noqa: E402

QD = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
TORCH_CPU = 1  # QL_SR_TORCH_CPU
MODES = {"codebook": 0, "uniform": 1, "asym": 2, "6bit": 3}


@pytest.fixture(scope="module")
def ql():
    return _lib.load()


def ptr(ffi, t, ty):
    return ffi.cast(ty, t.data_ptr())


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def ql_rotate(ql, x, group):
    ffi, lib = ql
    x = x.clone().contiguous()
    n, k = x.shape
    _lib.check(lib.ql_rotate(QD[x.dtype], ptr(ffi, x, "void *"), n, k, k, group))
    return x


# ------------------------------------------------------------- the stream

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rand(ql, dtype):
    ffi, lib = ql
    n = 2_000_003
    for seed in (1, 2**32 + 7, 987654321):
        ref = torch.rand(n, generator=gen(seed), dtype=dtype).float()
        out = torch.empty(n)
        _lib.check(lib.ql_torch_rand(seed, QD[dtype], 0, n, ptr(ffi, out, "float *")))
        assert torch.equal(out, ref)
        part = torch.empty(1000)
        _lib.check(lib.ql_torch_rand(seed, QD[dtype], 1_234_567, 1000, ptr(ffi, part, "float *")))
        assert torch.equal(part, ref[1_234_567:1_235_567])
    # a 2-D shape is drawn in row-major order
    ref2 = torch.rand((700, 3001), generator=gen(5), dtype=dtype).float().flatten()
    out = torch.empty(ref2.numel())
    _lib.check(lib.ql_torch_rand(5, QD[dtype], 0, out.numel(), ptr(ffi, out, "float *")))
    assert torch.equal(out, ref2)


@pytest.mark.parametrize("high", [1, 7, 300_000, 2**19, 2**28 - 1, 2**28, 2**31 + 5, 2**40])
def test_randint(ql, high):
    ffi, lib = ql
    ref = torch.randint(0, high, (300_000,), generator=gen(0))
    out = torch.empty(300_000, dtype=torch.int64)
    _lib.check(lib.ql_torch_randint(0, 0, high, 0, 300_000, ptr(ffi, out, "int64_t *")))
    assert torch.equal(out, ref)
    ref = torch.randint(-5, high, (100,), generator=gen(11))
    out = torch.empty(100, dtype=torch.int64)
    _lib.check(lib.ql_torch_randint(11, -5, high, 0, 100, ptr(ffi, out, "int64_t *")))
    assert torch.equal(out, ref)


# ------------------------------------------------------------------- int8

def ql_int8(ql, x, seed, tensorwise=0, group=0, idx0=0):
    ffi, lib = ql
    x = x.contiguous()
    n, k = x.shape
    q = torch.empty(n, k, dtype=torch.int8)
    s = torch.empty(1 if tensorwise else n)
    o = ffi.new("ql_int8_qoptions *")
    o.tensorwise, o.convrot_group, o.sr_stream, o.sr_seed, o.sr_idx0 = tensorwise, group, TORCH_CPU, seed, idx0
    _lib.check(lib.ql_quantize_int8(QD[x.dtype], ptr(ffi, x, "void *"), n, k, k, o, ptr(ffi, q, "int8_t *"), k,
                                    ptr(ffi, s, "float *")))
    return q, s


def int8_weight(g, n, k, dtype):
    x = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 3
    x[0, :7] *= 40
    x[1] = 0.0  # an all-zero row (fp16: the smallest-normal divisor)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 256), (300, 1024), (3, 20480)])
def test_int8_sr(ql, dtype, shape):
    g = gen(shape[0] * 7 + QD[dtype])
    x = int8_weight(g, *shape, dtype)
    for seed in (1, 12345, 2**32 + 99):
        qe, se = EQ.quantize_int8_rowwise(x.clone(), stochastic_rounding=seed)
        q, s = ql_int8(ql, x, seed)
        assert torch.equal(q, qe) and torch.equal(s, se.flatten())
        qe, se = EQ.quantize_int8_tensorwise(x.clone(), stochastic_rounding=seed)
        q, s = ql_int8(ql, x, seed, tensorwise=1)
        assert torch.equal(q, qe) and torch.equal(s, se.flatten())
    # a block of rows: sr_idx0 counts the elements before it
    qe, se = EQ.quantize_int8_rowwise(x.clone(), stochastic_rounding=77)
    r0, r1 = shape[0] // 3, shape[0] // 3 + 2
    q, s = ql_int8(ql, x[r0:r1], 77, idx0=r0 * shape[1])
    assert torch.equal(q, qe[r0:r1]) and torch.equal(s, se.flatten()[r0:r1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_int8_convrot_sr(ql, dtype):
    x = int8_weight(gen(21), 300, 1024, dtype)
    off = total = 0
    for seed in (1, 999):
        # the quantizer: eager given qlinear's rotation, bit for bit
        qe, se = EQ.quantize_int8_rowwise(ql_rotate(ql, x, 256), stochastic_rounding=seed)
        q, s = ql_int8(ql, x, seed, group=256)
        assert torch.equal(q, qe) and torch.equal(s, se.flatten())
        # end to end: eager rotates with a matmul in the weight's dtype
        qf, sf = EQ.quantize_int8_convrot_weight(x.clone(), 256, stochastic_rounding=seed)
        d = (qf.int() - q.int()).abs()
        assert d.max() <= 1
        off += int((d != 0).sum())
        total += d.numel()
        if dtype == torch.bfloat16:  # bf16: the rotations agree here
            assert torch.equal(qf, q) and torch.equal(sf.flatten(), s)
    print(f"{dtype}: end to end, {off} of {total} codes off by one")
    assert off <= total // 1000


# ------------------------------------------------------------ W4A8 / W6A8

def ql_wxa8(ql, w, mode, seed, group=16, cg=256, codebook=None, f32=False, search=False, row0=0):
    ffi, lib = ql
    w = w.contiguous()
    n, k = w.shape
    bits = 6 if mode == "6bit" else 4
    rb = k * bits // 8
    q = torch.zeros(n, rb, dtype=torch.uint8)
    srel = torch.zeros(n, k // group, dtype=torch.float32 if f32 else torch.uint8)
    sch = torch.zeros(n)
    corr = torch.zeros(n, k // group)
    p = ffi.new("ql_wxa8_qparams *")
    p.mode, p.group, p.convrot_group, p.scale_search = MODES[mode], group, cg, int(search)
    cb = None
    if codebook is not None:
        cb = torch.tensor(codebook, dtype=torch.float32)
        p.codebook = ptr(ffi, cb, "float *")
    o = ffi.new("ql_wxa8_qoptions *")
    o.s_rel_f32, o.sr_seed, o.sr_idx0, o.sr_stream = int(f32), seed, row0 * k, TORCH_CPU
    _lib.check(lib.ql_wxa8_quantize_ex(QD[w.dtype], ptr(ffi, w, "void *"), n, k, k, p, o, ptr(ffi, q, "uint8_t *"), rb,
                                       ptr(ffi, srel, "void *"), ptr(ffi, sch, "float *"), ptr(ffi, corr, "float *")))
    return q, srel, sch, corr


def eager_wxa8(rotate_fn, w, mode, seed, group=16, cg=256, codebook=None, f32=False, search=False):
    return W._quantize_w4a8_chunked(
        w, rotate_fn, group_size=group, convrot_groupsize=cg, symmetric=mode != "asym",
        scale_dtype=torch.float32 if f32 else torch.float8_e4m3fn, codebook=mode == "codebook",
        codebook_override=None if codebook is None else torch.tensor(codebook, dtype=torch.float32),
        stochastic_rounding=seed, bits=6 if mode == "6bit" else 4, scale_search=search)


def same_bytes(e, o, w, mode, f32):
    qe, se, sce, ce, _ = e
    q, s, sc, c = o
    ok = {"qdata": torch.equal(qe.view(torch.uint8), q),
          "s_rel": torch.equal(se.float() if f32 else se.view(torch.uint8), s),
          "s_channel": torch.equal(sce, sc)}
    if mode == "asym":
        ok["correction"] = torch.equal(ce, c.t().contiguous().to(w.dtype))
    return ok


STORED = [-0.93, -0.71, -0.55, -0.41, -0.3, -0.2, -0.12, -0.04, 0.03, 0.1, 0.19, 0.3, 0.42, 0.57, 0.74, 0.95]
CASES = [("codebook", _FIXED_LUT, False, False, 16), ("codebook", STORED, True, False, 16),
         ("codebook", _FIXED_LUT, False, False, 4), ("uniform", None, False, False, 16),
         ("uniform", None, True, False, 8), ("asym", None, False, False, 16), ("asym", None, True, False, 32),
         ("6bit", None, False, False, 16), ("6bit", None, True, False, 32), ("6bit", None, False, True, 16),
         ("6bit", None, True, True, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'f32' if c[2] else 'e4m3'}{'-search' if c[3] else ''}-g{c[4]}")
def test_wxa8_sr(ql, dtype, case):
    mode, cb, f32, search, group = case
    g = gen(31 + QD[dtype])
    w = (torch.randn(48, 512, generator=g) * 0.02)
    w[:, :3] *= 20
    w = w.to(dtype)
    kw = dict(group=group, codebook=None if cb is None else list(cb), f32=f32, search=search)
    for seed in (1, 4242):
        o = ql_wxa8(ql, w, mode, seed, **kw)
        ok = same_bytes(eager_wxa8(lambda x, c: ql_rotate(ql, x, c), w, mode, seed, **kw), o, w, mode, f32)
        assert all(ok.values()), ok
        # end to end with eager's rotation: the codes agree; fp32 scales may move in the last bit
        full = same_bytes(eager_wxa8(EQ.rotate_int8_convrot_weight, w, mode, seed, **kw), o, w, mode, f32)
        print(f"{dtype} {case}: end to end {full}")
        if dtype == torch.bfloat16:
            assert all(full.values()), full
        n0 = ql_wxa8(ql, w, mode, 0, **kw)
        assert not torch.equal(n0[0], o[0])  # SR moved codes


@pytest.mark.parametrize("mode", ["uniform", "codebook"])
def test_wxa8_sr_chunks(ql, mode):
    """K = 2^16: eager quantizes 64-row chunks, chunk r0 seeded with seed + r0."""
    w = (torch.randn(70, 1 << 16, generator=gen(41)) * 0.02)
    cb = list(_FIXED_LUT) if mode == "codebook" else None
    e = eager_wxa8(lambda x, c: ql_rotate(ql, x, c), w, mode, 5, codebook=cb)
    o = ql_wxa8(ql, w, mode, 5, codebook=cb)
    assert all(same_bytes(e, o, w, mode, False).values())
    p = ql_wxa8(ql, w[60:70], mode, 5, codebook=cb, row0=60)  # across the chunk boundary at 64
    assert torch.equal(p[0], e[0].view(torch.uint8)[60:70])


# ------------------------------------------------------------- codebook fit

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fit_codebook(ql, dtype):
    """Heavy tails (one spike per group): eager fits Lloyd-Max. With torch on
    one thread its cluster sums are the ones qlinear reproduces; eager's
    table is compared sorted (qlinear sorts; with repeated bf16 values an
    empty cluster can leave eager's out of order)."""
    ffi, lib = ql
    g = gen(51)
    w = torch.randn(300, 1024, generator=g) * 0.001
    w[:, ::16] = torch.randn(300, 64, generator=g)
    w = w.to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        e = W._decide_codebook(w, lambda x, c: ql_rotate(ql, x, c), 16, 4)
    finally:
        torch.set_num_threads(threads)
    p = ffi.new("ql_wxa8_qparams *")
    p.mode, p.group, p.convrot_group = 0, 16, 4
    cb = torch.zeros(16)
    fitted = torch.zeros(1, dtype=torch.int32)
    _lib.check(lib.ql_wxa8_fit_codebook(QD[dtype], ptr(ffi, w, "void *"), 300, 1024, 1024, p, ptr(ffi, cb, "float *"),
                                        ptr(ffi, fitted, "int *")))
    assert int(fitted) == 1 and not torch.equal(e, torch.tensor(_FIXED_LUT, dtype=torch.float32))
    assert torch.equal(e.sort().values, cb)
