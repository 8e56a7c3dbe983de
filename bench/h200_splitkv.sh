#!/usr/bin/env bash
# The split-KV kernel on the H200 test machine, in one bounded call (about 5 minutes):
#     bash bench/h200_splitkv.sh
# 1. build (NVRTC, cached for what follows) and print each entry's resources; the sweep's
#    variants are built beside the checks;
# 2. side by side: compute-sanitizer memcheck, racecheck and initcheck on small paged,
#    varlen, windowed and masked cases (the shipped fused-combine form, then the
#    two-kernel form), and the GPU tests of the kernel (serving layouts, forced splits,
#    the shipped variants' checks);
# 3. alone on the GPU: bench/splitkv_decode.py --sweep (the decode grid checked and timed
#    against SDPA cuDNN and flash; variants on the longest caches), then its table.
# Logs and the bench's JSON go to $OUT (at most 8 files).
set -uo pipefail
OUT=${OUT:-/tmp/h200-splitkv}
mkdir -p "$OUT"
if [ -f .whl/prelude.sh ]; then source .whl/prelude.sh; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-/tmp/fa-harness-home}
mkdir -p "$FA_HARNESS_HOME"

step() {  # step NAME TIMEOUT_S CMD...: run, log to $OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  echo "== $name: rc=$?, $((SECONDS - t0)) s" >>"$OUT/times.txt"
}

BUILD='
import dataclasses, sys
sys.path.insert(0, "bench")
from harness.candidates.compile import compile_cupy
from harness.candidates.variants import KERNELS_ROOT, load_variant_dir
which = sys.argv[1]
if which == "default":
    c = compile_cupy(load_variant_dir(KERNELS_ROOT / "splitkv"), (9, 0))
    for e, r in sorted(c.resources.items()):
        print(e, r)
else:
    import splitkv_decode
    for name, v in splitkv_decode.variants().items():
        c = compile_cupy(v.spec, (9, 0))
        print(name, {e: (r.registers, r.local_bytes) for e, r in c.resources.items()})
'
step compile 60 python3 -c "$BUILD" default

SAN="compute-sanitizer --error-exitcode 9"
MEM=b5h4k2-3x799-d64-bf16-none-paged64,b3h8k2-1x700-d128-fp16-none-paged40,b6h8k1-5x300-d64-fp16-none-wl20r3-varlen,b6h6k2-1x239-d128-fp16-causal_br-varlen,b2h8k2-1x4099-d128-bf16-key_padding,b2h8-1x3000-d64-fp16-random,b4h16k2-2x517-d128-bf16-causal_tl-wl50r0-paged24
RACE=b1h4k1-1x300-d128-fp16-none-paged32,b3h4k2-1x200-d64-bf16-causal_br-wl30r0-varlen,b1h4k1-1x300-d64-fp16-none-paged40
# The two-kernel configuration (the combine as a second kernel) as a folder of its own.
TWO=/tmp/two-kernel-variant/splitkv
python3 - "$TWO" <<'PY'
import pathlib, re, shutil, sys
dst = pathlib.Path(sys.argv[1])
shutil.copytree("harness/kernels/splitkv", dst, dirs_exist_ok=True)
m = (dst / "manifest.toml").read_text()
m = re.sub(r"compile_options = \[.*\]", "compile_options = []", m)
m = re.sub(r'\[\[workspace\]\]\nname = "tickets"\n[^\[]*', "", m)
m += ('\n[[launch]]\nentry = "splitkv_combine_{dtype}_d{head_dim}"\n'
      'grid = ["batch * heads * seqlen_q * min(num_splits - 1, 1)", 1, 1]\nblock = [128, 1, 1]\n')
(dst / "manifest.toml").write_text(m)
PY
tool() {  # tool NAME ARGS CASES: the shipped configuration, then the two-kernel one
  local name=$1 args=$2 cases=$3
  for v in harness/kernels/splitkv "$TWO"; do
    echo "## $v"
    $SAN $args python3 -m harness.execution.sanitize_target --variant "$v" --trusted --cases "$cases"
    echo "## rc=$?"
  done
}
export -f tool
export SAN TWO
step memcheck "${SAN_S:-95}" bash -c "tool memcheck '--tool memcheck' $MEM" &
step racecheck "${SAN_S:-95}" bash -c "tool racecheck '--tool racecheck --racecheck-report analysis' $RACE" &
step initcheck "${SAN_S:-95}" bash -c "tool initcheck '--tool initcheck' $MEM" &
step pytest "${PYTEST_S:-100}" python3 -m pytest -q -m gpu -p no:cacheprovider \
  --maxfail=15 tests/test_splitkv_serving_gpu.py tests/test_cuda_variants_gpu.py -k splitkv &
(python3 -c "$BUILD" sweep >>"$OUT/compile.txt" 2>&1) &
wait

step bench "${BENCH_S:-215}" python3 bench/splitkv_decode.py --sweep --json "$OUT/bench.json"
cat "$OUT/times.txt"
grep -h "##\|SUMMARY" "$OUT/memcheck.txt" "$OUT/racecheck.txt" "$OUT/initcheck.txt"; tail -n 3 "$OUT/pytest.txt"
python3 bench/splitkv_decode.py --table "$OUT/bench.json"
