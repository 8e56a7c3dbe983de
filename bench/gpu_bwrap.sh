# Sourced by the H200 scripts. The GPU machine has no bubblewrap and reaches no package
# registry: a bubblewrap extracted from Debian's package (with the three libraries it
# links) may be carried in .gpu/bwrap:
#     apt-get download bubblewrap && dpkg -x bubblewrap_*.deb .gpu/bwrap
#     mkdir -p .gpu/bwrap/lib && cp -L /lib/x86_64-linux-gnu/{libselinux.so.1,libcap.so.2,libpcre2-8.so.0} .gpu/bwrap/lib
# It is put on PATH through a wrapper; whether it can create namespaces there is then
# up to the machine (harness.candidates.sandbox tries it and says which backend it uses).
# Without a working one, compiles run under resource limits only (FA_HARNESS_SANDBOX=rlimits).
if ! command -v bwrap >/dev/null && [ -x "$PWD/.gpu/bwrap/usr/bin/bwrap" ]; then
  mkdir -p /tmp/fa-bwrap-bin
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$PWD/.gpu/bwrap/lib" \
    "$PWD/.gpu/bwrap/usr/bin/bwrap" >/tmp/fa-bwrap-bin/bwrap
  chmod +x /tmp/fa-bwrap-bin/bwrap
  export PATH=/tmp/fa-bwrap-bin:$PATH
fi
if ! bwrap --unshare-all --ro-bind / / true 2>/tmp/fa-bwrap-probe.txt; then
  echo "bwrap: $(command -v bwrap || echo absent); cannot sandbox here ($(head -c 200 /tmp/fa-bwrap-probe.txt)): FA_HARNESS_SANDBOX=rlimits"
  export FA_HARNESS_SANDBOX=rlimits
else
  echo "bwrap: $(command -v bwrap) works"
fi
