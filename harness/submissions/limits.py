"""Launch and workspace limits of a submission, evaluated at every case it is scored on
(harness.submissions.submit, check 5).

Each pass is checked at the cases it runs: the forward at every case of the full, perf and
decode grids it supports, the backward (a manifest's `[backward]`) at every case of the
full grid (its correctness) and the perf-bwd grid (its timing). The largest values decide;
the first limit exceeded rejects the submission with one message naming the pass's launch
or workspace (`backward.launch[0] (entry): ...`) and the case.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from harness.core.cases import Case
from harness.submissions.sources import (
    MAX_BLOCKS_PER_LAUNCH,
    MAX_GRID_Y_Z,
    MAX_SHARED_BYTES,
    MAX_SPLITS,
    MAX_THREADS_PER_BLOCK,
    MAX_WORKSPACE_BYTES,
    SM_COUNT,
    Rejected,
)

FWD_GRIDS = ("full", "perf", "decode")
BWD_GRIDS = ("full", "perf-bwd")


def limit_cases(grids: Sequence[str] = FWD_GRIDS) -> list[Case]:
    """Every case of `grids` (by default those the forward can be run on)."""
    from harness.core.grids import get_grid

    cases: list[Case] = []
    for grid in grids:
        cases += get_grid(grid)
    return cases


def check_launch_limits(spec: Any, cases: Iterable[Case], *,
                        backward: bool = False) -> dict[str, Any]:
    """Evaluate the launch and workspace expressions of the spec's forward (or, with
    `backward`, its `[backward]`) at every case it supports (the split count is tried at
    both extremes when the manifest leaves it to the heuristic). Returns the largest
    values seen and how many cases were checked."""
    from harness.candidates.expr import ExprError
    from harness.candidates.variants import size_env

    prefix = "backward." if backward else ""
    launches = spec.pass_launches(backward)
    workspaces = spec.pass_workspaces(backward)
    support = spec.to_support()
    splits_options = [spec.num_splits] if spec.num_splits else [1, MAX_SPLITS]
    worst: dict[str, Any] = {"blocks": 0, "threads": 0, "shared_bytes": 0,
                             "workspace_bytes": 0, "case": None, "cases_checked": 0}
    for case in cases:
        if support.reason_unsupported(case) is not None:
            continue
        worst["cases_checked"] += 1
        for splits in splits_options:
            env = size_env(case, num_splits=splits, sm_count=SM_COUNT, tiles=spec.tiles)
            try:
                for li, launch in enumerate(launches):
                    where = f"{prefix}launch[{li}] ({launch.entry})"
                    grid = [e.evaluate(env) for e in launch.grid]
                    block = [e.evaluate(env) for e in launch.block]
                    _check_launch(where, case, grid, block, launch.shared_mem.evaluate(env),
                                  worst)
                ws_total = 0
                for wi, ws in enumerate(workspaces):
                    where = f"{prefix}workspace[{wi}] ({ws.name})"
                    n = ws.elements.evaluate(env)
                    if n < 0:
                        raise Rejected(f"{where}: negative size {n} at case {case.id}")
                    ws_total += n * ws.itemsize
                    if ws_total > MAX_WORKSPACE_BYTES:
                        raise Rejected(f"{where}: {ws_total} bytes at case {case.id} exceed "
                                       f"the limit of {MAX_WORKSPACE_BYTES} bytes")
                worst["workspace_bytes"] = max(worst["workspace_bytes"], ws_total)
            except ExprError as e:
                raise Rejected(f"manifest: {prefix}{e} (case {case.id})") from None
    return worst


def _check_launch(where: str, case: Case, grid: list[int], block: list[int], shared: int,
                  worst: dict[str, Any]) -> None:
    if any(g < 1 for g in grid) or any(b < 1 for b in block) or len(grid) > 3 or len(block) > 3:
        raise Rejected(f"{where}: grid {grid} / block {block} at case {case.id}: every "
                       f"dimension must be >= 1 and there are at most 3")
    blocks = 1
    for g in grid:
        blocks *= g
    threads = 1
    for b in block:
        threads *= b
    if blocks > MAX_BLOCKS_PER_LAUNCH:
        raise Rejected(f"{where}: {blocks} blocks at case {case.id} exceed the limit of "
                       f"{MAX_BLOCKS_PER_LAUNCH} blocks per launch")
    if any(g > MAX_GRID_Y_Z for g in grid[1:]):
        raise Rejected(f"{where}: grid {grid} at case {case.id}: gridDim.y/z above {MAX_GRID_Y_Z}")
    if threads > MAX_THREADS_PER_BLOCK:
        raise Rejected(f"{where}: block {block} = {threads} threads at case {case.id} exceeds "
                       f"{MAX_THREADS_PER_BLOCK} threads per block")
    if shared < 0 or shared > MAX_SHARED_BYTES:
        raise Rejected(f"{where}: {shared} bytes of shared memory at case {case.id} exceed the "
                       f"device maximum of {MAX_SHARED_BYTES} bytes per block")
    if blocks > worst["blocks"]:
        worst["blocks"], worst["case"] = blocks, case.id
    worst["threads"] = max(worst["threads"], threads)
    worst["shared_bytes"] = max(worst["shared_bytes"], shared)
