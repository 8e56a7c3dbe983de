"""The SASS of a built cubin, read with cuobjdump (no GPU needed).

Used to prove that a kernel is on the fast path it claims: a Hopper variant's entries hold
warpgroup MMAs (`HGMMA`), not only the Ampere-style `HMMA`, and touch no local memory
(`LDL`/`STL`: spills or stack arrays). cuobjdump comes from the CUDA toolkit on PATH or
from the `nvidia-cuda-cuobjdump` wheel (with `nvidia-cuda-nvdisasm`, which it runs).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

_FUNCTION_RE = re.compile(r"^\s*Function : (\S+)", re.MULTILINE)
_OPCODE_RE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.x]+)?")


def _wheel_bin() -> Path | None:
    try:
        import nvidia  # the namespace package of NVIDIA's tool wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for sub in ("cu13", "cuda_cuobjdump", "cu12"):
            cand = Path(root) / sub / "bin"
            if (cand / "cuobjdump").is_file():
                return cand
    return None


def cuobjdump_path() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    wheel = _wheel_bin()
    return str(wheel / "cuobjdump") if wheel else None


def sass_by_function(cubin: bytes, timeout_s: float = 120.0) -> dict[str, str]:
    """{kernel name: its SASS text} of a cubin. Raises RuntimeError when cuobjdump is
    missing or fails (its message, which names the file it was given, is ours)."""
    tool = cuobjdump_path()
    if tool is None:
        raise RuntimeError("cuobjdump not found (CUDA toolkit or nvidia-cuda-cuobjdump)")
    env = dict(os.environ)
    # cuobjdump runs nvdisasm, which the wheels put beside it.
    env["PATH"] = str(Path(tool).parent) + os.pathsep + env.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="fa-harness-sass-") as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {proc.stderr.strip() or proc.returncode}")
    text = proc.stdout
    marks = list(_FUNCTION_RE.finditer(text))
    return {m.group(1): text[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(text)]
            for i, m in enumerate(marks)}


def opcode_counts(sass: str) -> Counter[str]:
    """Instructions by opcode with its modifiers ("HGMMA.64x128x16.F32", "LDL.64")."""
    return Counter(m.group(1) + (m.group(2) or "") for m in _OPCODE_RE.finditer(sass))


def count(sass: str, opcode: str) -> int:
    """Instructions whose bare opcode is `opcode` (any modifiers)."""
    return sum(n for op, n in opcode_counts(sass).items() if op.split(".")[0] == opcode)
