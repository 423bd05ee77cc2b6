"""numpy arrays and torch tensors as libqlinear takes them: the ql_dtype codes
of the float dtypes (read from qlinear.h), and an array's pointer, dtype and
rows, taken in place."""
import numpy as np

from ._lib import C, QlinearError

# ql_dtype values of the float dtypes and their names
F32, F16, BF16 = C.QL_F32, C.QL_F16, C.QL_BF16
DT_NAMES = {F32: "fp32", F16: "fp16", BF16: "bf16"}
DT_ALIASES = {"fp32": F32, "float32": F32, "float": F32, "fp16": F16, "float16": F16, "half": F16,
              "bf16": BF16, "bfloat16": BF16}
DT_BYTES = {F32: 4, F16: 2, BF16: 2}  # bytes per element
NP_OF = {F32: np.dtype(np.float32), F16: np.dtype(np.float16), BF16: np.dtype(np.uint16)}
NP_CODES = {v: k for k, v in NP_OF.items()}  # native byte order only: '>f4' is not a key
_NP_NAMES = {"float32": F32, "float16": F16, "uint16": BF16}


def torch_codes():
    """{torch dtype: ql_dtype} (imports torch)."""
    import torch
    return {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16}


def torch_dtype(code):
    """The torch dtype of a float ql_dtype (imports torch)."""
    import torch
    return {F32: torch.float32, F16: torch.float16, BF16: torch.bfloat16}[code]


def dtype_code(d, what="dtype"):
    """A ql_dtype from "bf16"/np.float16/torch.float32/..."""
    if isinstance(d, str):
        if d.lower() in DT_ALIASES:
            return DT_ALIASES[d.lower()]
    elif _is_torch_dtype(d):
        m = torch_codes()
        if d in m:
            return m[d]
    else:
        try:
            nd = np.dtype(d)
        except TypeError:
            nd = None
        for code, npd in NP_OF.items():
            if nd == npd:
                return code
    raise TypeError(f"qlinear: {what} {d!r} is not one of fp32, fp16, bf16")


def _is_torch_dtype(d):
    return type(d).__name__ == "dtype" and type(d).__module__ == "torch"


def is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def array_view(x, what, device="cpu"):
    """(pointer, ql_dtype, shape, strides in elements) of a numpy array or a CPU
    torch tensor (for a layer on a GPU: a torch tensor on that `device`),
    without copying; TypeError/QlinearError where the library cannot take it
    as it is."""
    if is_torch(x):
        if str(x.device) != device and not (device == "cpu" and x.device.type == "cpu"):
            raise QlinearError(f"qlinear: {what} is on {x.device} but the layer is on {device}: move it with "
                               f".to('{device}')" + (", or create the layer there (device=)" if device == "cpu" else ""),
                               "invalid argument")
        if x.is_sparse or x.is_quantized or getattr(x, "is_mkldnn", False):
            raise TypeError(f"qlinear: {what} must be a dense strided tensor, not {x.layout}")
        code = dtype_code(x.dtype, f"{what} dtype")
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
        return ptr, _NP_NAMES[x.dtype.name], x.shape, tuple(s // isz for s in x.strides)
    raise TypeError(f"qlinear: {what} must be a numpy array or a torch tensor, not {type(x).__name__}")


def rows(shape, strides, k, what):
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
