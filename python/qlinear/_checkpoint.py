"""safetensors checkpoints: Checkpoint (open, list, read tensors) and
quantize_file (a float checkpoint into ComfyUI INT8 / INT8-ConvRot)."""
import os
from collections import namedtuple

import numpy as np

from ._lib import C, QlinearError, check, load

TensorInfo = namedtuple("TensorInfo", "name dtype shape bytes")
LayerInfo = namedtuple("LayerInfo", "name format convrot group n k bytes has_bias supported reason")


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
        check(lib.ql_checkpoint_open(self.path.encode(), p), "ql_checkpoint_open")
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
        check(self._lib.ql_checkpoint_tensor(self.ptr, i, t))
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
            check(lib.ql_checkpoint_metadata(self.ptr, i, k, v))
            out[ffi.string(k[0]).decode()] = ffi.string(v[0]).decode()
        return out

    def layers(self):
        """The quantized layers: LayerInfo(name, format, convrot, group, n, k, bytes,
        has_bias, supported, reason). `bytes` counts every tensor of the layer."""
        ffi, lib = self._ffi, self._lib
        out = []
        li = ffi.new("ql_layer_info *")
        for i in range(lib.ql_checkpoint_layer_count(self.ptr)):
            check(lib.ql_checkpoint_layer(self.ptr, i, li))
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


def quantize_file(inp, out, format="int8-convrot", group=256, include=None, exclude=None, threads=0):
    """Quantize a float safetensors checkpoint into ComfyUI INT8 (format "int8")
    or INT8-ConvRot ("int8-convrot"), as `qlinear quantize` does: written
    atomically, never over the input. include/exclude: POSIX extended regexes
    on tensor names. Returns a dict with layers_quantized, tensors_copied,
    bytes_in, bytes_out, seconds."""
    ffi, lib = load()
    targets = {"int8": C.QL_QUANT_INT8, "int8-convrot": C.QL_QUANT_INT8_CONVROT}
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
    check(lib.ql_checkpoint_quantize(os.fsencode(inp), os.fsencode(out), opt, res))
    return {"layers_quantized": int(res.layers_quantized), "tensors_copied": int(res.tensors_copied),
            "bytes_in": int(res.bytes_in), "bytes_out": int(res.bytes_out), "seconds": float(res.seconds)}
