#!/usr/bin/env bash
# Install what building, testing and benchmarking qlinear needs, if missing
# (Debian 12; apt-get as root). Everything else is built from this tree.
set -euo pipefail
pkgs=(gcc g++ make cmake ninja-build clang libclang-rt-14-dev libjansson-dev libopenblas-dev libdnnl-dev pkgconf
  python3-numpy python3-torch python3-pytest python3-cffi python3-matplotlib)
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
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
