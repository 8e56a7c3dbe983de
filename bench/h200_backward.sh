#!/usr/bin/env bash
# The backward on the H200 test machine, in stages, each bounded in time:
#     bash bench/h200_backward.sh check sanitize perf     # any of these, in order
# check:    the backward of CHECK_KERNELS (default KERNELS) on the smoke grid (2 repeats,
#           bitwise compared) and on the full grid's backward for the in-repo kernels
# sanitize: compute-sanitizer (SAN_TOOLS, default memcheck racecheck) on the backward of
#           SAN_VARIANT (default harness/kernels/fa2_mma; SAN_NAME: one of its flavors),
#           small cases (SAN_CASES)
# perf:     the perf-bwd grid (PERF_BWD_CASES, default all) with the peers in the same run
# ab:       AB_KERNELS (two versions, one a renamed copy under FA_HARNESS_KERNELS) timed
#           on AB_CASES of AB_GRID (default perf-bwd) in one run, not recorded (a
#           before/after of a kernel change), logged as AB_NAME (default ab)
# full:     the full grid's backward of FULL_KERNELS under each of SECRETS secrets
#           (SECRET0 + 1, ...), 2 repeats, one log; none started after FULL_UNTIL (epoch s)
# secrets:  the same for each of FULL_KERNELS in its own processes, side by side: one per
#           candidate, flex_attention one per mask kind and dtype (compile-bound: its
#           Inductor compiles spread over the cores and share the on-disk cache) and
#           sdpa_cudnn one per dtype (its check is the slowest); logs in $OUT/secrets.tgz
# Several instances may run side by side (one per kernel, each with its own OUT): the first
# installs the package, the others set NO_INSTALL=1.
# The device returns at most 8 files: JSON=0 leaves out the --json copies (the logs and the
# record hold the results).
# Exit status: 1 when a secrets part judged nothing (no candidate, bad arguments), 2 for an
# unknown stage, else 0; each stage's own verdicts are in its log and summary.
# Set FA_HARNESS_COMMIT / FA_HARNESS_BRANCH to the commit measured (the tree comes without
# .git). Logs, the JSON results and the run records go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/h200-backward}
mkdir -p "$OUT"
if [ -f .whl/prelude.sh ]; then source .whl/prelude.sh; fi
[ "${NO_INSTALL:-0}" = 1 ] ||
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 ||
  echo "note: editable install failed; running from PYTHONPATH"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-/tmp/fa-harness-home}
mkdir -p "$FA_HARNESS_HOME"
FA="python3 -m harness"
KERNELS=${KERNELS:-fa2_mma,triton_fa2,sdpa_flash,sdpa_cudnn,sdpa_efficient,flex_attention}
stamp=$(date -u +%Y%m%dT%H%M%SZ)
json() { [ "${JSON:-1}" = 0 ] || echo "--json $OUT/$1"; }

source "$(dirname "$0")/step.sh"

full_loop() {  # full_loop LOG KERNELS NAME [CASES]: the full grid's backward per secret
  local log=$1 kernels=$2 name=$3 cases=${4:-} i left limit secret t0
  : >"$log"
  for i in $(seq 1 "${SECRETS:-1}"); do
    # FULL_UNTIL (epoch seconds): start no secret after it, cut the last one there.
    left=$(( ${FULL_UNTIL:-9999999999} - $(date +%s) ))
    [ "$left" -gt 20 ] || { echo "== $name: stopped before secret $i (FULL_UNTIL)" | tee -a "$OUT/times.txt"; break; }
    limit=${FULL_S:-300}; [ "$left" -lt "$limit" ] && limit=$left
    secret=$((${SECRET0:-90100} + i))
    t0=$SECONDS
    echo "### secret $secret" >>"$log"
    timeout --kill-after=10 "$limit" $FA run --grid full --backward --kernels "$kernels" \
      ${cases:+--cases "$cases"} --repeats 2 --no-progress --secret "$secret" --no-store \
      >>"$log" 2>&1
    echo "== $name secret $secret: rc=$?, $((SECONDS - t0)) s" | tee -a "$OUT/times.txt"
  done
}

for stage in "$@"; do
  case $stage in
    check)
      step check-smoke "${CHECK_S:-240}" $FA run --grid smoke --backward --kernels "${CHECK_KERNELS:-$KERNELS}" \
        --repeats 2 --no-progress $(json check-smoke.json) --no-store ;;
    full)
      full_loop "$OUT/check-full.log" "${FULL_KERNELS:-fa2_mma,triton_fa2}" full
      tail -n "${TAIL:-25}" "$OUT/check-full.log" ;;
    secrets)
      logs=$OUT/secrets; mkdir -p "$logs"; pids=(); t0=$SECONDS
      IFS=, read -ra names <<<"${FULL_KERNELS:-fa2_mma,triton_fa2}"
      jobs=()  # "candidate pattern": its parts, as case patterns
      set -f  # the patterns are split on spaces, never globbed
      for k in "${names[@]}"; do
        case $k in
          flex_attention) pats=$(for d in fp16 bf16; do for m in none causal_br causal_tl \
                                   key_padding random; do echo "*-$d-$m"; done; done) ;;
          sdpa_cudnn) pats="*-fp16-* *-bf16-*" ;;
          *) pats="*" ;;
        esac
        for pat in $pats; do jobs+=("$k $pat"); done
      done
      set +f
      # Each process gets its share of the cores for torch's CPU threads (the float64
      # oracle): 18 processes each starting a thread per core (16) finished nothing in
      # 420 s at 59ab35c, where 7 had finished a secret in 11-54 s.
      share=$(( $(nproc) / ${#jobs[@]} )); [ "$share" -ge 1 ] || share=1
      for job in "${jobs[@]}"; do
        k=${job%% *} pat=${job#* }
        name=$k; [ "$pat" = "*" ] || name=$k-$(tr -d '*' <<<"$pat" | sed 's/^-//;s/-$//')
        OMP_NUM_THREADS=$share MKL_NUM_THREADS=$share TORCHINDUCTOR_COMPILE_THREADS=1 \
          full_loop "$logs/$name.log" "$k" "$name" "$pat" &
        pids+=("$!")
      done
      for p in "${pids[@]}"; do wait "$p"; done
      echo "== secrets: ${#pids[@]} processes, $share CPU threads each, $((SECONDS - t0)) s" | tee -a "$OUT/times.txt"
      for f in "$logs"/*.log; do  # per part: secrets started, and whose run passed / failed
        started=$(grep -c '^### secret' "$f") ok=$(grep -c '^ok' "$f") bad=$(grep -c '^FAIL' "$f")
        note=""  # a part that judged nothing (no candidate, bad arguments) is not a pass
        [ $((ok + bad)) -gt 0 ] || { note=" NOT RUN: $(tail -n 1 "$f" | cut -c1-100)"; status=1; }
        [ $((ok + bad)) -gt 0 ] && [ $((ok + bad)) -lt "$started" ] && note=" ($started started)"
        echo "$(basename "$f" .log): ok $ok, FAIL $bad$note"
      done
      echo "failure kinds (candidate, first check failed), over every part and secret:"
      grep -h '^  FAILED' "$logs"/*.log | sed -E 's/^  FAILED ([^ ]+) [^ ]+: ([^:]+:[^:]+).*/\1 \2/' |
        sort | uniq -c | sort -rn | head -n 20
      tar -czf "$OUT/secrets.tgz" -C "$logs" . && rm -rf "$logs" ;;
    ab)
      step "${AB_NAME:-ab}" "${AB_S:-120}" $FA run --grid "${AB_GRID:-perf-bwd}" --kernels "$AB_KERNELS" \
        ${AB_CASES:+--cases "$AB_CASES"} --no-progress ${MIN_TIME:+--min-time "$MIN_TIME"} \
        $(json "${AB_NAME:-ab}.json") --no-store ;;
    sanitize)
      CASES=${SAN_CASES:-b2h4k2-113x203-d64-fp16-causal_br,b1h4-203x113-d128-bf16-key_padding}
      for tool in ${SAN_TOOLS:-memcheck racecheck}; do
        step "sanitize-$tool${SAN_NAME:+-$SAN_NAME}" "${SAN_S:-180}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
          python3 -m harness.execution.sanitize_target --variant "${SAN_VARIANT:-harness/kernels/fa2_mma}" \
          ${SAN_NAME:+--name "$SAN_NAME"} --cases "$CASES" --trusted --backward
      done ;;
    perf)
      step perf-bwd "${PERF_S:-420}" $FA run --grid perf-bwd --kernels "$KERNELS" \
        ${PERF_BWD_CASES:+--cases "$PERF_BWD_CASES"} --no-progress ${MIN_TIME:+--min-time "$MIN_TIME"} \
        $(json perf-bwd.json) --record "$OUT/h200-$stamp-perf-bwd.json" ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
done
exit "${status:-0}"
