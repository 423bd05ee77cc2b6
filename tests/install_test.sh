#!/usr/bin/env bash
# Install the build into a temporary prefix and use it as a user would: the
# example program built with pkg-config and with CMake (shared and static),
# run on a checkpoint written by the installed `qlinear quantize`; the soname,
# the exported symbols, `qlinear --version` and the Python package.
#   tests/install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d "$build/install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_install: FAIL: $*" >&2; exit 1; }
pfx=$tmp/prefix
cmake --install "$build" --prefix "$pfx" >/dev/null
version=$(sed -n 's/^project(qlinear VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
soversion=$(echo "$version" | awk -F. '{ print ($1 > 0) ? $1 : $1 "." $2 }')
libdir=$(dirname "$(find "$pfx" -name "libqlinear.so.$version" | head -n 1)")
[ -n "$libdir" ] || fail "libqlinear.so.$version not installed"
for f in include/qlinear.h bin/qlinear; do [ -e "$pfx/$f" ] || fail "$f not installed"; done
for f in libqlinear.a libqlinear.so "libqlinear.so.$soversion" pkgconfig/qlinear.pc cmake/qlinear/qlinearConfig.cmake \
  cmake/qlinear/qlinearConfigVersion.cmake cmake/qlinear/qlinearTargets.cmake; do
  [ -e "$libdir/$f" ] || fail "$libdir/$f not installed"
done
soname=$(objdump -p "$libdir/libqlinear.so.$version" | awk '$1 == "SONAME" { print $2 }')
[ "$soname" = "libqlinear.so.$soversion" ] || fail "soname '$soname', expected libqlinear.so.$soversion"
# Exported: exactly the functions the header declares.
nm -D --defined-only "$libdir/libqlinear.so.$version" | awk '$2 == "T" { sub(/@.*/, "", $3); print $3 }' | sort >"$tmp/exported"
perl -0pe 's{/\*.*?\*/}{}gs' "$src/include/qlinear.h" | grep -o '[ *]ql_[a-z0-9_]*(' | tr -d ' *(' | sort -u >"$tmp/declared"
if ! cmp -s "$tmp/exported" "$tmp/declared"; then
  diff "$tmp/declared" "$tmp/exported" >&2 || true
  fail "exported symbols differ from the header's functions (< declared, > exported)"
fi
echo "installed: $(wc -l <"$tmp/exported") functions exported, soname $soname"
out=$("$pfx/bin/qlinear" --version)
[[ "$out" == "qlinear $version "* ]] || fail "qlinear --version says '$out'"
echo "$out"

# A float checkpoint with random weights (seeded) and a bias, quantized by the installed tool.
seed=${QL_TEST_SEED:-$RANDOM}
echo "test_install: seed $seed (rerun with QL_TEST_SEED=$seed)"
n=48 k=512
{
  hdr=$(printf '{"blk.fc.bias":{"dtype":"F32","shape":[%d],"data_offsets":[0,%d]},"blk.fc.weight":{"dtype":"F32","shape":[%d,%d],"data_offsets":[%d,%d]}}' \
    "$n" $((4 * n)) "$n" "$k" $((4 * n)) $((4 * n + 4 * n * k)))
  while (( ${#hdr} % 8 )); do hdr="$hdr "; done
  LC_ALL=C awk -v len="${#hdr}" -v hdr="$hdr" -v cnt=$((n + n * k)) -v seed="$seed" 'BEGIN {
    srand(seed); l = len
    for (i = 0; i < 8; i++) { printf "%c", l % 256; l = int(l / 256) }
    printf "%s", hdr
    # little-endian fp32 with magnitudes in [2^-7, 2^-5), random signs
    for (i = 0; i < cnt; i++)
      printf "%c%c%c%c", int(rand() * 256), int(rand() * 256), int(rand() * 256), (rand() < 0.5 ? 60 : 188)
  }'
} >"$tmp/float.safetensors"
"$pfx/bin/qlinear" quantize "$tmp/float.safetensors" "$tmp/int8.safetensors" --format int8-convrot >/dev/null

ld_run() { LD_LIBRARY_PATH="$libdir" "$@"; }
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc -std=c11 -Wall -Werror -o "$tmp/ex_pkgconfig" "$src/examples/run_layer.c" $(pkg-config --cflags --libs qlinear)
# grep without -q: with pipefail, grep -q leaving early can kill ldd by SIGPIPE (a spurious failure)
ld_run ldd "$tmp/ex_pkgconfig" | grep "$libdir/libqlinear.so.$soversion" >/dev/null ||
  fail "pkg-config build does not load the installed library"
ld_run "$tmp/ex_pkgconfig" "$tmp/int8.safetensors" blk.fc 5 >"$tmp/out_pkgconfig" || fail "pkg-config build: $(cat "$tmp/out_pkgconfig")"
for kind in shared static; do
  cmake -S "$src/examples" -B "$tmp/ex_$kind" -DCMAKE_PREFIX_PATH="$pfx" -DQL_EXAMPLE_STATIC=$([ $kind = static ] && echo ON || echo OFF) \
    -DCMAKE_C_FLAGS="-Wall -Werror" >/dev/null
  cmake --build "$tmp/ex_$kind" >/dev/null
  "$tmp/ex_$kind/run_layer" "$tmp/int8.safetensors" blk.fc 5 >"$tmp/out_$kind" || fail "CMake $kind build: $(cat "$tmp/out_$kind")"
done
cat "$tmp/out_pkgconfig"
grep -q "^qlinear $version (header $version)" "$tmp/out_pkgconfig" || fail "ql_version() mismatch"
grep -q "bit for bit: yes" "$tmp/out_pkgconfig" || fail "example output"
cmp -s "$tmp/out_pkgconfig" "$tmp/out_shared" && cmp -s "$tmp/out_pkgconfig" "$tmp/out_static" ||
  fail "pkg-config, CMake shared and CMake static builds print different results"
echo "example: pkg-config, CMake (qlinear::qlinear) and CMake (qlinear::qlinear_static) builds agree"

# The installed Python package finds the installed library on its own.
# (scripts/deps.sh installs python3-numpy and python3-cffi for /usr/bin/python3)
pyver=$(cd "$tmp" && env -u QLINEAR_LIBRARY -u QLINEAR_HEADER PYTHONPATH="$pfx/lib/python3/dist-packages" \
  /usr/bin/python3 -c "import qlinear; print(qlinear.version(), qlinear.library_path())") ||
  fail "the installed Python package does not load"
[[ "$pyver" == "$version $libdir/libqlinear.so.$soversion" ]] || fail "installed Python package says '$pyver'"
echo "python: $pyver"
echo "test_install: passed"
