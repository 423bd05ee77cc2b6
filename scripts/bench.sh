#!/usr/bin/env bash
# Build qlinear (release) and run the main job: `qlinear bench` on its default
# workload (anima profile, M = 1024), then the ComfyUI path layer by layer (qlinear_bench.comfy) and
# the end-to-end DiT step (qlinear_bench.e2e), in the PyPI stack of scripts/venv.sh.
# Extra arguments go to `qlinear bench`; QL_E2E_ARGS to the end-to-end run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
py=$(bash scripts/venv.sh)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target qlinear qlinear_shared
./build/qlinear bench "$@"
export QLINEAR_LIBRARY="$PWD/build/libqlinear.so" PYTHONPATH="$PWD/python"
# What reaches a ComfyUI user, layer by layer: comfy_kitchen.int8_linear through the qlinear backend
# against comfy-kitchen's eager backend and PyTorch's bf16 / fp32 F.linear (QL_COMFY_ARGS).
"$py" -m qlinear_bench.comfy ${QL_COMFY_ARGS:-}
# End to end: one step of a diffusion transformer with the anima shapes in PyTorch, its linears as
# PyTorch (fp32, oneDNN fp32, bf16), qlinear, and comfy_kitchen.int8_linear through qlinear and
# through eager (python3 -m qlinear_bench.e2e --help; QL_E2E_ARGS).
"$py" -m qlinear_bench.e2e ${QL_E2E_ARGS:-}
