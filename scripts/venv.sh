#!/usr/bin/env bash
# The Python stack (python/requirements.txt: PyPI's torch, comfy-kitchen
# 0.2.40, numpy, pytest, cffi, safetensors, matplotlib) in a virtual
# environment at .venv (git-ignored; QL_VENV= elsewhere), made with Debian's
# python3 and reused while python/requirements.txt is unchanged (a stamp
# written last: an interrupted install is redone). Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${QL_VENV:-$PWD/.venv}
req=python/requirements.txt
stamp="$venv/.qlinear-requirements"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  echo "$venv/bin/python"
  exit 0
fi
echo "qlinear: creating the Python environment $venv (from PyPI: $(grep -v '^#' "$req" | tr '\n' ' '))" >&2
start=$(date +%s)
rm -rf "$venv"
/usr/bin/python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req" >&2
cp "$req" "$stamp"
echo "qlinear: $venv ready in $(($(date +%s) - start)) s, $(du -sh "$venv" | cut -f1)" >&2
echo "$venv/bin/python"
