#!/usr/bin/env bash
# The project's GPU path on the H200 test machine, in stages, each bounded in time so one
# broken stage cannot eat the whole call. Run from the project root on the GPU machine:
#     bash bench/h200_session.sh check perf      # any of: check perf decode bench submit final
# The GPU machine gets a copy of the working tree without .git: pass the commit being
# measured as FA_HARNESS_COMMIT=<sha> (and FA_HARNESS_BRANCH) so the run records carry it.
# Logs and JSON/record files go to $WORK (default /tmp/h200-session); at the end they are
# packed into $OUT/h200-session.tgz when $OUT is set (the device tool brings back only a
# few files). Each stage prints the tail of its log.
set -uo pipefail
WORK=${WORK:-/tmp/h200-session}
mkdir -p "$WORK"
if [ -f .whl/prelude.sh ]; then source .whl/prelude.sh; fi
# The package itself (console script, pytest plugin entry point), without touching the
# machine's torch/CuPy: no dependencies, no build isolation (nothing can be downloaded).
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 ||
  echo "note: editable install failed; running from PYTHONPATH"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-/tmp/fa-harness-home}
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache}
FA="python3 -m harness"
DB="sqlite:///$WORK/h200.sqlite"
mkdir -p "$FA_HARNESS_HOME"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
# Slow-by-design variants (fa1: one CTA per head; template: one warp per row) are left out
# of the timing grids: their correctness is what the full grid checks.
PERF_KERNELS=${PERF_KERNELS:-fa2_mma,fa2_simt,naive,sdpa_flash,sdpa_cudnn,sdpa_efficient}
DECODE_KERNELS=${DECODE_KERNELS:-splitkv,fa2_mma,fa2_simt,sdpa_flash,sdpa_cudnn,sdpa_efficient}

step() {  # step NAME TIMEOUT_S CMD...: run, log to $OUT/NAME.log, print its tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-12}" "$WORK/$name.log"
}

for stage in "$@"; do
  case $stage in
    check)
      step kernels 60 $FA kernels
      step gpu_tests 280 python3 -m pytest -m gpu tests -q \
        -p no:cacheprovider --timeout 240 -rfE
      step full 200 $FA run --grid full --device cuda --no-progress --json "$WORK/full.json"
      ;;
    perf)
      # The perf grid in two halves (fp16, bf16), each its own run record, so a stage that
      # overruns its limit still leaves the other half recorded.
      step calibrate 75 $FA calibrate --json
      for dt in fp16 bf16; do
        step perf_$dt 240 $FA run --grid perf --cases "*-$dt-*" --kernels "$PERF_KERNELS" \
          --device cuda --no-progress --record "$WORK/perf-$dt-$stamp.json" --db "$DB"
      done
      ;;
    decode)
      step decode 200 $FA run --grid decode --kernels "$DECODE_KERNELS" --device cuda \
        --no-progress --record "$WORK/decode-$stamp.json" --db "$DB"
      ;;
    bench)
      step timing_noise 90 python3 bench/timing_noise.py --out "$WORK/timing_noise.json"
      step agreement 60 python3 bench/benchmark_agreement.py --out "$WORK/agreement.json"
      step ncu_bytes 150 python3 bench/ncu_bytes.py --out "$WORK/ncu_bytes.json"
      ;;
    final)
      # Everything the records need in one call: calibration, the perf and decode grids
      # (0.2 s minimum sampling per measurement, >= 20 samples), the timing-noise
      # benchmark and the submissions table.
      step calibrate 40 $FA calibrate --json
      step perf 270 $FA run --grid perf --kernels "fa2_mma,fa2_simt,sdpa_flash,sdpa_cudnn" \
        --min-time 0.2 --device cuda --no-progress --record "$WORK/perf-$stamp.json" --db "$DB"
      step decode 90 $FA run --grid decode --kernels "splitkv,fa2_mma,sdpa_flash,sdpa_cudnn" \
        --min-time 0.2 --device cuda --no-progress --record "$WORK/decode-$stamp.json" --db "$DB"
      step timing_noise 60 python3 bench/timing_noise.py --out "$WORK/timing_noise.json"
      step submissions 120 python3 bench/submissions_demo.py --db "sqlite:///$WORK/subs.sqlite" \
        --max-perf-cases 2 --case-timeout 15 --json "$WORK/submissions.json"
      ;;
    retest)  # GPU tests named in $RETEST (pytest node ids or -k expression files)
      step retest 120 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 100 -rfE $RETEST
      ;;
    submit)
      step submissions 240 python3 bench/submissions_demo.py --db "$DB" --max-perf-cases 4
      ;;
    *) echo "unknown stage: $stage" >&2 ;;
  esac
done

if [ -n "${OUT:-}" ]; then tar czf "$OUT/h200-session.tgz" -C "$WORK" . && echo "packed $WORK -> $OUT/h200-session.tgz"; fi
