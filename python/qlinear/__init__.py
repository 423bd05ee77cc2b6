"""qlinear for Python: quantized linear layers in ComfyUI's INT8 / INT8-ConvRot
formats, over the C library libqlinear (pure Python, cffi in ABI mode).

    import qlinear
    with qlinear.Checkpoint("model.safetensors") as ck:
        print(ck.layers())
        lin = qlinear.Linear.from_checkpoint(ck, "blocks.0.attn.q")
    y = lin.forward(x)                    # numpy fp32/fp16, bf16 as uint16, or torch CPU tensors
    lin = qlinear.Linear.from_weight(w, format="int8-convrot")
    qlinear.quantize_file("in.safetensors", "out.safetensors", format="int8-convrot")

bf16 arrays in numpy are uint16 arrays holding the bit patterns. Errors from
the library are raised as QlinearError with its message. PyTorch modules are
in qlinear.torch; the end-to-end benchmark is `python3 -m qlinear.e2e`.
"""
import os
import sys
from collections import namedtuple

import numpy as np

from ._lib import QlinearError, library_path, load

__all__ = ["Checkpoint", "Linear", "QlinearError", "quantize_file", "version", "library_path", "TensorInfo",
           "LayerInfo"]

# ql_dtype values (qlinear.h) and their names
_F32, _F16, _BF16 = 0, 1, 2
_DT_NAMES = {_F32: "fp32", _F16: "fp16", _BF16: "bf16"}
_DT_ALIASES = {"fp32": _F32, "float32": _F32, "float": _F32, "fp16": _F16, "float16": _F16, "half": _F16,
               "bf16": _BF16, "bfloat16": _BF16}
_NP_OF = {_F32: np.dtype(np.float32), _F16: np.dtype(np.float16), _BF16: np.dtype(np.uint16)}
_NP_CODES = {v: k for k, v in _NP_OF.items()}  # native byte order only: '>f4' is not a key

# Linear.forward's fast path for torch tensors: (torch.Tensor, fn(linear, x) -> y or
# None), filled in when qlinear.torch is imported; numpy users never import torch.
_torch_fast = [None, None]


def _fast_fn(name, signature):
    """lib.<name> cast to `signature` (pointers declared uintptr_t, which every
    ABI cffi runs on passes as it passes a pointer: callers pass torch's
    data_ptr() integers, no ffi.cast per call); made once per process."""
    if name not in _fast_fns:
        ffi, lib = load()
        _fast_fns[name] = ffi.cast(signature, getattr(lib, name))
    return _fast_fns[name]


def _forward_int():
    """ql_linear_forward taking x and y as integers."""
    return _fast_fn("ql_linear_forward", "ql_status (*)(ql_linear *, uintptr_t, ql_dtype, int64_t, int64_t, uintptr_t, "
                                         "ql_dtype, int64_t, const ql_epilogue *)")


def _forward_shared_int():
    """ql_linear_forward_shared with every pointer an integer: the layer, output
    and row-stride arrays are host buffers the caller fills."""
    return _fast_fn("ql_linear_forward_shared", "ql_status (*)(uintptr_t, int, uintptr_t, ql_dtype, int64_t, int64_t, "
                                                "uintptr_t, ql_dtype, uintptr_t, uintptr_t)")


_fast_fns = {}

_KINDS = {"w8a8": 0, "weight-only": 1, "dense": 2, "dequant": 3}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}

TensorInfo = namedtuple("TensorInfo", "name dtype shape bytes")
LayerInfo = namedtuple("LayerInfo", "name format convrot group n k bytes has_bias supported reason")


def version():
    """Version of the loaded libqlinear ("MAJOR.MINOR.PATCH")."""
    ffi, lib = load()
    return ffi.string(lib.ql_version()).decode()


def _check(st, what=""):
    if st:
        from ._lib import check
        check(st, what)


def _dtype_code(d, what="dtype"):
    """A ql_dtype from "bf16"/np.float16/torch.float32/..."""
    if isinstance(d, str):
        if d.lower() in _DT_ALIASES:
            return _DT_ALIASES[d.lower()]
    elif _is_torch_dtype(d):
        import torch
        m = {torch.float32: _F32, torch.float16: _F16, torch.bfloat16: _BF16}
        if d in m:
            return m[d]
    else:
        try:
            nd = np.dtype(d)
        except TypeError:
            nd = None
        for code, npd in _NP_OF.items():
            if nd == npd:
                return code
    raise TypeError(f"qlinear: {what} {d!r} is not one of fp32, fp16, bf16")


def _is_torch_dtype(d):
    return type(d).__name__ == "dtype" and type(d).__module__ == "torch"


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _parse_device(device):
    """"cpu" or "cuda:N" from None, "cpu", "cuda", "cuda:N" or a torch.device
    ("cuda" alone: torch's current device when torch is loaded, else 0)."""
    if device is None:
        return "cpu"
    s = str(device)
    if s == "cpu":
        return s
    if s == "cuda" or (s.startswith("cuda:") and s[5:].isdigit()):
        if s == "cuda":
            torch = sys.modules.get("torch")
            idx = torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else 0
            return f"cuda:{idx}"
        return s
    raise QlinearError(f"qlinear: device {device!r} is not 'cpu', 'cuda' or 'cuda:N'", "invalid argument")


class _Context:
    """A ql_context: thread count and ISA, or a CUDA device and the stream its
    calls are queued on. The context outlives its linears."""

    def __init__(self, threads=None, device="cpu"):
        ffi, lib = load()
        p = ffi.new("ql_context **")
        _check(lib.ql_context_create(p), "ql_context_create")
        self._lib = lib
        self.ptr = ffi.gc(p[0], lib.ql_context_destroy)
        self.threads = lib.ql_context_threads(self.ptr)
        self.device, self.stream, self.torch_stream = device, None, None
        if device != "cpu":
            _check(lib.ql_context_set_device(self.ptr, lib.QL_DEVICE_CUDA, int(device[5:])),
                   "ql_context_set_device")
        if threads is not None:
            self.set_threads(threads)

    def use_stream(self, stream):
        """Queue this context's next calls on `stream` (a cudaStream_t as an int; 0: the default stream)."""
        if stream != self.stream:
            _check(self._lib.ql_context_set_cuda_stream(self.ptr, stream or None), "ql_context_set_cuda_stream")
            self.stream = stream

    def set_threads(self, threads):
        if not isinstance(threads, int) or isinstance(threads, bool):
            raise TypeError(f"qlinear: threads must be an int, not {type(threads).__name__}")
        _check(self._lib.ql_context_set_threads(self.ptr, threads), "ql_context_set_threads")
        self.threads = threads

    @property
    def isa(self):
        ffi, lib = load()
        return ffi.string(lib.ql_isa_name(lib.ql_context_isa(self.ptr))).decode()


_default_ctx = None
_device_ctx = {}  # "cuda:N" -> the context every layer on that device shares


def _default_context(device="cpu"):
    global _default_ctx
    if device != "cpu":
        if device not in _device_ctx:
            _device_ctx[device] = _Context(device=device)
        return _device_ctx[device]
    if _default_ctx is None:
        _default_ctx = _Context()
    return _default_ctx


# ------------------------------------------------------------------ checkpoints

class Checkpoint:
    """An open safetensors checkpoint (memory-mapped, validated on open).

    `layers()` lists the quantized layers, `tensors()` every tensor, `tensor(name)`
    returns one as a numpy array (a copy; bf16 as uint16), `metadata()` the
    __metadata__ dict. Use as a context manager, or call close()."""

    _NP_ST = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32,
              "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
              "F8_E8M0": np.uint8, "F8_E4M3FNUZ": np.uint8, "F8_E5M2FNUZ": np.uint8}

    def __init__(self, path):
        ffi, lib = load()
        self._ffi, self._lib = ffi, lib
        self.path = os.fspath(path)
        p = ffi.new("ql_checkpoint **")
        _check(lib.ql_checkpoint_open(self.path.encode(), p), "ql_checkpoint_open")
        self._ptr = p[0]

    @property
    def ptr(self):
        if self._ptr is None:
            raise QlinearError(f"qlinear: checkpoint {self.path} is closed")
        return self._ptr

    def close(self):
        if self._ptr is not None:
            self._lib.ql_checkpoint_close(self._ptr)
            self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_ptr", None) is not None:
            self.close()

    def __repr__(self):
        state = "closed" if self._ptr is None else f"{len(self.tensors())} tensors"
        return f"<qlinear.Checkpoint {self.path!r} ({state})>"

    @property
    def file_bytes(self):
        return int(self._lib.ql_checkpoint_file_bytes(self.ptr))

    def _info(self, i):
        t = self._ffi.new("ql_tensor_info *")
        _check(self._lib.ql_checkpoint_tensor(self.ptr, i, t))
        return t

    def _tensor_info(self, t):
        ffi, lib = self._ffi, self._lib
        return TensorInfo(ffi.string(t.name).decode(), ffi.string(lib.ql_st_dtype_name(t.dtype)).decode(),
                          tuple(t.shape[j] for j in range(t.ndim)), int(t.bytes))

    def tensors(self):
        """Every tensor, in header order: TensorInfo(name, dtype, shape, bytes)."""
        return [self._tensor_info(self._info(i)) for i in range(self._lib.ql_checkpoint_tensor_count(self.ptr))]

    def metadata(self):
        ffi, lib = self._ffi, self._lib
        k, v = ffi.new("char **"), ffi.new("char **")
        out = {}
        for i in range(lib.ql_checkpoint_metadata_count(self.ptr)):
            _check(lib.ql_checkpoint_metadata(self.ptr, i, k, v))
            out[ffi.string(k[0]).decode()] = ffi.string(v[0]).decode()
        return out

    def layers(self):
        """The quantized layers: LayerInfo(name, format, convrot, group, n, k, bytes,
        has_bias, supported, reason). `bytes` counts every tensor of the layer."""
        ffi, lib = self._ffi, self._lib
        out = []
        li = ffi.new("ql_layer_info *")
        for i in range(lib.ql_checkpoint_layer_count(self.ptr)):
            _check(lib.ql_checkpoint_layer(self.ptr, i, li))
            nbytes = sum(int(self._info(j).bytes) for j in (li.weight, li.weight_scale, li.bias, li.comfy_quant)
                         if j >= 0)
            out.append(LayerInfo(ffi.string(li.prefix).decode(), ffi.string(li.format).decode(), bool(li.convrot),
                                 int(li.convrot_group) if li.convrot else 0, int(li.n), int(li.k), nbytes,
                                 li.bias >= 0, bool(li.supported),
                                 ffi.string(li.unsupported_reason).decode() if li.unsupported_reason else None))
        return out

    def tensor(self, name):
        """One tensor as a numpy array (a copy). bf16 comes as uint16 bit
        patterns, float8 as uint8; 4/6-bit and complex dtypes are refused."""
        ffi, lib = self._ffi, self._lib
        i = lib.ql_checkpoint_find(self.ptr, name.encode())
        if i < 0:
            raise QlinearError(f"{self.path}: no tensor '{name}'", "invalid argument")
        t = self._info(i)
        info = self._tensor_info(t)
        npd = self._NP_ST.get(info.dtype)
        if npd is None:
            raise QlinearError(f"{self.path}: tensor '{name}' has dtype {info.dtype}, which numpy cannot hold",
                               "unsupported")
        buf = ffi.buffer(t.data, info.bytes)
        return np.frombuffer(buf, dtype=npd).reshape(info.shape).copy()


# ------------------------------------------------------------------ linear layers

def _array_view(x, what, device="cpu"):
    """(pointer, ql_dtype, shape, strides in elements) of a numpy array or a CPU
    torch tensor (for a layer on a GPU: a torch tensor on that `device`),
    without copying; TypeError/QlinearError where the library cannot take it
    as it is."""
    if _is_torch(x):
        if str(x.device) != device and not (device == "cpu" and x.device.type == "cpu"):
            raise QlinearError(f"qlinear: {what} is on {x.device} but the layer is on {device}: move it with "
                               f".to('{device}')" + (", or create the layer there (device=)" if device == "cpu" else ""),
                               "invalid argument")
        if x.is_sparse or x.is_quantized or getattr(x, "is_mkldnn", False):
            raise TypeError(f"qlinear: {what} must be a dense strided tensor, not {x.layout}")
        code = _dtype_code(x.dtype, f"{what} dtype")
        return x.data_ptr(), code, tuple(x.shape), tuple(x.stride())
    if isinstance(x, np.ndarray):
        if device != "cpu":
            raise TypeError(f"qlinear: the layer is on {device}: {what} must be a torch tensor there, not a numpy array")
        if not x.dtype.isnative:
            raise TypeError(f"qlinear: {what} has non-native byte order {x.dtype}")
        if x.dtype not in (np.float32, np.float16, np.uint16):
            raise TypeError(f"qlinear: {what} dtype {x.dtype} is not float32, float16 or uint16 (bf16 bits)")
        ptr = x.__array_interface__["data"][0]
        isz = x.dtype.itemsize
        if ptr % isz or any(s % isz for s in x.strides):
            raise QlinearError(f"qlinear: {what} is not aligned to its {isz}-byte elements", "invalid argument")
        return ptr, _DT_ALIASES[{"float32": "fp32", "float16": "fp16", "uint16": "bf16"}[x.dtype.name]], \
            x.shape, tuple(s // isz for s in x.strides)
    raise TypeError(f"qlinear: {what} must be a numpy array or a torch tensor, not {type(x).__name__}")


def _rows(shape, strides, k, what):
    """Leading dimensions as M rows of a fixed stride: (m, ld)."""
    if len(shape) == 0:
        raise QlinearError(f"qlinear: {what} is a scalar; expected [..., {k}]", "invalid argument")
    if shape[-1] != k:
        raise QlinearError(f"qlinear: {what} has shape {list(shape)}, its last dimension must be K = {k}",
                           "invalid argument")
    m = 1
    for s in shape[:-1]:
        m *= s
    if m == 0:
        return 0, k
    if k > 1 and strides[-1] != 1:
        raise QlinearError(f"qlinear: {what} has strides {list(strides)}: its last dimension must be contiguous "
                           "(make a contiguous copy first)", "invalid argument")
    # Walk the leading dims from the innermost: each must step by the next one's span.
    lead = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    ld = lead[-1][1] if lead else k
    span = ld
    for n, s in reversed(lead):
        if s != span:
            raise QlinearError(f"qlinear: {what} has shape {list(shape)} and strides {list(strides)}: its rows are "
                               "not evenly spaced (make a contiguous copy first)", "invalid argument")
        span = s * n
    if ld < k:
        raise QlinearError(f"qlinear: {what} rows overlap (row stride {ld} < K = {k})", "invalid argument")
    return m, ld


class Linear:
    """A qlinear layer: the weight packed once for this CPU, run by forward().

    kind: "w8a8" (int8 weights, activations quantized per row: the fast path),
    "weight-only" (int8 codes resident, float activations), "dequant"
    (expand the weight on every call; a baseline), "dense" (float weights)."""

    def __init__(self, ptr, ctx, n, k, kind, fmt, group, has_bias):
        self._ptr, self._ctx = ptr, ctx
        self.device = ctx.device  # "cpu" or "cuda:N"
        self._cuda = self.device != "cpu"
        self._ffi, self._lib = load()
        self.n, self.k, self.kind, self.format, self.group, self.has_bias = n, k, kind, fmt, group, has_bias
        # Per-call constants, bound once (the M = 1 call costs a few µs in C).
        self._fwd, self._fwd_int = self._lib.ql_linear_forward, _forward_int()
        self._addr = None  # the ql_linear's address as an integer (shared forwards), set with the pointer
        self._from_buffer, self._null = self._ffi.from_buffer, self._ffi.NULL
        self._last_shapes = ((), ())
        self._epi_gelu = self._ffi.new("ql_epilogue *")  # activation only, for the fast paths
        self._epi_gelu.activation = _ACTIVATIONS["gelu"]

    # -- construction
    @classmethod
    def _create(cls, desc, ctx, threads, fmt, group, has_bias, device=None):
        ffi, lib = load()
        device = _parse_device(device)
        if device != "cpu" and threads is not None:
            raise QlinearError(f"qlinear: threads= is for CPU layers; this one is on {device}", "invalid argument")
        if ctx is None:
            ctx = _default_context(device) if threads is None else _Context(threads)
        elif ctx.device != device and device != "cpu":
            raise QlinearError(f"qlinear: the context is on {ctx.device}, not {device}", "invalid argument")
        p = ffi.new("ql_linear **")
        _check(lib.ql_linear_create(ctx.ptr, desc, p), "ql_linear_create")
        return cls(ffi.gc(p[0], lib.ql_linear_destroy), ctx, int(desc.n), int(desc.k), _KIND_NAMES[desc.kind], fmt,
                   group, has_bias)

    @classmethod
    def from_checkpoint(cls, checkpoint, name, kind=None, threads=None, _context=None, device=None):
        """Layer `name` (a prefix such as "blocks.0.attn.q") of a checkpoint (a
        path or an open Checkpoint). Quantized layers run as kind "w8a8" (the
        default), "weight-only" or "dequant"; float layers as "dense".
        device="cuda[:N]": the layer is uploaded to that GPU (kind "w8a8" only)
        and runs on torch tensors there."""
        if not isinstance(checkpoint, Checkpoint):
            with Checkpoint(checkpoint) as ck:
                return cls.from_checkpoint(ck, name, kind, threads, _context, device)
        ffi, lib = load()
        if kind is None:
            prefix = name[:-7] if name.endswith(".weight") else name
            kind = "w8a8" if lib.ql_checkpoint_find_layer(checkpoint.ptr, prefix.encode()) >= 0 else "dense"
        kcode = _kind_code(kind)
        desc = ffi.new("ql_linear_desc *")
        _check(lib.ql_checkpoint_linear_desc(checkpoint.ptr, name.encode(), kcode, desc))
        if desc.kind == _KINDS["dense"]:
            fmt, group, has_bias = "float", 0, desc.bias != ffi.NULL
        else:
            group = int(desc.int8.convrot_group)
            fmt, has_bias = ("int8-convrot" if group else "int8"), desc.int8.bias != ffi.NULL
        return cls._create(desc, _context, threads, fmt, group, has_bias, device)

    @classmethod
    def from_weight(cls, w, format="int8-convrot", bias=None, group=256, kind="w8a8", threads=None, _context=None,
                    device=None):
        """A layer from a float weight [N, K] (numpy fp32/fp16/bf16-as-uint16 or a
        torch CPU tensor; read in place, not kept). format "int8-convrot"
        (rotated with groups of `group`, K % group == 0), "int8" (row-wise) or
        "float" (kind "dense": the weight stays float, fp32 arithmetic). The
        codes and scales are the reference quantizer's. device="cuda[:N]": the
        layer is uploaded to that GPU (kind "w8a8" only; the weight is read
        from host memory) and runs on torch tensors there."""
        ffi, lib = load()
        if _is_torch(w) and w.device.type != "cpu":  # quantized on the host, whatever the layer's device
            w = w.detach().cpu()
        if bias is not None and _is_torch(bias) and bias.device.type != "cpu":
            bias = bias.detach().cpu()
        ptr, code, shape, strides = _array_view(w, "weight")
        if len(shape) != 2:
            raise QlinearError(f"qlinear: weight has shape {list(shape)}; expected [N, K]", "invalid argument")
        n, k = shape
        if n == 0 or k == 0:
            raise QlinearError(f"qlinear: weight has shape {list(shape)}; N and K must be positive",
                               "invalid argument")
        if strides[1] != 1 and k > 1:
            raise QlinearError(f"qlinear: weight has strides {list(strides)}: rows must be contiguous",
                               "invalid argument")
        ldw = strides[0] if n > 1 else k
        desc = ffi.new("ql_linear_desc *")
        bptr, bcode = ffi.NULL, 0
        if bias is not None:
            bp, bcode, bshape, bstr = _array_view(bias, "bias")
            if bshape != (n,) or (n > 1 and bstr[0] != 1):
                raise QlinearError(f"qlinear: bias has shape {list(bshape)}; expected a contiguous [{n}]",
                                   "invalid argument")
            bptr = ffi.cast("void *", bp)
        if format in ("float", "dense"):
            desc.kind, desc.n, desc.k = _KINDS["dense"], n, k
            desc.weight, desc.ld_weight, desc.weight_dtype, desc.compute_dtype = ffi.cast("void *", ptr), ldw, code, _F32
            desc.bias, desc.bias_dtype = bptr, bcode
            return cls._create(desc, _context, threads, "float", 0, bias is not None, device)
        if format not in ("int8", "int8-convrot"):
            raise QlinearError(f"qlinear: format {format!r} is not one of int8-convrot, int8, float",
                               "invalid argument")
        g = int(group) if format == "int8-convrot" else 0
        q = np.empty((n, k), np.int8)
        s = np.empty((n,), np.float32)
        qp, sp = ffi.cast("int8_t *", q.ctypes.data), ffi.cast("float *", s.ctypes.data)
        if g:
            _check(lib.ql_quantize_convrot_weight(code, ffi.cast("void *", ptr), n, k, ldw, g, qp, k, sp))
        else:
            _check(lib.ql_quantize_rowwise(code, ffi.cast("void *", ptr), n, k, ldw, qp, k, sp))
        kcode = _kind_code(kind)
        if kcode == _KINDS["dense"]:
            raise QlinearError("qlinear: kind 'dense' needs format 'float'", "invalid argument")
        desc.kind, desc.n, desc.k = kcode, n, k
        wq = desc.int8
        wq.n, wq.k, wq.q, wq.ldq, wq.scale, wq.n_scale, wq.convrot_group = n, k, qp, k, sp, n, g
        wq.bias, wq.bias_dtype = bptr, bcode
        return cls._create(desc, _context, threads, format, g, bias is not None, device)

    # -- properties
    @property
    def weight_bytes(self):
        """Bytes of the packed weight (what stays resident)."""
        return int(self._lib.ql_linear_weight_bytes(self._ptr))

    @property
    def threads(self):
        return self._ctx.threads

    def set_threads(self, threads):
        """Use `threads` threads from now on (this layer gets its own context)."""
        if self._ctx is _default_ctx:
            raise QlinearError("qlinear: this layer shares the default context; pass threads= when creating it, "
                               "or set QLINEAR_THREADS", "invalid argument")
        self._ctx.set_threads(threads)

    def __repr__(self):
        where = self.device if self._cuda else f"{self.threads} threads"
        return (f"<qlinear.Linear {self.n}x{self.k} {self.format}"
                f"{'/' + str(self.group) if self.group else ''} {self.kind}, {where}>")

    # -- running
    def forward(self, x, out_dtype=None, out=None, residual=None, residual_scale=None, activation=None):
        """y = x·Wᵀ (+ bias) for x of shape [..., K]; returns [..., N] of the same
        kind (numpy array or torch tensor). fp32/fp16/bf16 in (numpy bf16 as
        uint16), out_dtype defaults to the input's. Rows may be strided; the
        last dimension must be contiguous. out: an existing array or tensor of
        shape [..., N] (rows at any fixed stride, not overlapping x) written in
        place and returned — a reused buffer saves the fresh output memory of
        every call; its dtype is the output dtype. residual [..., N] and
        residual_scale (N elements), both in the output dtype, fuse a gated
        residual into the epilogue: y = residual + residual_scale ⊙ y (the
        library's ql_epilogue; out may be residual itself, updated in place).
        activation="gelu": y = gelu(x·Wᵀ + bias) (torch.nn.GELU(), erf form,
        fp32 within 6 ulps of exact, rounded to the output dtype), applied in
        the epilogue after the bias and before the residual."""
        if (out is not None or residual is not None or residual_scale is not None or activation is not None
                or self._cuda):
            return self._forward_any(x, out_dtype, out, residual, residual_scale, activation)
        # Fast paths: a C-contiguous array or CPU tensor of a dtype the library
        # takes, output in its dtype: no per-call tables, casts or shape walks.
        if out_dtype is None:
            t = type(x)
            if t is np.ndarray:
                code = _NP_CODES.get(x.dtype)
                if code is not None and x.ndim and x.shape[-1] == self.k:
                    f = x.flags
                    if f.c_contiguous and f.aligned:
                        y = np.empty(x.shape[:-1] + (self.n,), x.dtype)
                        if x.size:
                            st = self._fwd(self._ptr, self._from_buffer(x), code, x.size // self.k, self.k,
                                           self._from_buffer(y), code, self.n, self._null)
                            if st:
                                _check(st, "ql_linear_forward")
                        return y
            elif t is _torch_fast[0]:
                y = _torch_fast[1](self, x)
                if y is not None:
                    return y
        return self._forward_any(x, out_dtype)

    def _forward_any(self, x, out_dtype, out=None, residual=None, residual_scale=None, activation=None):
        act = _activation_code(activation)
        dev = self.device
        ptr, code, shape, strides = _array_view(x, "x", dev)
        m, ld = _rows(shape, strides, self.k, "x")
        ocode = code if out_dtype is None else _dtype_code(out_dtype, "out_dtype")
        oshape = tuple(shape[:-1]) + (self.n,)
        epi = self._null
        if residual is not None or residual_scale is not None:
            if out is not None:
                ocode = _array_view(out, "out", dev)[1]
            epi, spans = self._epilogue(residual, residual_scale, oshape, ocode, m)
            epi.activation = act
        has_residual = epi is not self._null
        if act and not has_residual:
            epi = self._epi_gelu
        if out is not None:
            yp, ycode, yshape, ystrides = _array_view(out, "out", dev)
            if tuple(yshape) != oshape:
                raise QlinearError(f"qlinear: out has shape {list(yshape)}, expected {list(oshape)}", "invalid argument")
            if out_dtype is not None and ycode != ocode:
                raise QlinearError(f"qlinear: out dtype {_DT_NAMES[ycode]} is not out_dtype {_DT_NAMES[ocode]}",
                                   "invalid argument")
            _, ldy = _rows(yshape, ystrides, self.n, "out")
            if m:
                xe, ye = (4, 2, 2)[code], (4, 2, 2)[ycode]  # element bytes of fp32, fp16, bf16
                x_end = ptr + ((m - 1) * ld + self.k) * xe
                y_end = yp + ((m - 1) * ldy + self.n) * ye
                if ptr < y_end and yp < x_end:
                    raise QlinearError("qlinear: out overlaps x (the layer reads x while it writes out)",
                                       "invalid argument")
                if has_residual:
                    (r0, r1, rld), (s0, s1) = spans
                    if yp < s1 and s0 < y_end:
                        raise QlinearError("qlinear: out overlaps residual_scale", "invalid argument")
                    if yp < r1 and r0 < y_end and (r0, rld) != (yp, ldy):
                        raise QlinearError("qlinear: out overlaps residual without being it (in place, out must be "
                                           "residual itself)", "invalid argument")
                if self._cuda:
                    self._use_current_stream()
                st = self._fwd_int(self._ptr, ptr, code, m, ld, yp, ycode, ldy, epi)
                if st:
                    _check(st, "ql_linear_forward")
            return out
        if _is_torch(x):
            import torch
            y = torch.empty(oshape, dtype=(torch.float32, torch.float16, torch.bfloat16)[ocode], device=x.device)
            yp = y.data_ptr()
            if self._cuda and m:
                self._use_current_stream()
        else:
            y = np.empty(oshape, _NP_OF[ocode])
            yp = y.__array_interface__["data"][0]
        if m:
            st = self._fwd_int(self._ptr, ptr, code, m, ld, yp, ocode, self.n, epi)
            if st:
                _check(st, "ql_linear_forward")
        return y

    def _epilogue(self, residual, residual_scale, oshape, ocode, m):
        """The ql_epilogue for a gated residual, checked: (struct, ((start, end, ld)
        of residual, (start, end) of residual_scale) in bytes)."""
        if residual is None or residual_scale is None:
            raise QlinearError("qlinear: residual and residual_scale go together (y = residual + residual_scale ⊙ y)",
                               "invalid argument")
        rp, rcode, rshape, rstrides = _array_view(residual, "residual", self.device)
        sp, scode, sshape, sstrides = _array_view(residual_scale, "residual_scale", self.device)
        for what, c in (("residual", rcode), ("residual_scale", scode)):
            if c != ocode:
                raise QlinearError(f"qlinear: {what} dtype {_DT_NAMES[c]} is not the output dtype {_DT_NAMES[ocode]}",
                                   "invalid argument")
        if tuple(rshape) != oshape:
            raise QlinearError(f"qlinear: residual has shape {list(rshape)}, expected {list(oshape)}",
                               "invalid argument")
        _, rld = _rows(rshape, rstrides, self.n, "residual")
        n_el = 1
        for d in sshape:
            n_el *= d
        if not sshape or sshape[-1] != self.n or n_el != self.n or (self.n > 1 and sstrides[-1] != 1):
            raise QlinearError(f"qlinear: residual_scale has shape {list(sshape)} and strides {list(sstrides)}; "
                               f"expected {self.n} contiguous elements ([..., {self.n}] with leading sizes 1)",
                               "invalid argument")
        e = self._ffi.new("ql_epilogue *")
        e.residual, e.ld_residual = self._ffi.cast("void *", rp), rld
        e.residual_scale = self._ffi.cast("void *", sp)
        eb = (4, 2, 2)[ocode]
        r_end = rp + (((m - 1) * rld + self.n) * eb if m else 0)
        return e, ((rp, r_end, rld), (sp, sp + self.n * eb))

    def _use_current_stream(self):
        """Queue the next call on torch's current stream of the layer's device,
        behind the work that produced its inputs. The activation workspace is
        the context's, shared by its layers: on a change of stream the new one
        first waits for what the context queued on the previous one (calls
        from two streams never overlap on it)."""
        import torch
        ctx = self._ctx
        cur = torch.cuda.current_stream(self.device)
        if cur.cuda_stream != ctx.stream:
            # Not while a CUDA graph is being captured: a captured stream cannot
            # wait on work outside the capture (CUDA refuses it and the capture
            # fails); the caller orders the capture after earlier work, as
            # torch.cuda.graph's own protocol asks.
            if ctx.torch_stream is not None and not torch.cuda.is_current_stream_capturing():
                cur.wait_stream(ctx.torch_stream)
            ctx.torch_stream = cur
            ctx.use_stream(cur.cuda_stream)

    __call__ = forward


_ACTIVATIONS = {"none": 0, "gelu": 1}


def _activation_code(activation):
    """ql_activation of None / "none" / "gelu"."""
    if activation is None:
        return 0
    if activation not in _ACTIVATIONS:
        raise QlinearError(f"qlinear: activation {activation!r} is not one of {', '.join(_ACTIVATIONS)}",
                           "invalid argument")
    return _ACTIVATIONS[activation]


def _kind_code(kind):
    if kind not in _KINDS:
        raise QlinearError(f"qlinear: kind {kind!r} is not one of {', '.join(_KINDS)}", "invalid argument")
    return _KINDS[kind]


# ------------------------------------------------------------------ checkpoint quantization

def quantize_file(inp, out, format="int8-convrot", group=256, include=None, exclude=None, threads=0):
    """Quantize a float safetensors checkpoint into ComfyUI INT8 (format "int8")
    or INT8-ConvRot ("int8-convrot"), as `qlinear quantize` does: written
    atomically, never over the input. include/exclude: POSIX extended regexes
    on tensor names. Returns a dict with layers_quantized, tensors_copied,
    bytes_in, bytes_out, seconds."""
    ffi, lib = load()
    targets = {"int8": 0, "int8-convrot": 1}
    if format not in targets:
        raise QlinearError(f"qlinear: format {format!r} is not one of int8, int8-convrot", "invalid argument")
    opt = ffi.new("ql_quantize_options *")
    opt.target, opt.group, opt.threads = targets[format], group, threads
    keep = []
    for field, val in (("include", include), ("exclude", exclude)):
        if val is not None:
            keep.append(ffi.new("char[]", val.encode()))
            setattr(opt, field, keep[-1])
    res = ffi.new("ql_quantize_result *")
    _check(lib.ql_checkpoint_quantize(os.fsencode(inp), os.fsencode(out), opt, res))
    return {"layers_quantized": int(res.layers_quantized), "tensors_copied": int(res.tensors_copied),
            "bytes_in": int(res.bytes_in), "bytes_out": int(res.bytes_out), "seconds": float(res.seconds)}
