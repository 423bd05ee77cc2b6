#!/usr/bin/env bash
# The measurements the amx kernel table's entries are chosen from, on a
# machine with AMX (the lent machine's Xeon): the int8 GEMM of the anima
# profile at M = 1024 on every core, swept over the blocked driver's
# blocking and loop order (QLINEAR_S8_BLOCKING=mc,nc,kc,a|b) and the tile
# kernel's prefetch (QLINEAR_AMX_PF=b[,a]); then the small-M limit over the
# qwen3-te profile (QLINEAR_SMALL_M: GEMV route against blocked, per M).
# One line per configuration: its weighted total (ms, lower is better).
#   bash scripts/amx_tune.sh [path/to/qlinear] [blocking|prefetch|smallm ...]
set -uo pipefail
q=${1:-build/qlinear}; shift || true
parts=${*:-blocking prefetch smallm}
export QLINEAR_ISA=${QLINEAR_ISA:-amx}
total() { # the weighted total of one path from a bench run's output
  awk -v p="$1" '/weighted totals/ {t = 1} t && $1 == p {print $2; exit}'
}
run() { # label, env..., -- bench args
  local label=$1; shift
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local o; o=$(env "${envs[@]}" "$q" bench "$@" 2>/dev/null)
  printf '%-34s %s\n' "$label" "$(echo "$o" | total int8-gemm) ms"
  echo "$o" | grep -m1 "int8 peak" | sed 's/^ */    /'
}
anima=(--profile anima --m 1024 --paths int8-gemm --reps 3)
for part in $parts; do
  case $part in
  blocking)
    echo "== blocking (mc,nc,kc,order): anima M = 1024, int8-gemm, $(nproc) threads"
    run "table's" -- "${anima[@]}"
    for order in a b; do
      for kc in 256 512 1024 2048; do
        for mn in 32,256 64,512 128,512 128,1024 256,1024 64,2048; do
          run "$mn,$kc,$order" QLINEAR_S8_BLOCKING="$mn,$kc,$order" -- "${anima[@]}"
        done
      done
    done
    ;;
  prefetch)
    echo "== prefetch (B blocks ahead[,A]): table's blocking"
    for pf in 0 1 2 4 1,1 2,2; do run "pf $pf" QLINEAR_AMX_PF=$pf -- "${anima[@]}"; done
    ;;
  smallm)
    echo "== small M: qwen3-te, GEMV route (QLINEAR_SMALL_M=4096) against blocked (=0)"
    for m in 8 16 32 48 64 96 128; do
      for lim in 4096 0; do
        run "M=$m small_m=$lim" QLINEAR_SMALL_M=$lim -- --profile qwen3-te --m $m --paths int8-gemm --reps 5
      done
    done
    ;;
  esac
done
