"""What the `qlinear` backend takes: comfy-kitchen constraints (dtypes,
devices, dimensions) and call rules (cross-argument rules) per op. A call
that fails them is declined, and the registry hands it to the next backend
(eager), so qlinear never answers where its answer could differ from eager's
beyond the documented rounding rules, and never raises where eager would
answer. Rules are plain functions: they run on every call."""
import torch
from comfy_kitchen.constraints import ExactDims, FunctionConstraints, ParamConstraint, ValidationResult


FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16})
INT8 = frozenset({torch.int8})
E4M3 = getattr(torch, "float8_e4m3fn", None)
_OK = ValidationResult(success=True)
_fail = ValidationResult.fail
# comfy-kitchen's input activations (backends/_activations.py); those the C
# library does not fuse are applied with comfy-kitchen's own function first
KNOWN_ACTS = frozenset({None, "none", "gelu_tanh", "swiglu", "rms_norm", "situ"})
_WIDTH2 = frozenset({"swiglu", "situ"})


def _group_ok(g, k):
    """A ConvRot group qlinear rotates by: a power of 4 in [4, 65536] dividing K."""
    return type(g) is int and 4 <= g <= 65536 and g & (g - 1) == 0 and (g.bit_length() - 1) % 2 == 0 and k % g == 0


def _sr_off(kw):
    """Stochastic rounding off, or on a dtype whose torch.rand stream the
    library reproduces in this process's torch (SR_DTYPES, checked at
    registration: the fp16/bf16 conversion of torch.rand changed between
    torch versions)."""
    s = kw.get("stochastic_rounding")
    if s is None or s <= 0:
        return True
    x = kw.get("x", kw.get("weight"))
    return x is not None and x.dtype in SR_DTYPES


SR_DTYPES = set()  # the dtypes whose torch.rand stream the library reproduces here (filled by __init__)


def _act_rule(kw, x, k):
    act = kw.get("input_act")
    if act not in KNOWN_ACTS:
        return _fail("input_act", f"{act!r} is not an activation comfy-kitchen defines")
    width = 2 if act in _WIDTH2 else 1
    if x.numel() == 0:
        return _fail("x", "empty: left to the next backend, whose answer (or error) it is")
    if x.dim() == 0 or x.shape[-1] != width * k:
        return _fail("x", f"last dimension {x.shape[-1] if x.dim() else None} is not {width}·K = {width * k}")
    if act == "rms_norm":
        w = kw.get("input_act_weight")
        if w is None or w.numel() != k:
            return _fail("input_act_weight", f"rms_norm needs a weight of K = {k} elements")
    return None


def _epilogue_rule(kw, n):
    b = kw.get("bias")
    if b is not None and b.numel() != n:
        return _fail("bias", f"{b.numel()} elements, not N = {n}")
    if kw.get("residual") is not None and kw.get("residual_scale") is None:
        return _fail("residual_scale", "residual requires residual_scale")
    if kw.get("out_dtype", torch.bfloat16) not in FLOATS:
        return _fail("out_dtype", "not fp32, fp16 or bf16")
    return None


_CPU = torch.device("cpu")
_T = torch.Tensor


CUDA = [False]  # int8_linear and w4a8_int8_linear on CUDA tensors too (set by register() when asked for and a GPU is there)


def _tensors_rule(kw, spec, cuda_ok=False):
    """The per-parameter checks of the hot ops, by hand (comfy-kitchen's
    ParamConstraint loop costs ~1 µs a parameter): spec (name, dtypes,
    required) in order; every tensor on the CPU, or (cuda_ok) every one on
    the first one's CUDA device."""
    first = kw.get(spec[0][0])
    if cuda_ok and CUDA[0] and isinstance(first, _T) and first.is_cuda:
        # bf16 activations only: fp16 and fp32 outputs of the CUDA layers were
        # seen to differ from eager's on the GPU without a rotation (not yet
        # explained), so those are eager's
        if first.dtype != torch.bfloat16:
            return _fail(spec[0][0], "on CUDA qlinear serves bf16 activations only")
        dev = first.get_device()  # an int: cheaper than torch.device objects on every call
        for name, dtypes, required in spec:
            t = kw.get(name)
            if t is None:
                if required:
                    return _fail(name, "missing")
                continue
            if not isinstance(t, _T) or t.dtype not in dtypes or t.get_device() != dev:
                return _fail(name, f"not a {sorted(map(str, dtypes))} tensor on {first.device}")
        return None
    for name, dtypes, required in spec:
        t = kw.get(name)
        if t is None:
            if required:
                return _fail(name, "missing")
            continue
        if not isinstance(t, _T):
            return _fail(name, f"not a tensor ({type(t).__name__})")
        if t.dtype not in dtypes:
            return _fail(name, f"dtype {t.dtype} not in {sorted(map(str, dtypes))}")
        if not t.is_cpu:
            return _fail(name, f"device {t.device.type} not in ['cpu']")
    return None


_INT8_LINEAR = (("x", FLOATS, True), ("weight", INT8, True), ("weight_scale", FLOATS, True), ("bias", FLOATS, False),
                ("input_act_weight", FLOATS, False), ("residual", FLOATS, False), ("residual_scale", FLOATS, False))


def int8_linear_rule(kw):
    r = _tensors_rule(kw, _INT8_LINEAR, cuda_ok=True)
    if r is not None:
        return r
    if type(kw.get("convrot", False)) is not bool or type(kw.get("convrot_groupsize", 256)) is not int:
        return _fail("convrot", "convrot a bool, convrot_groupsize an int")
    if type(kw.get("input_act_eps", 0.0)) not in (float, int):
        return _fail("input_act_eps", "not a float")
    w = kw["weight"]
    x = kw["x"]
    if w.dim() != 2:
        return _fail("weight", "not [N, K]")
    n, k = w.shape
    if n == 0 or k == 0:
        return _fail("weight", f"[{n}, {k}]: N and K must be positive")
    r = _act_rule(kw, x, k) or _epilogue_rule(kw, n)
    if r is not None:
        return r
    s = kw["weight_scale"]
    if s.numel() != 1 and s.numel() != n:
        return _fail("weight_scale", f"{s.numel()} elements, not 1 or N = {n}")
    if kw.get("convrot") and not _group_ok(kw.get("convrot_groupsize", 256), k):
        return _fail("convrot_groupsize", f"not a power of 4 in [4, 65536] dividing K = {k}")
    return _OK


def w4a8_geometry(qdata, s_rel, group):
    """(n, k, bits) of comfy-kitchen's packed W4A8/W6A8 operands, or a reason."""
    if qdata.dim() != 2 or s_rel.dim() != 2 or s_rel.shape[0] != qdata.shape[0]:
        return "qdata [N, bytes] and s_rel [N, K/group] must agree"
    if type(group) is not int or group < 4 or (16 % group and group % 16):
        return f"group_size {group} must be >= 4 and divide 16 or be a multiple of 16"
    n, cols = qdata.shape
    k = s_rel.shape[1] * group
    if k <= 0 or k * 4 != cols * 8 and k * 6 != cols * 8:
        return f"rows of {cols} bytes do not hold K = {k} codes of 4 or 6 bits"
    bits = cols * 8 // k
    if k % 16 or bits == 6 and (k % 32 or group % 16):
        return f"K = {k} and group {group} break the {bits}-bit layout"
    return n, k, bits


def _w4a8_weight_rule(kw):
    g = w4a8_geometry(kw["qdata"], kw["s_rel"], kw.get("group_size", 16))
    if isinstance(g, str):
        return _fail("qdata", g), None
    n, k, bits = g
    if not _group_ok(kw.get("convrot_groupsize", 256), k):
        return _fail("convrot_groupsize", f"not a power of 4 in [4, 65536] dividing K = {k}"), None
    sc, cb, cr = kw["s_channel"], kw.get("codebook"), kw.get("correction")
    if tuple(sc.shape) != (n,):
        return _fail("s_channel", f"shape {tuple(sc.shape)}, not ({n},)"), None
    if cb is not None and (bits == 6 or tuple(cb.shape) != (16,)):
        return _fail("codebook", "a [16] table, 4 bits only"), None
    if cr is not None and (bits == 6 or tuple(cr.shape) != (k // kw.get("group_size", 16), n)):
        return _fail("correction", "[K/group, N], 4 bits only"), None
    return None, (n, k, bits)


_W4A8_LINEAR = (("x", FLOATS, True), ("qdata", INT8, True), ("s_rel", frozenset({E4M3, torch.float32}), True),
                ("s_channel", frozenset({torch.float32}), True), ("codebook", frozenset({torch.float32}), False),
                ("correction", FLOATS, False), ("bias", FLOATS, False), ("input_act_weight", FLOATS, False),
                ("residual", FLOATS, False), ("residual_scale", FLOATS, False))


def w4a8_int8_linear_rule(kw):
    r = _tensors_rule(kw, _W4A8_LINEAR, cuda_ok=True)
    if r is not None:
        return r
    if type(kw.get("input_act_eps", 0.0)) not in (float, int):
        return _fail("input_act_eps", "not a float")
    if kw["s_channel"].dim() != 1 or (kw.get("codebook") is not None and kw["codebook"].dim() != 1):
        return _fail("s_channel", "s_channel and codebook are 1-D")
    r, g = _w4a8_weight_rule(kw)
    if r is not None:
        return r
    n, k, _ = g
    return _act_rule(kw, kw["x"], k) or _epilogue_rule(kw, n) or _OK


def dequantize_w4a8_rule(kw):
    r, _ = _w4a8_weight_rule(kw)
    if r is not None:
        return r
    if kw.get("output_dtype", torch.bfloat16) not in FLOATS:
        return _fail("output_dtype", "not fp32, fp16 or bf16")
    return _OK


def _sr_rule(kw):
    if not _sr_off(kw):
        return _fail("stochastic_rounding", "torch.rand's stream of this dtype is not reproduced in this torch")
    return None


def _weight_rule(kw):
    w = kw["weight"]
    if w.dim() != 2 or w.numel() == 0:
        return _fail("weight", "not a non-empty [N, K]")
    return None


def quantize_w4a8_rule(kw):
    r = _weight_rule(kw)
    if r is not None:
        return r
    w = kw["weight"]
    k = w.shape[1]
    g, cg, bits = kw.get("group_size", 16), kw.get("convrot_groupsize", 256), kw.get("bits", 4)
    if bits not in (4, 6) or type(g) is not int or g < 4 or (16 % g and g % 16) or k % 16 or k % g:
        return _fail("group_size", f"K = {k}, group {g}, bits {bits}: not a W4A8/W6A8 layout")
    if bits == 6 and (k % 32 or g % 16 or not kw.get("symmetric", True)):
        return _fail("bits", "6-bit storage: symmetric, K % 32 == 0, group a multiple of 16")
    if not _group_ok(cg, k):
        return _fail("convrot_groupsize", f"not a power of 4 in [4, 65536] dividing K = {k}")
    if kw.get("scale_dtype", E4M3) not in (torch.float32, E4M3):
        return _fail("scale_dtype", "not float32 or float8_e4m3fn")
    cb = kw.get("codebook_tensor")
    if bits == 4 and kw.get("symmetric", True) and kw.get("codebook", True) and cb is not None \
            and tuple(cb.shape) != (16,):
        return _fail("codebook_tensor", "not [16]")
    return _sr_rule(kw) or _OK


def quantize_rule(kw):
    x = kw.get("x", kw.get("weight"))
    if x.dim() == 0 or x.numel() == 0:
        return _fail("x", "empty or 0-d")
    return _sr_rule(kw) or _OK


def quantize_convrot_rule(kw):
    r = _weight_rule(kw)
    if r is not None:
        return r
    w = kw["weight"]
    if not _group_ok(kw.get("group_size"), w.shape[1]):
        return _fail("group_size", f"not a power of 4 in [4, 65536] dividing K = {w.shape[1]}")
    return quantize_rule(kw)


def _scale_per_row(q, s):
    """Whether scale s broadcasts against q as one value, or one per row of q's [rows, K] view."""
    if s.numel() == 1:
        return True
    return q.dim() >= 1 and s.dim() == q.dim() and tuple(s.shape) == tuple(q.shape[:-1]) + (1,)


def dequantize_rule(kw):
    q, s = kw["q"], kw["scale"]
    if kw.get("output_dtype_code", 0) not in (0, 1, 2):
        return _fail("output_dtype_code", "not 0 (fp32), 1 (fp16) or 2 (bf16)")
    if not _scale_per_row(q, s):
        return _fail("scale", "neither one scale nor one per row ([..., 1])")
    g = kw.get("group_size", 0)
    if g and not (q.dim() == 2 and _group_ok(g, q.shape[1])):
        return _fail("group_size", "not a power of 4 in [4, 65536] dividing K")
    return _OK


def embedding_rule(kw):
    q, s = kw["q"], kw["scale"]
    if kw.get("output_dtype_code", 0) not in (0, 1, 2):
        return _fail("output_dtype_code", "not 0 (fp32), 1 (fp16) or 2 (bf16)")
    if not (s.numel() == 1 or (s.dim() == 2 and tuple(s.shape) == (q.shape[0], 1))):
        return _fail("scale", "neither one scale nor [V, 1]")
    g = kw.get("group_size", 0)
    if type(g) is not int or (g > 0 and not _group_ok(g, q.shape[1])):
        return _fail("group_size", "not a power of 4 in [4, 65536] dividing D")
    return _OK


def capabilities(devices):
    """The op -> FunctionConstraints dict qlinear registers with: every op on
    the CPU, int8_linear and w4a8_int8_linear also on the other `devices`
    (CUDA)."""
    devs = frozenset({"cpu"})
    linear_devs = frozenset(devices)
    f = ParamConstraint(dtypes=FLOATS)
    i8 = ParamConstraint(dtypes=INT8)
    w2 = ParamConstraint(dtypes=INT8, shape_rules=(ExactDims(2),))
    b = ParamConstraint(dtypes=frozenset({bool}))
    i = ParamConstraint(dtypes=frozenset({int}))

    def fc(params, *rules, on=devs):
        return FunctionConstraints(params=params, default_devices=on, call_rules=rules)

    w4a8_w = {"qdata": w2, "s_rel": ParamConstraint(dtypes=frozenset({E4M3, torch.float32}), shape_rules=(ExactDims(2),)),
              "s_channel": ParamConstraint(dtypes=frozenset({torch.float32}), shape_rules=(ExactDims(1),)),
              "codebook": ParamConstraint(dtypes=frozenset({torch.float32}), shape_rules=(ExactDims(1),)),
              "correction": ParamConstraint(dtypes=FLOATS, shape_rules=(ExactDims(2),)),
              "group_size": i, "convrot_groupsize": i}
    sr = ParamConstraint(dtypes=frozenset({int}))
    code = ParamConstraint(dtypes=frozenset({int}))
    # the two linears check every argument in their call rules (fast: they run on every call)
    return {
        "int8_linear": fc({}, int8_linear_rule, on=linear_devs),
        "w4a8_int8_linear": fc({}, w4a8_int8_linear_rule, on=linear_devs),
        "quantize_int8_tensorwise": fc({"x": f, "stochastic_rounding": sr}, quantize_rule),
        "quantize_int8_rowwise": fc({"x": f, "stochastic_rounding": sr}, quantize_rule),
        "quantize_int8_convrot_weight": fc({"weight": ParamConstraint(dtypes=FLOATS, shape_rules=(ExactDims(2),)),
                                            "group_size": i, "stochastic_rounding": sr}, quantize_convrot_rule),
        "dequantize_int8_simple": fc({"q": i8, "scale": f}, dequantize_rule),
        "dequantize_int8_simple_dtype": fc({"q": i8, "scale": f, "output_dtype_code": code}, dequantize_rule),
        "dequantize_int8_convrot_weight": fc({"q": w2, "scale": f, "group_size": i}, dequantize_rule),
        "dequantize_int8_convrot_weight_dtype": fc({"q": w2, "scale": f, "group_size": i, "output_dtype_code": code},
                                                   dequantize_rule),
        "dequantize_int8_embedding": fc({"q": w2, "scale": f, "indices":
                                         ParamConstraint(dtypes=frozenset({torch.int32, torch.int64})),
                                         "group_size": i, "output_dtype_code": code}, embedding_rule),
        "quantize_w4a8_int8_weight": fc({"weight": ParamConstraint(dtypes=FLOATS, shape_rules=(ExactDims(2),)),
                                         "group_size": i, "convrot_groupsize": i, "symmetric":
                                         ParamConstraint(dtypes=frozenset({bool})), "codebook": b,
                                         "codebook_tensor": ParamConstraint(dtypes=FLOATS), "bits": i,
                                         "stochastic_rounding": sr, "scale_search": b}, quantize_w4a8_rule),
        "dequantize_w4a8_int8_weight": fc(w4a8_w | {"output_dtype": f}, dequantize_w4a8_rule),
    }
