#!/usr/bin/env bash
# On the lent machine (a 16-core Xeon with AMX beside an H200; its own python3
# with PyTorch, no network): build with CUDA, then the AMX kernels' tests,
# the comfy-kitchen backend's tests on the CPU and on the GPU, the ComfyUI
# path layer by layer at 16 threads, and `qlinear bench` through AMX against
# AVX512-VNNI and oneDNN. comfy-kitchen (its Python files) and cffi travel in
# .whl/ (git-excluded): see docs/MEASUREMENTS.md §8 for how they were staged.
# Results under $OUT. QL_LENT_SKIP=comma list of: build,amx,pytest,comfy,bench.
# QL_LENT_EXTRA=comma list of: tune (scripts/amx_tune.sh: the amx table's
# blocking, prefetch and small-M sweeps), threads (the 1..16-thread curve of
# w8a8-convrot and the int8 GEMM through AMX and AVX512-VNNI, beside the
# sampled dot-product peak's: python -m qlinear_bench.threads), acts (the
# input activations at 16 threads through AMX: fused, and as their own pass
# then the layer, in `qlinear bench`; against PyTorch's op then the layer on
# ComfyUI's path, qlinear_bench.comfy --input-act).
# QL_LENT_CUDA=OFF builds without the CUDA backend (the CPU work alone, a
# quicker build); QL_LENT_TUNE names amx_tune.sh's parts (default: all).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-gpu/out}; mkdir -p "$out"
skip=",${QL_LENT_SKIP:-},"
more=",${QL_LENT_EXTRA:-},"
if [ -d .whl ]; then
  mkdir -p /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
  cp -r .whl/site/* /tmp/site/ 2>/dev/null
  export PYTHONPATH=/tmp/site
fi
if [ -f .devdeps/include/jansson.h ] && [ ! -f /usr/include/jansson.h ]; then
  jl=$(ls "$PWD"/.devdeps/lib/libjansson.so.4 2>/dev/null || echo "$PWD/.devdeps/lib/libjansson.a")
  extra=(-DQL_JANSSON_INCLUDE="$PWD/.devdeps/include" -DQL_JANSSON_LIB="$jl")
  export LD_LIBRARY_PATH="$PWD/.devdeps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PATH=/usr/local/cuda/bin:$PATH
lscpu | grep -E "Model name|^CPU\(s\)|amx" | sed 's/Flags:.*\(amx[a-z0-9_ ]*\).*/AMX flags: \1/' | tee "$out/cpu.txt"
if [[ $skip != *,build,* ]]; then
  gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
  cmake -S . -B build-gpu -G "$gen" -DCMAKE_BUILD_TYPE=Release -DQL_CUDA="${QL_LENT_CUDA:-ON}" "${extra[@]}" > "$out/cmake.log" 2>&1
  cmake --build build-gpu -j "$(nproc)" --target qlinear qlinear_shared test_amx test_kernels test_linear test_dispatch test_input_act \
    > "$out/build.log" 2>&1 || { tail -n 30 "$out/build.log"; exit 1; }
fi
export QLINEAR_LIBRARY="$PWD/build-gpu/libqlinear.so" QLINEAR_CLI="$PWD/build-gpu/qlinear" PYTHONPATH="$PWD/python:${PYTHONPATH:-}"
if [[ $skip != *,amx,* ]]; then
  echo "== AMX: test_amx, test_kernels, test_linear, test_dispatch, test_input_act"
  for t in test_amx test_kernels test_linear test_dispatch test_input_act; do
    ./build-gpu/$t > "$out/$t.log" 2>&1; echo "$t rc $? $(tail -n 1 "$out/$t.log")"
  done
fi
if [[ $skip != *,pytest,* ]]; then
  echo "== pytest: the comfy-kitchen backend (CPU and GPU) (python3: $(python3 -c 'import torch; print(torch.__version__)'))"
  python3 -m pytest -q -p no:cacheprovider python/tests/test_comfy.py python/tests/test_comfy_cuda.py 2>&1 | tail -n 6
fi
if [[ $skip != *,comfy,* ]]; then
  echo "== the ComfyUI path, layer by layer, 16 threads"
  python3 -m qlinear_bench.comfy --threads "$(nproc)" --reps 3 --json "$out/comfy.json" 2>&1 | tail -n 16
fi
if [[ $skip != *,bench,* ]]; then
  echo "== qlinear bench: AMX, AVX512-VNNI and oneDNN, anima M = 1024, $(nproc) threads"
  for isa in amx avx512vnni; do
    QLINEAR_ISA=$isa ./build-gpu/qlinear bench --paths w8a8-convrot,int8-gemm,onednn-int8,onednn-bf16 --reps 3 \
      --json "$out/bench_$isa.json" 2>&1 | tail -n 7
  done
fi
if [[ $more == *,tune,* ]]; then
  echo "== amx table sweeps (scripts/amx_tune.sh)"
  bash scripts/amx_tune.sh build-gpu/qlinear ${QL_LENT_TUNE:-} 2>&1 | tee "$out/amx_tune.txt"
fi
if [[ $more == *,acts,* ]]; then
  echo "== input activations, anima M = 1024, $(nproc) threads, AMX"
  QLINEAR_ISA=amx ./build-gpu/qlinear bench --paths w8a8-convrot,in-gelu_tanh,in-swiglu,in-rms_norm,op-gelu_tanh,op-swiglu,op-rms_norm \
    --reps 3 --json "$out/bench_acts.json" 2>&1 | grep -E "weighted|^  [a-z]"
  python3 -m qlinear_bench.comfy --threads "$(nproc)" --reps 3 --input-act gelu_tanh,swiglu,rms_norm \
    --json "$out/comfy_acts.json" 2>&1 | tail -n 12
fi
if [[ $more == *,threads,* ]]; then
  for isa in amx avx512vnni; do
    echo "== thread scaling, $isa, anima M = 1024"
    QLINEAR_ISA=$isa python3 -m qlinear_bench.threads --cli build-gpu/qlinear --json "$out/threads_$isa.json" 2>&1 | tail -n 9
  done
fi
