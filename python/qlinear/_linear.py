"""Linear: a quantized (or float) linear layer packed once by libqlinear and
run on numpy arrays or torch tensors (CPU, or a CUDA device), with the
epilogue's fused residual and activation."""
import numpy as np

from ._arrays import DT_BYTES, DT_NAMES, F32, NP_CODES, NP_OF, array_view, dtype_code, is_torch, rows, \
    torch_dtype
from ._checkpoint import Checkpoint
from ._context import Context, default_context, is_default_cpu_context, parse_device
from ._lib import C, QlinearError, check, fast_fn, load

# kind= and activation= names of ql_linear_kind and ql_activation values
KINDS = {"w8a8": C.QL_LINEAR_W8A8, "weight-only": C.QL_LINEAR_WEIGHT_ONLY, "dense": C.QL_LINEAR_DENSE,
         "dequant": C.QL_LINEAR_DEQUANT}
KIND_NAMES = {v: k for k, v in KINDS.items()} | {C.QL_LINEAR_WXA8_PACKED: "wxa8-packed"}
ACTIVATIONS = {"none": C.QL_ACTIVATION_NONE, "gelu": C.QL_ACTIVATION_GELU}

# Linear.forward's fast path for torch tensors: (torch.Tensor, fn(linear, x) -> y or
# None), filled in when qlinear.torch is imported; numpy users never import torch.
torch_fast = [None, None]


def forward_int():
    """ql_linear_forward taking x and y as integers."""
    return fast_fn("ql_linear_forward", "ql_status (*)(ql_linear *, uintptr_t, ql_dtype, int64_t, int64_t, uintptr_t, "
                                        "ql_dtype, int64_t, const ql_epilogue *)")


def forward_shared_int():
    """ql_linear_forward_shared with every pointer an integer: the layer, output
    and row-stride arrays are host buffers the caller fills."""
    return fast_fn("ql_linear_forward_shared", "ql_status (*)(uintptr_t, int, uintptr_t, ql_dtype, int64_t, int64_t, "
                                               "uintptr_t, ql_dtype, uintptr_t, uintptr_t)")


def activation_code(activation):
    """ql_activation of None / "none" / "gelu"."""
    if activation is None:
        return C.QL_ACTIVATION_NONE
    if activation not in ACTIVATIONS:
        raise QlinearError(f"qlinear: activation {activation!r} is not one of {', '.join(ACTIVATIONS)}",
                           "invalid argument")
    return ACTIVATIONS[activation]


def kind_code(kind):
    if kind not in KINDS:
        raise QlinearError(f"qlinear: kind {kind!r} is not one of {', '.join(KINDS)}", "invalid argument")
    return KINDS[kind]


_raw = []


def _raw_stream():
    """torch's raw current-stream query (device index -> cudaStream_t as an
    int), or None where this torch has none."""
    if not _raw:
        import torch
        _raw.append(getattr(torch._C, "_cuda_getCurrentRawStream", None))
    return _raw[0]


class Linear:
    """A qlinear layer: the weight packed once for this CPU, run by forward().

    kind: "w8a8" (int8 weights, activations quantized per row: the fast path),
    "weight-only" (int8 codes resident, float activations), "dequant"
    (expand the weight on every call; a baseline), "dense" (float weights)."""

    def __init__(self, ptr, ctx, n, k, kind, fmt, group, has_bias):
        self._ptr, self._ctx = ptr, ctx
        self.device = ctx.device  # "cpu" or "cuda:N"
        self._cuda = self.device != "cpu"
        self._dev_index = int(self.device.split(":")[1]) if self._cuda else -1
        self._ffi, self._lib = load()
        self.n, self.k, self.kind, self.format, self.group, self.has_bias = n, k, kind, fmt, group, has_bias
        # Per-call constants, bound once (the M = 1 call costs a few µs in C).
        self._fwd, self._fwd_int = self._lib.ql_linear_forward, forward_int()
        self._addr = None  # the ql_linear's address as an integer (shared forwards), set with the pointer
        self._from_buffer, self._null = self._ffi.from_buffer, self._ffi.NULL
        self._last_shapes = ((), ())
        self._epi_gelu = self._ffi.new("ql_epilogue *")  # activation only, for the fast paths
        self._epi_gelu.activation = ACTIVATIONS["gelu"]

    # -- construction
    @classmethod
    def _create(cls, desc, ctx, threads, fmt, group, has_bias, device=None):
        ffi, lib = load()
        device = parse_device(device)
        if device != "cpu" and threads is not None:
            raise QlinearError(f"qlinear: threads= is for CPU layers; this one is on {device}", "invalid argument")
        if ctx is None:
            ctx = default_context(device) if threads is None else Context(threads)
        elif ctx.device != device and device != "cpu":
            raise QlinearError(f"qlinear: the context is on {ctx.device}, not {device}", "invalid argument")
        p = ffi.new("ql_linear **")
        check(lib.ql_linear_create(ctx.ptr, desc, p), "ql_linear_create")
        return cls(ffi.gc(p[0], lib.ql_linear_destroy), ctx, int(desc.n), int(desc.k), KIND_NAMES[desc.kind], fmt,
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
        kcode = kind_code(kind)
        desc = ffi.new("ql_linear_desc *")
        check(lib.ql_checkpoint_linear_desc(checkpoint.ptr, name.encode(), kcode, desc))
        if desc.kind == KINDS["dense"]:
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
        if is_torch(w) and w.device.type != "cpu":  # quantized on the host, whatever the layer's device
            w = w.detach().cpu()
        if bias is not None and is_torch(bias) and bias.device.type != "cpu":
            bias = bias.detach().cpu()
        ptr, code, shape, strides = array_view(w, "weight")
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
        bptr, bcode = ffi.NULL, F32  # no bias: its dtype is not read
        if bias is not None:
            bp, bcode, bshape, bstr = array_view(bias, "bias")
            if bshape != (n,) or (n > 1 and bstr[0] != 1):
                raise QlinearError(f"qlinear: bias has shape {list(bshape)}; expected a contiguous [{n}]",
                                   "invalid argument")
            bptr = ffi.cast("void *", bp)
        if format in ("float", "dense"):
            desc.kind, desc.n, desc.k = KINDS["dense"], n, k
            desc.weight, desc.ld_weight, desc.weight_dtype, desc.compute_dtype = ffi.cast("void *", ptr), ldw, code, F32
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
            check(lib.ql_quantize_convrot_weight(code, ffi.cast("void *", ptr), n, k, ldw, g, qp, k, sp))
        else:
            check(lib.ql_quantize_rowwise(code, ffi.cast("void *", ptr), n, k, ldw, qp, k, sp))
        kcode = kind_code(kind)
        if kcode == KINDS["dense"]:
            raise QlinearError("qlinear: kind 'dense' needs format 'float'", "invalid argument")
        desc.kind, desc.n, desc.k = kcode, n, k
        wq = desc.int8
        wq.n, wq.k, wq.q, wq.ldq, wq.scale, wq.n_scale, wq.convrot_group = n, k, qp, k, sp, n, g
        wq.bias, wq.bias_dtype = bptr, bcode
        return cls._create(desc, _context, threads, format, g, bias is not None, device)

    @classmethod
    def from_int8(cls, codes, scale, convrot_group=0, bias=None, kind="w8a8", threads=None, _context=None,
                  device=None):
        """A layer from int8 codes [N, K] (rows contiguous) and their fp32
        scales (1 or N), as a checkpoint stores them: ConvRot codes when
        convrot_group > 0. numpy arrays or CPU torch tensors, read in place
        (not kept)."""
        ffi, lib = load()
        cp, n, k, ldq = _int8_matrix(codes, "codes")
        sp, n_scale = _f32_vector(scale, "scale", (1, n))
        desc = ffi.new("ql_linear_desc *")
        desc.kind, desc.n, desc.k = kind_code(kind), n, k
        wq = desc.int8
        wq.n, wq.k, wq.q, wq.ldq = n, k, ffi.cast("int8_t *", cp), ldq
        wq.scale, wq.n_scale, wq.convrot_group = ffi.cast("float *", sp), n_scale, int(convrot_group)
        wq.bias, wq.bias_dtype = _bias_view(ffi, bias, n)
        fmt = "int8-convrot" if convrot_group else "int8"
        return cls._create(desc, _context, threads, fmt, int(convrot_group), bias is not None, device)

    @classmethod
    def from_wxa8(cls, qdata, s_rel, s_channel, codebook=None, correction=None, group=16, convrot_group=256,
                  bias=None, packed=True, threads=None, _context=None, device=None):
        """A W4A8 / W6A8 layer from ComfyUI's tensors (CPU torch tensors or numpy
        arrays, read in place): qdata [N, K/2] (4 bits) or [N, 3K/4] (6 bits)
        bytes, s_rel [N, K/group] (float8_e4m3fn bytes or fp32), s_channel [N]
        fp32, codebook [16] fp32 or None, correction [K/group, N] or None.
        packed: keep the codes packed (decoded inside the GEMM) or decode them
        once to int8 (twice the bytes, the W8A8 kernels). device="cuda[:N]": the
        layer is uploaded to that GPU (the tensors are read on the host)."""
        ffi, lib = load()
        qp, n, cols, ldq = _int8_matrix(qdata, "qdata", any_byte=True)
        srp, srshape, sr_f32 = _scale_matrix(s_rel, "s_rel")
        if len(srshape) != 2 or srshape[0] != n:
            raise QlinearError(f"qlinear: s_rel has shape {list(srshape)}; expected [{n}, K/group]", "invalid argument")
        k = srshape[1] * int(group)
        bits = cols * 8 // k if k else 0
        if bits not in (4, 6) or bits * k != cols * 8:
            raise QlinearError(f"qlinear: qdata rows of {cols} bytes do not hold K = {k} codes of 4 or 6 bits",
                               "invalid argument")
        scp, _ = _f32_vector(s_channel, "s_channel", (n,))
        desc = ffi.new("ql_linear_desc *")
        desc.kind = C.QL_LINEAR_WXA8_PACKED if packed else C.QL_LINEAR_W8A8
        desc.n, desc.k = n, k
        w = desc.wxa8
        w.n, w.k, w.bits, w.q, w.ldq = n, k, bits, ffi.cast("uint8_t *", qp), ldq
        w.s_rel, w.s_rel_f32, w.s_channel = ffi.cast("void *", srp), int(sr_f32), ffi.cast("float *", scp)
        if codebook is not None:
            cbp, _ = _f32_vector(codebook, "codebook", (16,))
            w.codebook = ffi.cast("float *", cbp)
        if correction is not None:
            crp, ccode, cshape, cstr = array_view(correction, "correction")
            if tuple(cshape) != (k // int(group), n) or (n > 1 and cstr[-1] != 1) or cstr[0] != n:
                raise QlinearError(f"qlinear: correction has shape {list(cshape)}; expected a contiguous "
                                   f"[{k // int(group)}, {n}]", "invalid argument")
            w.correction, w.correction_dtype = ffi.cast("void *", crp), ccode
        w.group, w.convrot_group = int(group), int(convrot_group)
        w.bias, w.bias_dtype = _bias_view(ffi, bias, n)
        return cls._create(desc, _context, threads, f"w{bits}a8", int(convrot_group), bias is not None, device)

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
        if is_default_cpu_context(self._ctx):
            raise QlinearError("qlinear: this layer shares the default context; pass threads= when creating it, "
                               "or set QLINEAR_THREADS", "invalid argument")
        self._ctx.set_threads(threads)

    # -- unmerged LoRAs (docs/NUMERICS.md §7)
    def add_lora(self, down, up, scale=None, strength=1.0, alpha=None):
        """Attach y += scale·(x·downᵀ)·upᵀ to this layer without repacking its
        weight: down [R, K] and up [N, R], float (numpy fp32 / fp16 / uint16
        holding bf16 bits, or CPU torch tensors; rows contiguous; read here and
        packed by the library, not kept). scale defaults to strength·alpha/R,
        with alpha = R when None (ComfyUI's rule for files without one). The
        low-rank term runs inside the W8A8 pipeline, on the CPU or on this
        layer's GPU, with the base's quantized activation. W8A8 layers (on the
        CPU also symmetric W4A8/W6A8 ones). Returns an id for remove_lora."""
        ffi, lib = self._ffi, self._lib
        dp, dcode, r, dld = _float_matrix(down, "LoRA down", None, self.k)
        up_, ucode, _, uld = _float_matrix(up, "LoRA up", self.n, r)
        if scale is None:
            scale = lib.ql_lora_scale(float(strength), 0.0 if alpha is None else float(alpha), alpha is not None, r)
        d = ffi.new("ql_lora_desc *")
        d.rank, d.down, d.down_dtype, d.ld_down = r, ffi.cast("void *", dp), dcode, dld
        d.up, d.up_dtype, d.ld_up, d.scale = ffi.cast("void *", up_), ucode, uld, float(scale)
        idbuf = np.zeros(1, np.int32)  # both bindings take an address for int *
        check(lib.ql_linear_add_lora(self._ptr, d, ffi.cast("int *", idbuf.__array_interface__["data"][0])),
              "ql_linear_add_lora")
        return int(idbuf[0])

    def remove_lora(self, lora_id):
        """Detach the LoRA add_lora returned `lora_id` for (the others stay)."""
        check(self._lib.ql_linear_remove_lora(self._ptr, int(lora_id)), "ql_linear_remove_lora")

    @property
    def lora_count(self):
        """LoRAs attached (zero-scale ones included)."""
        return int(self._lib.ql_linear_lora_count(self._ptr))

    @property
    def lora_rank(self):
        """Total rank of the attached LoRAs."""
        return int(self._lib.ql_linear_lora_rank(self._ptr))

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
                code = NP_CODES.get(x.dtype)
                if code is not None and x.ndim and x.shape[-1] == self.k:
                    f = x.flags
                    if f.c_contiguous and f.aligned:
                        y = np.empty(x.shape[:-1] + (self.n,), x.dtype)
                        if x.size:
                            st = self._fwd(self._ptr, self._from_buffer(x), code, x.size // self.k, self.k,
                                           self._from_buffer(y), code, self.n, self._null)
                            if st:
                                check(st, "ql_linear_forward")
                        return y
            elif t is torch_fast[0]:
                y = torch_fast[1](self, x)
                if y is not None:
                    return y
        return self._forward_any(x, out_dtype)

    def _forward_any(self, x, out_dtype, out=None, residual=None, residual_scale=None, activation=None):
        act = activation_code(activation)
        dev = self.device
        ptr, code, shape, strides = array_view(x, "x", dev)
        m, ld = rows(shape, strides, self.k, "x")
        ocode = code if out_dtype is None else dtype_code(out_dtype, "out_dtype")
        oshape = tuple(shape[:-1]) + (self.n,)
        epi = self._null
        if residual is not None or residual_scale is not None:
            if out is not None:
                ocode = array_view(out, "out", dev)[1]
            epi, spans = self._epilogue(residual, residual_scale, oshape, ocode, m)
            epi.activation = act
        has_residual = epi is not self._null
        if act and not has_residual:
            epi = self._epi_gelu
        if out is not None:
            yp, ycode, yshape, ystrides = array_view(out, "out", dev)
            if tuple(yshape) != oshape:
                raise QlinearError(f"qlinear: out has shape {list(yshape)}, expected {list(oshape)}", "invalid argument")
            if out_dtype is not None and ycode != ocode:
                raise QlinearError(f"qlinear: out dtype {DT_NAMES[ycode]} is not out_dtype {DT_NAMES[ocode]}",
                                   "invalid argument")
            _, ldy = rows(yshape, ystrides, self.n, "out")
            if m:
                xe, ye = DT_BYTES[code], DT_BYTES[ycode]
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
                    check(st, "ql_linear_forward")
            return out
        if is_torch(x):
            import torch
            y = torch.empty(oshape, dtype=torch_dtype(ocode), device=x.device)
            yp = y.data_ptr()
            if self._cuda and m:
                self._use_current_stream()
        else:
            y = np.empty(oshape, NP_OF[ocode])
            yp = y.__array_interface__["data"][0]
        if m:
            st = self._fwd_int(self._ptr, ptr, code, m, ld, yp, ocode, self.n, epi)
            if st:
                check(st, "ql_linear_forward")
        return y

    def _epilogue(self, residual, residual_scale, oshape, ocode, m):
        """The ql_epilogue for a gated residual, checked: (struct, ((start, end, ld)
        of residual, (start, end) of residual_scale) in bytes)."""
        if residual is None or residual_scale is None:
            raise QlinearError("qlinear: residual and residual_scale go together (y = residual + residual_scale ⊙ y)",
                               "invalid argument")
        rp, rcode, rshape, rstrides = array_view(residual, "residual", self.device)
        sp, scode, sshape, sstrides = array_view(residual_scale, "residual_scale", self.device)
        for what, c in (("residual", rcode), ("residual_scale", scode)):
            if c != ocode:
                raise QlinearError(f"qlinear: {what} dtype {DT_NAMES[c]} is not the output dtype {DT_NAMES[ocode]}",
                                   "invalid argument")
        if tuple(rshape) != oshape:
            raise QlinearError(f"qlinear: residual has shape {list(rshape)}, expected {list(oshape)}",
                               "invalid argument")
        _, rld = rows(rshape, rstrides, self.n, "residual")
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
        eb = DT_BYTES[ocode]
        r_end = rp + (((m - 1) * rld + self.n) * eb if m else 0)
        return e, ((rp, r_end, rld), (sp, sp + self.n * eb))

    def _use_current_stream(self):
        """Queue the next call on torch's current stream of the layer's device,
        behind the work that produced its inputs. The activation workspace is
        the context's, shared by its layers: on a change of stream the new one
        first waits for what the context queued on the previous one (calls
        from two streams never overlap on it)."""
        ctx = self._ctx
        raw = _raw_stream()
        if raw is not None and raw(self._dev_index) == ctx.stream:
            return  # the common case, without building a torch Stream object (~µs)
        import torch
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


def _int8_matrix(a, what, any_byte=False):
    """(pointer, rows, cols, row stride) of a 2-D int8 (any_byte: or uint8)
    numpy array or CPU torch tensor whose rows are contiguous."""
    if is_torch(a):
        import torch
        ok = a.dtype == torch.int8 or (any_byte and a.dtype == torch.uint8)
        if not ok or a.device.type != "cpu":
            raise QlinearError(f"qlinear: {what} must be an int8 CPU tensor, not {a.dtype} on {a.device}",
                               "invalid argument")
        ptr, shape, strides = a.data_ptr(), tuple(a.shape), tuple(a.stride())
    elif isinstance(a, np.ndarray) and (a.dtype == np.int8 or (any_byte and a.dtype == np.uint8)):
        ptr, shape, strides = a.__array_interface__["data"][0], a.shape, a.strides
    else:
        raise QlinearError(f"qlinear: {what} must be an int8 array or tensor, not {type(a).__name__}",
                           "invalid argument")
    if len(shape) != 2:
        raise QlinearError(f"qlinear: {what} has shape {list(shape)}; expected 2 dimensions", "invalid argument")
    n, k = shape
    if k > 1 and strides[1] != 1:
        raise QlinearError(f"qlinear: {what} has strides {list(strides)}: rows must be contiguous", "invalid argument")
    return ptr, n, k, (strides[0] if n > 1 else k)


def _float_matrix(a, what, nrows, ncols):
    """(pointer, ql_dtype, rows, row stride) of a 2-D float matrix on the host
    with contiguous rows, `ncols` columns and (unless None) `nrows` rows."""
    if is_torch(a) and a.device.type != "cpu":
        raise QlinearError(f"qlinear: {what} is on {a.device}; LoRA factors are read on the host (also for a GPU "
                           f"layer): pass .cpu()", "invalid argument")
    ptr, code, shape, strides = array_view(a, what)
    want = f"[{'R' if nrows is None else nrows}, {ncols}]"
    if len(shape) != 2 or shape[1] != ncols or (nrows is not None and shape[0] != nrows) or shape[0] < 1:
        raise QlinearError(f"qlinear: {what} has shape {list(shape)}; expected {want}", "invalid argument")
    n, k = shape
    if k > 1 and strides[1] != 1 or (n > 1 and strides[0] < k):
        raise QlinearError(f"qlinear: {what} has strides {list(strides)}: its rows must be contiguous",
                           "invalid argument")
    return ptr, code, n, (strides[0] if n > 1 else k)


def _f32_vector(a, what, sizes):
    """(pointer, numel) of a contiguous fp32 vector whose numel is one of sizes."""
    if is_torch(a):
        import torch
        if a.dtype != torch.float32 or a.device.type != "cpu" or not a.is_contiguous():
            raise QlinearError(f"qlinear: {what} must be a contiguous fp32 CPU tensor", "invalid argument")
        ptr, numel = a.data_ptr(), a.numel()
    elif isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous:
        ptr, numel = a.__array_interface__["data"][0], a.size
    else:
        raise QlinearError(f"qlinear: {what} must be a contiguous fp32 array or tensor", "invalid argument")
    if numel not in sizes:
        raise QlinearError(f"qlinear: {what} has {numel} elements; expected {' or '.join(map(str, sizes))}",
                           "invalid argument")
    return ptr, numel


def _scale_matrix(a, what):
    """(pointer, shape, is_fp32) of contiguous e4m3 bytes (uint8 / float8_e4m3fn) or fp32."""
    if is_torch(a):
        import torch
        f8 = getattr(torch, "float8_e4m3fn", None)
        if a.device.type != "cpu" or not a.is_contiguous() or a.dtype not in (torch.float32, torch.uint8, f8):
            raise QlinearError(f"qlinear: {what} must be a contiguous float8_e4m3fn or fp32 CPU tensor",
                               "invalid argument")
        return a.data_ptr(), tuple(a.shape), a.dtype == torch.float32
    if isinstance(a, np.ndarray) and a.flags.c_contiguous and a.dtype in (np.float32, np.uint8):
        return a.__array_interface__["data"][0], a.shape, a.dtype == np.float32
    raise QlinearError(f"qlinear: {what} must be contiguous e4m3 bytes or fp32", "invalid argument")


def _bias_view(ffi, bias, n):
    """(pointer, ql_dtype) of an optional contiguous [n] float bias."""
    if bias is None:
        return ffi.NULL, F32
    bp, bcode, bshape, bstr = array_view(bias, "bias")
    if tuple(bshape) != (n,) or (n > 1 and bstr[0] != 1):
        raise QlinearError(f"qlinear: bias has shape {list(bshape)}; expected a contiguous [{n}]", "invalid argument")
    return ffi.cast("void *", bp), bcode
