#!/usr/bin/env bash
# The Python candidates GPU run (flex_attention, Triton FA2): see gpu_python_candidates.sh.
exec bash "$(dirname "$0")/gpu_python_candidates.sh" "$@"
