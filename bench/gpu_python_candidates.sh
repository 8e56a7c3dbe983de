#!/usr/bin/env bash
# Python candidates on the GPU: PyTorch flex_attention (compiled) and the project's Triton
# FA2 kernel, on the full grid (pass/fail per mask kind) and on part of the perf grid
# next to SDPA flash, each run writing its run record. Run from the repository root on a
# GPU machine (about 4 minutes):
#     OUT=/some/dir bash bench/gpu_python_candidates.sh
# Writes under $OUT: one log per step, full-triton-record.json, full-flex-record.json,
# perf-record.json (run records), masks.json (pass/fail counts per candidate and mask
# kind from the full-grid records). The perf subset is the d=128 fp16 half of the perf grid (12 cases,
# N = 512 ... 16384, causal and not), timed with a 0.1 s minimum sampling time (at least
# 20 samples are always taken), to fit the time limit.
# The GPU machine gets a copy of the working tree without .git: pass the commit being
# measured as FA_HARNESS_COMMIT=<sha> so the run records carry it.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-python-candidates}
mkdir -p "$OUT"
if [ -f .whl/prelude.sh ]; then source .whl/prelude.sh; fi
# The package's entry points (console script, pytest plugin, the candidates' entry point
# group) need it installed; no dependencies, no build isolation (no network there).
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 ||
  echo "note: editable install failed (see install.log); running from PYTHONPATH"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-/tmp/fa-harness-home}
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache}
mkdir -p "$FA_HARNESS_HOME"
FA="python3 -m harness"

step() {  # step NAME TIMEOUT_S CMD...: run, log to $OUT/NAME.log, print its tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-14}" "$OUT/$name.log"
}

step kernels 20 $FA kernels
# The GPU test of the Triton kernel (smoke grid, every mask kind, both dtypes); flex's
# twin test is left to `pytest -m gpu tests` (its compiles would not fit here).
step gpu_tests 40 python3 -m pytest -q -p no:cacheprovider -m gpu -rfEs \
  tests/test_python_candidates.py -k triton_fa2
# The full grid, one run (and record) per candidate, so a slow compile of one cannot
# cost the other its record.
step full_triton ${FULL_TRITON_S:-150} $FA run --grid full --kernels triton_fa2 --device cuda \
  --no-progress --timeout 60 --record "$OUT/full-triton-record.json"
step full_flex ${FULL_FLEX_S:-200} $FA run --grid full --kernels flex_attention --device cuda \
  --no-progress --timeout 60 --record "$OUT/full-flex-record.json"
step masks 10 python3 - "$OUT/masks.json" "$OUT"/full-*-record.json <<'PY'
import collections, json, sys
rows = []
for path in sys.argv[2:]:
    try:
        rows += json.load(open(path)).get("results", [])
    except (OSError, ValueError) as e:
        print(f"{path}: {e}")
table = collections.defaultdict(collections.Counter)
for r in rows:
    case = r.get("case", {})
    mask = case.get("mask") if isinstance(case, dict) else str(case).rsplit("-", 1)[-1]
    table[f"{r.get('kernel')} {mask}"][r.get("status")] += 1
out = {k: dict(v) for k, v in sorted(table.items())}
json.dump(out, open(sys.argv[1], "w"), indent=1)
for k, v in out.items():
    print(f"{k:32s} {v}")
PY
step perf ${PERF_S:-150} $FA run --grid perf --cases '*-d128-fp16-*' \
  --kernels flex_attention,triton_fa2,sdpa_flash --device cuda --min-time 0.1 \
  --no-progress --timeout 60 --record "$OUT/perf-record.json"
echo "records: $(ls "$OUT"/*-record.json 2>/dev/null | tr '\n' ' ')"
