#!/usr/bin/env bash
# Everything the GPU needs, in one call on a machine with an NVIDIA GPU:
# build (release, CUDA on), the CUDA tests (test_cuda against the CPU
# reference; test_linear too), then `qlinear bench --device cuda` at
# M = 1024, 4096, 16384 and 1 (anima profile), then with CUDA graphs at
# M = 1024 and 1, then PyTorch on the GPU: the qlinear.torch tests
# (python/tests/test_torch_cuda.py, where pytest is installed) and the
# end-to-end DiT step (python3 -m qlinear_bench.e2e --device cuda: PyTorch fp32 /
# bf16 against qlinear's CUDA layers; QL_GPU_E2E lists the runs, "4096g":
# M = 4096 with CUDA graphs, "4096gs": and --shared-input), results under $OUT when set. QL_GPU_ONLY=python skips to the
# Python part (after the build); QL_GPU_ONLY=c stops before it.
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
  cp -a /usr/lib/x86_64-linux-gnu/libjansson.so.4* .devdeps/lib/  # the shared library links this one (not PIC: the .a)
  grep -qx '/.devdeps/' .git/info/exclude 2>/dev/null || echo '/.devdeps/' >> .git/info/exclude
  echo "staged libjansson in .devdeps/"
  exit 0
fi
out=${OUT:-build-gpu/out}
mkdir -p "$out"
extra=()
if [ ! -f /usr/include/jansson.h ] && [ -f .devdeps/include/jansson.h ]; then
  jl=$(ls "$PWD"/.devdeps/lib/libjansson.so.4 2>/dev/null || echo "$PWD/.devdeps/lib/libjansson.a")
  extra+=(-DQL_JANSSON_INCLUDE="$PWD/.devdeps/include" -DQL_JANSSON_LIB="$jl")
  export LD_LIBRARY_PATH="$PWD/.devdeps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee "$out/gpu.txt"
gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release -DQL_CUDA=ON "${extra[@]}" > "$out/cmake.log"
cmake --build build-gpu -j "$(nproc)" --target qlinear qlinear_shared test_cuda test_linear 2>&1 | grep -E "error|FAILED" -A4 | head -n 40 || true
command -v cuobjdump >/dev/null && cuobjdump --dump-sass build-gpu/CMakeFiles/qlinear_objs.dir/src/cuda/gemm_sm90.cu.o 2>/dev/null \
  | grep -o -E '[A-Z]+GMMA[.A-Z0-9]*' | sort | uniq -c | tee "$out/sass_gmma.txt" || true
set +e
tc=0 tl=0 fwd=0
if [ "${QL_GPU_ONLY:-}" != python ]; then
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
fi
if [ "${QL_GPU_ONLY:-}" = c ]; then
  echo "test_cuda rc=$tc test_linear rc=$tl forward rc=$fwd (QL_GPU_ONLY=c: the Python part not run)"
  [ "$tc" = 0 ] && [ "$tl" = 0 ] && [ "$fwd" = 0 ]; exit
fi
echo "== PyTorch on the GPU (python3: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1 | tail -n 1))"
set +e
export QLINEAR_LIBRARY="$PWD/build-gpu/libqlinear.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
py=0
if python3 -c 'import pytest, numpy, torch' 2>/dev/null; then
  python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_cuda.py 2>&1 | tee "$out/pytest_cuda.log" | tail -n 5
  py=${PIPESTATUS[0]}
else
  echo "pytest/numpy/torch missing in python3 here: the GPU tests of qlinear.torch not run"
fi
for run in ${QL_GPU_E2E:-1024 1024g 4096 4096g 1024gs 4096gs}; do  # M, "g": CUDA graphs, "s": --shared-input
  m=${run%%[gs]*}; g=; sh=; tag=$m
  case $run in *g*) g=--graphs; tag=${tag}g;; esac
  case $run in *s*) sh=--shared-input; tag=${tag}s;; esac
  echo "-- e2e M = $m ${g:-eager} $sh"
  python3 -m qlinear_bench.e2e --device cuda --tokens "$m" --reps 5 $g $sh --json "$out/e2e_cuda_${tag}.json" \
    > "$out/e2e_cuda_${tag}.txt" 2>&1 || py=1
  sed -n '/^path /,$p' "$out/e2e_cuda_${tag}.txt" | head -n 8; tail -n 2 "$out/e2e_cuda_${tag}.txt"
done
set -e
echo "test_cuda rc=$tc test_linear rc=$tl forward rc=$fwd python rc=$py"
[ "$tc" = 0 ] && [ "$tl" = 0 ] && [ "$fwd" = 0 ] && [ "$py" = 0 ]
