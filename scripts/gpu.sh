#!/usr/bin/env bash
# Everything the GPU needs, in one call on a machine with an NVIDIA GPU:
# build (release, CUDA on), the CUDA tests (test_cuda against the CPU
# reference; test_linear too), then `qlinear bench --device cuda` at
# M = 1024, 4096, 16384 and 1 (anima profile), then with CUDA graphs at
# M = 1024 and 1, results under $OUT when set.
#   bash scripts/gpu.sh            build + tests + bench
#   bash scripts/gpu.sh stage      (on a machine with apt) copy libjansson's
#                                  header and static library into .devdeps/,
#                                  for GPU machines that cannot install it
#   QL_GPU_SWEEP=1                 also time every Hopper tile (QL_GPU_TILES, QL_GPU_SWEEP_M)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = stage ]; then
  bash scripts/deps.sh
  mkdir -p .devdeps/include .devdeps/lib
  cp /usr/include/jansson.h /usr/include/jansson_config.h .devdeps/include/
  cp /usr/lib/x86_64-linux-gnu/libjansson.a .devdeps/lib/
  grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >> .git/info/exclude
  echo "staged libjansson in .devdeps/"
  exit 0
fi
out=${OUT:-build-gpu/out}
mkdir -p "$out"
extra=()
if [ ! -f /usr/include/jansson.h ] && [ -f .devdeps/include/jansson.h ]; then
  extra+=(-DQL_JANSSON_INCLUDE="$PWD/.devdeps/include" -DQL_JANSSON_LIB="$PWD/.devdeps/lib/libjansson.a")
fi
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/gpu.txt"
gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release -DQL_CUDA=ON "${extra[@]}" > "$out/cmake.log"
cmake --build build-gpu -j "$(nproc)" --target qlinear test_cuda test_linear 2>&1 | grep -E "error|FAILED" -A4 | head -n 40 || true
command -v cuobjdump >/dev/null && cuobjdump --dump-sass build-gpu/CMakeFiles/qlinear_objs.dir/src/cuda/gemm_sm90.cu.o 2>/dev/null \
  | grep -o -E '[A-Z]+GMMA[.A-Z0-9]*' | sort | uniq -c | tee "$out/sass_gmma.txt" || true
set +e
echo "== test_cuda"
./build-gpu/test_cuda 2>&1 | tee "$out/test_cuda.log" | tail -n 15
tc=${PIPESTATUS[0]}
echo "== test_linear (CPU, same build)"
./build-gpu/test_linear > "$out/test_linear.log" 2>&1; tl=$?
tail -n 1 "$out/test_linear.log"
echo "== qlinear forward --device cuda vs the CPU, on a checkpoint written by qlinear quantize"
fw=build-gpu/fw; mkdir -p "$fw"; fwd=1
if python3 -c 'import numpy, safetensors' 2>/dev/null; then
  python3 - "$fw" <<'PY'
import sys, numpy as np
from safetensors.numpy import save_file
d = sys.argv[1]; r = np.random.default_rng(7)
save_file({"blk.proj.weight": (r.standard_normal((768, 1536)) * 0.02).astype(np.float32),
           "blk.proj.bias": r.standard_normal(768).astype(np.float32)}, f"{d}/w.safetensors")
x = r.standard_normal((77, 1536)).astype(np.float32); x[:, 5] *= 40
save_file({"x": x}, f"{d}/x.safetensors")
PY
  ./build-gpu/qlinear quantize "$fw/w.safetensors" "$fw/q.safetensors" --format int8-convrot > /dev/null &&
  ./build-gpu/qlinear forward "$fw/q.safetensors" blk.proj "$fw/x.safetensors" "$fw/y_cpu.safetensors" --out-dtype bf16 &&
  ./build-gpu/qlinear forward "$fw/q.safetensors" blk.proj "$fw/x.safetensors" "$fw/y_gpu.safetensors" --out-dtype bf16 --device cuda &&
  cmp "$fw/y_cpu.safetensors" "$fw/y_gpu.safetensors" && echo "forward: GPU output file identical to the CPU's" && fwd=0
else
  echo "forward check skipped: no numpy/safetensors in python3 here"; fwd=0
fi
set -e
if [ "${QL_GPU_SWEEP:-0}" = 1 ]; then
  for t in ${QL_GPU_TILES:-0 1 2 3 4}; do
    echo "== tile $t"
    QLINEAR_CUDA_TILE=$t ./build-gpu/qlinear bench --device cuda --m ${QL_GPU_SWEEP_M:-1024,4096,16384} --reps 5 --no-peak \
      --json "$out/sweep_$t.json" > "$out/sweep_$t.txt" 2>&1 || true
    grep -E "^(M =|total)" "$out/sweep_$t.txt" || tail -n 3 "$out/sweep_$t.txt"
  done
fi
echo "== bench"
./build-gpu/qlinear bench --device cuda --m "${QL_GPU_M:-1024,4096,16384,1}" --json "$out/bench_cuda.json" 2>&1 | tee "$out/bench_cuda.txt"
echo "== bench, CUDA graphs (every path's calls replayed from one graph: no host launch cost)"
./build-gpu/qlinear bench --device cuda --graphs --m "${QL_GPU_GRAPH_M:-1024,1}" --no-peak --json "$out/bench_cuda_graphs.json" 2>&1 \
  | tee "$out/bench_cuda_graphs.txt"
echo "test_cuda rc=$tc test_linear rc=$tl forward rc=$fwd"
[ "$tc" = 0 ] && [ "$tl" = 0 ] && [ "$fwd" = 0 ]
