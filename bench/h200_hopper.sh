#!/usr/bin/env bash
# The Hopper kernel (fa3_wgmma) on the H200 test machine, in stages, each bounded in time:
#     bash bench/h200_hopper.sh sass smoke full sanitize perf     # any of these, in order
# sass:     build for sm_90a with nvcc, the registers/spills report and any wgmma ptxas
#           serialized, HGMMA counted in the SASS
# smoke:    the smoke grid, 2 repeats (bitwise compared)
# full:     the full grid under each of SECRETS secrets (default 1), 2 repeats
# sanitize: compute-sanitizer memcheck, racecheck and synccheck on small cases
# perf:     the perf grid (PERF_CASES, default all) with the peers in the same run, recorded
# ncu:      Nsight Compute on one launch of NCU_KERNEL (default fa3_wgmma) on NCU_CASE: speed of
#           light, tensor-pipe use, warp stall reasons
# ab:       bench/ab_interleaved.py on AB_KERNELS (comma-separated, the first the baseline),
#           with the variants that bench/ab_prepare.py wrote to ab/ (send ab/ along: the
#           device tool's carry), AB_CASES (default N = 2048, 4096, 16384), AB_ROUNDS (3)
# Set FA_HARNESS_COMMIT / FA_HARNESS_BRANCH to the commit measured (the tree comes without
# .git). Logs, JSON results and the run record go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/h200-hopper}
mkdir -p "$OUT"
if [ -f .whl/prelude.sh ]; then source .whl/prelude.sh; fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 ||
  echo "note: editable install failed; running from PYTHONPATH"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-/tmp/fa-harness-home}
mkdir -p "$FA_HARNESS_HOME"
FA="python3 -m harness"
PEERS=${PEERS:-fa2_mma,triton_fa2,flex_attention,sdpa_flash,sdpa_cudnn}
stamp=$(date -u +%Y%m%dT%H%M%SZ)

source "$(dirname "$0")/step.sh"

for stage in "$@"; do
  case $stage in
    sass)
      step sass 120 bash -c "nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -std=c++17 \
        --use_fast_math -Xptxas -v -I harness/kernels/include \
        harness/kernels/fa3_wgmma/fa3_wgmma.cu -o $OUT/fa3.cubin 2>&1 | grep -E 'Used|spill|serialized' ;
        cuobjdump -sass $OUT/fa3.cubin > $OUT/fa3.sass; grep -o 'HGMMA[.A-Z0-9x]*' $OUT/fa3.sass |
        sort | uniq -c; echo local memory ops: \$(grep -c -E 'STL|LDL' $OUT/fa3.sass)" ;;
    smoke)
      step smoke "${SMOKE_S:-180}" $FA run --grid smoke --kernels fa3_wgmma --repeats 2 \
        --no-progress --json "$OUT/smoke.json" --no-store ;;
    full)
      for s in $(seq 1 "${SECRETS:-1}"); do
        step "full-$s" "${FULL_S:-300}" $FA run --grid full --kernels fa3_wgmma --repeats 2 \
          --secret "$((90000 + s))" --no-progress --json "$OUT/full-$s.json" --no-store
      done ;;
    sanitize)
      CASES=${SAN_CASES:-b2h4k2-113x203-d64-fp16-causal_br,b1h4-203x113-d128-bf16-key_padding}
      for tool in memcheck racecheck synccheck; do
        step "sanitize-$tool" 180 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 -m harness.execution.sanitize_target --variant harness/kernels/fa3_wgmma \
          --cases "$CASES" --trusted
      done ;;
    perf)
      step perf "${PERF_S:-420}" $FA run --grid perf --kernels "fa3_wgmma,$PEERS" \
        ${PERF_CASES:+--cases "$PERF_CASES"} --no-progress ${MIN_TIME:+--min-time "$MIN_TIME"} \
        --baseline sdpa_cudnn --json "$OUT/perf.json" --record "$OUT/h200-$stamp-perf.json" ;;
    ncu)
      NK=${NCU_KERNEL:-fa3_wgmma}
      step ncu "${NCU_S:-180}" ncu --target-processes all --kernel-name "regex:${NK}_fwd" \
        --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
        $FA run --grid perf --kernels "$NK" --cases "${NCU_CASE:-b4h16-4096x4096-d128-fp16-none}" \
        --no-progress --no-store ;;
    ab)
      step ab "${AB_S:-420}" env FA_HARNESS_KERNELS="$PWD/ab" python3 bench/ab_interleaved.py \
        --kernels "${AB_KERNELS:?set AB_KERNELS}" --rounds "${AB_ROUNDS:-3}" \
        --cases "${AB_CASES:-*-2048x2048-*,*-4096x4096-*,*-16384x16384-*}" \
        --min-time "${MIN_TIME:-0.1}" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
