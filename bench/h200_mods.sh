#!/usr/bin/env bash
# The score modifiers (softcap, ALiBi, sinks) and d_v != d_qk on the GPU, in stages, each
# bounded in time:
#     bash bench/h200_mods.sh naive fa3 sanitize cost peers    # any of these, in order
# naive:    the shipped naive CUDA kernel with the modifiers declared (a copy of its folder,
#           `naive_mods`, whose manifest adds softcap / alibi / sinks / head_dim_v and
#           fp8 / fp8_kv), on the
#           mods grid under SECRETS secrets (default 0 1), 2 repeats (bitwise compared)
# fa3:      the same for fa3_wgmma (`fa3_wgmma_mods`: softcap / alibi / sinks)
# cost:     what the modifiers cost fa3_wgmma: bench/ab_interleaved.py, fa3_wgmma on the
#           perf grid's COST_CASES against fa3_wgmma_mods on the same cases plain and
#           with sc30, alibi, sink (COST_KERNELS; AB_DIR adds bench/ab_prepare.py's copies)
# record:   a perf run record of fa3_wgmma and cuDNN (REC_KERNELS, REC_CASES), for results/
# peers:    the peers that declare the modifiers (flex_attention compiled, the SDPA
#           backends) on the mods grid, secret 0
# sanitize: compute-sanitizer memcheck on naive_mods, small cases of each modifier
# Set FA_HARNESS_COMMIT to the commit measured (the tree comes without .git). Logs and
# JSON results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/h200-mods}
mkdir -p "$OUT"
if [ -f .whl/prelude.sh ] && [ -z "${FA_PRELUDE_DONE:-}" ]; then source .whl/prelude.sh; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-/tmp/fa-harness-home}
mkdir -p "$FA_HARNESS_HOME"
FA="python3 -m harness"
K=${WORK:-/tmp}/mods-kernels
rm -rf "$K" && mkdir -p "$K"
cp -r harness/kernels/naive "$K/naive_mods"
sed -i -e 's/^name = "naive"/name = "naive_mods"/' \
  -e 's/^masked_lse = "-inf"/masked_lse = "-inf"\nsoftcap = true\nalibi = true\nsinks = true\nhead_dim_v = true\nfp8 = true\nfp8_kv = true/' \
  "$K/naive_mods/manifest.toml"
cp -r harness/kernels/fa3_wgmma "$K/fa3_wgmma_mods"
sed -i -e 's/^name = "fa3_wgmma"/name = "fa3_wgmma_mods"/' \
  -e 's/^masked_lse = "-inf"/masked_lse = "-inf"\nsoftcap = true\nalibi = true\nsinks = true/' \
  "$K/fa3_wgmma_mods/manifest.toml"

source "$(dirname "$0")/step.sh"

for stage in "$@"; do
  case $stage in
    naive|fa3)
      kernel=$([ "$stage" = naive ] && echo naive_mods || echo fa3_wgmma_mods)
      for s in ${SECRETS:-0 1}; do
        step "$stage-$s" "${MODS_S:-240}" $FA run --grid mods --kernels-dir "$K" \
          --kernels "$kernel" --device cuda --repeats 2 --secret "$s" --no-progress \
          --json "$OUT/$stage-mods-$s.json" --no-store
      done ;;
    cost)
      # With ab/ (bench/ab_prepare.py, sent along), COST_KERNELS may name its variants too.
      step cost "${COST_S:-300}" env FA_HARNESS_KERNELS="$K${AB_DIR:+:$AB_DIR}" \
        python3 bench/ab_interleaved.py --kernels \
        "${COST_KERNELS:-fa3_wgmma,fa3_wgmma_mods,fa3_wgmma_mods@sc30,fa3_wgmma_mods@alibi,fa3_wgmma_mods@sink}" \
        --cases "${COST_CASES:-*-4096x4096-d*-bf16-*,*-16384x16384-d*-bf16-*}" \
        --rounds "${COST_ROUNDS:-3}" --min-time "${MIN_TIME:-0.1}" ;;
    record)
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E 'h100|h200|a100' | tr A-Z a-z)
      step record "${REC_S:-300}" $FA run --grid perf --kernels "${REC_KERNELS:-fa3_wgmma,sdpa_cudnn}" \
        --cases "${REC_CASES:-*-4096x4096-*-bf16-*,*-16384x16384-*-bf16-*}" --baseline sdpa_cudnn \
        --no-progress --record "$OUT/${gpu:-gpu}-$(date -u +%Y%m%dT%H%M%SZ)-perf.json" ;;
    peers)
      step peers "${PEERS_S:-300}" $FA run --grid mods \
        --kernels "${PEERS:-flex_attention,sdpa_math,sdpa_flash,sdpa_efficient,sdpa_cudnn}" --device cuda \
        --no-progress --json "$OUT/peers-mods.json" --no-store ;;
    sanitize)
      step sanitize-fa3 180 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m harness.execution.sanitize_target --variant "$K/fa3_wgmma_mods" \
        --cases "${SAN_FA3:-b2h4k2-203x113-d64-bf16-causal_br-sc10,b2h4k1-113x203-d64-bf16-causal_tl-alibi,b3h4k2-97x130-d64-fp16-key_padding-sink,b2h6k2-113x203-d128-fp16-causal_br-sc20-alibi-sink}" --trusted
      step sanitize 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m harness.execution.sanitize_target --variant "$K/naive_mods" \
        --cases "${SAN_CASES:-b2h4k2-203x113-d64-bf16-causal_br-sc10,b2h4k1-113x203-d64-bf16-causal_tl-alibi,b3h4k2-97x130-d64-fp16-key_padding-sink,b2h4k2-203x113-d192v128-bf16-causal_br,b1h8k2-1x239-d128-bf16-none-sc20-alibi-sink}" --trusted ;;
    *) echo "unknown stage $stage" ;;
  esac
done
