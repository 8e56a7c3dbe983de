#!/usr/bin/env bash
# Where a kernel's time goes, by Nsight Compute: speed of light, tensor-pipe utilisation and
# warp stall reasons of one call, on the H200 test machine.
#     bash bench/h200_ncu.sh fwd KERNEL CASE [ENTRY_REGEX]   # the forward (ncu_target)
#     bash bench/h200_ncu.sh bwd VARIANT_DIR CASE [ENTRY_REGEX]  # forward + [backward]
# fwd profiles the second of two calls (the first compiles and warms up); bwd runs
# sanitize_target --backward once, so every launch of the variant's forward and backward
# is profiled unless ENTRY_REGEX narrows it. The whole CSV goes to $OUT/ncu-<name>.csv, the
# lines that say where the time goes to stdout, ncu's stderr to /tmp/ncu-<name>.err.
# NCU_S bounds the call (default 240 s).
set -uo pipefail
OUT=${OUT:-/tmp/h200-ncu}
mkdir -p "$OUT"
if [ -f .whl/prelude.sh ]; then source .whl/prelude.sh; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mode=$1 who=$2 case=$3 regex=${4:-}
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats
  --section Occupancy --section LaunchStats"
# The stall reasons (warps stalled per issued instruction, by reason) and every tensor pipe.
metrics="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor_op_.*_cycles_active\.avg\.pct_of_peak_sustained_active"
filter=${regex:+-k regex:$regex}
name=$mode-$(basename "$who")-$case
if [ "$mode" = fwd ]; then
  target=(python3 -m harness.measure.ncu_target --kernel "$who" --case "$case")
  from=(--profile-from-start off)
else
  target=(python3 -m harness.execution.sanitize_target --variant "$who" --cases "$case"
          --trusted --backward)
  from=()
fi
# shellcheck disable=SC2086
timeout --kill-after=10 "${NCU_S:-240}" ncu $sections $metrics "${from[@]}" $filter --launch-count 8 \
  --csv --page details "${target[@]}" >"$OUT/ncu-$name.csv" 2>"/tmp/ncu-$name.err"
echo "== ncu $name: rc=$?"
# Duration, throughput, the tensor pipes, issue and the stall breakdown (warp cycles per
# issued instruction by reason), per kernel.
grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued Instruction|Executed Ipc Active)"' \
  "$OUT/ncu-$name.csv" | awk -F'","' '{printf "%-40.40s %-36s %s %s\n", $5, $(NF-2), $NF, $(NF-1)}' | tr -d '"'
grep -E 'stalled|tensor_op' "$OUT/ncu-$name.csv" |
  awk -F'","' '{printf "%-40.40s %-75s %s\n", $5, $(NF-2), $NF}' | tr -d '"' | head -80
tail -n 3 "/tmp/ncu-$name.err"
