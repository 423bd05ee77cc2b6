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
in qlinear.torch.

The package by role: _lib (loading libqlinear through cffi or ctypes, and the
constants of qlinear.h), _arrays (ql_dtype codes; numpy arrays and torch
tensors as the library takes them), _context (ql_context, devices),
_checkpoint (Checkpoint, quantize_file), _linear (Linear), torch (PyTorch
modules). The end-to-end benchmark is not part of it: `python3 -m
qlinear_bench.e2e`, from the source tree's python/.
"""
from ._checkpoint import Checkpoint, LayerInfo, TensorInfo, quantize_file
from ._lib import QlinearError, library_path, version
from ._linear import Linear

__all__ = ["Checkpoint", "Linear", "QlinearError", "quantize_file", "version", "library_path", "TensorInfo",
           "LayerInfo"]
