#!/usr/bin/env bash
# Install what building, testing and benchmarking qlinear needs, if missing
# (Debian 12; apt-get as root). Everything else is built from this tree, but
# the Python stack (PyTorch, comfy-kitchen, pytest...), which scripts/venv.sh
# installs from PyPI into .venv; Debian's python3-numpy and python3-cffi serve
# the install test (the package installed for /usr/bin/python3).
set -euo pipefail
pkgs=(gcc g++ make cmake ninja-build clang libclang-rt-14-dev libomp-14-dev libjansson-dev libopenblas-dev libdnnl-dev pkgconf
  python3-venv python3-numpy python3-cffi)
# `deps.sh arm`: the AArch64 cross build and its emulator (scripts/test.sh) on
# an x86-64 host: Debian's cross gcc and its C library (libc6-dev-arm64-cross:
# only recommended by the compiler, so --no-install-recommends leaves it out),
# qemu-user, and the arm64 multiarch
# runtime the emulated tests load (libc6, libgomp1, libjansson).
arm=0
if [ "${1:-}" = arm ] && [ "$(dpkg --print-architecture)" != arm64 ]; then
  arm=1
  pkgs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libjansson-dev:arm64 libgomp1:arm64)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "qlinear: missing packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "qlinear: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if ((arm)) && ! dpkg --print-foreign-architectures | grep -qx arm64; then dpkg --add-architecture arm64; fi
  apt-get update -qq
  apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
