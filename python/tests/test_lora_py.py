"""Unmerged LoRAs through the Python binding (Linear.add_lora / remove_lora):
the low-rank term against float64, the exact properties docs/NUMERICS.md §7
states (add-then-remove and strength 0 are the identity bit for bit, a LoRA
that cancels the weight gives exactly 0, ComfyUI's scale rule), and every
refusal as a QlinearError. The C tests (tests/test_lora.c) hold the term to
its per-case probabilistic bound; here the binding's wiring is what is
checked."""
import numpy as np
import pytest

import qlinear
from conftest import bf16_bits, rel_l2

# The low-rank term's relative error against float64 (NUMERICS.md §7):
# measured here over 300 random cases per row count, mean 1.5-1.6 %, largest
# 1.7 % (M = 64), 2.2 % (M = 7) and 4.5 % (M = 1: one row of 40 outputs, whose
# norm can be small by cancellation, has a wide tail). A wrong scale, a
# transposed factor or a dropped term is off by 50-100 %.
TERM_BOUND = {1: 0.10, 7: 0.04, 64: 0.03}


def _as(a, dtype):
    if dtype == "fp32":
        return a.astype(np.float32)
    if dtype == "fp16":
        return a.astype(np.float16)
    return bf16_bits(a)  # bf16 as uint16 bits


def _value(a, dtype):
    """The float64 values of what _as(a, dtype) holds."""
    if dtype == "bf16":
        return (bf16_bits(a).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return _as(a, dtype).astype(np.float64)


def _layer(rng, n, k, fmt):
    w = rng.normal(0.0, 0.02, (n, k)).astype(np.float32)
    return qlinear.Linear.from_weight(w, format=fmt, threads=2), w


@pytest.mark.parametrize("fmt,k", [("int8-convrot", 512), ("int8", 300), ("int8-convrot", 256)])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 7, 64])
def test_term_against_float64(rng, fmt, k, dtype, m):
    n, r = 40, 8
    lin, _ = _layer(rng, n, k, fmt)
    x = rng.normal(0.0, 1.0, (m, k)).astype(np.float32)
    y0 = lin.forward(x)
    down, up = rng.normal(0.0, 0.05, (r, k)), rng.normal(0.0, 0.05, (n, r))
    lid = lin.add_lora(_as(down, dtype), _as(up, dtype), scale=0.75)
    assert (lin.lora_count, lin.lora_rank) == (1, r)
    y1 = lin.forward(x)
    ref = 0.75 * (x.astype(np.float64) @ _value(down, dtype).T) @ _value(up, dtype).T
    err = rel_l2(y1.astype(np.float64) - y0, ref)
    assert err <= TERM_BOUND[m], f"{fmt} K={k} {dtype} M={m}: the LoRA term's rel-L2 {err:.4f}"
    lin.remove_lora(lid)
    assert lin.lora_count == 0 and lin.lora_rank == 0
    assert np.array_equal(lin.forward(x), y0), "add then remove must give the base's bits"


def test_strength_zero_and_scale_rule(rng):
    n, k, r = 24, 256, 4
    lin, _ = _layer(rng, n, k, "int8-convrot")
    x = rng.normal(0.0, 1.0, (5, k)).astype(np.float32)
    y0 = lin.forward(x)
    down = rng.normal(0.0, 0.1, (r, k)).astype(np.float32)
    up = rng.normal(0.0, 0.1, (n, r)).astype(np.float32)
    z = lin.add_lora(down, up, strength=0.0)
    assert lin.lora_count == 1
    assert np.array_equal(lin.forward(x), y0), "a zero-strength LoRA must be ignored"
    lin.remove_lora(z)
    # strength·alpha/R, alpha = R when absent (ComfyUI's rule)
    a = lin.add_lora(down, up, strength=0.8, alpha=2.0)
    ya = lin.forward(x)
    lin.remove_lora(a)
    b = lin.add_lora(down, up, scale=0.8 * 2.0 / r)
    assert np.array_equal(lin.forward(x), ya)
    lin.remove_lora(b)
    c = lin.add_lora(down, up, strength=0.8)
    yc = lin.forward(x)
    lin.remove_lora(c)
    lin.add_lora(down, up, scale=0.8)
    assert np.array_equal(lin.forward(x), yc)


def test_two_loras_and_removing_one(rng):
    n, k = 32, 512
    lin, _ = _layer(rng, n, k, "int8-convrot")
    x = rng.normal(0.0, 1.0, (9, k)).astype(np.float32)
    d1, u1 = rng.normal(0, 0.05, (4, k)).astype(np.float32), rng.normal(0, 0.05, (n, 4)).astype(np.float32)
    d2, u2 = rng.normal(0, 0.05, (6, k)).astype(np.float32), rng.normal(0, 0.05, (n, 6)).astype(np.float32)
    first = lin.add_lora(d1, u1, scale=1.0)
    y_first = lin.forward(x)
    second = lin.add_lora(d2, u2, scale=0.5)
    assert first != second and (lin.lora_count, lin.lora_rank) == (2, 10)
    lin.remove_lora(second)
    assert np.array_equal(lin.forward(x), y_first), "removing one LoRA must restore the other's bits"
    lin.remove_lora(first)


def test_lora_that_cancels_the_weight(rng):
    """up = -W (the layer's own dequantized weight), down = I: exactly 0.
    Exact where each up row's int8 scale max|up|/127 gives the weight's scale
    back: a ±127 code in every row and power-of-two scales (tests/test_lora.c
    covers ConvRot, down = H)."""
    n, k = 16, 200
    codes = rng.integers(-127, 128, (n, k)).astype(np.int8)
    codes[np.arange(n), rng.integers(0, k, n)] = 127
    scale = np.ldexp(1.0, -rng.integers(3, 12, n)).astype(np.float32)
    lin = qlinear.Linear.from_int8(codes, scale, threads=2)
    w = codes.astype(np.float32) * scale[:, None]
    x = rng.normal(0.0, 1.0, (6, k)).astype(np.float32)
    assert np.count_nonzero(lin.forward(x)) > 0
    lin.add_lora(np.eye(k, dtype=np.float32), -w, scale=1.0)
    assert np.array_equal(lin.forward(x), np.zeros((6, n), np.float32))


def test_torch_factors_equal_numpy(rng):
    """torch CPU tensors (fp32, and bf16 against numpy's bf16 bits) give numpy's bits."""
    torch = pytest.importorskip("torch")
    n, k, r = 24, 256, 5
    lin, _ = _layer(rng, n, k, "int8-convrot")
    x = rng.normal(0.0, 1.0, (3, k)).astype(np.float32)
    down = rng.normal(0, 0.05, (r, k)).astype(np.float32)
    up = rng.normal(0, 0.05, (n, r)).astype(np.float32)
    for t_down, t_up, n_down, n_up in [(torch.from_numpy(down), torch.from_numpy(up), down, up),
                                       (torch.from_numpy(down).to(torch.bfloat16), torch.from_numpy(up).to(torch.bfloat16),
                                        bf16_bits(down), bf16_bits(up))]:
        a = lin.add_lora(t_down, t_up, scale=0.3)
        y_t = lin.forward(x)
        lin.remove_lora(a)
        b = lin.add_lora(n_down, n_up, scale=0.3)
        assert np.array_equal(lin.forward(x), y_t)
        lin.remove_lora(b)


def test_refusals(rng):
    n, k = 16, 256
    lin, w = _layer(rng, n, k, "int8-convrot")
    d = rng.normal(0, 0.05, (4, k)).astype(np.float32)
    u = rng.normal(0, 0.05, (n, 4)).astype(np.float32)
    with pytest.raises(qlinear.QlinearError, match=r"LoRA down has shape \[4, 100\]; expected \[R, 256\]"):
        lin.add_lora(d[:, :100], u)
    with pytest.raises(qlinear.QlinearError, match=r"LoRA up has shape \[16, 3\]; expected \[16, 4\]"):
        lin.add_lora(d, u[:, :3])
    with pytest.raises(qlinear.QlinearError, match=r"LoRA up has shape \[8, 4\]; expected \[16, 4\]"):
        lin.add_lora(d, u[:8])
    with pytest.raises(qlinear.QlinearError, match="rows must be contiguous"):
        lin.add_lora(np.asfortranarray(np.repeat(d, 1, axis=0)), u)
    with pytest.raises(qlinear.QlinearError, match="shape"):
        lin.add_lora(d[:0], u[:, :0])
    bad = d.copy()
    bad[2, 7] = np.nan
    with pytest.raises(qlinear.QlinearError, match=r"down\[2, 7\] is NaN or Inf"):
        lin.add_lora(bad, u)
    with pytest.raises(TypeError):
        lin.add_lora(d.astype(np.float64), u)
    with pytest.raises(qlinear.QlinearError, match="no LoRA with id 99"):
        lin.remove_lora(99)
    assert lin.lora_count == 0, "a refused LoRA must leave the layer as it was"
    wo = qlinear.Linear.from_weight(w, format="int8-convrot", kind="weight-only", threads=2)
    with pytest.raises(qlinear.QlinearError):
        wo.add_lora(d, u)
