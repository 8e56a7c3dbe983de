"""A grid's name resolved to what a front runs: the cases each candidate gets, the pass
(forward or backward) they go through, and whether the grid is timed.

`fa-harness run`, `fa-harness ci`, `fa-harness kernels --compile` and the pytest plugin
all ask `resolve_grid`, so one grid name means the same (candidate, case) pairs and the
same pass on every front: the full grid is generated per candidate from what it declares
(harness.core.grids.cases_for: a GPU candidate's waves are cases the shared list does not
hold), and a grid whose pass is the backward (`grid_pass`, e.g. perf-bwd) is run through
the backward wherever it is named.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.core.cases import Case
from harness.core.grids import TIMING_GRIDS, FullGrid, get_grid, grid_pass, own_grid

# Grids whose cases depend on the candidate (harness.core.grids.cases_for); the shared
# list of such a grid only stands in where no candidate is at hand (an estimate).
PER_CANDIDATE_GRIDS = frozenset({"full"})


def matches(case_id: str, patterns: Sequence[str]) -> bool:
    """Whether a case id matches one of the globs (no globs: every id does)."""
    return not patterns or any(fnmatch.fnmatchcase(case_id, p) for p in patterns)


@dataclass(frozen=True)
class GridCases:
    name: str
    # The grid's shared list, filtered by `patterns`; a per-candidate grid's real cases
    # come from `for_candidate`.
    cases: tuple[Case, ...]
    per_candidate: bool
    backward: bool
    timing: bool
    patterns: tuple[str, ...] = ()
    # Each candidate's own grid, generated once: `for_candidate` and `no_case_lines` both
    # need it, and some candidates' supports() runs a backend per shape it is asked about.
    _own: dict[int, tuple[Any, FullGrid]] = field(default_factory=dict, compare=False,
                                                  repr=False, hash=False)

    @property
    def pass_name(self) -> str:
        return "bwd" if self.backward else "fwd"

    def for_candidate(self, cand: Any) -> list[Case]:
        """The cases `cand` runs on this grid."""
        if not self.per_candidate:
            return list(self.cases)
        return [k for k in self._own_grid(cand).cases if matches(k.id, self.patterns)]

    def _own_grid(self, cand: Any) -> FullGrid:
        # Keyed by identity, the candidate kept beside its grid so that the id is not
        # reused by another object while the entry lives.
        got = self._own.get(id(cand))
        if got is None or got[0] is not cand:
            got = self._own[id(cand)] = (cand, own_grid(self.name, cand))
        return got[1]

    def no_case_line(self, cand: Any) -> str | None:
        """"CANDIDATE: no case of grid NAME: why" for a candidate that runs no case of a
        per-candidate grid (None where it runs one, and on a shared grid, whose cases a
        candidate refuses are each reported as skipped), so that no front drops it in
        silence."""
        if not self.per_candidate or self.for_candidate(cand):
            return None
        own = self._own_grid(cand)
        why = (own.why_none if not own.cases else
               f"none of its cases matches --cases {','.join(self.patterns)}")
        return f"{cand.name}: no case of grid {self.name}: {why}"

    def no_case_lines(self, candidates: Sequence[Any]) -> list[str]:
        """`no_case_line` of each candidate that has one, in the candidates' order."""
        return [line for c in candidates if (line := self.no_case_line(c)) is not None]

    def pairs(self, candidates: Sequence[Any]) -> list[tuple[Any, Case]]:
        """Every (candidate, case) of the grid: candidate by candidate for a per-candidate
        grid, else case by case (each case's oracle is then computed once for all)."""
        if self.per_candidate:
            return [(c, k) for c in candidates for k in self.for_candidate(c)]
        return [(c, k) for k in self.cases for c in candidates]


def resolve_grid(name: str, patterns: Sequence[str] = ()) -> GridCases:
    """Grid `name` as every front runs it; ValueError naming the known grids for an
    unknown name. `patterns`: globs a case id must match (`run --cases`)."""
    shared = get_grid(name)
    pats = tuple(patterns)
    return GridCases(name=name, cases=tuple(k for k in shared if matches(k.id, pats)),
                     per_candidate=name in PER_CANDIDATE_GRIDS,
                     backward=grid_pass(name) == "bwd", timing=name in TIMING_GRIDS,
                     patterns=pats)


def cases_of(grids: Sequence[GridCases]) -> list[Case]:
    """The shared lists of several grids, one after the other."""
    return [k for g in grids for k in g.cases]


def per_candidate(grids: Sequence[GridCases]) -> Any:
    """A `cases_for` callable for harness.execution.runner.run_correctness over several
    grids, or None where no grid depends on the candidate (the shared lists are then
    exactly what each candidate runs)."""
    if not any(g.per_candidate for g in grids):
        return None

    def cases(cand: Any) -> list[Case]:
        return [k for g in grids for k in g.for_candidate(cand)]

    return cases
