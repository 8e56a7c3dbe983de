"""Run candidates over cases and summarise: the correctness job behind `fa-harness run`.

Trusted in-process candidates (the CPU models, the SDPA peers) are checked case by case
in this process, one candidate after the other. Candidates with `isolate=True` (CUDA variants,
submissions) go through harness.execution.isolate.run_isolated: one child process per candidate, a
crash or hang becomes that case's verdict and the child restarts for the rest.

With `parallel=N > 1` (the CI gate on a GPU runner) up to N children run side by side:
correctness is not timed, and most of it is compiling (NVRTC, Triton, Inductor) and the
float64 oracle, which the runner's cores can share. The CPU models then run in children
too (the oracle cache of harness.core.check is per process), and a candidate's cases may
be split into several children by `split(candidate)` (the gate splits the Python
candidates by mask kind: each compiles a kernel per mask kind). The SDPA peers stay in
this process, checked while the children run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from harness.core.candidate import Candidate
from harness.core.cases import Case
from harness.core.results import CaseResult, Status

DEFAULT_TIMEOUT_S = 300.0
FAILING = (Status.FAILED, Status.CRASHED, Status.TIMEOUT, Status.ERROR, Status.INVALID)


def _progress(enabled: bool, total: int):
    if not enabled:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=True)
    return prog


def run_correctness(candidates: Sequence[Candidate], cases: Sequence[Case], *, secret: int = 0,
                    on_result: Callable[[CaseResult], None] | None = None, repeats: int = 1,
                    progress: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                    isolate_options: dict[str, Any] | None = None,
                    cases_for: Callable[[Candidate], Sequence[Case]] | None = None,
                    parallel: int = 1,
                    split: Callable[[Candidate], Callable[[Case], Any] | None] | None = None,
                    backward: bool = False) -> list[CaseResult]:
    """One CaseResult per (candidate, case), candidate-major in the given orders. With
    `cases_for`, each candidate runs its own list (the per-candidate full grid) and
    `cases` is ignored. `parallel`, `split`: the module doc. `backward`: each
    candidate's backward is judged (harness.core.check_grad) instead of its forward."""
    from harness.candidates.registry import unavailable_reason
    from harness.core.check import check_case
    from harness.core.check_grad import BWD_CASE_FN, check_backward_case

    check_fn = check_backward_case if backward else check_case

    lists = [list(cases_for(c)) if cases_for else list(cases) for c in candidates]
    results: dict[tuple[int, int], CaseResult] = {}
    total = sum(len(cl) for cl in lists)
    with _progress(progress, total) as prog:
        task = prog.add_task("correctness", total=total) if prog is not None else None

        lock = threading.Lock()

        def settle(ci: int, ki: int, res: CaseResult) -> None:
            with lock:  # children's results arrive from several threads
                if backward:  # skips and crash verdicts made here carry the pass too
                    res.extra.setdefault("pass", "bwd")
                results[(ci, ki)] = res
                if prog is not None:
                    prog.update(task, advance=1, description=f"{res.kernel}")
                if on_result is not None:
                    on_result(res)

        in_process: list[int] = []
        # (candidate index, the indices of its cases) run in one child each
        children: list[tuple[int, list[int]]] = []
        for ci, cand in enumerate(candidates):
            cases = lists[ci]
            reason = unavailable_reason(cand)
            if reason:
                for ki, case in enumerate(cases):
                    settle(ci, ki, CaseResult(cand.name, case, Status.SKIPPED, reason))
            elif cand.isolate or (parallel > 1 and cand.kind == "model"):
                key = split(cand) if (split is not None and parallel > 1) else None
                groups: dict[Any, list[int]] = {}
                for ki, case in enumerate(cases):
                    groups.setdefault(key(case) if key else 0, []).append(ki)
                children += [(ci, idx) for idx in groups.values()]
            else:
                in_process.append(ci)

        extra = dict(isolate_options or {})
        if backward:
            extra.setdefault("case_fn", BWD_CASE_FN)
        if parallel > 1:
            import os

            extra.setdefault("threads", max(1, (os.cpu_count() or 1) // parallel))

        def child(item: tuple[int, list[int]]) -> None:
            ci, idx = item
            cand = candidates[ci]
            sub = [lists[ci][k] for k in idx]
            _run_isolated(ci, cand, sub, secret, repeats, timeout_s, extra,
                          lambda _ci, j, res: settle(ci, idx[j], res))

        pool = ThreadPoolExecutor(max_workers=max(1, parallel)) if parallel > 1 else None
        futures = []
        if pool is None:
            for item in children:
                child(item)
        else:
            # The Python candidates (compile-bound) first, then the largest groups, so that
            # the longest child does not start last.
            for item in sorted(children, key=lambda it: (candidates[it[0]].kind != "python",
                                                         -len(it[1]))):
                futures.append(pool.submit(child, item))
        # Candidate-major, so each candidate finishes (and its line reaches a CI log) in
        # turn; the oracle is recomputed per candidate, which costs little next to them.
        try:
            for ci in in_process:
                cand = candidates[ci]
                for ki, case in enumerate(lists[ci]):
                    settle(ci, ki, check_fn(cand, case, device=cand.device, secret=secret,
                                            repeats=repeats))
        finally:
            for f in futures:
                f.result()
            if pool is not None:
                pool.shutdown()
    return [results[(ci, ki)] for ci in range(len(candidates)) for ki in range(len(lists[ci]))]


def _run_isolated(ci: int, cand: Candidate, cases: list[Case], secret: int, repeats: int,
                  timeout_s: float, extra: dict[str, Any],
                  settle: Callable[[int, int, CaseResult], None]) -> None:
    from harness.execution.isolate import run_isolated

    todo = []
    for ki, case in enumerate(cases):
        reason = cand.supports(case)
        if reason:  # decided here: no child process for a case that would only skip
            settle(ci, ki, CaseResult(cand.name, case, Status.SKIPPED, reason))
        else:
            todo.append(ki)
    if not todo:
        return
    # A candidate may say how its child rebuilds it (e.g. {"variant_dir": ...} for a
    # submission, {"factory": "module:function"}); the caller's options come last.
    own = dict((cand.meta or {}).get("isolate_options") or {})
    options = {"secret": secret, "repeats": repeats, "device": cand.device, **own, **extra}
    # Each result is settled as the child sends it, so a CI log sees it while the run goes on.
    by_id = {cases[ki].id: ki for ki in todo}
    run_isolated(cand.name, [cases[ki] for ki in todo], mode="check", options=options,
                 timeout_s=timeout_s, on_result=lambda res: settle(ci, by_id[res.case.id], res))


@dataclass
class SummaryRow:
    kernel: str
    counts: dict[str, int] = field(default_factory=dict)
    worst_ratio: float | None = None
    worst_case: str | None = None
    first_failure: str | None = None

    @property
    def failed(self) -> int:
        return sum(self.counts.get(s.value, 0) for s in FAILING)


def summarize(results: Sequence[CaseResult]) -> list[SummaryRow]:
    """Per candidate: how many cases ended in each status, the worst error ratio (error /
    naive error; the tolerance bound is 2) and the first failure's message."""
    rows: dict[str, SummaryRow] = {}
    for res in results:
        row = rows.setdefault(res.kernel, SummaryRow(res.kernel))
        row.counts[res.status.value] = row.counts.get(res.status.value, 0) + 1
        ratio = res.errors.ratio
        if ratio is not None and (row.worst_ratio is None or ratio > row.worst_ratio):
            row.worst_ratio, row.worst_case = ratio, res.case.id
        if res.status in FAILING and row.first_failure is None:
            row.first_failure = f"{res.case.id}: {res.status.value}: {res.message}"
    return list(rows.values())


def exit_code(results: Sequence[CaseResult]) -> int:
    """1 when any case failed, crashed, timed out, errored or was invalid; else 0."""
    return 1 if any(r.status in FAILING for r in results) else 0


def summary_table(rows: Sequence[SummaryRow], title: str = "correctness"):
    """Per candidate counts. Only the statuses that occur get a column (passed always), so
    the table fits 80 columns with whole candidate names; the worst case id folds."""
    from rich.table import Table

    shown = [s for s in Status
             if s is Status.PASSED or any(row.counts.get(s.value) for row in rows)]
    table = Table(title=title)
    table.add_column("candidate", no_wrap=True)
    for s in shown:
        table.add_column(s.value, justify="right", no_wrap=True)
    table.add_column("worst ratio", justify="right")
    table.add_column("worst case", overflow="fold")
    for row in rows:
        cells = []
        for s in shown:
            n = row.counts.get(s.value, 0)
            cell = str(n) if n else "."
            cells.append(f"[red]{cell}[/red]" if n and s in FAILING else cell)
        ratio = "-" if row.worst_ratio is None else f"{row.worst_ratio:.2f}"
        table.add_row(row.kernel, *cells, ratio, row.worst_case or "-")
    return table
