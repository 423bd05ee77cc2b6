#!/usr/bin/env bash
# Build qlinear (release) and run the main job: `qlinear bench` on its default
# workload (anima profile, M = 1024). Extra arguments go to `qlinear bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target qlinear
exec ./build/qlinear bench "$@"
