"""qlinear as a comfy-kitchen backend: `import qlinear.comfy` registers the
backend "qlinear" in comfy-kitchen's registry, first in priority, so every
INT8 / INT8-ConvRot / W4A8 / W6A8 op ComfyUI dispatches on the CPU runs on
libqlinear:

    import qlinear.comfy               # registers, first in priority
    qlinear.comfy.state()              # what it serves, or why it is unavailable
    qlinear.comfy.disable()            # comfy-kitchen's next backend takes every call
    qlinear.comfy.enable()

Served ops (comfy-kitchen's names and signatures): int8_linear (tensor-wise
and row-wise scales, ConvRot or not, bias, input_act, residual, x of any
rank), w4a8_int8_linear, the INT8 quantizers and dequantizers ComfyUI's LoRA
merge calls, the W4A8/W6A8 quantizer and dequantizer, and
dequantize_int8_embedding. A call qlinear cannot answer exactly is declined
(its constraints fail) and the next backend in priority answers it; with the
backend unavailable (no libqlinear) comfy-kitchen runs on as before, with the
reason in comfy_kitchen.list_backends()["qlinear"].

Weights arrive as raw tensors on every call: each is packed once and found
again by the tensor (see _cache.py; `state()["cache"]` has its size). The
thread count follows torch.get_num_threads(); qlinear and PyTorch share one
OpenMP runtime in the process (both link libgomp.so.1, loaded once).

`pytest -p qlinear.comfy` registers the backend before comfy-kitchen's own
tests are collected.
"""
import logging

NAME = "qlinear"
log = logging.getLogger("qlinear.comfy")

_state = {"registered": False, "reason": None, "devices": (), "ops": ()}


def _registry():
    import comfy_kitchen  # noqa: F401 (imports and registers comfy-kitchen's own backends)
    from comfy_kitchen.registry import registry
    return registry


def register(first=True):
    """Register the backend (again: after comfy_kitchen.set_backend_priority
    dropped it, say); first=True puts it first in priority. Returns state()."""
    reg = _registry()
    try:
        import torch  # noqa: F401 (first: libqlinear then shares torch's OpenMP runtime)
        from .. import _lib
        _lib.load()
        from . import _caps, _ops
    except Exception as e:  # no library, no torch, an incompatible build: comfy-kitchen runs on without us
        reason = f"{type(e).__name__}: {e}"
        reg.mark_unavailable(NAME, reason)
        _state.update(registered=False, reason=reason)
        log.warning("qlinear: backend unavailable: %s", reason)
        return state()
    _caps.SR_DTYPES.clear()
    _caps.SR_DTYPES.update(_ops.sr_dtypes())
    devices = ("cpu",)
    cuda_why = _cuda_reason()
    _caps.CUDA[0] = cuda_why is None
    if cuda_why is None:
        devices += ("cuda",)
    caps = _caps.capabilities(devices)
    reg.register(NAME, _ops, caps)
    if first:
        reg.set_priority([NAME] + [b for b in reg._priority if b != NAME])
    elif NAME not in reg._priority:
        reg.set_priority(list(reg._priority) + [NAME])
    _state.update(registered=True, reason=None, devices=devices, ops=tuple(sorted(caps)), cuda=cuda_why)
    return state()


def _cuda_reason():
    """None when int8_linear and w4a8_int8_linear are served on CUDA tensors,
    else why not. Opt-in
    (QLINEAR_COMFY_CUDA=1): the CUDA layer holds a second, permuted copy of
    each weight on the GPU beside ComfyUI's, which a user sizing VRAM for
    the model alone does not expect."""
    import os
    import torch
    if os.environ.get("QLINEAR_COMFY_CUDA", "0") != "1":
        return "off (QLINEAR_COMFY_CUDA=1 serves int8_linear and w4a8_int8_linear on CUDA, with a second copy of each weight on the GPU)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    from .._lib import load
    _, lib = load()
    if lib.ql_cuda_device_count() <= 0:
        return "libqlinear was built without CUDA, or sees no GPU"
    return None


def disable():
    """comfy-kitchen's next backend takes every call (until enable())."""
    _registry().disable(NAME)


def enable():
    _registry().enable(NAME)


def state():
    """{"available", "disabled", "reason", "devices", "ops", "priority", "cache", "library"}."""
    reg = _registry()
    out = {"available": _state["registered"] and NAME in reg._backends and NAME not in reg._unavailable,
           "disabled": NAME in reg._disabled,
           "reason": _state["reason"], "devices": list(_state["devices"]), "ops": list(_state["ops"]),
           "priority": list(reg._priority), "cuda": _state.get("cuda")}
    if _state["registered"]:
        from . import _ops
        from .. import _lib
        out["cache"] = _ops.weights.stats()
        out["library"] = f"{_lib.library_path()} ({_lib.version()})"
        out["isa"] = _ops._context().isa
    return out


register()
