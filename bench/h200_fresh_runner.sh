#!/usr/bin/env bash
# The gate on a fresh runner, proven on the H200. From the project root on the GPU machine
# (after `source .whl/prelude.sh`), with the commit being measured:
#     FA_HARNESS_COMMIT=<sha> bash bench/h200_fresh_runner.sh STAGE...
# Stages (each its own time limit; everything lands in $WORK, default /tmp/h200-fresh):
#   install    the package, editable, no dependencies (entry points for the Python
#              candidates; the machine reaches no registry)
#   cold       every compile cache deleted (a fresh FA_HARNESS_HOME, and Triton's,
#              Inductor's, CuPy's and CUDA's default caches wiped), then `fa-harness ci`
#              with no options, through a pipe, timed; must exit 0 with >= 8 timed cases
#              for each owned candidate
#   warm       the same command again on the same caches, compared with the cold run
#              (--baseline: the same commit; same code: green), timed
#   slowed     cold again, from a copy of the package in which fa2_mma runs 10% longer
#              (bench/plant_slowdown.py), compared with the cold run: must exit 1 naming
#              fa2_mma
#   compile    every cache deleted, then `fa-harness kernels --compile` (nvcc for sm_80 and
#              sm_90, then the warm-up of everything `ci` compiles on this GPU), timed
#   farwriter  a team's kernels folder holding a kernel that writes 3 MiB past its
#              output: `ci` must exit 1 by the sanitizer tier; timed
#   gputests   `make test-gpu` (the whole GPU-marked suite), timed
#   history    a fresh database holding the committed H200 records (`fa-harness import
#              results/`): the history a team's database has when its gate runs
#   aa         AA_RUNS (default 3) runs of `ci $AA_OPTS` on this one commit, numbered
#              from AA_FIRST (default 1), on warm caches after the first; each run after
#              the first is compared with the first (AA_BASE: its uuid, when it ran in an
#              earlier call; AA_BASE=none: the gate's own baseline and history, as on a
#              team's runner; AA_HISTORY: earlier runs' records to import into a new
#              database first; AA_CHAIN=1: each run a commit of its own whose parent
#              is the run before, as a team's no-op commits): nothing may be flagged
#   planted    fa2_mma slowed by PLANT_PERCENT (default 2) in a copy of the package, as
#              the next commit (FA_HARNESS_PARENT = this one): its A/A runs are the
#              baseline and the noise model's history; must exit 1 naming fa2_mma
#              (PLANT_COMMIT: its commit, default feedc0de...; PLANT_NAME: its files'
#              names, default planted; PLANT_PERCENT=0: a source change that changes
#              nothing, which must exit 0)
#   teamrepo   a team's git repository with one kernel folder (team_fa2, a copy of
#              fa2_mma): TEAM_AA (4) empty commits gated, then (unless TEAM_PLANT=0) a
#              commit slowing it by PLANT_PERCENT: the gate confirms it, timing the
#              parent's code in a git worktree
#   teamsave   that repository and its database into $OUT/team.tgz
#   teamnext   the repository and database of TEAM_TGZ gated on this runner (another
#              chip, when the machine is another): TEAM_NEXT ("comment slow"): a
#              comment-only commit (must stay green) and a slowed one (must be red)
# $OUT gets at most 8 files: times.txt, <stage>-summary.md and <stage>-record.json of
# the gate stages asked for, logs.tgz.
set -uo pipefail
WORK=${WORK:-/tmp/h200-fresh}
OUT=${OUT:-$WORK/out}
mkdir -p "$WORK" "$OUT"
if [ -f .whl/prelude.sh ] && [ -z "${FA_PRELUDE_DONE:-}" ]; then source .whl/prelude.sh; fi
# The prelude points CuPy at /tmp/cupy-cache: the gate's own cache folder is what is
# measured here (harness.paths), so nothing outside FA_HARNESS_HOME may hold a compile.
unset CUPY_CACHE_DIR TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR FA_HARNESS_CUBIN_CACHE
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_BRANCH=${FA_HARNESS_BRANCH:-main}
export FA_HARNESS_DB="sqlite:///$WORK/gate.sqlite"
TIMES=$OUT/times.txt
ROOT=$PWD

step() {  # step NAME TIMEOUT_S CMD...: run, log to $WORK/NAME.log, record rc and wall time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | cat >"$WORK/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name rc=$rc wall_s=$((SECONDS - t0)) limit_s=$limit" | tee -a "$TIMES"
  tail -n "${TAIL:-12}" "$WORK/$name.log"
  return "$rc"
}

wipe_caches() {  # a fresh runner: no compile cache anywhere
  rm -rf "$WORK/home" ~/.triton /tmp/torchinductor_* ~/.cache/fa-harness /tmp/cupy-cache \
    ~/.nv/ComputeCache
  export FA_HARNESS_HOME=$WORK/home
  mkdir -p "$FA_HARNESS_HOME"
}

cold_uuid() {  # the cold run's record, the baseline of the runs on the same commit after it
  # (BASE_RECORD: a cold run's record from an earlier call, stored here first)
  if [ ! -f "$WORK/cold-record.json" ] && [ -n "${BASE_RECORD:-}" ]; then
    python3 -m harness import "$BASE_RECORD" >/dev/null && cp "$BASE_RECORD" "$WORK/cold-record.json"
  fi
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['uuid'])" "$WORK/cold-record.json"
}

timed_counts() {  # per owned candidate: timed cases in a record
  python3 - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
plan = r["env"]["ci_plan"]
for k, floor in sorted(plan.get("minimum", {}).items()):
    n = sum(1 for e in r["results"] if e["kernel"] == k and e.get("median_ms"))
    print(f"  timed {k}: {n} (floor {floor})")
print(f"  plan: wall {plan.get('wall_s')} s, warm-up {plan.get('compile_took_s')} s, "
      f"prepared after {plan.get('correctness_took_s')} s, jobs {plan.get('jobs')}")
for s in r["env"].get("ci_sanitizer", []):
    print(f"  {s['line']}")
EOF
}

gate() {  # gate NAME LIMIT DIR [ci options...]: `fa-harness ci` from DIR, summary + record
  local name=$1 limit=$2 dir=$3; shift 3
  step "$name" "$limit" env -C "$dir" python3 -m harness ci --summary "$WORK/$name-summary.md" \
    --record "$WORK/$name-record.json" "$@"
  local rc=$?
  echo "$name exit code $rc" | tee -a "$TIMES"
  [ -f "$WORK/$name-record.json" ] && timed_counts "$WORK/$name-record.json" | tee -a "$TIMES"
  # (ONLY_RECORDS=1: the summaries travel in logs.tgz; $OUT takes 8 files at most)
  [ -n "${ONLY_RECORDS:-}" ] || cp "$WORK/$name-summary.md" "$OUT/" 2>/dev/null
  cp "$WORK/$name-record.json" "$OUT/" 2>/dev/null
  return "$rc"
}

T=$WORK/teamrepo
gitc() { git -C "$T" -c user.email=ci@example.com -c user.name=ci "$@"; }
team_gate() {  # team_gate NAME LIMIT: the team repository's own commit and parent (git)
  # shellcheck disable=SC2086
  (unset FA_HARNESS_COMMIT FA_HARNESS_PARENT
   gate "$1" "$2" "$T" --kernels team_fa2 --timing-cases 8 --sanitize none --budget 1 \
     --db "sqlite:///$WORK/team.sqlite")
}
team_slow() {  # a commit slowing team_fa2 by PLANT_PERCENT, gated
  python3 - "$T/kernels/team_fa2" "${PLANT_PERCENT:-2}" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "bench")
from plant_slowdown import plant
n = 0
for cu in sorted(Path(sys.argv[1]).glob("*.cu")):
    text, k = plant(cu.read_text(), int(sys.argv[2]))
    cu.write_text(text)
    n += k
print(f"team_fa2 slowed by {sys.argv[2]}% in {n} kernel(s)")
PY
  gitc commit -qam "team_fa2 slower"
  team_gate team-slow "${TEAM_SLOW_S:-240}"
  grep -E '^confirming |parent|still undecided' "$WORK/team-slow.log" | head -n 20 | tee -a "$TIMES"
  grep -E '^\| (regression|improvement|inconclusive) ' "$WORK/team-slow-summary.md" \
    | head -n 20 | tee -a "$TIMES"
}

for stage in "$@"; do
  case $stage in
    install)
      step install 90 python3 -m pip install -q --no-deps --no-build-isolation -e .
      ;;
    cold)
      wipe_caches
      rm -f "$WORK/gate.sqlite"
      gate cold "${COLD_S:-380}" "$ROOT"
      ;;
    warm)
      # The same commit: the parent-commit rule finds no baseline, so the cold run is named
      # (an A/A comparison: green expected).
      export FA_HARNESS_HOME=$WORK/home
      gate warm "${WARM_S:-240}" "$ROOT" --baseline "$(cold_uuid)"
      ;;
    slowed)
      slow=$WORK/slow
      rm -rf "$slow"
      python3 bench/plant_slowdown.py "$slow" --variant fa2_mma --percent 10 | tee -a "$TIMES"
      wipe_caches
      # From inside the copy: Python puts the working directory first on sys.path.
      PYTHONPATH="$slow:$PYTHONPATH" gate slowed "${SLOWED_S:-380}" "$slow" \
        --baseline "$(cold_uuid)"
      named=$(grep -c '| regression | `fa2_mma`' "$WORK/slowed-summary.md" 2>/dev/null)
      echo "slowed: fa2_mma regression rows: ${named:-0} (expected > 0, exit 1)" | tee -a "$TIMES"
      ;;
    compile)
      wipe_caches
      step compile "${COMPILE_S:-150}" python3 -m harness kernels --compile
      grep -E "^warm-up|^nvcc|^FAILED" "$WORK/compile.log" | tee -a "$TIMES"
      du -sh "$FA_HARNESS_HOME/cache"/* 2>/dev/null | tee -a "$TIMES"
      ;;
    farwriter)
      export FA_HARNESS_HOME=$WORK/home
      mkdir -p "$WORK/team/kernels"
      cp tests/data/submissions/far_writer.cu "$WORK/team/kernels/"
      gate farwriter "${FAR_S:-150}" "$WORK/team" --kernels-dir "$WORK/team/kernels" \
        --kernels far_writer --grid smoke --db "sqlite:///$WORK/far.sqlite"
      ;;
    gputests)
      export FA_HARNESS_HOME=$WORK/home-tests
      step gputests "${GPUTESTS_S:-280}" make test-gpu GPU_PYTEST="python3 -m pytest"
      grep -E "passed|failed|error" "$WORK/gputests.log" | tail -n 4 | tee -a "$TIMES"
      ;;
    history)
      rm -f "$WORK/gate.sqlite"
      step history "${HISTORY_S:-150}" python3 -m harness import --trusted results/
      ;;
    aa)
      export FA_HARNESS_HOME=$WORK/home
      mkdir -p "$FA_HARNESS_HOME"
      first=${AA_FIRST:-1}
      # AA_HISTORY: records of earlier A/A runs (an earlier call's, on a machine since
      # returned) imported first when this machine's database is new.
      if [ -n "${AA_HISTORY:-}" ] && [ ! -f "$WORK/gate.sqlite" ]; then
        # shellcheck disable=SC2086
        step aa-history 120 python3 -m harness import --trusted $AA_HISTORY
      fi
      for i in $(seq "$first" $((first + ${AA_RUNS:-3} - 1))); do
        base=${AA_BASE:-}
        # AA_BASE=none: no --baseline, each run judged as a team's gate judges it (the
        # runs before it on the branch, the noise history of the database).
        if [ "$base" = none ]; then
          base=""
        elif [ -z "$base" ] && [ "$i" -gt 1 ] && [ -f "$WORK/aa-1-record.json" ]; then
          base=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['uuid'])" \
            "$WORK/aa-1-record.json")
        fi
        # AA_CHAIN=1: run i is a commit of its own (aa00000i + the measured commit's
        # tail) whose parent is run i-1's: the no-op commits of a team's branch, each
        # judged by the gate against its parent's run and the history before it.
        if [ -n "${AA_CHAIN:-}" ]; then
          commit=$(printf 'aa%06d' "$i")${FA_HARNESS_COMMIT:8}
          parent=${AA_PARENT:-$FA_HARNESS_COMMIT}
          # shellcheck disable=SC2086
          FA_HARNESS_COMMIT=$commit FA_HARNESS_PARENT=$parent \
            gate "aa-$i" "${AA_S:-300}" "$ROOT" ${AA_OPTS:-}
          AA_PARENT=$commit
          export AA_PARENT
        else
          # shellcheck disable=SC2086  # AA_OPTS is a list of options
          gate "aa-$i" "${AA_S:-300}" "$ROOT" ${AA_OPTS:-} ${base:+--baseline "$base"}
        fi
        grep -E '^\| (regression|improvement|inconclusive) ' "$WORK/aa-$i-summary.md" \
          | head -n 20 | tee -a "$TIMES"
      done
      ;;
    planted)
      slow=$WORK/slow
      rm -rf "$slow"
      python3 bench/plant_slowdown.py "$slow" --variant fa2_mma \
        --percent "${PLANT_PERCENT:-2}" | tee -a "$TIMES"
      export FA_HARNESS_HOME=$WORK/home
      # shellcheck disable=SC2086
      FA_HARNESS_PARENT=${AA_PARENT:-$FA_HARNESS_COMMIT} FA_HARNESS_COMMIT=${PLANT_COMMIT:-feedc0de${FA_HARNESS_COMMIT:8}} \
        PYTHONPATH="$slow:$PYTHONPATH" gate "${PLANT_NAME:-planted}" "${PLANTED_S:-300}" "$slow" ${AA_OPTS:-}
      grep -E '^\| (regression|improvement|inconclusive) ' "$WORK/${PLANT_NAME:-planted}-summary.md" \
        | head -n 40 | tee -a "$TIMES"
      grep -E '^confirming ' "$WORK/${PLANT_NAME:-planted}.log" | tee -a "$TIMES"
      ;;
    teamrepo)
      # A team's git repository holding one kernel folder (a copy of fa2_mma named
      # team_fa2): TEAM_AA empty commits, each gated (A/A), then (unless TEAM_PLANT=0) a
      # commit that slows team_fa2 by PLANT_PERCENT: its gate confirms the suspect and
      # times the parent commit's code in a git worktree (harness.runs.gate_confirm).
      export FA_HARNESS_HOME=$WORK/home
      rm -rf "$T" && mkdir -p "$T/kernels"
      cp -r harness/kernels/fa2_mma "$T/kernels/team_fa2"
      sed -i -E 's/^name = "fa2_mma(_det)?"/name = "team_fa2\1"/' "$T/kernels/team_fa2/manifest.toml"
      printf '[tool.fa-harness]\nkernels-dirs = ["kernels"]\n' >"$T/pyproject.toml"
      gitc init -q -b main && gitc add -A && gitc commit -qm "team_fa2"
      for i in $(seq 1 "${TEAM_AA:-4}"); do
        gitc commit -q --allow-empty -m "no-op $i"
        team_gate "team-aa-$i" "${TEAM_S:-90}"
      done
      [ "${TEAM_PLANT:-1}" = 0 ] || team_slow
      ;;
    teamsave)
      # The team's repository and database, to go on from on another runner (teamnext).
      tar -czf "$OUT/team.tgz" -C "$WORK" teamrepo team.sqlite
      ;;
    teamnext)
      # The team's repository and database of an earlier call (TEAM_TGZ, as teamsave
      # wrote it), gated on this runner, whose chip may not be the history's: TEAM_NEXT
      # names the commits, in order: "comment" (a comment added to team_fa2's source: the
      # source hash changes, the code does not; must stay green) and "slow" (slowed by
      # PLANT_PERCENT; must be red).
      export FA_HARNESS_HOME=$WORK/home
      rm -rf "$T" "$WORK/team.sqlite" && tar -xzf "$TEAM_TGZ" -C "$WORK"
      python3 -c "import json,subprocess; print('this runner:', subprocess.run(['nvidia-smi','--query-gpu=uuid','--format=csv,noheader'],capture_output=True,text=True).stdout.strip())" | tee -a "$TIMES"
      for what in ${TEAM_NEXT:-comment slow}; do
        case $what in
          comment)
            for cu in "$T"/kernels/team_fa2/*.cu; do printf '\n// no change to the code\n' >>"$cu"; done
            gitc commit -qam "team_fa2: a comment"
            team_gate team-comment "${TEAM_SLOW_S:-240}"
            grep -E '^confirming |still undecided' "$WORK/team-comment.log" | head -n 8 | tee -a "$TIMES"
            ;;
          slow) team_slow ;;
        esac
      done
      ;;
    *) echo "unknown stage $stage (install cold warm slowed compile farwriter gputests" \
         "history aa planted teamrepo teamsave teamnext)"
       exit 2 ;;
  esac
done
tar -czf "$OUT/logs.tgz" -C "$WORK" --exclude=home --exclude=home-tests --exclude=slow \
  --exclude=out --exclude=team --exclude="*.sqlite" . 2>/dev/null
echo "== times"; cat "$TIMES"
