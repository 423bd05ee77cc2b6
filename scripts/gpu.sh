#!/usr/bin/env bash
# Everything the GPU needs, in one call on a machine with an NVIDIA GPU:
# build (release, CUDA on), the CUDA tests (test_cuda against the CPU
# reference; test_linear too), then `qlinear bench --device cuda` at
# M = 1024, 4096, 16384 and 1 (anima profile), results under $OUT when set.
#   bash scripts/gpu.sh            build + tests + bench
#   bash scripts/gpu.sh stage      (on a machine with apt) copy libjansson's
#                                  header and static library into .devdeps/,
#                                  for GPU machines that cannot install it
#   QL_GPU_SWEEP=1                 also time every Hopper tile at M = 1024/4096/16384
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
set -e
if [ "${QL_GPU_SWEEP:-0}" = 1 ]; then
  for t in 0 1 2 3; do
    echo "== tile $t"
    QLINEAR_CUDA_TILE=$t ./build-gpu/qlinear bench --device cuda --m 1024,4096,16384 --reps 5 --no-peak \
      --json "$out/sweep_$t.json" > "$out/sweep_$t.txt" 2>&1 || true
    grep -E "^(M =|total)" "$out/sweep_$t.txt" || tail -n 3 "$out/sweep_$t.txt"
  done
fi
echo "== bench"
./build-gpu/qlinear bench --device cuda --m "${QL_GPU_M:-1024,4096,16384,1}" --json "$out/bench_cuda.json" 2>&1 | tee "$out/bench_cuda.txt"
echo "test_cuda rc=$tc test_linear rc=$tl"
[ "$tc" = 0 ] && [ "$tl" = 0 ]
