#!/usr/bin/env bash
# Build qlinear (release) and run the main job: `qlinear bench` on its default
# workload (anima profile, M = 1024), then the end-to-end DiT step (qlinear_bench.e2e).
# Extra arguments go to `qlinear bench`; QL_E2E_ARGS to the end-to-end run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target qlinear qlinear_shared
./build/qlinear bench "$@"
# End to end: one step of a diffusion transformer with the anima shapes in PyTorch, its linears as
# PyTorch (fp32 OpenBLAS / oneDNN, bf16) vs qlinear (python3 -m qlinear_bench.e2e --help; QL_E2E_ARGS).
QLINEAR_LIBRARY="$PWD/build/libqlinear.so" PYTHONPATH="$PWD/python" /usr/bin/python3 -m qlinear_bench.e2e ${QL_E2E_ARGS:-}
