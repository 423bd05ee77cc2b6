#!/usr/bin/env bash
# Hardware counters (Nsight Compute) for the kernels that decide the anima
# totals, on a GPU machine where ncu can read them; run after
# `bash scripts/gpu.sh` has built build-gpu/. Results under $OUT when set.
#   1. every kernel of one bench shape with one-pass metrics (name, time,
#      DRAM bytes, SM throughput): which cuBLASLt kernel each peer ran;
#   2. our kernels in detail (speed of light, memory, scheduler and warp
#      stall sections).
# QL_PROF_SHAPES: "M:NxK ..." for part 1; QL_PROF_DETAIL: "M:NxK:regex:count ...".
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-gpu/out}
mkdir -p "$out"
[ -f .devdeps/lib/libjansson.so.4 ] && export LD_LIBRARY_PATH="$PWD/.devdeps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -n "$ncu" ] && [ -x "$ncu" ] || { echo "gpu_profile: no ncu on this machine"; exit 1; }
q=./build-gpu/qlinear
[ -x "$q" ] || { echo "gpu_profile: build-gpu/qlinear missing: run scripts/gpu.sh first"; exit 1; }
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread
for spec in ${QL_PROF_SHAPES:-16384:2048x2048 16384:6144x256 8192:8192x8192}; do
  m=${spec%%:*}; s=${spec#*:}
  echo "== all kernels, M = $m, $s"
  "$ncu" --clock-control none --metrics "$metrics" -c 300 --csv --page raw \
    "$q" bench --device cuda --m "$m" --shape "$s" --reps 1 --no-peak > "$out/ncu_list_${m}_${s}.csv" 2> "$out/ncu_list_${m}_${s}.err"
  echo "rc=$? $(wc -l < "$out/ncu_list_${m}_${s}.csv") lines"
done
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis"
for spec in ${QL_PROF_DETAIL:-16384:2048x2048:quantize_rows_g256:1 16384:2048x2048:s8_gemm_sm90:2 16384:6144x256:s8_gemm_sm90:2 8192:8192x8192:s8_gemm_sm90:2}; do
  IFS=: read -r m s re c <<< "$spec"
  f="$out/ncu_detail_${m}_${s}_${re}.txt"
  echo "== detail, M = $m, $s, kernels /$re/ x$c"
  # shellcheck disable=SC2086
  "$ncu" --clock-control none $sections -k "regex:$re" -c "$c" \
    "$q" bench --device cuda --m "$m" --shape "$s" --reps 1 --no-peak > "$f" 2>&1
  echo "rc=$?"; grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Issue Slots Busy|No Eligible|Achieved Occupancy" "$f" | head -n 40
done
