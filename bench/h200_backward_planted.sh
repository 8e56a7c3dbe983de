#!/usr/bin/env bash
# The backward judged like the forward, on a GPU: the planted CUDA backwards of
# tests/data/planted_bwd, copied into a temporary kernels folder, through `fa-harness ci`
# and the submission scorer. From the project root on the GPU machine:
#     bash bench/h200_backward_planted.sh [load] [control] [first_call] [far_write] [score] [gputests]
# Default: load control first_call far_write score (about 6-10 minutes). Stages:
#   load        `fa-harness kernels --json` on the folder: the three variants load, each
#               with a backward
#   control     ci on planted_bwd (the right backward): green (exit 0), its backward
#               checked, its sanitizer line clean on the forward and backward
#   first_call  ci on planted_bwd_first_call (right only on its first call per case):
#               red (exit 1), a backward case failing on its repeat
#   far_write   ci on planted_bwd_far_write (one element 3 MiB past dK): red (exit 1),
#               the sanitizer tier's finding in the backward's kernel
#   score       bench/backward_planted_score.py: each plant as a submission, scored by the
#               worker's scorer on small cases: forward scored, backward not
#   gputests    the GPU tests of the backward's checks (tests/test_planted_bwd_gpu.py)
# Each ci runs --grid smoke --sanitize fast into its own database (no run is another's
# baseline). Every check prints a PASS or FAIL line (also in $OUT/verdicts.txt); the exit
# status is 1 when any check failed, 2 for an unknown stage. Set FA_HARNESS_COMMIT to the
# commit measured (the tree comes without .git). $OUT (default $WORK/out) gets the ci
# summaries, the scores, verdicts.txt, times.txt and logs.tgz, written as each step ends.
set -uo pipefail
WORK=${WORK:-/tmp/h200-backward-planted}
OUT=${OUT:-$WORK/out}
mkdir -p "$WORK" "$OUT"
if [ -f .whl/prelude.sh ] && [ -z "${FA_PRELUDE_DONE:-}" ]; then source .whl/prelude.sh; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-$WORK/home}
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$WORK/cupy-cache}
export FA_HARNESS_BRANCH=${FA_HARNESS_BRANCH:-planted}
mkdir -p "$FA_HARNESS_HOME"
FA="python3 -m harness"
TIMES=$OUT/times.txt
VERDICTS=$OUT/verdicts.txt
: >"$TIMES"
: >"$VERDICTS"
failed=0
source bench/gpu_bwrap.sh >"$WORK/bwrap.txt" 2>&1; tee -a "$TIMES" <"$WORK/bwrap.txt"
# The temporary kernels folder: the planted variants, never the shipped kernels.
KDIR=$WORK/kernels
rm -rf "$KDIR" && mkdir -p "$KDIR" && cp -r tests/data/planted_bwd/planted_bwd "$KDIR/"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(load control first_call far_write score)

step() {  # step NAME TIMEOUT_S CMD...: run, log to $WORK/NAME.log, record rc and wall time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc wall_s=$((SECONDS - t0)) limit_s=$limit" | tee -a "$TIMES"
  tail -n "${TAIL:-15}" "$WORK/$name.log"
  return $rc
}

check() {  # check WHAT OK(0/1): one PASS/FAIL line
  if [ "$2" = 0 ]; then echo "PASS $1" | tee -a "$VERDICTS"
  else echo "FAIL $1" | tee -a "$VERDICTS"; failed=1; fi
}

has() { grep -qF -- "$2" "$1" 2>/dev/null; }  # has FILE TEXT

ci_run() {  # ci_run NAME KERNEL: ci on one planted variant; its rc
  local name=$1
  step "ci-$name" "${CI_S:-420}" $FA ci --kernels-dir "$KDIR" --kernels "$2" --grid smoke \
    --sanitize fast --timeout 60 --db "sqlite:///$WORK/ci-$name.sqlite" \
    --summary "$OUT/ci-$name-summary.md" --record "$WORK/ci-$name-record.json"
}

for stage in "${stages[@]}"; do
  case $stage in
    load)
      t0=$SECONDS
      timeout --kill-after=10 120 $FA kernels --kernels-dir "$KDIR" --json \
        >"$OUT/kernels.json" 2>"$WORK/load.log"
      echo "load rc=$? wall_s=$((SECONDS - t0)) limit_s=120" | tee -a "$TIMES"
      python3 - "$OUT/kernels.json" >"$WORK/load-check.txt" 2>&1 <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
rows = {c["name"]: c for c in doc["candidates"]}
want = ["planted_bwd", "planted_bwd_first_call", "planted_bwd_far_write"]
bad = [n for n in want if not (rows.get(n) or {}).get("backward", {}).get("supported")]
print("missing or without a backward:", bad, "load errors:", doc["load_errors"])
sys.exit(1 if bad or doc["load_errors"] else 0)
EOF
      check "load: the three planted variants load, each with a backward" $?
      cat "$WORK/load-check.txt"
      ;;
    control)
      ci_run control planted_bwd
      rc=$?
      s=$OUT/ci-control-summary.md
      check "control: ci on planted_bwd is green (rc=$rc, want 0)" $([ "$rc" = 0 ]; echo $?)
      check "control: its sanitizer line is clean, forward and backward" \
        $(grep -q -- '- sanitize planted_bwd: clean (.*forward and backward' "$s"; echo $?)
      python3 - "$WORK/ci-control-record.json" <<'EOF'
import json, sys
rec = json.load(open(sys.argv[1]))
bwd = [e for e in rec["results"] if e.get("pass") == "bwd"]
ok = [e for e in bwd if e["status"] == "passed"]
print(f"control: {len(ok)} backward case(s) passed of {len(bwd)}")
sys.exit(0 if ok and all(e["status"] in ("passed", "skipped") for e in bwd) else 1)
EOF
      check "control: its backward passed every case it ran" $?
      ;;
    first_call)
      ci_run first_call planted_bwd_first_call
      rc=$?
      s=$OUT/ci-first_call-summary.md
      check "first_call: ci is red (rc=$rc, want 1)" $([ "$rc" = 1 ]; echo $?)
      check "first_call: a backward case fails on its repeat, the first call right" \
        $(has "$s" "repeat 1 (call 2 of 2; the first passed)"; echo $?)
      ;;
    far_write)
      ci_run far_write planted_bwd_far_write
      rc=$?
      s=$OUT/ci-far_write-summary.md
      check "far_write: ci is red (rc=$rc, want 1)" $([ "$rc" = 1 ]; echo $?)
      # The frame is the backward's main pass: pb_main, inlined in planted_bwd_main_*.
      check "far_write: the sanitizer tier finds the write in the backward's kernel" \
        $(grep -qE -- '- FAILED sanitize planted_bwd_far_write: memcheck: .*Invalid __global__ write.* in (void )?(pb_main|planted_bwd_main).*planted_bwd\.cu:' "$s"; echo $?)
      ;;
    score)
      step score "${SCORE_S:-540}" python3 bench/backward_planted_score.py "$WORK/score"
      rc=$?
      grep -E '^(PASS|FAIL) ' "$WORK/score.log" >>"$VERDICTS"
      grep -q '^FAIL ' "$WORK/score.log" && failed=1
      check "score: both plants scored on the forward, not on the backward (rc=$rc)" \
        $([ "$rc" = 0 ] && [ "$(grep -c '^PASS ' "$WORK/score.log")" = 2 ]; echo $?)
      cp "$WORK"/score/score-*.json "$OUT/" 2>/dev/null
      ;;
    gputests)
      # The tests need the package's metadata (its entry points): an editable install,
      # no dependencies, no build isolation (the machine reaches no registry).
      python3 -m pip install -q --no-deps --no-build-isolation -e . >"$WORK/install.log" 2>&1 ||
        echo "note: editable install failed ($(tail -n 1 "$WORK/install.log"))"
      step gputests "${GPU_TESTS_S:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider \
        --timeout 240 -rfE tests/test_planted_bwd_gpu.py
      check "gputests: the planted backwards' GPU tests pass" $?
      ;;
    *) echo "unknown stage $stage (load control first_call far_write score gputests)"; exit 2 ;;
  esac
done
tar -czf "$OUT/logs.tgz" -C "$WORK" --exclude=cupy-cache --exclude=home --exclude=out \
  --exclude=kernels . 2>/dev/null
echo "== verdicts"; cat "$VERDICTS"
echo "== times"; cat "$TIMES"
[ "$failed" = 0 ] && echo "ALL PASS" || echo "SOME FAILED"
exit "$failed"
