#!/usr/bin/env bash
# Build and run every test: release build and tests (C, install, Python), the
# AArch64 cross build's tests under qemu-user (three CPU models, and the
# kernel tests once more under ASan + UBSan), 60 s of
# libFuzzer on each reader (fuzz/: the checkpoint container, the comfy layer
# parser, the LoRA file reader; a crash, leak or UB fails the script), then
# the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
py=$(bash scripts/venv.sh)
jobs=$(nproc)
echo "== release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"
echo "== Python tests (pytest; PyPI's torch and comfy-kitchen in .venv: $("$py" -c 'import torch; print("torch", torch.__version__)'))"
QLINEAR_LIBRARY="$PWD/build/libqlinear.so" QLINEAR_CLI="$PWD/build/qlinear" PYTHONDONTWRITEBYTECODE=1 \
  "$py" -m pytest -q -p no:cacheprovider python/tests
echo "== Python tests again through ctypes (the binding where cffi is not installed)"
QLINEAR_FFI=ctypes QLINEAR_LIBRARY="$PWD/build/libqlinear.so" QLINEAR_CLI="$PWD/build/qlinear" PYTHONDONTWRITEBYTECODE=1 \
  "$py" -m pytest -q -p no:cacheprovider python/tests
if [ "$(uname -m)" = x86_64 ]; then
  # The ARM backend (src/arm) on this x86 machine: the cross-built suite under
  # qemu-user, once per CPU model: max (every ISA: generic, neon, neondot,
  # i8mm, neonbf16), neoverse-n1 (dot product, no i8mm), cortex-a57 (NEON only). The
  # dispatch tests pin each model themselves. Left out: test_large (4 GiB,
  # 64-bit indexing: over 10 minutes of CPU emulated), test_install (it builds
  # and runs consumers with the host's tools), test_linear_no_avx512bf16
  # (test_linear again, with an x86 feature hidden).
  echo "== AArch64 cross build + tests under qemu-user"
  bash scripts/deps.sh arm
  cmake -S . -B build-arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
    -DQL_CUDA=OFF >/dev/null
  cmake --build build-arm -j "$jobs"
  for cpu in max neoverse-n1 cortex-a57; do
    echo "-- qemu-aarch64 -cpu $cpu"
    QEMU_CPU=$cpu OMP_WAIT_POLICY=passive ctest --test-dir build-arm --output-on-failure -j "$jobs" \
      -E '^(test_install|test_linear_no_avx512bf16|test_large)$'
  done
  # The ARM code under ASan + UBSan: once, on qemu's max model (every ISA's
  # kernels, with every tail), sanitizer runtimes linked statically
  # (cmake/arm.cmake). LeakSanitizer cannot stop the world under qemu-user,
  # so leaks are left to the native run below, as are the checkpoint and
  # command tests (portable code, 8 of the 11 minutes this would take).
  echo "== AArch64 cross build under ASan + UBSan, qemu-aarch64 -cpu max"
  cmake -S . -B build-arm-asan -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQL_SANITIZE=ON -DQL_CUDA=OFF >/dev/null
  cmake --build build-arm-asan -j "$jobs"
  QEMU_CPU=max OMP_WAIT_POLICY=passive ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-arm-asan --output-on-failure -j "$jobs" \
    -E '^(test_install|test_linear_no_avx512bf16|test_large|test_format|test_format_cli|test_merge)$'
fi
echo "== libFuzzer on the readers (60 s each, ASan + UBSan): checkpoint, comfy layers, LoRA files"
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQL_BUILD_FUZZ=ON -DQL_SANITIZE=ON \
  -DQL_BUILD_TESTS=OFF -DQL_CUDA=OFF >/dev/null
cmake --build build-fuzz --target fuzz_checkpoint fuzz_layers fuzz_lora fuzz_make_seeds
rm -rf build-fuzz/corpus && build-fuzz/fuzz_make_seeds build-fuzz/corpus
for t in checkpoint layers lora; do # the final coverage line, or what went wrong (and the input's file)
  echo "-- fuzz_$t"
  build-fuzz/fuzz_$t -dict=fuzz/$t.dict -artifact_prefix=build-fuzz/$t- -max_total_time=60 \
    -max_len=65536 -timeout=10 -rss_limit_mb=2048 build-fuzz/corpus/$t 2>&1 |
    grep -E '^#[0-9]+[[:space:]]+DONE|^Done|^==[0-9]+==|^fuzz|SUMMARY|runtime error|Test unit written'
done
echo "== ASan + UBSan build + tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQL_SANITIZE=ON -DQL_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
