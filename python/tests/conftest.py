"""Shared pieces of the Python tests: the seed (printed; QL_TEST_SEED reruns
one), the qlinear CLI of the same build, a minimal safetensors writer."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))


def pytest_report_header(config):
    import qlinear
    return [f"qlinear {qlinear.version()} from {qlinear.library_path()}", f"seed {SEED} (rerun with QL_TEST_SEED={SEED})"]


SEED = int(os.environ.get("QL_TEST_SEED") or int.from_bytes(os.urandom(3), "little"))


@pytest.fixture
def rng(request):
    # one stream per test, derived from the session seed and the test's name
    h = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.name))
    print(f"seed {SEED} (QL_TEST_SEED={SEED}), stream {h}")
    return np.random.default_rng([SEED, h])


@pytest.fixture
def gen(rng):
    """A torch CPU generator seeded from the test's stream (imports torch)."""
    import torch
    return torch.Generator().manual_seed(int(rng.integers(2**31)))


@pytest.fixture(scope="session")
def cli():
    p = Path(os.environ.get("QLINEAR_CLI") or ROOT / "build" / "qlinear")
    if not p.exists():
        pytest.fail(f"the qlinear command is not at {p}; build it or set QLINEAR_CLI")
    return str(p)


def run_cli(cli, *args):
    r = subprocess.run([cli, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"qlinear {' '.join(map(str, args))}: {r.stderr}"
    return r


_ST = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int8): "I8",
       np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.float64): "F64"}


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> numpy array, or (array, "BF16") for uint16 bf16 bits."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        a, dt = (t if isinstance(t, tuple) else (t, _ST[np.dtype(t.dtype)]))
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def bf16_bits(a):
    """fp32 -> bf16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def bf16_to_f32(b):
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def rel_l2(a, ref):
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def read_safetensors_tensor(path, name):
    import qlinear
    with qlinear.Checkpoint(path) as ck:
        return ck.tensor(name)
