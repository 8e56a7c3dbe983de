#!/usr/bin/env bash
# The per-commit gate on the H200, proven end to end. From the project root on the GPU
# machine (after `source .whl/prelude.sh`), with the commit being measured:
#     FA_HARNESS_COMMIT=<sha> bash bench/h200_gate.sh [gate] [compare] [launch] [gputests]
# Default: gate compare launch (about 7-8 minutes; one call, since compare needs the gate's
# database). Stages:
#   gate      (a) `fa-harness ci` with no options, timed: its summary, record, wall time
#   compare   (b) a second ci on the same commit against (a), --kernels fa2_mma
#                 --grid perf,decode --budget 0.75: must be green (exit 0);
#             (c) the same with fa2_mma slowed by 10% (bench/plant_slowdown.py: a copy of
#                 the package, the shipped kernels untouched): must be red (exit 1) naming
#                 fa2_mma
#   launch    (d) bench/launch_overhead.py, uncached (before) then cached (after)
#   gputests  the GPU test suite, serially, with the 25 slowest tests (not in the default)
#   install, gputests_a, gputests_py, gputests_cheats, launch_after, subs, full_triton,
#   full_flex, perf_python, retime: see below (the GPU suite in three parts, each under 3
#             minutes on the H200; the cached launch path only; the submission corpus; a
#             Python candidate's full grid; both Python candidates on the perf grid next
#             to SDPA flash)
# Everything lands in $WORK (default /tmp/h200-gate); $OUT gets at most 8 files:
# gate-summary.md, gate-record.json, same-commit-summary.md, slowed-summary.md,
# launch.json, times.txt, logs.tgz.
set -uo pipefail
WORK=${WORK:-/tmp/h200-gate}
OUT=${OUT:-$WORK/out}
mkdir -p "$WORK" "$OUT"
if [ -f .whl/prelude.sh ] && [ -z "${FA_PRELUDE_DONE:-}" ]; then source .whl/prelude.sh; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-$WORK/home}
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$WORK/cupy-cache}
export FA_HARNESS_BRANCH=${FA_HARNESS_BRANCH:-main}
export FA_HARNESS_DB="sqlite:///$WORK/gate.sqlite"
mkdir -p "$FA_HARNESS_HOME"
FA="python3 -m harness"
TIMES=$OUT/times.txt
source bench/gpu_bwrap.sh >"$WORK/bwrap.txt" 2>&1; tee -a "$TIMES" <"$WORK/bwrap.txt"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(gate compare launch)

step() {  # step NAME TIMEOUT_S CMD...: run, log to $WORK/NAME.log, record rc and wall time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall_s=$((SECONDS - t0)) limit_s=$limit" | tee -a "$TIMES"
  tail -n "${TAIL:-15}" "$WORK/$name.log"
  return $rc
}

uuid_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['uuid'])" "$1"; }

for stage in "${stages[@]}"; do
  case $stage in
    gate)
      # (a) defaults: smoke correctness for every candidate, timing per each manifest's
      # `timing`, planned to the 5 minute budget.
      rm -f "$WORK/gate.sqlite"
      step gate 400 $FA ci --summary "$WORK/gate-summary.md" --record "$WORK/gate-record.json"
      echo "gate exit code $? (0: green)" | tee -a "$TIMES"
      cp "$WORK/gate-summary.md" "$WORK/gate-record.json" "$OUT/" 2>/dev/null
      ;;
    compare)
      [ -f "$WORK/gate-record.json" ] || { echo "compare: run the gate stage first"; continue; }
      base=$(uuid_of "$WORK/gate-record.json")
      # (b) same commit, same code: green.
      step same_commit 150 $FA ci --kernels fa2_mma --grid perf,decode --budget 0.75 \
        --baseline "$base" --summary "$WORK/same-commit-summary.md"
      rc=$?
      echo "same-commit exit code $rc (expected 0)" | tee -a "$TIMES"
      # (c) fa2_mma 10% slower, in a copy of the package: red, naming fa2_mma.
      slow=$WORK/slow
      python3 bench/plant_slowdown.py "$slow" --variant fa2_mma --percent 10 | tee -a "$TIMES"
      # From inside the copy: Python puts the working directory first on sys.path, so run
      # from the project root would import the unslowed package.
      env -C "$slow" PYTHONPATH="$slow:$PYTHONPATH" python3 -c \
        "import harness; print('slowed copy:', harness.__file__)" | tee -a "$TIMES"
      step slowed 150 env -C "$slow" PYTHONPATH="$slow:$PYTHONPATH" $FA ci --kernels fa2_mma \
        --grid perf,decode --budget 0.75 --baseline "$base" --summary "$WORK/slowed-summary.md"
      rc=$?
      named=$(grep -c '| regression | `fa2_mma`' "$WORK/slowed-summary.md" 2>/dev/null)
      echo "slowed exit code $rc (expected 1), fa2_mma regression rows: ${named:-0}" | tee -a "$TIMES"
      cp "$WORK/same-commit-summary.md" "$WORK/slowed-summary.md" "$OUT/" 2>/dev/null
      ;;
    launch)
      # (d) host cost per call: the old per-call work (cache off), then the cached path.
      step launch_before 90 python3 bench/launch_overhead.py --uncached --json "$WORK/launch-before.json"
      step launch_after 90 python3 bench/launch_overhead.py --json "$WORK/launch-after.json"
      python3 - "$WORK" "$OUT/launch.json" <<'EOF'
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
rows = []
for p in ("launch-before.json", "launch-after.json"):
    if (w / p).exists():
        rows += json.loads((w / p).read_text())["rows"]
Path(sys.argv[2]).write_text(json.dumps({"target_us": 30, "rows": rows}, indent=1) + "\n")
EOF
      ;;
    install)
      # The package's entry points (console script, pytest plugin, the Python candidates'
      # group) exist only installed: editable, no dependencies, no build isolation (the
      # machine reaches no registry).
      step install 60 python3 -m pip install -q --no-deps --no-build-isolation -e .
      ;;
    gputests)
      step gpu_tests 290 python3 -m pytest -m gpu tests -q -p no:cacheprovider --timeout 120 \
        -rfE --durations=25
      ;;
    gputests_a)  # the GPU tests of buffers, timing, the runner and the CUDA variants
      step gpu_tests_a ${GPU_A_S:-150} python3 -m pytest -m gpu -q -p no:cacheprovider \
        --timeout 120 -rfE --durations=10 tests/test_buffers.py tests/test_gpu_measure.py \
        tests/test_runner.py tests/test_cuda_variants_gpu.py
      ;;
    gputests_py)  # the gate and the Python candidates on a GPU
      step gpu_tests_py ${GPU_B_S:-200} python3 -m pytest -m gpu -q -p no:cacheprovider \
        --timeout 150 -rfE --durations=10 tests/test_gate.py tests/test_python_candidates.py
      ;;
    gputests_cheats)  # the submissions' verdicts on a GPU
      step gpu_tests_cheats ${GPU_B_S:-280} python3 -m pytest -m gpu -q -p no:cacheprovider \
        --timeout 200 -rfE --durations=15 tests/test_cheats_gpu.py
      ;;
    launch_after)  # the cached path only
      step launch_after 90 python3 bench/launch_overhead.py --kernels fa2_mma,splitkv,fa2_simt --paths driver,cupy \
        --json "$OUT/launch.json"
      ;;
    subs)  # the submission corpus: sanitizer on three kernels, then scored by a worker
      SKIP_FLOOR=1 OUT=$WORK/subs step subs ${SUBS_S:-220} bash bench/h200_submissions.sh
      cp "$WORK/subs/demo.json" "$OUT/submissions-demo.json" 2>/dev/null
      cp "$WORK/subs/sanitize.json" "$OUT/sanitizer-corpus.json" 2>/dev/null
      ;;
    full_triton|full_flex)  # one Python candidate on its whole full grid, one record
      # Compile-bound (one Inductor/Triton compile per head dim, dtype and mask kind), so
      # one process per mask kind, side by side: correctness is not timed, and the parts
      # are joined into one record (bench/merge_records.py names them in env.merged_from).
      name=${stage#full_}; kern=$([ "$name" = triton ] && echo triton_fa2 || echo flex_attention)
      t0=$SECONDS; pids=()
      for m in none causal_br causal_tl key_padding random; do
        TORCHINDUCTOR_COMPILE_THREADS=1 timeout --kill-after=10 "${FULL_S:-240}" $FA run \
          --grid full --kernels "$kern" --cases "*-$m" --device cuda --no-progress --no-store \
          --timeout 120 --record "$WORK/$stage-$m.json" >"$WORK/$stage-$m.log" 2>&1 &
        pids+=("$!")
      done
      for i in "${!pids[@]}"; do  # no pipe here: `wait` works only in this shell
        wait "${pids[$i]}"; echo "$stage part $i rc=$?" | tee -a "$TIMES"
      done
      echo "$stage wall_s=$((SECONDS - t0)) limit_s=${FULL_S:-240} (5 processes)" | tee -a "$TIMES"
      grep -h -e '^ok' -e '^FAIL' "$WORK/$stage"-*.log | tee -a "$TIMES"
      if ! python3 bench/merge_records.py "$OUT/$stage-record.json" "$WORK/$stage"-*.json \
          2>&1 | tee -a "$TIMES" | grep -q 'results from 5 records'; then
        cat "$WORK/$stage"-*.json.partial.jsonl >"$OUT/$stage-partial.jsonl" 2>/dev/null
      fi
      ;;
    perf_python)  # the two Python candidates and SDPA flash on the perf grid, one run
      step perf_python "${PERF_S:-330}" $FA run --grid perf --kernels \
        flex_attention,triton_fa2,sdpa_flash --device cuda --min-time 0.1 --no-progress \
        --timeout 120 --record "$WORK/perf-python-record.json"
      cp "$WORK/perf-python-record.json" "$OUT/" 2>/dev/null || \
        cp "$WORK/perf-python-record.json.partial.jsonl" "$OUT/" 2>/dev/null
      ;;
    retime)  # where the run-to-run noise comes from (bench/retiming_noise.py): the
      # teaching kernels' decode case timed 10 times in this process, with fresh buffers,
      # and in 10 child processes (about 3 minutes)
      step retime "${RETIME_S:-420}" python3 bench/retiming_noise.py \
        --out "$OUT/retiming-noise.json"
      ;;
    *) echo "unknown stage $stage (gate compare launch gputests ...)"; exit 2 ;;
  esac
done
tar -czf "$OUT/logs.tgz" -C "$WORK" --exclude=cupy-cache --exclude=slow --exclude=home \
  --exclude=out . 2>/dev/null
echo "== times"; cat "$TIMES"
