#!/usr/bin/env bash
# Hostile submissions and trustworthy verdicts on the H200 (at most 4 minutes). From the
# project root on the GPU machine, after `source .whl/prelude.sh`:
#     bash bench/h200_submissions.sh
# Writes under $OUT (default /tmp/h200-submissions): env.txt, sanitize.json (every tool on the
# racy kernel, the far out-of-bounds writer and the honest kernel, with raw reports), demo.json (the corpus submitted and scored by a worker:
# verdict, message, sanitizer stage and its wall time per submission), floor.json (cuDNN's
# decode judged as a submission), and one log per step.
set -uo pipefail
OUT=${OUT:-/tmp/h200-submissions}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-$(mktemp -d)}
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache}
# Without a working bubblewrap on the GPU machine (bench/gpu_bwrap.sh can bring one),
# compiles there run under resource limits only (the backend is recorded in env.txt); the
# preprocessor report and the message filter still refuse the attacks
# (tests/test_submit_hostile.py runs them under both backends).
source bench/gpu_bwrap.sh

step() {  # step NAME TIMEOUT_S CMD...: run, log to $OUT/NAME.log, print its tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-40}" "$OUT/$name.log"
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for t in bwrap nvcc compute-sanitizer ncu; do echo "$t: $(command -v $t || echo absent)"; done
  python3 -c "from harness.candidates import sandbox; print('sandbox backend:', sandbox.backend())"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. compute-sanitizer directly: findings, one-line summaries, wall time per tool.
step sanitize 50 python3 bench/sanitize_corpus.py --json "$OUT/sanitize.json"
# 2. The cost of an honest fast kernel: cuDNN decode as a submission is never invalid.
[ -z "${SKIP_FLOOR:-}" ] && step floor 35 python3 bench/floor_decode.py --json "$OUT/floor.json"
# 3. The corpus through submit + worker: smoke correctness with race-check repeats, the
#    sanitizer stage, 2 perf cases. Rejections at validation cost no GPU time.
step demo 150 python3 bench/submissions_demo.py --correctness-grid smoke --max-perf-cases 2 \
  --case-timeout 60 --skip-fa2 --json "$OUT/demo.json" --only good_rowwarp.cu racy_rows.cu \
  far_writer.cu cached_output.cu syntax_error.cu system_include.cu redefine_check.cu \
  dynamic_parallelism.cu
echo "== total ${SECONDS} s"
