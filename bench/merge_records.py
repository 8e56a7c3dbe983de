"""Join run records of one commit on one GPU, made by processes that split a grid between
them, into one record.

    python bench/merge_records.py OUT.json PART.json [PART.json ...]

A candidate whose full grid is mostly compile time (flex_attention: one Inductor compile
per head dim, dtype and mask kind) finishes sooner as several `fa-harness run --cases ...`
processes side by side, each on its own slice of the grid. Correctness is not timed, so
they may share the GPU. The joined record has a fresh uuid, the earliest start time, the
union of the parts' grids and kernels, and `env.merged_from` naming every part (uuid and
argv), so nobody mistakes it for one process's run. Parts of different commits or GPUs,
and a (kernel, case) present in two parts, are refused (exit 2, one line).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.records.record import RecordError, RunRecord  # noqa: E402


def merge(parts: list[RunRecord]) -> RunRecord:
    first = parts[0]
    for p in parts[1:]:
        if p.commit != first.commit:
            raise RecordError(f"record {p.uuid} is of commit {p.commit}, not {first.commit}")
        gpu_of = (p.gpu or {}).get("uuid"), (first.gpu or {}).get("uuid")
        if gpu_of[0] != gpu_of[1]:
            raise RecordError(f"record {p.uuid} ran on GPU {gpu_of[0]}, not {gpu_of[1]}")
    env = dict(first.env)
    env.pop("argv", None)
    env["merged_from"] = [{"uuid": p.uuid, "argv": p.env.get("argv")} for p in parts]
    kernels: dict = {}
    grids: list[str] = []
    for p in parts:
        for k, v in p.kernels.items():
            kernels.setdefault(k, v)
        grids += [g for g in p.grids if g not in grids]
    data = first.to_dict() | {
        "uuid": str(uuid.uuid4()), "created_at": min(p.created_at for p in parts),
        "env": env, "grids": grids, "kernels": kernels,
        "results": [e for p in parts for e in p.results]}
    return RunRecord.from_dict(data)  # validates: a (kernel, case) twice is refused here


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("parts", type=Path, nargs="+")
    args = ap.parse_args(argv)
    try:
        parts = [RunRecord.read(p) for p in args.parts]
        joined = merge(parts)
        joined.write(args.out)
    except (RecordError, OSError) as e:
        print(f"merge_records: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(joined.results)} results from {len(parts)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
