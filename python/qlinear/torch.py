"""PyTorch modules over qlinear (CPU and CUDA, inference).

    from qlinear.torch import QLinear, quantize_module, load_comfy
    report = quantize_module(model, format="int8-convrot")   # swaps nn.Linear in place
    print(report)
    load_comfy(model, "model_int8_convrot.safetensors")     # ComfyUI INT8 / ConvRot files

QLinear.forward takes tensors of any leading shape in fp32, bf16 or fp16
and returns the input's dtype; the input is read in place through its data
pointer (rows may be strided, the last dimension must be contiguous) and the
packed weight is never touched per call. The thread count follows
torch.get_num_threads() unless a layer was given threads=. A layer made from
an nn.Linear on a GPU (or with device="cuda") is uploaded once and runs on
that GPU's tensors (kind "w8a8"; the CUDA backend), queued on torch's current
stream. Outputs carry no autograd history (inference only).
"""
import re

import torch
from torch import nn

import qlinear as _ql
from ._arrays import torch_codes
from ._context import Context, parse_device
from ._lib import C, QlinearError, check
from ._linear import activation_code, forward_shared_int, torch_fast

__all__ = ["QLinear", "forward_shared", "quantize_module", "load_comfy", "SwapReport"]

_CODE = torch_codes()  # torch dtype -> ql_dtype

_follow_ctx = None  # one context shared by every layer that follows torch's thread count


def _torch_context():
    global _follow_ctx
    if _follow_ctx is None:
        _follow_ctx = Context(torch.get_num_threads())
    return _follow_ctx


class QLinear(nn.Module):
    """An nn.Module holding a qlinear layer (see qlinear.Linear)."""

    def __init__(self, linear, follow_torch_threads=True, activation=None):
        """Wrap a qlinear.Linear; with follow_torch_threads, every call first sets
        its context's thread count to torch.get_num_threads(). activation="gelu":
        the module computes gelu(linear(x)) (torch.nn.GELU(), erf form) in the
        layer's epilogue, no extra pass over the output."""
        super().__init__()
        if not isinstance(linear, _ql.Linear):
            raise TypeError(f"QLinear wraps a qlinear.Linear, not {type(linear).__name__}; "
                            "use QLinear.from_linear(nn.Linear)")
        self.in_features, self.out_features = linear.k, linear.n
        self.linear = linear
        self._follow = follow_torch_threads and not linear._cuda
        self._ptr, self._fwd_int, self._null = linear._ptr, linear._fwd_int, linear._null
        self.activation = None if activation in (None, "none") else activation
        self._epi = linear._null if activation_code(activation) == C.QL_ACTIVATION_NONE else linear._epi_gelu

    @classmethod
    def from_linear(cls, linear, format="int8-convrot", kind="w8a8", group=256, threads=None, activation=None,
                    device=None):
        """Quantize an nn.Linear's weight (fp32/bf16/fp16, read in place) into a
        QLinear; the bias is kept in its dtype. The nn.Linear is not changed.
        activation="gelu": the QLinear computes gelu(linear(x)) (fused, CPU and CUDA).
        device: where the layer runs, by default the nn.Linear's device (a GPU
        weight is copied to the host once, quantized there and uploaded)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear takes an nn.Linear, not {type(linear).__name__}")
        w = linear.weight.detach()
        if not w.is_contiguous():
            raise QlinearError(f"qlinear: weight of {linear} is not contiguous", "invalid argument")
        b = linear.bias.detach() if linear.bias is not None else None
        dev = parse_device(w.device if device is None else device)
        ctx = None if dev != "cpu" or threads is not None else _torch_context()
        lin = _ql.Linear.from_weight(w, format=format, bias=b, group=group, kind=kind, threads=threads,
                                     _context=ctx, device=dev)
        return cls(lin, threads is None, activation)

    def _apply(self, fn, *args, **kwargs):
        """model.cuda() / .to(device) / .half(): a QLinear takes any input dtype,
        and its packed layer cannot change device (its codes live in the
        library, in that device's layout) — a move is refused here, with what
        to do, rather than at the first forward."""
        probe = fn(torch.empty(0, device=self.linear.device))  # where the layer is: a dtype-only fn keeps it there
        want = parse_device(probe.device) if probe.device.type in ("cpu", "cuda") else str(probe.device)
        if want != self.linear.device:
            raise QlinearError(f"qlinear: a QLinear on {self.linear.device} cannot move to {probe.device}: "
                               "move the float model first, then quantize it there (model.to(device); "
                               "quantize_module(model)), or build the layer with device=", "invalid argument")
        return super()._apply(fn, *args, **kwargs)

    def extra_repr(self):
        lin = self.linear
        g = f", group={lin.group}" if lin.group else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={lin.has_bias}, "
                f"format={lin.format}{g}, kind={lin.kind}" + (f", activation={self.activation}" if self.activation else ""))

    def forward(self, x, out=None, residual=None, residual_scale=None):
        """y for x of any leading shape, in x's dtype. out: a tensor of the output's
        shape to write into and return, its dtype the output's (a reused buffer:
        no fresh output memory per call; checked, and not overlapping x).
        residual (the output's shape) and residual_scale (N elements, e.g. a
        [1, 1, N] gate), in the output's dtype: returns residual +
        residual_scale ⊙ y, computed in the layer's epilogue (in fp32 the
        product and the sum each rounded, as PyTorch's `residual + gate * y`;
        for a 16-bit output one rounding at the end)."""
        # The hot path: no per-call tables, shape walks or casts (a dict
        # lookup, a few attribute reads, torch.empty (or out) and the C call).
        if residual is not None or residual_scale is not None:
            if self._follow:
                _follow_threads(self.linear._ctx)
            if out is None and type(x) is _Tensor:
                y = _forward_fast_residual(self, x, residual, residual_scale)
                if y is not None:
                    return y
            for what, t in (("x", x), ("residual", residual), ("residual_scale", residual_scale), ("out", out)):
                if t is not None and not isinstance(t, torch.Tensor):
                    raise TypeError(f"QLinear: {what} must be a torch tensor, not {type(t).__name__}")
            return self.linear._forward_any(x, None, out, residual, residual_scale, self.activation)
        if type(x) is _Tensor:
            y = _forward_fast(self.linear, x, self._follow, out, self._epi)
            if y is not None:
                return y
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"QLinear takes a torch tensor, not {type(x).__name__}")
        if out is not None and not isinstance(out, torch.Tensor):
            raise TypeError(f"QLinear: out must be a torch tensor, not {type(out).__name__}")
        if self._follow:
            _follow_threads(self.linear._ctx)
        return self.linear._forward_any(x, None, out, activation=self.activation)


def _follow_threads(ctx):
    t = torch.get_num_threads()
    if t != ctx.threads:
        ctx.set_threads(t)


def _forward_fast(lin, x, follow=False, out=None, epi=None):
    """y for a contiguous CPU tensor of a dtype the library takes, whose last
    dimension is K (written into out if that is a contiguous CPU tensor of the
    output's shape and x's dtype, apart from x); None for anything else (the
    general path then decides, and checks)."""
    if lin._cuda:
        return _forward_fast_cuda(lin, x, out, epi)
    code = _CODE.get(x.dtype)
    if code is None or not x.is_cpu or x.layout is not _strided or not x.is_contiguous():
        return None
    shape = x.shape
    k = lin.k
    if not shape or shape[-1] != k:
        return None
    if follow:
        _follow_threads(lin._ctx)
    last = lin._last_shapes  # (input shape, output shape) of the previous call: torch.Size arithmetic costs ~1 µs
    if shape != last[0]:
        last = lin._last_shapes = (shape, shape[:-1] + (lin.n,))
    if out is None:
        y = torch.empty(last[1], dtype=x.dtype)
    elif (type(out) is _Tensor and out.dtype is x.dtype and out.is_cpu and out.layout is _strided
          and out.is_contiguous() and out.shape == last[1]):
        xp, yp, nb = x.data_ptr(), out.data_ptr(), x.element_size()
        if xp < yp + out.numel() * nb and yp < xp + x.numel() * nb:
            return None  # overlapping: the general path says so
        y = out
    else:
        return None
    m = x.numel() // k
    if m:
        st = lin._fwd_int(lin._ptr, x.data_ptr(), code, m, k, y.data_ptr(), code, lin.n, lin._null if epi is None else epi)
        if st:
            check(st, "ql_linear_forward")
    return y


def _forward_fast_cuda(lin, x, out, epi):
    """_forward_fast for a layer on a GPU: x contiguous on the layer's device;
    queued on torch's current stream there."""
    code = _CODE.get(x.dtype)
    tdev = lin.__dict__.get("_tdev")
    if tdev is None:
        tdev = lin._tdev = torch.device(lin.device)
    if code is None or x.device != tdev or x.layout is not _strided or not x.is_contiguous() or out is not None:
        return None
    shape = x.shape
    if not shape or shape[-1] != lin.k:
        return None
    last = lin._last_shapes
    if shape != last[0]:
        last = lin._last_shapes = (shape, shape[:-1] + (lin.n,))
    y = torch.empty(last[1], dtype=x.dtype, device=tdev)
    m = x.numel() // lin.k
    if m:
        if _raw_stream(tdev.index) != lin._ctx.stream:
            lin._use_current_stream()
        st = lin._fwd_int(lin._ptr, x.data_ptr(), code, m, lin.k, y.data_ptr(), code, lin.n,
                          lin._null if epi is None else epi)
        if st:
            check(st, "ql_linear_forward")
    return y


def forward_shared(layers, x):
    """[layer(x) for layer in layers] for layers that read one input — q, k and v
    of an attention block, a DiT block's modulation projections. QLinear
    layers on one GPU (one context, kind, K and rotation group; no activation,
    no hooks) share one rotation and quantization of x
    (ql_linear_forward_shared): the same outputs, bit for bit, one prologue
    instead of one per layer (on the CPU the C library runs them one after
    another). Anything else (other modules, hooks, layers that do not match)
    runs the layers one by one through their modules."""
    ys = _forward_shared_cuda(layers, x)
    return ys if ys is not None else [layer(x) for layer in layers]


def _forward_shared_cuda(layers, x):
    if type(x) is not _Tensor or not 2 <= len(layers) <= _SHARED_MAX:
        return None
    lins = []
    for q in layers:
        if type(q) is not QLinear or q.activation is not None or q._forward_hooks or q._forward_pre_hooks:
            return None
        lins.append(q.linear)
    l0 = lins[0]
    if any(l._ctx is not l0._ctx or l.k != l0.k or l.kind != l0.kind or l.group != l0.group
                           for l in lins):
        return None
    code = _CODE.get(x.dtype)
    tdev = torch.device(l0.device)
    shape = x.shape
    if (code is None or x.device != tdev or x.layout is not _strided or not x.is_contiguous() or not shape
            or shape[-1] != l0.k):
        return None
    ys = [torch.empty(shape[:-1] + (l.n,), dtype=x.dtype, device=tdev) for l in lins]
    m = x.numel() // l0.k
    if m:
        if l0._cuda:
            if _raw_stream(tdev.index) != l0._ctx.stream:
                l0._use_current_stream()
        elif layers[0]._follow:
            _follow_threads(l0._ctx)
        c = len(lins)
        for l in lins:
            if l._addr is None:
                l._addr = int(l._ffi.cast("uintptr_t", l._ptr))
        # layer pointers, output pointers, output row strides: one host array
        arr = torch.tensor([l._addr for l in lins] + [y.data_ptr() for y in ys] + [l.n for l in lins],
                           dtype=torch.int64)
        base = arr.data_ptr()
        # epis NULL: no epilogue
        st = forward_shared_int()(base, c, x.data_ptr(), code, m, l0.k, base + 8 * c, code, base + 16 * c, 0)
        if st:
            check(st, "ql_linear_forward_shared")
    return ys


_SHARED_MAX = C.QL_SHARED_MAX


def _forward_fast_residual(q, x, res, rs):
    """residual + residual_scale ⊙ q(x) for contiguous tensors of x's dtype on
    the layer's device, shapes as the general path wants them, into a fresh
    output (so nothing overlaps); the layer's ql_epilogue is reused (filled per
    call: read during the call only). None for anything else."""
    lin = q.linear
    code = _CODE.get(x.dtype)
    if (code is None or type(res) is not _Tensor or type(rs) is not _Tensor or res.dtype is not x.dtype
            or rs.dtype is not x.dtype or x.layout is not _strided or res.layout is not _strided
            or rs.layout is not _strided or not (x.is_contiguous() and res.is_contiguous() and rs.is_contiguous())):
        return None
    dev = x.device
    if res.device != dev or rs.device != dev or (dev.type != "cpu" if not lin._cuda else str(dev) != lin.device):
        return None
    shape, k, n = x.shape, lin.k, lin.n
    if not shape or shape[-1] != k or res.shape != shape[:-1] + (n,) or rs.numel() != n or (rs.dim() and rs.shape[-1] != n):
        return None
    y = torch.empty(res.shape, dtype=x.dtype, device=dev)
    m = x.numel() // k
    if m:
        ffi = lin._ffi
        e = lin.__dict__.get("_epi_res")
        if e is None:
            e = lin._epi_res = ffi.new("ql_epilogue *")
            e.activation = activation_code(q.activation)
        e.residual, e.ld_residual, e.residual_scale = ffi.cast("void *", res.data_ptr()), n, ffi.cast("void *", rs.data_ptr())
        if lin._cuda and _raw_stream(dev.index) != lin._ctx.stream:
            lin._use_current_stream()
        st = lin._fwd_int(lin._ptr, x.data_ptr(), code, m, k, y.data_ptr(), code, n, e)
        if st:
            check(st, "ql_linear_forward")
    return y


def _raw_stream(index):
    """torch's current cudaStream_t on device `index`, as an int."""
    f = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return f(index) if f is not None else torch.cuda.current_stream(index).cuda_stream


_Tensor, _strided = torch.Tensor, torch.strided
torch_fast[:] = [_Tensor, _forward_fast]


class SwapReport:
    """What quantize_module / load_comfy did: `swapped` module names,
    `skipped` (name, reason) pairs, `fused` names of swapped linears that took
    over the nn.GELU after them (quantize_module(fuse_gelu=True)), and for
    load_comfy `loaded` float tensors and `unused` file tensors."""

    def __init__(self):
        self.swapped, self.skipped, self.loaded, self.unused, self.fused = [], [], [], [], []

    def __repr__(self):
        lines = [f"qlinear: swapped {len(self.swapped)} linear layers"
                 + (f", loaded {len(self.loaded)} float tensors" if self.loaded else "")
                 + (f", {len(self.fused)} with their GELU fused" if self.fused else "")
                 + (f", skipped {len(self.skipped)}" if self.skipped else "")
                 + (f", {len(self.unused)} file tensors unused" if self.unused else "")]
        lines += [f"  skipped {n}: {why}" for n, why in self.skipped]
        return "\n".join(lines)


def _set_module(model, name, new):
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def quantize_module(model, format="int8-convrot", include=None, exclude=None, kind="w8a8", group=256,
                    threads=None, fuse_gelu=False):
    """Swap every eligible nn.Linear of `model` for a QLinear, in place.

    Eligible: an nn.Linear whose weight is an fp32/bf16/fp16 tensor (on the
    CPU, or on a GPU for kind "w8a8": the layer then runs there) and, for
    "int8-convrot", whose in_features is a multiple of `group`; with `include`
    (a regex, re.search on the module's qualified name) only matching names,
    with `exclude` none of the matching ones. fuse_gelu: a swapped Linear
    followed directly by an nn.GELU(approximate="none") in an nn.Sequential
    computes the GELU in its epilogue and the GELU module becomes
    nn.Identity (results then differ from PyTorch's GELU by its own fp32
    error, not more; off by default). Returns a SwapReport."""
    inc = re.compile(include) if include else None
    exc = re.compile(exclude) if exclude else None
    rep = SwapReport()
    todo = []
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or not name:
            continue
        if inc and not inc.search(name):
            continue
        if exc and exc.search(name):
            rep.skipped.append((name, f"excluded by {exclude!r}"))
            continue
        w = mod.weight
        if w.device.type not in ("cpu", "cuda") or (w.device.type == "cuda" and kind != "w8a8"):
            rep.skipped.append((name, f"weight on {w.device}" + (f" (kind {kind} runs on the CPU only)"
                                                                  if w.device.type == "cuda" else "")))
        elif w.dtype not in _CODE:
            rep.skipped.append((name, f"weight dtype {w.dtype}"))
        elif format == "int8-convrot" and mod.in_features % group:
            rep.skipped.append((name, f"in_features {mod.in_features} is not a multiple of the ConvRot group {group}"))
        else:
            todo.append((name, mod))
    gelu_after = {}  # name of a Linear -> name of the nn.GELU right after it
    if fuse_gelu:
        for sname, seq in model.named_modules():
            if isinstance(seq, nn.Sequential):
                kids = list(seq.named_children())
                for (a, ma), (b, mb) in zip(kids, kids[1:]):
                    if (isinstance(ma, nn.Linear) and type(mb) is nn.GELU
                            and getattr(mb, "approximate", "none") == "none"):
                        pre = sname + "." if sname else ""
                        gelu_after[pre + a] = pre + b
    for name, mod in todo:
        act = "gelu" if name in gelu_after and mod.weight.device.type == "cpu" else None
        _set_module(model, name, QLinear.from_linear(mod, format=format, kind=kind, group=group, threads=threads,
                                                     activation=act))
        rep.swapped.append(name)
        if act:
            _set_module(model, gelu_after[name], nn.Identity())
            rep.fused.append(name)
    return rep


def _tensor_from_numpy(a, st_dtype):
    t = torch.from_numpy(a)
    if st_dtype == "BF16":
        t = t.view(torch.int16).view(torch.bfloat16)
    return t


def load_comfy(model, path, prefix=None, kind="w8a8", threads=None, strict=False):
    """Load a ComfyUI INT8 / INT8-ConvRot safetensors file into `model`.

    Every quantized layer `P` of the file replaces the model's nn.Linear (or
    QLinear) named `P` (after removing `prefix`, by default the part before the
    first name the model has, e.g. "model.diffusion_model.") with a QLinear
    packed from the file (on the device of the module it replaces: a model
    on a GPU gets GPU layers); every other tensor whose name and shape match a
    parameter or buffer of the model is copied into it. Shapes must agree.
    strict=True raises when a quantized layer has no module in the model.
    Returns a SwapReport (swapped, loaded, skipped, unused)."""
    modules = dict(model.named_modules())
    params = dict(model.state_dict(keep_vars=True))
    rep = SwapReport()
    with _ql.Checkpoint(path) as ck:
        layers = ck.layers()
        names = [t.name for t in ck.tensors()]
        if prefix is None:
            prefix = _guess_prefix([l.name for l in layers] + names, modules, params)
        layer_tensors = set()
        for l in layers:
            for suffix in (".weight", ".weight_scale", ".bias", ".comfy_quant", ".input_scale"):
                layer_tensors.add(l.name + suffix)
            mname = l.name[len(prefix):] if l.name.startswith(prefix) else None
            mod = modules.get(mname) if mname else None
            if mod is None or not isinstance(mod, (nn.Linear, QLinear)):
                why = f"no nn.Linear called '{mname}' in the model"
                if strict:
                    raise QlinearError(f"{path}: layer '{l.name}': {why}", "invalid argument")
                rep.skipped.append((l.name, why))
                continue
            if (mod.out_features, mod.in_features) != (l.n, l.k):
                raise QlinearError(f"{path}: layer '{l.name}' is {l.n}x{l.k} but the model's '{mname}' is "
                                   f"{mod.out_features}x{mod.in_features}", "invalid argument")
            if not l.supported:
                rep.skipped.append((l.name, f"format {l.format}: {l.reason}"))
                continue
            dev = parse_device(mod.weight.device if isinstance(mod, nn.Linear) else mod.linear.device)
            ctx = _torch_context() if threads is None and dev == "cpu" else None
            lin = _ql.Linear.from_checkpoint(ck, l.name, kind=kind, threads=threads, _context=ctx, device=dev)
            _set_module(model, mname, QLinear(lin, threads is None))
            rep.swapped.append(mname)
        with torch.no_grad():
            for info in ck.tensors():
                if info.name in layer_tensors:
                    continue
                key = info.name[len(prefix):] if info.name.startswith(prefix) else None
                dst = params.get(key) if key else None
                if dst is None or not isinstance(dst, torch.Tensor) or _owner_swapped(key, rep.swapped):
                    rep.unused.append(info.name)
                    continue
                if tuple(dst.shape) != info.shape:
                    raise QlinearError(f"{path}: tensor '{info.name}' has shape {list(info.shape)} but the model's "
                                       f"'{key}' has {list(dst.shape)}", "invalid argument")
                dst.copy_(_tensor_from_numpy(ck.tensor(info.name), info.dtype).to(dst.dtype))
                rep.loaded.append(key)
    return rep


def _owner_swapped(key, swapped):
    owner = key.rpartition(".")[0]
    return owner in swapped


def _guess_prefix(file_names, modules, params):
    """The prefix to drop from the file's names: the shortest one after which
    a name of the file is a module or parameter of the model."""
    known = set(modules) | set(params)
    best = None
    for n in file_names:
        parts = n.split(".")
        for i in range(len(parts)):
            if ".".join(parts[i:]) in known:
                p = ".".join(parts[:i]) + ("." if i else "")
                if best is None or len(p) < len(best):
                    best = p
                break
    return best or ""
