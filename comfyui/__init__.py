"""qlinear for ComfyUI: a custom node package. Link this folder into
ComfyUI/custom_nodes/ (ln -s /path/to/qlinear/comfyui ComfyUI/custom_nodes/qlinear);
when ComfyUI starts it registers qlinear as comfy-kitchen's first backend, so
the INT8 / INT8-ConvRot / W4A8 / W6A8 layers of a checkpoint run on
libqlinear, and logs what it serves (or why it cannot: ComfyUI then runs on
as before). The node "qlinear backend" shows the backend's state and turns it
on or off from a workflow."""
import logging
import sys
from pathlib import Path

log = logging.getLogger("qlinear")
_SRC = Path(__file__).resolve().parent.parent / "python"  # a source tree: its python/ (and build/ for the library)


def _load():
    """qlinear.comfy, registered; or None with the reason logged."""
    try:
        import qlinear  # noqa: F401 (installed, or ...)
    except ImportError:
        if (_SRC / "qlinear").is_dir():
            sys.path.insert(0, str(_SRC))  # ... from the source tree this folder belongs to
    try:
        import qlinear.comfy as qc
    except Exception as e:  # no comfy-kitchen, no torch: nothing to register with
        log.warning("qlinear: not loaded (%s: %s); ComfyUI runs without it", type(e).__name__, e)
        return None
    st = qc.state()
    if st["available"]:
        log.info("qlinear: comfy-kitchen backend 'qlinear' first in priority on %s (%s, ISA %s): %s",
                 ", ".join(st["devices"]), st["library"], st["isa"], ", ".join(st["ops"]))
    else:
        log.warning("qlinear: backend unavailable (%s); ComfyUI runs on comfy-kitchen's other backends",
                    st["reason"])
    return qc


_qc = _load()


def _describe(st):
    if not st.get("available"):
        return f"qlinear: unavailable ({st.get('reason')})"
    c = st.get("cache", {})
    return (f"qlinear: {'disabled' if st['disabled'] else 'enabled'} on {', '.join(st['devices'])}; "
            f"priority {st['priority']}; {c.get('entries', 0)} packed weights, "
            f"{c.get('packed_bytes', 0) / 2**20:.1f} MiB ({c.get('hits', 0)} hits, {c.get('misses', 0)} misses); "
            f"{st.get('library', '')}, ISA {st.get('isa', '?')}")


class QlinearBackend:
    """Shows the qlinear backend's state and turns it on or off. The switch is
    process-wide (comfy-kitchen's registry): it holds for every workflow run
    after this node. Chain a MODEL through it to order it before the sampler."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"enabled": ("BOOLEAN", {"default": True})},
                "optional": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("model", "state")
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "advanced/qlinear"

    @classmethod
    def IS_CHANGED(cls, enabled, model=None):
        return float("nan")  # the state is global: re-run (and report) every time

    def run(self, enabled, model=None):
        if _qc is None:
            text = "qlinear: not loaded (see ComfyUI's log)"
        else:
            (_qc.enable if enabled else _qc.disable)()
            text = _describe(_qc.state())
        log.info(text)
        return {"ui": {"text": [text]}, "result": (model, text)}


NODE_CLASS_MAPPINGS = {"QlinearBackend": QlinearBackend}
NODE_DISPLAY_NAME_MAPPINGS = {"QlinearBackend": "qlinear backend"}
__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
