# Sourced by the bench/h200_*.sh scripts: one bounded step of a GPU run.
# step NAME TIMEOUT_S CMD...: run CMD under a time limit (killed 10 s after it), its output
# to $OUT/NAME.log, "== NAME: rc=..., N s" appended to $OUT/times.txt, then the log's
# last $TAIL (25) lines.
step() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$OUT/times.txt"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}
