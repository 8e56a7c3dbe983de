"""The gate's confirmation runs (harness.records.confirm): after timing, before the run
is stored and judged, each suspect candidate's timed cases are timed again in fresh
timing children, one after the other, nothing else on the GPU, and their medians go
into the record.

What a suspect is, and why a fresh child each time, is the records module's doc. Here:
- The preliminary verdicts use the gate's own baseline (`--baseline`, else the parent
  commit's run or the recent runs of the baseline branch) and the noise model of the
  database; with no database, no baseline or no GPU timing nothing is confirmed (said
  in a note when the database could not be read).
- Each confirmation times exactly the cases the run timed for that candidate-pass, with
  the same stopping rule and calibration, forward or backward.
- The parent commit's code, where it can be had: the run's parent commit checked out in
  a git worktree and the candidate timed there by a child of its own
  (harness.runs.bisect_measure.WorktreeMeasure, as bisect times a commit), once per
  confirmation round, interleaved with the confirmations (so a drift of the runner over
  the minutes they take lands on both sides). It counts only if the child timed the
  source hash the baseline run recorded for the candidate: a candidate whose code is
  not in the repository (a shipped variant, an installed library) would be timed at its
  installed version, which is not the parent's; then the parent's timings are dropped
  and the note says why.
- The time it took is in the record (`env.ci_confirm`) and in the log.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.core.results import Status
from harness.records.record import RunRecord
from harness.runs.gate_options import GateOptions

# (candidate, case ids, pass) -> ({case id: median ms}, the source hash it timed; with no
# median, why nothing was timed, or None)
ParentTimer = Callable[[str, list[str], str], tuple[dict[str, float], str | None]]


def confirm_runs(opts: GateOptions) -> int:
    from harness.records.confirm import CONFIRM_RUNS, MAX_CONFIRM_RUNS

    n = CONFIRM_RUNS if opts.confirm_runs is None else opts.confirm_runs
    return max(0, min(MAX_CONFIRM_RUNS, n))


def confirm(record: RunRecord, ex: Any, opts: GateOptions, *,
            log: Callable[[str], None] = print,
            time_again: Callable[..., list[Any]] | None = None,
            time_parent: ParentTimer | None = None) -> list[str]:
    """Time the record's suspects again (module doc) and add what they read to
    `record`; returns notes for the summary. `ex`: the gate's Execution.
    `time_again(candidate, cases, backward=...)`: the timing (default: a fresh child by
    harness.measure.perf.run_perf, as the gate timed them). `time_parent`: the parent
    commit's code (default: a git worktree of `record.parent`, `WorktreeParent`)."""
    from harness.records.confirm import (
        across_suspects,
        baseline_sources,
        extend,
        preliminary,
        step_suspects,
        suspects,
    )
    from harness.records.db.store import DatabaseError, open_db

    runs = confirm_runs(opts)
    plan = ex.plan
    if runs == 0 or plan is None or not (plan.timed or plan.timed_bwd):
        return []
    kw = {"branch": opts.baseline_branch, "window": opts.window,
          "baseline_run": opts.baseline_run}
    parent = time_parent or WorktreeParent(record.parent, opts, log)
    can_parent = getattr(parent, "why", None) is None
    try:
        with open_db(opts.db_url) as db:
            report = preliminary(db, record, policy=opts.policy, **kw)  # type: ignore[arg-type]
            more = step_suspects(db, record) if report is not None else []
            if can_parent and report is not None:  # across chips (harness.records.confirm, 5.)
                more += across_suspects(db, record, **kw)  # type: ignore[arg-type]
            found = suspects(report, owned=ex.owned, steps=more)
            expected = baseline_sources(db, record, **kw) if found else {}  # type: ignore[arg-type]
    except DatabaseError as exc:
        return [f"confirmation runs not considered: database unavailable ({exc})"]
    except Exception as exc:  # noqa: BLE001  the run must still be stored and judged
        return [f"confirmation runs not considered: {type(exc).__name__}: {str(exc)[:200]}"]
    if not found:
        return []
    rounds = _Rounds(record, ex, plan, time_again or _default_timer(opts, ex), parent,
                     expected, log)
    notes: list[str] = []
    try:
        for s in found:
            rounds.time(s, runs)
        try:  # the second look (harness.records.confirm, 6.)
            with open_db(opts.db_url) as db:
                again = extend(preliminary(db, record, policy=opts.policy, **kw),  # type: ignore[arg-type]
                               found, runs)
        except Exception as exc:  # noqa: BLE001  judged on the first round
            again = []
            notes.append(f"no second round of confirmation: {type(exc).__name__}: "
                         f"{str(exc)[:200]}")
        for s in again:
            log(f"{s.variant} ({s.pass_name}) still undecided after its first round "
                f"({s.ratio - 1:+.2%}, p = {s.p_value:.2g}): a second round")
            rounds.time(s, max(runs, s.runs or runs))
    finally:
        close = getattr(parent, "close", None)
        try:
            if close is not None:
                close()
        except Exception as exc:  # noqa: BLE001  a worktree left behind is said, not fatal
            notes.append(f"the parent's worktree was not removed: {type(exc).__name__}")
    notes = rounds.notes() + notes
    if rounds.done:
        record.env["ci_confirm"] = list(rounds.done.values())
    return notes


class _Rounds:
    """The confirmation rounds of one gate run: each call times a suspect's cases `runs`
    more times (and its parent's code as often, interleaved, where that counts), adds
    the medians to the record, and keeps what was done for the notes."""

    def __init__(self, record: RunRecord, ex: Any, plan: Any,
                 timer: Callable[..., list[Any]], parent: Any,
                 expected: dict[str, str], log: Callable[[str], None]) -> None:
        self.record, self.plan, self.timer, self.parent = record, plan, timer, parent
        self.expected, self.log = expected, log
        self.by_name = {c.name: c for c in ex.candidates}
        self.done: dict[tuple[str, str], dict[str, Any]] = {}  # env.ci_confirm's rows
        self.why: dict[tuple[str, str], str] = {}  # what made each a suspect, for the notes
        self.extra: list[str] = []

    def time(self, s: Any, runs: int) -> None:
        from harness.records.confirm import timed_keys, with_confirmations

        cand = self.by_name.get(s.variant)
        timed = (self.plan.timed_bwd if s.pass_name == "bwd" else self.plan.timed
                 ).get(s.variant) or []
        keys = set(timed_keys(self.record, s.variant, s.pass_name))
        cases = [c for c in timed if (s.variant, s.pass_name, c.id) in keys]
        if cand is None or not cases:
            return
        k = (s.variant, s.pass_name)
        why = (f"a step of {s.ratio - 1:+.2%} across {s.step}" if s.step else
               f"read {s.ratio - 1:+.2%} on another chip than its baseline's"
               if math.isnan(s.p_value) else f"read {s.ratio - 1:+.2%} (p = {s.p_value:.2g})")
        d = self.done.setdefault(k, {
            "kernel": s.variant, "pass": s.pass_name, "ratio": s.ratio,
            "p_value": None if s.step or math.isnan(s.p_value) else s.p_value,
            "step": s.step, "runs": 0,
            "cases": 0, "parent_cases": 0, "rounds": 0, "wall_s": 0.0,
            "parent_not_timed": "a step across commits" if s.step else None})
        self.why.setdefault(k, why)
        self.log(f"confirming {s.variant} ({s.pass_name}): {why}; timing its {len(cases)} "
                 f"case(s) {runs} more time(s), each in a fresh child"
                 + ("" if d["parent_not_timed"] else ", and its parent's code as often"))
        t0 = time.monotonic()
        got: dict[tuple[str, str, str], list[float]] = {}
        base: dict[tuple[str, str, str], list[float]] = {}
        bad: list[str] = []  # a confirmation that did not pass: said, not judged
        try:
            for _ in range(runs):
                for r in self.timer(cand, cases, backward=s.pass_name == "bwd"):
                    med = r.timing.median_ms if r.timing is not None else None
                    if Status(r.status) is Status.PASSED and med:
                        got.setdefault((s.variant, s.pass_name, r.case.id), []).append(
                            float(med))
                    elif Status(r.status) is not Status.SKIPPED:
                        bad.append(f"{r.case.id}: {Status(r.status).value}")
                if d["parent_not_timed"] is None:
                    meds, source = self.parent(s.variant, [c.id for c in cases], s.pass_name)
                    d["parent_not_timed"] = _parent_ok(meds, source,
                                                       self.expected.get(s.variant))
                    for cid, med in meds.items():
                        base.setdefault((s.variant, s.pass_name, cid), []).append(med)
        except Exception as exc:  # noqa: BLE001  what was timed counts; the run goes on
            self.extra.append(f"{s.variant} ({s.pass_name}): confirmation stopped: "
                              f"{type(exc).__name__}: {str(exc)[:200]}")
            if d["parent_not_timed"] is None:
                d["parent_not_timed"] = "stopped"
        n = with_confirmations(self.record, got)
        if d["parent_not_timed"] is None:
            d["parent_cases"] = max(d["parent_cases"],
                                    with_confirmations(self.record, base, "parent_ms"))
        d["cases"] = max(d["cases"], n)
        d["runs"] += runs if n else 0
        d["rounds"] += 1
        d["wall_s"] = round(d["wall_s"] + time.monotonic() - t0, 1)
        if bad:
            self.extra.append(f"{s.variant} ({s.pass_name}): {len(bad)} confirmation "
                              f"timing(s) did not pass ({'; '.join(sorted(set(bad))[:3])})")

    def notes(self) -> list[str]:
        out = []
        for k, d in self.done.items():
            why, n, n_parent = self.why[k], d["cases"], d["parent_cases"]
            if n == 0:
                out.append(f"{d['kernel']} ({d['pass']}) {why} at first: no confirmation "
                           "timed, judged on its one run")
                continue
            rounds = "" if d["rounds"] < 2 else f" in {d['rounds']} rounds"
            out.append(f"{d['kernel']} ({d['pass']}) {why} at first: timed {d['runs']} more "
                       f"time(s){rounds} on {n} case(s)"
                       + (f", its parent's code on {n_parent}" if n_parent else
                          f"; its parent's code not timed ({d['parent_not_timed']})")
                       + f" ({d['wall_s']:.0f} s), judged on the mean")
        return out + self.extra


def _parent_ok(meds: dict[str, float], source: str | None, expected: str | None
               ) -> str | None:
    """Why the parent's timings do not count (None: they do)."""
    if not meds:
        return source or "its child timed no case"
    if not expected or source != expected:
        return (f"the parent's worktree timed source {str(source)[:16]}, the baseline ran "
                f"{str(expected)[:16] or 'unknown'}: its code is not the repository's")
    return None


class WorktreeParent:
    """The parent commit's code of a candidate, timed in a git worktree of it (one per
    candidate-pass, kept while that candidate-pass is timed)."""

    def __init__(self, commit: str | None, opts: GateOptions,
                 log: Callable[[str], None]) -> None:
        self.commit, self.opts, self.log = commit, opts, log
        self._measure: Any = None
        self._key: tuple[str, str] | None = None
        self.why: str | None = None
        from harness.records.bisect_git import GitError, repo_root, resolve

        self.root: Path | None = None
        if commit is None:
            self.why = "the run names no parent commit"
            return
        try:
            self.root = repo_root(Path.cwd())
        except (GitError, OSError):
            self.why = "not run inside a git repository"
            return
        try:
            self.commit = resolve(self.root, commit)
        except (GitError, OSError):
            self.why = "the parent commit is not in this repository"

    def __call__(self, kernel: str, case_ids: list[str], pass_name: str
                 ) -> tuple[dict[str, float], str | None]:
        from harness.candidates.discovery import current
        from harness.runs.bisect_measure import WorktreeMeasure

        if self.why is not None or self.root is None or self.commit is None:
            return {}, self.why
        if self._key != (kernel, pass_name):
            self.close()
            self._measure = WorktreeMeasure(
                self.root, kernel, case_ids, pass_name=pass_name,
                min_time_s=self.opts.min_time_s, timeout_s=self.opts.timeout_s,
                kernels_dirs=current().kernels_dirs, log=self.log)
            self._key = (kernel, pass_name)
        got = self._measure(self.commit)
        return got, self._measure.last_source

    def close(self) -> None:
        if self._measure is not None:
            self._measure.close()
        self._measure, self._key = None, None


def _default_timer(opts: GateOptions, ex: Any) -> Callable[..., list[Any]]:
    def time_again(cand: Any, cases: list[Any], *, backward: bool) -> list[Any]:
        from harness.measure.perf import run_perf

        return run_perf([cand], cases, calibration=ex.calibration, timeout_s=opts.timeout_s,
                        timing={"rule": {"min_time_s": opts.min_time_s}},
                        log=lambda _line: None, backward=backward)
    return time_again
