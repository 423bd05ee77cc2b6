"""The ops the `qlinear` comfy-kitchen backend serves, with comfy-kitchen's
names and signatures (the registry calls getattr(module, op)(**kwargs)).

Every op here has already passed the backend's constraints and call rules
(_caps.py), which decline what qlinear cannot do exactly; what is left and
still cannot run (a weight the library refuses, non-finite values where the
library reports them) is handed to comfy-kitchen's eager implementation from
inside the op, so the caller gets eager's answer (or eager's error).
"""
import os
import threading

import torch

import qlinear
from .._lib import C, check, load
from ._cache import WeightCache

CODE = {torch.float32: C.QL_F32, torch.float16: C.QL_F16, torch.bfloat16: C.QL_BF16}
DTYPE_OF_CODE = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}  # comfy-kitchen's output_dtype_code
FUSED_ACTS = {}  # input_act name -> ql_input_act code, where the library fuses it (see _fused_acts)

weights = WeightCache()
_ctx = None
_ffi = _lib = None


def _eager():
    from comfy_kitchen.backends import eager
    return eager


def _context():
    global _ctx, _ffi, _lib
    if _ctx is None:
        from .._context import Context
        _ffi, _lib = load()
        _ctx = Context(torch.get_num_threads())
    t = torch.get_num_threads()
    if t != _ctx.threads:
        _ctx.set_threads(t)
    return _ctx


def _fused_acts():
    """The input activations the library's prologue applies (none on a build
    without them: they are applied with comfy-kitchen's own function first)."""
    names = {"gelu_tanh": "QL_INPUT_ACT_GELU_TANH", "swiglu": "QL_INPUT_ACT_SWIGLU", "rms_norm": "QL_INPUT_ACT_RMS_NORM"}
    return {k: getattr(C, v) for k, v in names.items() if hasattr(C, v)}


FUSED_ACTS.update(_fused_acts())


def _ptr(t):
    return _ffi.cast("void *", t.data_ptr())


def _has_field(struct, field):
    ffi, _ = load()
    try:
        getattr(ffi.new(struct + " *"), field)
        return True
    except AttributeError:
        return False


HAS_EPI_BIAS = _has_field("ql_epilogue", "bias")  # a per-call bias in the epilogue
HAS_PROLOGUE_CACHE = _has_field("ql_epilogue", "prologue_cache") and \
    os.environ.get("QLINEAR_COMFY_PROLOGUE_CACHE", "1") != "0"
_tls = threading.local()


def _thread_cache():
    """This thread's prologue-cache state: [cache, epilogue, last x, its key,
    generation] (made on first use)."""
    st = getattr(_tls, "pc", None)
    if st is None:
        p = _ffi.new("ql_prologue_cache **")
        check(_lib.ql_prologue_cache_create(p), "ql_prologue_cache_create")
        cache = _ffi.gc(p[0], _lib.ql_prologue_cache_destroy)
        epi = _ffi.new("ql_epilogue *")
        epi.prologue_cache = cache
        st = _tls.pc = [cache, epi, None, None, 0]
    return st


def _thread_token():
    """An object of this thread's own (what a plan is kept for without the prologue cache)."""
    t = getattr(_tls, "token", None)
    if t is None:
        t = _tls.token = object()
    return t


def _generation(st, x, m, ldx, extra):
    """The generation of x in this thread's cache state st: it moves on
    whenever x is not the input of the last call — data pointer, rows, row
    length or stride, or dtype differ (views of one memory as [m, k] rows are
    the same input) — or has been written since (its version counter, which
    views share with their base). The last x is held (a strong reference), so
    its memory cannot be handed to another tensor while the cache holds its
    codes: an equal pointer is the same memory. extra: what else the codes
    depend on that the library keys by pointer only (an rms_norm weight's
    version)."""
    key = (x.data_ptr(), m, x.shape[-1], ldx, x.dtype, x._version, extra)
    if key != st[3]:
        st[2], st[3] = x, key
        st[4] += 1
    return st[4]


def _prologue(x, m, ldx, extra=()):
    """This thread's prologue-cache state for an int8_linear on x: a
    ql_epilogue (reused per call) carrying the cache and the generation of x
    (_generation). ComfyUI calls q, k and v one by one on one x: the second
    and third quantize nothing."""
    st = _thread_cache()
    epi = st[1]
    epi.prologue_generation = _generation(st, x, m, ldx, extra)
    return epi


def prologue_cache_stats():
    """(hits, misses) of this thread's prologue cache (0, 0 before its first use)."""
    st = getattr(_tls, "pc", None)
    if st is None:
        return 0, 0
    hm = torch.zeros(2, dtype=torch.int64)  # read the same way through cffi and ctypes
    _lib.ql_prologue_cache_stats(st[0], _ffi.cast("int64_t *", hm.data_ptr()),
                                 _ffi.cast("int64_t *", hm.data_ptr() + 8))
    return int(hm[0]), int(hm[1])


def prologue_cache_release():
    """Drop this thread's hold on the last input (and the codes of it)."""
    st = getattr(_tls, "pc", None)
    if st is not None:
        _lib.ql_prologue_cache_clear(st[0])
        st[2] = st[3] = None
HAS_TORCH_SR = hasattr(C, "QL_SR_TORCH_CPU")  # stochastic rounding on torch's CPU generator stream


def sr_dtypes():
    """The float dtypes whose torch.rand stream on the CPU (a generator seeded
    by hand) the library's ql_torch_rand reproduces in this torch: compared
    on a few thousand draws."""
    if not HAS_TORCH_SR:
        return set()
    ffi, lib = load()
    ok = set()
    for dt in CODE:
        for seed in (1, 2**32 + 7):
            g = torch.Generator().manual_seed(seed)
            ref = torch.rand(4096, dtype=dt, generator=g).float()
            ours = torch.empty(4096, dtype=torch.float32)
            if lib.ql_torch_rand(seed, CODE[dt], 0, 4096, ffi.cast("float *", ours.data_ptr())) or \
                    not torch.equal(ours, ref):
                break
        else:
            ok.add(dt)
    return ok


# ---------------------------------------------------------------- int8_linear

def _int8_layer(weight, weight_scale, group):
    e = weights.hit(weight, ("int8", group), weight_scale)
    if e is not None:
        return e

    def make():
        _context()
        w = weight.detach()
        if not w.is_contiguous():
            w = w.contiguous()
        s = weight_scale.detach().reshape(-1).to(torch.float32).contiguous()
        return qlinear.Linear.from_int8(w, s, convrot_group=group, _context=_ctx)
    return weights.get(weight, ("int8", group), (weight_scale,), make)


def _int8_layer_cuda(weight, weight_scale, group):
    e = weights.hit(weight, ("int8-cuda", group), weight_scale)
    if e is not None:
        return e

    def make():
        # the CUDA layer keeps its own copy (codes permuted within each rotation group
        # into its prologue's order, rows padded to TMA's pitch), uploaded from the host
        w = weight.detach().to("cpu").contiguous()
        s = weight_scale.detach().reshape(-1).to("cpu", torch.float32).contiguous()
        return qlinear.Linear.from_int8(w, s, convrot_group=group, device=str(weight.device))
    return weights.get(weight, ("int8-cuda", group), (weight_scale,), make)


def _int8_linear_cuda(x, weight, weight_scale, bias, out_dtype, convrot, convrot_groupsize, input_act,
                      input_act_weight, input_act_eps, residual, residual_scale):
    e = _int8_layer_cuda(weight, weight_scale, convrot_groupsize if convrot else 0)
    if e.failed is not None:
        return _eager().int8_linear(x, weight, weight_scale, bias, out_dtype, convrot, convrot_groupsize, input_act,
                                    input_act_weight, input_act_eps, residual, residual_scale)
    y = _fast(e, x, bias, out_dtype, input_act, input_act_weight, input_act_eps, residual, residual_scale)
    if y is not None:
        return y
    return _run_cuda(e, x, bias, out_dtype, input_act, input_act_weight, input_act_eps, residual, residual_scale)


CUDA_EPI_BIAS = [True]  # the library's CUDA layers take a per-call bias (cleared on the first refusal)
_act_fns = []


def _acts():
    """comfy-kitchen's (apply_input_act, apply_residual), imported once."""
    if not _act_fns:
        from comfy_kitchen.backends._activations import apply_input_act, apply_residual
        _act_fns[:] = [apply_input_act, apply_residual]
    return _act_fns


def _run_cuda(e, x, bias, out_dtype, input_act, input_act_weight, input_act_eps, residual, residual_scale):
    """y = layer(act(x)) + bias, then the residual, on a GPU (e: the layer's
    cache entry): the input activation fused into the CUDA layer's prologue
    (the library's activations, FUSED_ACTS; applied first in PyTorch where
    the library declines it: a build without it, or an activation it lacks);
    the bias in the layer's epilogue (bias.to(out_dtype) as fp32 on the GPU,
    kept on the entry while the caller passes the same bias: eager's
    roundings, no pass over y); the residual in PyTorch, in eager's order.
    The layer reads x through this thread's prologue cache, as on the CPU:
    q, k and v of one x quantize it once while the codes stay in the
    context's GPU workspace."""
    layer = e.layer
    act = input_act not in (None, "none")
    b32 = None
    if bias is not None and CUDA_EPI_BIAS[0] and out_dtype in CODE:
        b32 = _bias_f32(e, bias, out_dtype)
    y = None
    if act and input_act in FUSED_ACTS and out_dtype in CODE and x.dtype in CODE:
        y = _cuda_fused_act(layer, x, out_dtype, input_act, input_act_weight, input_act_eps, b32)
        if y is None:
            b32 = None
    if y is None:
        if act:
            x = _acts()[0](x, input_act, input_act_weight, input_act_eps)
        if not x.is_contiguous():
            x = x.contiguous()
        k, n = layer.k, layer.n
        m = x.numel() // k if k else 0
        if not act and m and x.shape[-1] == k and out_dtype in CODE and x.dtype in CODE:
            y = torch.empty(x.shape[:-1] + (n,), dtype=out_dtype, device=x.device)
            epi = _prologue(x, m, k) if HAS_PROLOGUE_CACHE else _plain_epilogue()
            layer._use_current_stream()
            args = (layer._ptr, x.data_ptr(), CODE[x.dtype], m, k, y.data_ptr(), CODE[out_dtype], n, epi)
            epi.bias = _ffi.NULL if b32 is None else _ffi.cast("const float *", b32.data_ptr())
            st = layer._fwd_int(*args)
            if st == C.QL_ERR_UNSUPPORTED and b32 is not None:  # a library without the CUDA per-call bias
                CUDA_EPI_BIAS[0], b32, epi.bias = False, None, _ffi.NULL
                st = layer._fwd_int(*args)
            epi.bias = _ffi.NULL  # the epilogue is this thread's, reused by the next call
            if st:
                check(st, "ql_linear_forward")
        else:
            b32 = None
            y = layer.forward(x, out_dtype=out_dtype)
    if bias is not None and b32 is None:
        y = y + bias.to(out_dtype)
    return y if residual is None else _acts()[1](y, residual, residual_scale)


def _plain_epilogue():
    """This thread's ql_epilogue without a prologue cache (reused per call)."""
    epi = getattr(_tls, "plain", None)
    if epi is None:
        epi = _tls.plain = _ffi.new("ql_epilogue *")
    return epi


def _cuda_fused_act(layer, x, out_dtype, act, act_weight, act_eps, b32=None):
    """y = layer(act(x)) (+ b32, a per-call bias already in fp32 on the GPU)
    on the GPU with the activation in the layer's prologue (rows of x read at
    their stride, through this thread's prologue cache when x is read in
    place), or None where the library declines it (QL_ERR_UNSUPPORTED: a
    build whose CUDA backend has no input activations, or no per-call bias):
    the caller then applies both in PyTorch."""
    k, n = layer.k, layer.n
    cols = 2 * k if act == "swiglu" else k
    x_in = x
    if x.stride(-1) != 1 and cols > 1:
        x = x.contiguous()
    x2 = x.reshape(-1, cols)
    if x2.shape[0] > 1 and x2.stride(0) < cols:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty(x.shape[:-1] + (n,), dtype=out_dtype, device=x.device)
    if m == 0:
        return y if b32 is None else None
    ldx = x2.stride(0) if m > 1 else cols
    epi = _ffi.new("ql_epilogue *")
    epi.input_act = FUSED_ACTS[act]
    if b32 is not None:
        epi.bias = _ffi.cast("const float *", b32.data_ptr())
    extra = ()
    if act == "rms_norm":
        w = act_weight.detach()  # on x's device (the call rule)
        if w.dtype not in CODE:
            w = w.float()
        w = w.contiguous()  # a copy is freed in the stream's order, after the kernel that reads it
        epi.input_act_weight, epi.input_act_weight_dtype = _ptr(w), CODE[w.dtype]
        epi.input_act_eps = float(act_eps if act_eps is not None else torch.finfo(x.dtype).eps)
        extra = (act_weight.data_ptr(), act_weight._version)
    if HAS_PROLOGUE_CACHE and x2.data_ptr() == x_in.data_ptr():  # x as the caller gave it, not a copy
        c = _prologue(x_in, m, ldx, extra)
        epi.prologue_cache, epi.prologue_generation = c.prologue_cache, c.prologue_generation
    layer._use_current_stream()
    st = layer._fwd_int(layer._ptr, x2.data_ptr(), CODE[x2.dtype], m, ldx, y.data_ptr(), CODE[out_dtype], n, epi)
    if st == C.QL_ERR_UNSUPPORTED:
        return None
    if st:
        check(st, "ql_linear_forward")
    return y


def int8_linear(x, weight, weight_scale, bias=None, out_dtype=torch.bfloat16, convrot=False, convrot_groupsize=256,
                input_act=None, input_act_weight=None, input_act_eps=0.0, residual=None, residual_scale=None):
    if x.is_cuda:
        return _int8_linear_cuda(x, weight, weight_scale, bias, out_dtype, convrot, convrot_groupsize, input_act,
                                 input_act_weight, input_act_eps, residual, residual_scale)
    group = convrot_groupsize if convrot else 0
    e = _int8_layer(weight, weight_scale, group)
    if e.failed is None:
        y = _fast(e, x, bias, out_dtype, input_act, input_act_weight, input_act_eps, residual, residual_scale)
        if y is not None:
            return y
    if e.failed is not None:
        return _eager().int8_linear(x, weight, weight_scale, bias, out_dtype, convrot, convrot_groupsize, input_act,
                                    input_act_weight, input_act_eps, residual, residual_scale)
    return _run(e.layer, x, bias, out_dtype, input_act, input_act_weight, input_act_eps, residual, residual_scale)


def _fast(e, x, bias, out_dtype, input_act, act_weight, act_eps, residual=None, residual_scale=None):
    """The common call in one C call, or None where it needs the general path
    (_run, _run_cuda): ComfyUI's F.linear path and its fused input
    activations on a contiguous x, with the bias in the epilogue, and a
    pre-norm block's residual (residual + residual_scale ⊙ y, 16-bit outputs,
    both in the output dtype on x's device and laid out as _run fuses them:
    the product of two 16-bit values is exact in fp32, so the epilogue's
    rounding is addcmul's on either device). Nothing is
    built per call: the weight's entry keeps a plan (_Plan: the epilogue with
    the bias converted once, the activation, this thread's prologue cache)
    while the call's terms stay the same; an rms_norm weight in a dtype the
    library reads is passed as it lies (else the general path converts it)."""
    layer = e.layer
    code = 0
    if input_act is not None and input_act != "none":
        code = FUSED_ACTS.get(input_act)
        if code is None:
            return None
    k = layer.k
    cols = 2 * k if code and input_act == "swiglu" else k
    xdt = x.dtype
    if not x.is_contiguous() or x.dim() == 0 or x.shape[-1] != cols or xdt not in CODE or out_dtype not in CODE:
        return None
    m = x.numel() // cols if cols else 0
    if m == 0:
        return None
    cuda = x.is_cuda
    if bias is not None and not (CUDA_EPI_BIAS[0] if cuda else HAS_EPI_BIAS):  # a library without per-call bias
        return None
    w = None
    eps = 0.0
    if code and input_act == "rms_norm":
        w = act_weight
        if w is None or w.dtype not in CODE or not w.is_contiguous() or w.device != x.device:
            return None
        eps = float(act_eps if act_eps is not None else torch.finfo(xdt).eps)
    n = layer.n
    sh = x.shape
    oshape = (m, n) if len(sh) == 2 else (*sh[:-1], n)
    res = residual is not None
    if res and (out_dtype is torch.float32 or residual.dtype is not out_dtype or residual.shape != oshape
                or residual.device != x.device or residual_scale is None or residual_scale.device != x.device
                or not residual.is_contiguous() or residual_scale.dtype is not out_dtype
                or residual_scale.dim() == 0 or residual_scale.numel() != n
                or residual_scale.shape[-1] != n or not residual_scale.is_contiguous()):
        return None
    # the plan's owner: this thread's cache state, or without the cache a token of this thread (a plan's
    # epilogue is written per call, so no two threads share one)
    st = _thread_cache() if HAS_PROLOGUE_CACHE else _thread_token()
    bver = 0 if bias is None else bias._version
    p = e.plan
    if (p is None or p.st is not st or p.bias is not bias or p.bver != bver or p.odt is not out_dtype or p.code != code
            or p.res is not res or (w is not None and (p.w is not w or p.wptr != w.data_ptr() or p.eps != eps))):
        p = e.plan = _Plan(e, st, bias, bver, out_dtype, code, w, eps, res)
    if not cuda and _ctx.threads != torch.get_num_threads():
        _context()
    if HAS_PROLOGUE_CACHE:
        g = _generation(st, x, m, cols, () if w is None else (w.data_ptr(), w._version))
        if g != p.gen:
            p.epi.prologue_generation = p.gen = g
    y = x.new_empty(oshape, dtype=out_dtype)
    if res:  # the plan's epilogue is its own: these are written before each of its calls
        epi = p.epi
        epi.residual, epi.ld_residual, epi.residual_scale = _ptr(residual), n, _ptr(residual_scale)
    if cuda:
        layer._use_current_stream()
    st = layer._fwd_int(layer._ptr, x.data_ptr(), CODE[xdt], m, cols, y.data_ptr(), p.ycode, n, p.arg)
    if st == C.QL_ERR_UNSUPPORTED and cuda:
        e.plan = None
        if bias is not None:  # a library without the CUDA per-call bias
            CUDA_EPI_BIAS[0] = False
        return None  # or without CUDA input activations: the general path applies them in PyTorch
    if st:
        check(st, "ql_linear_forward")
    return y


class _Plan:
    """What _fast hands the C call for one weight entry, built once and kept
    on the entry while the call's terms stay the same (the thread's cache
    state st, the bias tensor and its version, the output dtype, the
    activation and its weight, whether a residual is fused): a ql_epilogue of
    its own (the bias converted once, the activation, the thread's prologue
    cache; per call only the generation of x moves, and a residual's
    pointers) and the epilogue in the form the binding passes.
    The plan holds st (the thread's cache state, or a token of the thread),
    so the cache it points to lives while the plan does; another thread's
    call finds another st and builds its own plan: no two threads write one
    epilogue."""
    __slots__ = ("st", "bias", "bver", "odt", "code", "w", "wptr", "eps", "res", "b32", "epi", "arg", "gen", "ycode")

    def __init__(self, e, st, bias, bver, out_dtype, code, w, eps, res):
        self.st, self.bias, self.bver, self.odt, self.code, self.res = st, bias, bver, out_dtype, code, res
        self.w, self.wptr, self.eps, self.gen, self.ycode = w, None, eps, -1, CODE[out_dtype]
        epi = self.epi = _ffi.new("ql_epilogue *")
        self.b32 = None
        if bias is not None:
            self.b32 = _bias_f32(e, bias, out_dtype)
            epi.bias = _ffi.cast("const float *", self.b32.data_ptr())
        if code:
            epi.input_act = code
            if w is not None:
                self.wptr = w.data_ptr()
                epi.input_act_weight, epi.input_act_weight_dtype = _ffi.cast("void *", self.wptr), CODE[w.dtype]
                epi.input_act_eps = eps
        if isinstance(st, list):  # the thread's prologue-cache state (else a token of the thread)
            epi.prologue_cache = st[0]
        self.arg = getattr(epi, "_as_parameter_", epi)  # ctypes: the struct's address, made once


def _bias_f32(e, bias, out_dtype):
    """bias.to(out_dtype) as fp32 values (what the epilogue adds), kept on the
    cache entry while the caller passes the same bias tensor unchanged."""
    b = getattr(e, "bias_memo", None)
    if b is not None and b[0] is bias and b[1] == bias._version and b[2] is out_dtype:
        return b[3]
    b32 = bias.detach().reshape(-1).to(out_dtype).to(torch.float32).contiguous()
    e.bias_memo = (bias, bias._version, out_dtype, b32)
    return b32


def _run(layer, x, bias, out_dtype, input_act, act_weight, act_eps, residual, residual_scale):
    """y = layer(act(x)) + bias, then residual + residual_scale ⊙ y, in eager's
    rounding order, on the CPU."""
    _context()
    x_in = x
    if input_act not in (None, "none") and input_act not in FUSED_ACTS:
        from comfy_kitchen.backends._activations import apply_input_act
        x = apply_input_act(x, input_act, act_weight, act_eps)
        input_act = None
    k_in = x.shape[-1]
    n = layer.n
    if x.stride(-1) != 1 and k_in > 1:
        x = x.contiguous()
    x2 = x.reshape(-1, k_in)
    if x2.shape[0] > 1 and x2.stride(0) < k_in:
        x2 = x2.contiguous()
    m = x2.shape[0]
    oshape = x.shape[:-1] + (n,)
    y = torch.empty(oshape, dtype=out_dtype)
    if m == 0:
        return _finish(y, bias, residual, residual_scale, out_dtype, False)
    epi = _ffi.NULL
    fused_res = False
    extra = ()
    if input_act not in (None, "none"):
        epi = _ffi.new("ql_epilogue *")
        epi.input_act = FUSED_ACTS[input_act]
        if input_act == "rms_norm":
            w = act_weight.detach()
            if w.dtype not in CODE:
                w = w.float()
            w = w.contiguous()
            epi.input_act_weight, epi.input_act_weight_dtype = _ptr(w), CODE[w.dtype]
            epi.input_act_eps = float(act_eps if act_eps is not None else torch.finfo(x.dtype).eps)
            extra = (act_weight.data_ptr(), act_weight._version)
    if HAS_PROLOGUE_CACHE and x2.data_ptr() == x_in.data_ptr():  # x as the caller gave it, not a copy
        if epi is _ffi.NULL:
            epi = _ffi.new("ql_epilogue *")
        c = _prologue(x_in, m, x2.stride(0) if m > 1 else k_in, extra)
        epi.prologue_cache, epi.prologue_generation = c.prologue_cache, c.prologue_generation
    # bias, then the residual, fused when the library can take them as eager rounds them
    bias_f32 = None
    if bias is not None and HAS_EPI_BIAS:
        bias_f32 = bias.detach().to(out_dtype).to(torch.float32).contiguous()
        if epi is _ffi.NULL:
            epi = _ffi.new("ql_epilogue *")
        epi.bias = _ffi.cast("const float *", bias_f32.data_ptr())
    # fused for 16-bit outputs only: PyTorch's fp32 addcmul is one FMA (one
    # rounding), the epilogue's fp32 residual rounds the product and the sum
    if residual is not None and (bias is None or bias_f32 is not None) and out_dtype is not torch.float32:
        r = residual.to(out_dtype)
        rs = residual_scale.to(out_dtype)
        if tuple(r.shape) == tuple(oshape) and (rs.numel() == n or rs.numel() == 1) and \
                (rs.dim() == 0 or rs.shape[-1] == rs.numel() or rs.numel() == 1):
            r2 = r.reshape(m, n)
            if r2.stride(-1) != 1 or (m > 1 and r2.stride(0) < n):
                r2 = r2.contiguous()
            rs1 = rs.reshape(-1).expand(n).contiguous() if rs.numel() == 1 else rs.reshape(n).contiguous()
            if epi is _ffi.NULL:
                epi = _ffi.new("ql_epilogue *")
            epi.residual, epi.ld_residual, epi.residual_scale = _ptr(r2), r2.stride(0), _ptr(rs1)
            fused_res = True
    st = layer._fwd_int(layer._ptr, x2.data_ptr(), CODE[x2.dtype], m, x2.stride(0) if m > 1 else k_in,
                        y.data_ptr(), CODE[out_dtype], n, epi)
    if st:
        check(st, "ql_linear_forward")
    return _finish(y, None if bias_f32 is not None else bias, None if fused_res else residual, residual_scale,
                   out_dtype, fused_res)


def _finish(y, bias, residual, residual_scale, out_dtype, fused_res):
    if bias is not None:
        y = y + bias.to(dtype=out_dtype)
    if residual is not None and not fused_res:
        y = torch.addcmul(residual.to(out_dtype), y, residual_scale.to(out_dtype))
    return y


def input_act_values(x, act, weight=None, eps=0.0):
    """The activation values qlinear quantizes for input_act `act`: the
    library's own (fused: ql_input_act_apply) where it has the activation,
    else comfy-kitchen's."""
    if act not in FUSED_ACTS:
        from comfy_kitchen.backends._activations import apply_input_act
        return apply_input_act(x, act, weight, eps)
    _context()
    x2 = x.detach().contiguous().reshape(-1, x.shape[-1])
    k = x2.shape[1] // (2 if act == "swiglu" else 1)
    out = torch.empty((x2.shape[0], k), dtype=x.dtype)
    epi = _ffi.new("ql_epilogue *")
    epi.input_act = FUSED_ACTS[act]
    if weight is not None:
        w = weight.detach().contiguous()
        epi.input_act_weight, epi.input_act_weight_dtype = _ptr(w), CODE[w.dtype]
        epi.input_act_eps = float(eps)
    check(_lib.ql_input_act_apply(epi, CODE[x.dtype], _ptr(x2), x2.shape[0], k, x2.shape[1], _ptr(out), k),
          "ql_input_act_apply")
    return out.reshape(x.shape[:-1] + (k,))


# ----------------------------------------------------------- W4A8 / W6A8 linear

def _wxa8_layer(qdata, s_rel, s_channel, codebook, correction, group_size, convrot_groupsize):
    def make():
        _context()
        q = qdata.detach().contiguous().view(torch.uint8)
        sr = s_rel.detach().contiguous()
        if sr.dtype != torch.float32:
            sr = sr.view(torch.uint8)
        sc = s_channel.detach().to(torch.float32).contiguous()
        cb = codebook.detach().to(torch.float32).contiguous() if codebook is not None else None
        cr = correction.detach().contiguous() if correction is not None else None
        if cr is not None and cr.dtype not in CODE:
            cr = cr.float()
        return qlinear.Linear.from_wxa8(q, sr, sc, cb, cr, group_size, convrot_groupsize, packed=PACKED[0],
                                        _context=_ctx)
    return weights.get(qdata, ("wxa8", group_size, convrot_groupsize, PACKED[0]),
                       (s_rel, s_channel, codebook, correction), make)


PACKED = [True]  # W4A8/W6A8 codes stay packed (decoded inside the GEMM); False: decoded once to int8


def _wxa8_layer_cuda(qdata, s_rel, s_channel, codebook, group_size, convrot_groupsize):
    def make():
        # the CUDA layer keeps its own copy (packed codes, or the int8 grid), uploaded from the host
        def host(t):
            return t.detach().to("cpu").contiguous()
        q = host(qdata).view(torch.uint8)
        sr = host(s_rel)
        if sr.dtype != torch.float32:
            sr = sr.view(torch.uint8)
        cb = host(codebook).to(torch.float32) if codebook is not None else None
        return qlinear.Linear.from_wxa8(q, sr, host(s_channel).to(torch.float32), cb, None, group_size,
                                        convrot_groupsize, packed=PACKED[0], device=str(qdata.device))
    return weights.get(qdata, ("wxa8-cuda", group_size, convrot_groupsize, PACKED[0]),
                       (s_rel, s_channel, codebook), make)


def w4a8_int8_linear(x, qdata, s_rel, s_channel, codebook=None, correction=None, bias=None, group_size=16,
                     convrot_groupsize=256, out_dtype=torch.bfloat16, input_act=None, input_act_weight=None,
                     input_act_eps=0.0, residual=None, residual_scale=None):
    if correction is not None:
        return _w4a8_asym_linear(x, qdata, s_rel, s_channel, codebook, correction, bias, group_size,
                                 convrot_groupsize, out_dtype, input_act, input_act_weight, input_act_eps, residual,
                                 residual_scale)
    if x.is_cuda:
        e = _wxa8_layer_cuda(qdata, s_rel, s_channel, codebook, group_size, convrot_groupsize)
    else:
        e = _wxa8_layer(qdata, s_rel, s_channel, codebook, correction, group_size, convrot_groupsize)
    if e.failed is not None:
        return _eager().w4a8_int8_linear(x, qdata, s_rel, s_channel, codebook, correction, bias, group_size,
                                         convrot_groupsize, out_dtype, input_act, input_act_weight, input_act_eps,
                                         residual, residual_scale)
    if residual is None or not x.is_cuda:
        y = _fast(e, x, bias, out_dtype, input_act, input_act_weight, input_act_eps, residual, residual_scale)
        if y is not None:
            return y
    if x.is_cuda:
        return _run_cuda(e, x, bias, out_dtype, input_act, input_act_weight, input_act_eps, residual, residual_scale)
    return _run(e.layer, x, bias, out_dtype, input_act, input_act_weight, input_act_eps, residual, residual_scale)


class _Dense:
    """A dequantized weight kept in the cache (asymmetric W4A8)."""

    def __init__(self, w):
        self.w, self.weight_bytes = w, w.numel() * w.element_size()


def _w4a8_asym_linear(x, qdata, s_rel, s_channel, codebook, correction, bias, group_size, convrot_groupsize,
                      out_dtype, input_act, act_weight, act_eps, residual, residual_scale):
    """Eager's asymmetric W4A8 is a float linear of the dequantized weight (in
    x's dtype): the same here, with the weight dequantized once (cached)
    instead of on every call — by the library on the CPU, by eager's own code
    on a GPU — and PyTorch's F.linear."""
    from comfy_kitchen.backends._activations import apply_input_act, apply_residual

    def make():
        if not x.is_cuda:
            return _Dense(dequantize_w4a8_int8_weight(qdata, s_rel, s_channel, codebook, correction, group_size,
                                                      convrot_groupsize, x.dtype))
        # on the GPU by eager's own dequantization, once: eager's weight on a GPU is its GPU float arithmetic's
        # (the rotation's sums in another order than the CPU's), and so its outputs there
        return _Dense(_eager().dequantize_w4a8_int8_weight(qdata, s_rel, s_channel, codebook=codebook,
                                                           correction=correction, group_size=group_size,
                                                           convrot_groupsize=convrot_groupsize,
                                                           output_dtype=x.dtype).detach())
    e = weights.get(qdata, ("w4a8-asym", group_size, convrot_groupsize, x.dtype),
                    (s_rel, s_channel, codebook, correction), make)
    if e.failed is not None:
        return _eager().w4a8_int8_linear(x, qdata, s_rel, s_channel, codebook, correction, bias, group_size,
                                         convrot_groupsize, out_dtype, input_act, act_weight, act_eps, residual,
                                         residual_scale)
    x = apply_input_act(x, input_act, act_weight, act_eps)
    y = torch.nn.functional.linear(x, e.layer.w, bias).to(out_dtype)
    return apply_residual(y, residual, residual_scale)


# ------------------------------------------------------------ INT8 quantizers

def _rows2d(x):
    """x as contiguous [rows, k] (k = the last dimension)."""
    x = x.detach().contiguous()
    k = x.shape[-1]
    return x.reshape(-1, k), k


def _seed(stochastic_rounding):
    return int(stochastic_rounding) if stochastic_rounding is not None and stochastic_rounding > 0 else 0


def _quantize_int8(x2, k, tensorwise, group, seed, q, s):
    """ql_quantize_int8 of contiguous rows: eager's codes and scales; with a
    seed, stochastic rounding on torch's CPU generator stream (eager's draws)."""
    o = _ffi.new("ql_int8_qoptions *")
    o.tensorwise, o.convrot_group, o.sr_stream, o.sr_seed = int(tensorwise), group, C.QL_SR_TORCH_CPU, seed
    return _lib.ql_quantize_int8(CODE[x2.dtype], _ptr(x2), x2.shape[0], k, k, o, _ffi.cast("int8_t *", q.data_ptr()),
                                 k, _ffi.cast("float *", s.data_ptr()))


def quantize_int8_rowwise(x, stochastic_rounding=0):
    _context()
    x2, k = _rows2d(x)
    q = torch.empty(x2.shape, dtype=torch.int8)
    s = torch.empty(x2.shape[0], dtype=torch.float32)
    st = _quantize_int8(x2, k, False, 0, _seed(stochastic_rounding), q, s)
    if st == C.QL_ERR_NONFINITE:
        return _eager().quantize_int8_rowwise(x, stochastic_rounding)
    check(st, "ql_quantize_int8")
    return q.reshape(x.shape), s.reshape(x.shape[:-1] + (1,))


def quantize_int8_tensorwise(x, scale=None, stochastic_rounding=0):
    if scale is not None and not (isinstance(scale, str) and scale == "recalculate"):
        return _eager().quantize_int8_tensorwise(x, scale, stochastic_rounding)  # a given scale: one division
    _context()
    x2, k = _rows2d(x)
    q = torch.empty(x2.shape, dtype=torch.int8)
    s = torch.empty((), dtype=torch.float32)
    st = _quantize_int8(x2, k, True, 0, _seed(stochastic_rounding), q, s)
    if st == C.QL_ERR_NONFINITE:
        return _eager().quantize_int8_tensorwise(x, scale, stochastic_rounding)
    check(st, "ql_quantize_int8")
    return q.reshape(x.shape), s


def quantize_int8_convrot_weight(weight, group_size, stochastic_rounding=0):
    _context()
    w = weight.detach().contiguous()
    n, k = w.shape
    q = torch.empty((n, k), dtype=torch.int8)
    s = torch.empty(n, dtype=torch.float32)
    st = _quantize_int8(w, k, False, group_size, _seed(stochastic_rounding), q, s)
    if st == C.QL_ERR_NONFINITE:
        return _eager().quantize_int8_convrot_weight(weight, group_size, stochastic_rounding)
    check(st, "ql_quantize_int8")
    return q, s.reshape(n, 1)


# ---------------------------------------------------------- INT8 dequantizers

def _dequantize(q, scale, group, out_dtype):
    """fp32(q)·scale (1 scale, or one per row of the 2-D view), un-rotated when
    group > 0, rounded to out_dtype."""
    _context()
    q2 = q.detach().contiguous()
    shape = q2.shape
    k = shape[-1] if q2.dim() else 1
    q2 = q2.reshape(-1, k)
    n = q2.shape[0]
    s = scale.detach().to(torch.float32).contiguous().reshape(-1)
    y = torch.empty(shape, dtype=out_dtype)
    if n and k:
        check(_lib.ql_dequantize(_ffi.cast("int8_t *", q2.data_ptr()), n, k, k, _ffi.cast("float *", s.data_ptr()),
                                 s.numel(), group, CODE[out_dtype], _ptr(y), k), "ql_dequantize")
    return y


def dequantize_int8_simple(q, scale):
    return _dequantize(q, scale, 0, torch.float32)


def dequantize_int8_simple_dtype(q, scale, output_dtype_code):
    return _dequantize(q, scale, 0, DTYPE_OF_CODE[output_dtype_code])


def dequantize_int8_convrot_weight(q, scale, group_size):
    return _dequantize(q, scale, group_size, torch.float32)


def dequantize_int8_convrot_weight_dtype(q, scale, group_size, output_dtype_code):
    return _dequantize(q, scale, group_size, DTYPE_OF_CODE[output_dtype_code])


def dequantize_int8_embedding(q, scale, indices, group_size, output_dtype_code):
    idx = indices.reshape(-1)
    rows = q.index_select(0, idx)
    s = scale.index_select(0, idx) if scale.dim() >= 2 else scale
    y = _dequantize(rows, s, group_size if group_size > 0 else 0, DTYPE_OF_CODE[output_dtype_code])
    return y.reshape(tuple(indices.shape) + (q.shape[-1],))


# ------------------------------------------------------- W4A8 / W6A8 weights

_E4M3 = getattr(torch, "float8_e4m3fn", None)


def quantize_w4a8_int8_weight(weight, group_size=16, convrot_groupsize=256, symmetric=True,
                              scale_dtype=_E4M3, codebook=True, codebook_tensor=None, stochastic_rounding=0,
                              bits=4, scale_search=True):
    _context()
    w = weight.detach().contiguous()
    n, k = w.shape
    p = _ffi.new("ql_wxa8_qparams *")
    use_cb = bits == 4 and symmetric and codebook
    if bits == 6:
        p.mode = C.QL_WXA8_6BIT
    elif use_cb:
        p.mode = C.QL_WXA8_CODEBOOK
    else:
        p.mode = C.QL_WXA8_UNIFORM if symmetric else C.QL_WXA8_ASYM
    p.group, p.convrot_group, p.scale_search = group_size, convrot_groupsize, int(bool(scale_search) and bits == 6)
    cb = None
    if use_cb:
        if codebook_tensor is not None:
            cb = codebook_tensor.detach().to(torch.float32).contiguous()
        else:  # eager's choice: the fixed table, or a Lloyd-Max fit (left to eager: see _caps)
            cb = torch.empty(16, dtype=torch.float32)
            fitted = torch.zeros(1, dtype=torch.int32)
            st = _lib.ql_wxa8_fit_codebook(CODE[w.dtype], _ptr(w), n, k, k, p, _ffi.cast("float *", cb.data_ptr()),
                                           _ffi.cast("int *", fitted.data_ptr()))
            if st != C.QL_OK or int(fitted[0]):
                return _eager().quantize_w4a8_int8_weight(weight, group_size, convrot_groupsize, symmetric,
                                                          scale_dtype, codebook, codebook_tensor,
                                                          stochastic_rounding, bits, scale_search)
        p.codebook = _ffi.cast("float *", cb.data_ptr())
    o = _ffi.new("ql_wxa8_qoptions *")
    o.s_rel_f32 = int(scale_dtype == torch.float32)
    o.sr_stream, o.sr_seed = C.QL_SR_TORCH_CPU, _seed(stochastic_rounding)
    cols = k * bits // 8
    q = torch.empty((n, cols), dtype=torch.int8)
    s_rel = torch.empty((n, k // group_size), dtype=torch.float32 if o.s_rel_f32 else torch.uint8)
    s_ch = torch.empty(n, dtype=torch.float32)
    corr = torch.empty((n, k // group_size), dtype=torch.float32) if p.mode == C.QL_WXA8_ASYM else None
    st = _lib.ql_wxa8_quantize_ex(CODE[w.dtype], _ptr(w), n, k, k, p, o, _ffi.cast("uint8_t *", q.data_ptr()), cols,
                                  _ptr(s_rel), _ffi.cast("float *", s_ch.data_ptr()),
                                  _ffi.cast("float *", corr.data_ptr()) if corr is not None else _ffi.NULL)
    if st == C.QL_ERR_NONFINITE:
        return _eager().quantize_w4a8_int8_weight(weight, group_size, convrot_groupsize, symmetric, scale_dtype,
                                                  codebook, codebook_tensor, stochastic_rounding, bits, scale_search)
    check(st, "ql_wxa8_quantize_ex")
    if not o.s_rel_f32:
        s_rel = s_rel.view(_E4M3)
    if corr is not None:
        corr = corr.t().contiguous().to(weight.dtype)
    return q, s_rel, s_ch, corr, (cb if use_cb else None)


def dequantize_w4a8_int8_weight(qdata, s_rel, s_channel, codebook=None, correction=None, group_size=16,
                                convrot_groupsize=256, output_dtype=torch.bfloat16):
    _context()
    q = qdata.detach().contiguous().view(torch.uint8)
    n, cols = q.shape
    sr = s_rel.detach().contiguous()
    k = sr.shape[1] * group_size
    bits = cols * 8 // k
    w = _ffi.new("ql_wxa8_weight *")
    w.n, w.k, w.bits, w.q, w.ldq = n, k, bits, _ffi.cast("uint8_t *", q.data_ptr()), cols
    w.s_rel_f32 = int(sr.dtype == torch.float32)
    if not w.s_rel_f32:
        sr = sr.view(torch.uint8)
    w.s_rel = _ptr(sr)
    sc = s_channel.detach().to(torch.float32).contiguous()
    w.s_channel = _ffi.cast("float *", sc.data_ptr())
    cb = cr = None
    if codebook is not None:
        cb = codebook.detach().to(torch.float32).contiguous()
        w.codebook = _ffi.cast("float *", cb.data_ptr())
    if correction is not None:
        cr = correction.detach().contiguous()
        if cr.dtype not in CODE:
            cr = cr.float()
        w.correction, w.correction_dtype = _ptr(cr), CODE[cr.dtype]
    w.group, w.convrot_group = group_size, convrot_groupsize
    y = torch.empty((n, k), dtype=output_dtype)
    check(_lib.ql_wxa8_dequantize(w, CODE[output_dtype], _ptr(y), k), "ql_wxa8_dequantize")
    return y
