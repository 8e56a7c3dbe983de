#!/usr/bin/env bash
# The serving case kinds on the H200, in one bounded call (about 4 minutes), from the
# project root with `.whl` carried:
#     source .whl/prelude.sh && FA_HARNESS_COMMIT=<sha> bash bench/h200_serving.sh
# 0. the package installed, editable, with no dependencies (the Python candidates are
#    found through its entry points; the machine reaches no registry);
# 1. side by side: the `serving` grid checked for the in-repo kernels and flex_attention,
#    over SECRETS secrets (default 2; each secret draws new inputs for every case), and
#    the split-KV kernel's GPU tests;
# 2. the `decode` grid (contiguous, paged, varlen) checked and timed with splitkv,
#    triton_fa2 and the SDPA peers in one run, its record in $OUT/decode-record.json;
#    the decode table (GB/s) in $OUT/decode.txt.
set -uo pipefail
OUT=${OUT:-/tmp/h200-serving}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=120
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-/tmp/fa-harness-home}
export FA_HARNESS_BRANCH=${FA_HARNESS_BRANCH:-main}
mkdir -p "$FA_HARNESS_HOME"
step() {  # step NAME TIMEOUT_S CMD...: run, log to $OUT/NAME.txt, record rc and time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "== $name: rc=$?, $((SECONDS - t0)) s" | tee -a "$OUT/times.txt"
}
SERVING_KERNELS=${SERVING_KERNELS:-splitkv,triton_fa2,flex_attention}
serving() {
  for s in $(seq 1 "${SECRETS:-2}"); do
    step "serving-s$s" "${SERVING_S:-60}" python3 -m harness run --grid serving \
      --kernels "$SERVING_KERNELS" --device cuda --secret "$((s * 7919))" --no-store
    grep -E "passed|failed|skipped" "$OUT/serving-s$s.txt" | tail -n 3 >>"$OUT/times.txt"
  done
}
step install 90 python3 -m pip install -q --no-deps --no-build-isolation -e .
# Correctness side by side: the grid over the secrets, and the kernel's GPU tests.
serving &
step gputests "${PYTEST_S:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_splitkv_serving_gpu.py tests/test_cuda_variants_gpu.py -k splitkv &
wait
step decode "${DECODE_S:-150}" python3 -m harness run --grid decode \
  --kernels "${DECODE_KERNELS:-splitkv,triton_fa2,sdpa_cudnn,sdpa_flash}" --device cuda \
  --record "$OUT/decode-record.json" --no-store
