"""Compile before the clock starts: the warm-up of the compile caches.

A fresh CI runner has empty caches, and a kernel compiled inside the timed phase costs
the gate its timing (a cold `ci` once spent its whole budget compiling and timed
nothing). The warm-up builds what a later process will load, into the persistent caches
of harness.paths, side by side, one child process per task:

- a CUDA variant: its module compiled with NVRTC for this GPU (CuPy's disk cache); the
  correctness and timing children then load it;
- a Python candidate: called once on each case of a sequence, in the order a later
  process will call it (its timing child's cases, or one correctness child's), so that
  Triton's and Inductor's caches hold exactly the kernels that process compiles, the
  dynamic-shape recompiles (which depend on the order shapes are seen) included.

Each task runs in a child of harness.execution.isolate (`warm_case` is its case
function), so a candidate that crashes or hangs while compiling costs only its own task;
its verdict is left to the correctness and timing runs, which meet the same failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from harness.core.cases import Case
from harness.core.results import CaseResult, Status


@dataclass
class WarmTask:
    name: str  # the candidate
    cases: list[Case]  # the sequence to replay (CUDA variants: one case, any)
    what: str = ""  # "timing", "correctness 2/5", "compile"


@dataclass
class WarmResult:
    task: WarmTask
    seconds: float
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def warm_case(candidate: Any, case: Case, options: dict[str, Any]) -> CaseResult:
    """The warm-up child's work for one case (harness.execution.isolate's `case_fn`)."""
    import torch

    t0 = time.monotonic()
    if candidate.kind == "cuda" and getattr(candidate, "spec", None) is not None:
        from harness.candidates.compile import compile_cupy

        compile_cupy(candidate.spec, tuple(torch.cuda.get_device_capability()))
        return CaseResult(candidate.name, case, Status.PASSED,
                          f"compiled in {time.monotonic() - t0:.1f} s")
    from harness.core.cases import make_inputs
    from harness.core.serving import tensor_shapes

    inputs = make_inputs(case, "cuda", secret=int(options.get("secret", 0)))
    shape = tensor_shapes(case)["out"]  # q's shape in the case's layout (packed for varlen)
    out = torch.empty(shape, dtype=case.torch_dtype, device="cuda")
    lse = (torch.empty(shape[:3], dtype=torch.float32, device="cuda")
           if candidate.support.writes_lse else None)
    candidate.run(case, inputs, out, lse)
    torch.cuda.synchronize()
    return CaseResult(candidate.name, case, Status.PASSED,
                      f"called in {time.monotonic() - t0:.1f} s")


def _run(task: WarmTask, options: dict[str, Any], timeout_s: float) -> WarmResult:
    from harness.execution.isolate import run_isolated

    t0 = time.monotonic()
    opts = {"device": "cuda", "case_fn": "harness.execution.warmup:warm_case", **options}
    results = run_isolated(task.name, task.cases, mode="check", options=opts,
                           timeout_s=timeout_s)
    bad = [f"{r.case.id}: {r.status.value}: {(r.message or '').splitlines()[0][:200]}"
           if r.message else f"{r.case.id}: {r.status.value}"
           for r in results if r.status is not Status.PASSED]
    return WarmResult(task, time.monotonic() - t0, bad)


def warm_up(tasks: Sequence[WarmTask], *, parallel: int = 1, timeout_s: float = 300.0,
            options_for: Callable[[str], dict[str, Any]] | None = None,
            log: Callable[[str], None] | None = None) -> list[WarmResult]:
    """Run every task, `parallel` at a time, longest sequences first; one log line per
    task as it ends."""
    order = sorted(tasks, key=lambda t: -len(t.cases))

    def one(task: WarmTask) -> WarmResult:
        res = _run(task, options_for(task.name) if options_for else {}, timeout_s)
        if log is not None:
            what = f" ({task.what})" if task.what else ""
            state = "ok" if res.ok else f"{len(res.failures)} failed, first {res.failures[0]}"
            log(f"warm-up {task.name}{what}: {len(task.cases)} case(s) in "
                f"{res.seconds:.1f} s, {state}")
        return res

    if parallel <= 1:
        return [one(t) for t in order]
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(one, order))
