#!/usr/bin/env bash
# Declares fa3_wgmma's entries that are built but not yet declared, in the manifest of the
# tree at $1, for the GPU run that is to judge them (the copy sent to the GPU):
#     bash bench/declare_fa3.sh TREE fp8
# fp8:  e4m3 Q, K and V at d = 64 and 128 (`fp8 = [64, 128]`)
# (d = 192, 256 and 192/128 are declared in the manifest itself since they passed on a GPU.)
# Exit 1 when the manifest no longer has the line to change (or an unknown word).
set -euo pipefail
m=$1/harness/kernels/fa3_wgmma/manifest.toml
shift
for what in "$@"; do
  case $what in
    fp8)
      sed -i '0,/^masks = /s//fp8 = [64, 128]\nmasks = /' "$m"
      grep -q '^fp8 = \[64, 128\]$' "$m" || { echo "fa3_wgmma: fp8 not declared ($m)" >&2; exit 1; } ;;
    *) echo "declare_fa3.sh: unknown $what (fp8)" >&2; exit 1 ;;
  esac
  echo "fa3_wgmma: $what declared in $m"
done
