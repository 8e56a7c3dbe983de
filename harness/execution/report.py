"""Lines for a CI log, as results land: one per failing case, one per finished candidate.

A CI job has no terminal: a progress bar is noise there and a table printed at the end
leaves the log silent for the whole run. `LineReport.on_result` is given every result as
it is settled (harness.execution.runner, harness.measure.perf); it prints a failing case
at once and, when a candidate has all its expected results, one summary line for it
(counts per status, the worst error ratio and its case), flushing each line.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from harness.core.results import CaseResult, Status

FAILING = (Status.FAILED, Status.CRASHED, Status.TIMEOUT, Status.ERROR, Status.INVALID)
LINE_WIDTH = 80


@dataclass
class _Tally:
    expected: int
    counts: dict[str, int] = field(default_factory=dict)
    worst_ratio: float | None = None
    worst_case: str | None = None
    seen: int = 0


def candidate_line(name: str, counts: Mapping[str, int], worst_ratio: float | None,
                   worst_case: str | None, label: str = "") -> str:
    order = [s.value for s in Status]
    parts = ", ".join(f"{k} {counts[k]}" for k in order if counts.get(k))
    bad = sum(counts.get(s.value, 0) for s in FAILING)
    head = f"{'FAIL' if bad else 'ok  '} {name}{label}: {parts or 'no cases'}"
    if worst_ratio is not None:
        worst = f"worst error ratio {worst_ratio:.2f} ({worst_case})"
        # A CI log at 80 columns: a long name and case id go on a second, indented line.
        head += f"; {worst}" if len(head) + 2 + len(worst) <= LINE_WIDTH else f"\n     {worst}"
    return head


def case_line(res: CaseResult) -> str:
    first = (res.message or "").strip().splitlines()[0] if res.message else ""
    return f"  {res.status.value.upper()} {res.kernel} {res.case.id}" + (
        f": {first[:200]}" if first else "")


class LineReport:
    """`expected`: how many results each candidate will produce (name -> count)."""

    def __init__(self, expected: Mapping[str, int], *, stream: TextIO | None = None,
                 label: str = "") -> None:
        self.stream = stream or sys.stdout
        self.label = label
        self.tally = {k: _Tally(v) for k, v in expected.items()}

    def _print(self, line: str) -> None:
        # the reader may have gone away (`| head`): the run goes on
        with contextlib.suppress(BrokenPipeError):
            print(line, file=self.stream, flush=True)

    def on_result(self, res: CaseResult) -> None:
        t = self.tally.setdefault(res.kernel, _Tally(0))
        t.seen += 1
        t.counts[res.status.value] = t.counts.get(res.status.value, 0) + 1
        ratio = res.errors.ratio
        if ratio is not None and (t.worst_ratio is None or ratio > t.worst_ratio):
            t.worst_ratio, t.worst_case = ratio, res.case.id
        if res.status in FAILING:
            self._print(case_line(res))
        if t.seen == t.expected:
            self._print(candidate_line(res.kernel, t.counts, t.worst_ratio, t.worst_case,
                                       self.label))

    def __call__(self, res: Any) -> None:
        self.on_result(res)
