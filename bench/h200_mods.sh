#!/usr/bin/env bash
# The score modifiers (softcap, ALiBi, sinks), d_v != d_qk and FP8 inputs on the GPU, in
# stages, each bounded in time:
#     bash bench/h200_mods.sh naive fa3 sanitize cost record peers splitkv sk-serving \
#         sk-sanitize decode8 dims dims-record fp8 fp8-sanitize   # any, in order
# naive:    the shipped naive kernel (it declares all of them) on the mods grid under
#           SECRETS secrets (default 0 1), 2 repeats (bitwise compared)
# fa3:      the same for fa3_wgmma (softcap, ALiBi, sinks; d = 192, 256, 192/128)
# sanitize: compute-sanitizer memcheck on both, small cases of each modifier (and of
#           fa3_wgmma's larger head dims)
# cost:     what the modifiers cost fa3_wgmma: bench/ab_interleaved.py, fa3_wgmma on the
#           perf grid's COST_CASES plain and with sc30, alibi, sink (COST_KERNELS; AB_DIR
#           adds bench/ab_prepare.py's copies, e.g. the kernel at an earlier commit)
# record:   a perf run record of fa3_wgmma and cuDNN (REC_KERNELS, REC_CASES), for results/
# peers:    the peers that declare the modifiers (flex_attention compiled, the SDPA
#           backends) on the mods grid, secret 0
# splitkv:  the shipped splitkv on the mods grid under SK_SECRETS (default 0-4), 2
#           repeats (a run record of secret 0), its e4m3-cache cases among them
# sk-serving: splitkv on the serving grid, secret 0
# sk-sanitize: compute-sanitizer memcheck on splitkv's e4m3-cache cases
# decode8:  bench/splitkv_decode.py on the e4m3-cache twins of the long decode caches and
#           their 2-byte cases (DEC_CASES), no peers; the shipped kernel and DEC_ALSO
#           (default bitcvt,stages8_5: the fragments converted by bit moves; 5 slices
#           in flight per warp)
# dims:     bench/ab_interleaved.py on the perf-dims grid (d = 192, 256, 192/128):
#           fa3_wgmma against cuDNN (DIMS_KERNELS, DIMS_CASES), the d = 256 target
# dims-record: a perf-dims run record of fa3_wgmma and cuDNN, for results/
# fp8:      fa3_wgmma's e4m3 forward timed against its own fp16 / bf16 one on the perf
#           grid's d = 128 cases (FP8_CASES; bench/ab_interleaved.py, NAME@fp8_qkv_*:
#           the same case with e4m3 Q, K, V), each checked first
# fp8-sanitize: compute-sanitizer memcheck on fa3_wgmma's e4m3 cases
# Set FA_HARNESS_COMMIT to the commit measured (the tree comes without .git). Logs and
# JSON results go to $OUT. FA3_DECLARE=fp8 declares fa3_wgmma's e4m3 entries in this tree
# first (bench/declare_fa3.sh; the fa3, fp8 and fp8-sanitize stages run them). (Until both manifests declared the modifiers, the runs of
# results/h100-20261207f-mods judged renamed copies that did.)
set -uo pipefail
OUT=${OUT:-/tmp/h200-mods}
mkdir -p "$OUT"
if [ -f .whl/prelude.sh ] && [ -z "${FA_PRELUDE_DONE:-}" ]; then source .whl/prelude.sh; fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FA_HARNESS_HOME=${FA_HARNESS_HOME:-/tmp/fa-harness-home}
mkdir -p "$FA_HARNESS_HOME"
FA="python3 -m harness"

source "$(dirname "$0")/step.sh"

# fa3_wgmma's entries built ahead of a GPU run: FA3_DECLARE=fp8 declares them here.
if [ -n "${FA3_DECLARE:-}" ]; then bash "$(dirname "$0")/declare_fa3.sh" . $FA3_DECLARE; fi

for stage in "$@"; do
  case $stage in
    naive|fa3)
      kernel=$([ "$stage" = naive ] && echo naive || echo fa3_wgmma)
      for s in ${SECRETS:-0 1}; do
        step "$stage-$s" "${MODS_S:-240}" $FA run --grid mods --kernels "$kernel" \
          --device cuda --repeats 2 --secret "$s" --no-progress \
          --json "$OUT/$stage-mods-$s.json" --no-store
      done ;;
    sanitize)
      step sanitize-fa3 180 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m harness.execution.sanitize_target --variant harness/kernels/fa3_wgmma \
        --cases "${SAN_FA3:-b2h4k2-203x113-d64-bf16-causal_br-sc10,b2h4k1-113x203-d64-bf16-causal_tl-alibi,b3h4k2-97x130-d64-fp16-key_padding-sink,b2h6k2-113x203-d128-fp16-causal_br-sc20-alibi-sink,b2h4k2-203x113-d192-bf16-causal_br,b1h4k1-128x217-d256-fp16-key_padding,b2h4k2-113x203-d256-bf16-none-sc30-sink,b2h4k2-203x113-d192v128-bf16-causal_br,b2h4-113x203-d192v128-fp16-none-sink}" --trusted
      step sanitize 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m harness.execution.sanitize_target --variant harness/kernels/naive \
        --cases "${SAN_CASES:-b2h4k2-203x113-d64-bf16-causal_br-sc10,b2h4k1-113x203-d64-bf16-causal_tl-alibi,b3h4k2-97x130-d64-fp16-key_padding-sink,b2h4k2-203x113-d192v128-bf16-causal_br,b1h8k2-1x239-d128-bf16-none-sc20-alibi-sink}" --trusted ;;
    cost)
      step cost "${COST_S:-300}" env ${AB_DIR:+FA_HARNESS_KERNELS="$AB_DIR"} \
        python3 bench/ab_interleaved.py --kernels \
        "${COST_KERNELS:-fa3_wgmma,fa3_wgmma@sc30,fa3_wgmma@alibi,fa3_wgmma@sink}" \
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
    splitkv)
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E 'h100|h200|a100' | tr A-Z a-z)
      for s in ${SK_SECRETS:-0 1 2 3 4}; do
        rec=()  # the run record (for results/) of secret 0
        [ "$s" = 0 ] && rec=(--record "$OUT/${gpu:-gpu}-$(date -u +%Y%m%dT%H%M%SZ)-splitkv-mods.json")
        step "splitkv-$s" "${MODS_S:-240}" $FA run --grid mods --kernels splitkv \
          --device cuda --repeats 2 --secret "$s" --no-progress \
          --json "$OUT/splitkv-mods-$s.json" "${rec[@]}" --no-store
      done ;;
    sk-serving)
      step splitkv-serving "${MODS_S:-240}" $FA run --grid serving --kernels splitkv \
        --device cuda --secret 0 --no-progress --json "$OUT/splitkv-serving.json" --no-store ;;
    sk-sanitize)
      step sanitize-sk 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m harness.execution.sanitize_target --variant harness/kernels/splitkv \
        --cases "${SAN_SK:-b3h8k2-2x400-d64-fp16-causal_br-wl100-paged24-fp8_kv_token,b4h8k2-1x700-d128-bf16-none-varlen-fp8_kv_token,b5h6k2-16x1024-d64-bf16-causal_br-paged256-fp8_kv_token,b3h8-1x1000-d128-fp16-key_padding-fp8_kv_head}" --trusted ;;
    decode8)
      step decode8 "${DEC_S:-300}" python3 bench/splitkv_decode.py --also "${DEC_ALSO:-bitcvt,stages8_5}" --no-peers \
        --cases "${DEC_CASES:-b1h32k8-1x65536-d128-*-none,b1h32k8-1x65536-d128-*-none-fp8*,b1h32k8-1x131072-d128-*-none,b1h32k8-1x131072-d128-*-none-fp8*,b1h32k8-1x131072-d128-fp16-none-paged64f*,b1h32-1x131072-d128-fp16-none,b1h32-1x131072-d128-fp16-none-fp8*}" \
        --json "$OUT/decode8.json" ;;
    dims)
      step dims "${DIMS_S:-300}" python3 bench/ab_interleaved.py --grid perf-dims \
        --kernels "${DIMS_KERNELS:-sdpa_cudnn,fa3_wgmma,sdpa_flash}" --baseline sdpa_cudnn \
        --cases "${DIMS_CASES:-*-4096x4096-*-bf16-*,*-16384x16384-*-bf16-*}" \
        --rounds "${DIMS_ROUNDS:-3}" --min-time "${MIN_TIME:-0.1}" ;;
    dims-record)
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E 'h100|h200|a100' | tr A-Z a-z)
      step dims-record "${REC_S:-300}" $FA run --grid perf-dims --kernels "${REC_KERNELS:-fa3_wgmma,sdpa_cudnn}" \
        --cases "${DIMS_REC_CASES:-*}" --baseline sdpa_cudnn \
        --no-progress --record "$OUT/${gpu:-gpu}-$(date -u +%Y%m%dT%H%M%SZ)-perf-dims.json" ;;
    fp8)
      step fp8 "${FP8_S:-300}" python3 bench/ab_interleaved.py --grid perf \
        --kernels "${FP8_KERNELS:-fa3_wgmma,fa3_wgmma@fp8_qkv_head,fa3_wgmma@fp8_qkv_tensor,sdpa_cudnn}" \
        --baseline fa3_wgmma --cases "${FP8_CASES:-*-4096x4096-d128-bf16-*,*-16384x16384-d128-*}" \
        --rounds "${FP8_ROUNDS:-3}" --min-time "${MIN_TIME:-0.1}" ;;
    fp8-sanitize)
      step sanitize-fp8 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m harness.execution.sanitize_target --variant harness/kernels/fa3_wgmma \
        --cases "${SAN_FP8:-b2h4k2-203x113-d128-bf16-causal_br-fp8_qkv_head,b1h4k1-128x217-d128-fp16-key_padding-fp8_qkv_tensor,b2h4-300x300-d128-bf16-none-sc30-sink-fp8_qkv_tensor}" --trusted ;;
    *) echo "unknown stage $stage" ;;
  esac
done
