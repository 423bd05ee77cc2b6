"""The benchmark's model: a diffusion transformer with the anima shapes, its
linears as one path makes them (PyTorch fp32 / oneDNN fp32 / bf16, or
qlinear.torch.QLinear), and the hooks that time those linears.

Imports torch: load it only after env.reexec_for_openblas.
"""
import re
import time

import torch
from torch import nn
from torch.utils import mkldnn as mk

import qlinear.torch as qt

HIDDEN, HEADS, TEXT_DIM, MLP, LORA = 2048, 16, 1024, 8192, 256


def build(blocks, seed, path, quantize=None, device="cpu", shared=False):
    """The model for one path. Weights are drawn layer by layer from per-layer
    seeds (every path gets the same numbers) and converted at once, so the
    peak memory is the path's model plus one fp32 layer. `quantize` (a regex
    on the layer's role, e.g. "mlp.fc2" or "mod.*up"): on the qlinear paths,
    only the matching linears become qlinear, the others stay PyTorch fp32
    (bf16 on a GPU). device "cuda": the model on the GPU (see the e2e
    module's docstring). shared: layers that read one input go through
    qlinear.torch.forward_shared (the same numbers on every path)."""
    make = LinearMaker(seed, path, quantize, device)
    sdpa = getattr(nn.functional, "scaled_dot_product_attention", None) if device != "cpu" else None
    return DiT(make, blocks, shared, sdpa).eval()


class LinearMaker:
    """make(k, n, role, bias, act): the next linear of the model, its weights
    drawn from its own seed (seed and its place in the model), as `path` runs it."""

    def __init__(self, seed, path, quantize=None, device="cpu"):
        self.seed, self.path, self.device = seed, path, device
        self.sel = re.compile(quantize) if quantize else None
        self.count = 0

    def __call__(self, k, n, role, bias=True, act=None):
        return self._convert(self._draw(k, n, bias), role, act)

    def _draw(self, k, n, bias):
        """An fp32 nn.Linear: N(0, 0.02²) weights, four input channels ×10, N(0, 0.02²) bias."""
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + self.count)
        self.count += 1
        lin = torch.nn.utils.skip_init(nn.Linear, k, n, bias=bias)  # every value is drawn below
        with torch.no_grad():
            lin.weight.normal_(0.0, 0.02, generator=g)
            lin.weight[:, torch.randperm(k, generator=g)[:4]] *= 10.0
            if bias:
                lin.bias.normal_(0.0, 0.02, generator=g)
        return lin

    def _convert(self, lin, role, act):
        """The linear as the path runs it; act="gelu": a qlinear layer on the CPU
        computes gelu(lin(x)) in its epilogue (the model checks which did); on
        the GPU only path "w8a8-convrot+gelu" does, "w8a8-convrot" leaves it
        to PyTorch's pass after the layer (both are measured)."""
        path, sel = self.path, self.sel
        if self.device != "cpu":
            if path in ("w8a8-convrot", "w8a8-convrot+gelu") and not (sel and not sel.search(role)):
                return qt.QLinear.from_linear(lin, format="int8-convrot", device=self.device,
                                              activation=act if path == "w8a8-convrot+gelu" else None)
            if path in CK_BACKENDS:
                return CkInt8Linear(lin, CK_BACKENDS[path], self.device)
            return lin.to(device=self.device, dtype=torch.float32 if path == "fp32" else torch.bfloat16)
        if path == "onednn-fp32":
            return mk.MkldnnLinear(lin, torch.float32)
        if path in ("w8a8-convrot", "weight-only") and sel and not sel.search(role):
            return lin
        if path == "w8a8-convrot":
            return qt.QLinear.from_linear(lin, format="int8-convrot", activation=act)
        if path == "weight-only":
            return qt.QLinear.from_linear(lin, format="int8-convrot", kind="weight-only", activation=act)
        if path == "bf16":
            return lin.to(torch.bfloat16)
        if path in CK_BACKENDS:
            return CkInt8Linear(lin, CK_BACKENDS[path])
        return lin


CK_BACKENDS = {"ck-qlinear": "qlinear", "ck-eager": "eager", "ck-cuda": "cuda"}  # path -> comfy-kitchen backend


class CkInt8Linear(nn.Module):
    """A linear as ComfyUI runs an INT8-ConvRot layer: its int8 codes (ConvRot
    G=256, per-row scales, quantized by comfy-kitchen's eager backend) and a
    bf16 bias, called through comfy_kitchen.int8_linear on every forward, the
    registry choosing `backend` ("qlinear", or comfy-kitchen's "eager": what a
    ComfyUI CPU user gets without qlinear; on a GPU also comfy-kitchen's
    "cuda"). device: where the codes, scales and bias live (ComfyUI's
    weights on the GPU)."""

    def __init__(self, lin, backend, device="cpu"):
        super().__init__()
        import comfy_kitchen  # noqa: F401
        from comfy_kitchen.registry import registry
        self.registry, self.backend = registry, backend
        with registry.use_backend("eager"):
            self.q, self.s = comfy_kitchen.quantize_int8_convrot_weight(lin.weight.detach(), 256) \
                if hasattr(comfy_kitchen, "quantize_int8_convrot_weight") else \
                torch.ops.comfy_kitchen.quantize_int8_convrot_weight(lin.weight.detach(), 256)
        self.q, self.s = self.q.to(device), self.s.to(device, torch.float32)
        self.b = lin.bias.detach().to(device, torch.bfloat16) if lin.bias is not None else None
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self._int8_linear = comfy_kitchen.int8_linear

    def forward(self, x):
        with self.registry.use_backend(self.backend):
            return self._int8_linear(x, self.q, self.s, self.b, x.dtype, True, 256)

    def kwargs(self, x):
        return dict(x=x, weight=self.q, weight_scale=self.s, bias=self.b, out_dtype=x.dtype, convrot=True,
                    convrot_groupsize=256)


def check_ck_backend(model, x):
    """Raise unless the model's first ComfyUI linear is served by the backend
    it names (comfy-kitchen's use_backend falls through to the next backend
    silently where the named one declines)."""
    lin = next(m for m in model.modules() if isinstance(m, CkInt8Linear))
    kw = lin.kwargs(x[..., :lin.in_features].contiguous())
    r = lin.registry.validate_backend_for_call(lin.backend, "int8_linear", kw)
    if not r.success:
        raise RuntimeError(f"comfy-kitchen's {lin.backend!r} backend declines this model's int8_linear: {r}")


def gated_residual(lin, h, x, gate):
    """x + gate ⊙ lin(h): on a qlinear layer inside its epilogue (the same two
    fp32 roundings, no extra passes over [M, 2048]), else in PyTorch."""
    if isinstance(lin, qt.QLinear):
        return lin(h, residual=x, residual_scale=gate)
    return x + gate * lin(h)


def _pick_softmax():
    """softmax over the last dimension, in place where ATen can (its softmax
    reads each row before writing it), else through a fresh tensor."""
    try:
        torch._softmax(torch.zeros(1, 2), -1, False, out=torch.empty(1, 2))

        def softmax_(s):
            torch._softmax(s, -1, False, out=s)
    except (AttributeError, TypeError, RuntimeError):
        def softmax_(s):
            s.copy_(torch.softmax(s, -1))
    return softmax_


_softmax_ = _pick_softmax()


class Attention(nn.Module):
    """q, k, v, o of one attention sub-layer; sdpa: PyTorch's fused attention
    (on a GPU), else four heads at a time in baddbmm / softmax / bmm."""

    def __init__(self, make, ctx_dim, name, shared=False, sdpa=None):
        super().__init__()
        self.q, self.k, self.v, self.o = (make(HIDDEN if r in "qo" else ctx_dim, HIDDEN, f"{name}.{r}")
                                          for r in "qkvo")
        self.shared, self.sdpa = shared, sdpa

    def forward(self, x, ctx, residual, gate):
        """residual + gate ⊙ o(attention(x, ctx))."""
        q, k, v = self._qkv(x, ctx)
        b, m, _ = x.shape
        if self.sdpa is not None:  # on a GPU: PyTorch's fused attention, every path alike
            d = HIDDEN // HEADS
            heads = [u.view(b, -1, HEADS, d).transpose(1, 2) for u in (q, k, v)]
            o = self.sdpa(*heads).transpose(1, 2).reshape(b, m, HIDDEN)
        else:
            o = self._attention(q, k, v)
        return gated_residual(self.o, o, residual, gate)

    def _qkv(self, x, ctx):
        """q(x), k(ctx), v(ctx); shared: the layers of one input through forward_shared."""
        if not self.shared:
            return self.q(x), self.k(ctx), self.v(ctx)
        if x is ctx:
            return qt.forward_shared([self.q, self.k, self.v], x)
        q = self.q(x)
        k, v = qt.forward_shared([self.k, self.v], ctx)
        return q, k, v

    def _attention(self, q, k, v):
        """softmax(q·kᵀ/√d)·v four heads at a time (every path alike), with the
        1/√d inside the GEMM (alpha), the [4, M, T] scores reused from group to
        group (16 MB at M = T = 1024, where all 16 heads at once were 64 MB),
        the softmax in place, and each head's output written straight into its
        columns (no transposed copies). Measured against the one-call version
        (M = 1024, 2 threads): fp32 113 -> 85 ms self-, 62 -> 48 ms
        cross-attention; bf16 115 -> 108 and 55 -> 54 ms (one head at a time
        was slower in bf16)."""
        b, m, _ = q.shape
        t = k.shape[1]
        d, g = HIDDEN // HEADS, 4
        o = torch.empty(b, m, HEADS, d, dtype=q.dtype)
        s = torch.empty(g, m, t, dtype=q.dtype)
        for i in range(b):
            qh, kh = q[i].view(m, HEADS, d).transpose(0, 1), k[i].view(t, HEADS, d).transpose(0, 1)
            vh, oh = v[i].view(t, HEADS, d).transpose(0, 1), o[i].transpose(0, 1)
            for h in range(0, HEADS, g):
                torch.baddbmm(s, qh[h:h + g], kh[h:h + g].transpose(1, 2), beta=0, alpha=d ** -0.5, out=s)
                _softmax_(s)
                torch.bmm(s, vh[h:h + g], out=oh[h:h + g])
        return o.view(b, m, HIDDEN)


class Modulation(nn.Module):
    """adaLN-LoRA: shift, scale, gate from the time embedding."""

    def __init__(self, make, i):
        super().__init__()
        self.down, self.up = make(HIDDEN, LORA, f"mod{i}.down", bias=False), \
            make(LORA, 3 * HIDDEN, f"mod{i}.up", bias=False)

    def forward(self, t, down=None):
        """down: this module's down(t), when the block computed it with the others'"""
        return self.up(self.down(t) if down is None else down).unsqueeze(1).chunk(3, dim=-1)


class Block(nn.Module):
    """Self-attention, cross-attention and the MLP, each after a LayerNorm
    modulated from the time embedding and gated into the residual stream."""

    def __init__(self, make, shared=False, sdpa=None):
        super().__init__()
        self.self_attn = Attention(make, HIDDEN, "self_attn", shared, sdpa)
        self.cross_attn = Attention(make, TEXT_DIM, "cross_attn", shared, sdpa)
        # on the qlinear paths fc1 computes gelu(fc1(h)) in its epilogue
        self.fc1, self.fc2 = make(HIDDEN, MLP, "mlp.fc1", act="gelu"), make(MLP, HIDDEN, "mlp.fc2")
        self.mods = nn.ModuleList([Modulation(make, i) for i in range(3)])
        self.shared = shared

    def forward(self, x, t, ctx):
        t = nn.functional.silu(t)
        downs = qt.forward_shared([mod.down for mod in self.mods], t) if self.shared else [None] * 3
        for i, mod in enumerate(self.mods):
            shift, scale, gate = mod(t, downs[i])
            h = torch.addcmul(shift, nn.functional.layer_norm(x, (HIDDEN,), eps=1e-6), 1 + scale)
            if i == 0:
                x = self.self_attn(h, h, x, gate)
            elif i == 1:
                x = self.cross_attn(h, ctx, x, gate)
            else:
                u = self.fc1(h)
                if getattr(self.fc1, "activation", None) != "gelu":
                    u = nn.functional.gelu(u)
                x = gated_residual(self.fc2, u, x, gate)
        return x


class DiT(nn.Module):
    def __init__(self, make, blocks, shared=False, sdpa=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(make, shared, sdpa) for _ in range(blocks)])

    def forward(self, x, t, ctx):
        for blk in self.blocks:
            x = blk(x, t, ctx)
        return x


def linear_modules(model):
    return [m for m in model.modules() if isinstance(m, (nn.Linear, qt.QLinear, mk.MkldnnLinear, CkInt8Linear))]


def model_bytes(path, blocks):
    """Bytes of the linears' weights of the path's model."""
    per_block = (6 * HIDDEN * HIDDEN + 2 * HIDDEN * TEXT_DIM + 2 * MLP * HIDDEN
                 + 3 * (LORA * HIDDEN + 3 * HIDDEN * LORA))
    per = {"fp32": 4, "onednn-fp32": 4, "bf16": 2, "w8a8-convrot": 1, "w8a8-convrot+gelu": 1, "weight-only": 1, "ck-qlinear": 1,
           "ck-eager": 1, "ck-cuda": 1}[path]
    return per_block * blocks * per


class LinearTimer:
    """Time spent inside the linear modules, through forward hooks (on a GPU:
    CUDA events recorded on the stream around each linear, read by finish()
    after the step's synchronization)."""

    def __init__(self, model, cuda=False):
        self.total, self._t0, self.calls = 0.0, 0.0, 0
        self._cuda, self._events = cuda, []
        self._handles = []
        for m in linear_modules(model):
            self._handles.append(m.register_forward_pre_hook(self._pre))
            self._handles.append(m.register_forward_hook(self._post))

    def _event(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def _pre(self, mod, inp):
        if self._cuda:
            self._events.append(self._event())
        else:
            self._t0 = time.perf_counter()

    def _post(self, mod, inp, out):
        if self._cuda:
            self._events.append(self._event())
        else:
            self.total += time.perf_counter() - self._t0
        self.calls += 1

    def finish(self):
        if self._cuda:
            ev = self._events
            self.total = sum(ev[i].elapsed_time(ev[i + 1]) for i in range(0, len(ev), 2)) / 1e3
            self._events = []

    def reset(self):
        self.total, self.calls, self._events = 0.0, 0, []
