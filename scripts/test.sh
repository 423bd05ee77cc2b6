#!/usr/bin/env bash
# Build and run every test: release build and tests (C, install, Python), 60 s of libFuzzer on the
# checkpoint reader, then the whole suite again under AddressSanitizer +
# UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
echo "== release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"
echo "== Python tests (pytest, Debian's /usr/bin/python3)"
QLINEAR_LIBRARY="$PWD/build/libqlinear.so" QLINEAR_CLI="$PWD/build/qlinear" PYTHONDONTWRITEBYTECODE=1 \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests
echo "== libFuzzer on the checkpoint reader (60 s, ASan + UBSan)"
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQL_BUILD_FUZZ=ON -DQL_SANITIZE=ON \
  -DQL_BUILD_TESTS=OFF -DQL_CUDA=OFF >/dev/null
cmake --build build-fuzz --target fuzz_checkpoint fuzz_make_seeds
rm -rf build-fuzz/corpus && build-fuzz/fuzz_make_seeds build-fuzz/corpus
build-fuzz/fuzz_checkpoint -dict=fuzz/checkpoint.dict -artifact_prefix=build-fuzz/ -max_total_time=60 \
  -max_len=65536 -timeout=10 -rss_limit_mb=2048 build-fuzz/corpus 2>&1 | tail -n 3
echo "== ASan + UBSan build + tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQL_SANITIZE=ON -DQL_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
