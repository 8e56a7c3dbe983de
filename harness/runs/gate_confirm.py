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
        baseline_sources,
        preliminary,
        step_suspects,
        suspects,
        timed_keys,
        with_confirmations,
    )
    from harness.records.db.store import DatabaseError, open_db

    runs = confirm_runs(opts)
    plan = ex.plan
    if runs == 0 or plan is None or not (plan.timed or plan.timed_bwd):
        return []
    kw = {"branch": opts.baseline_branch, "window": opts.window,
          "baseline_run": opts.baseline_run}
    try:
        with open_db(opts.db_url) as db:
            report = preliminary(db, record, policy=opts.policy, **kw)  # type: ignore[arg-type]
            found = suspects(report, owned=ex.owned,
                             steps=step_suspects(db, record) if report is not None else ())
            expected = baseline_sources(db, record, **kw) if found else {}  # type: ignore[arg-type]
    except DatabaseError as exc:
        return [f"confirmation runs not considered: database unavailable ({exc})"]
    except Exception as exc:  # noqa: BLE001  the run must still be stored and judged
        return [f"confirmation runs not considered: {type(exc).__name__}: {str(exc)[:200]}"]
    if not found:
        return []
    by_name = {c.name: c for c in ex.candidates}
    timer = time_again or _default_timer(opts, ex)
    parent = time_parent or WorktreeParent(record.parent, opts, log)
    done: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        for s in found:
            cand = by_name.get(s.variant)
            timed = (plan.timed_bwd if s.pass_name == "bwd" else plan.timed).get(s.variant) or []
            keys = set(timed_keys(record, s.variant, s.pass_name))
            cases = [c for c in timed if (s.variant, s.pass_name, c.id) in keys]
            if cand is None or not cases:
                continue
            why = (f"a step of {s.ratio - 1:+.2%} across {s.step}" if s.step else
                   f"read {s.ratio - 1:+.2%} (p = {s.p_value:.2g})")
            log(f"confirming {s.variant} ({s.pass_name}): {why}; timing its {len(cases)} "
                f"case(s) {runs} more time(s), each in a fresh child"
                + ("" if s.step else ", and its parent's code as often"))
            t0 = time.monotonic()
            got: dict[tuple[str, str, str], list[float]] = {}
            base: dict[tuple[str, str, str], list[float]] = {}
            # A step is across commits: its parent's code is not what it is judged by.
            why_not: str | None = "a step across commits" if s.step else None
            bad: list[str] = []  # a confirmation that did not pass: said, not judged
            try:
                for _ in range(runs):
                    for r in timer(cand, cases, backward=s.pass_name == "bwd"):
                        med = r.timing.median_ms if r.timing is not None else None
                        if Status(r.status) is Status.PASSED and med:
                            got.setdefault((s.variant, s.pass_name, r.case.id), []).append(
                                float(med))
                        elif Status(r.status) is not Status.SKIPPED:
                            bad.append(f"{r.case.id}: {Status(r.status).value}")
                    if why_not is None:
                        meds, source = parent(s.variant, [c.id for c in cases], s.pass_name)
                        why_not = _parent_ok(meds, source, expected.get(s.variant))
                        for cid, med in meds.items():
                            base.setdefault((s.variant, s.pass_name, cid), []).append(med)
            except Exception as exc:  # noqa: BLE001  what was timed counts; the run goes on
                notes.append(f"{s.variant} ({s.pass_name}): confirmation stopped: "
                             f"{type(exc).__name__}: {str(exc)[:200]}")
                if why_not is None:
                    why_not = "stopped"
            n = with_confirmations(record, got)
            n_parent = 0 if why_not else with_confirmations(record, base, "parent_ms")
            took = time.monotonic() - t0
            done.append({"kernel": s.variant, "pass": s.pass_name, "ratio": s.ratio,
                         "p_value": None if s.step else s.p_value, "step": s.step, "runs": runs, "cases": n,
                         "parent_cases": n_parent, "parent_not_timed": why_not,
                         "wall_s": round(took, 1)})
            if n == 0:
                notes.append(f"{s.variant} ({s.pass_name}) {why} at first: no confirmation "
                             "timed, judged on its one run")
            else:
                notes.append(f"{s.variant} ({s.pass_name}) {why} at first: "
                             f"timed {runs} more time(s) on {n} case(s)"
                             + (f", its parent's code as often on {n_parent}" if n_parent else
                                f"; its parent's code not timed ({why_not})")
                             + f" ({took:.0f} s), judged on the mean")
            if bad:
                notes.append(f"{s.variant} ({s.pass_name}): {len(bad)} confirmation "
                             f"timing(s) did not pass ({'; '.join(sorted(set(bad))[:3])})")
    finally:
        close = getattr(parent, "close", None)
        try:
            if close is not None:
                close()
        except Exception as exc:  # noqa: BLE001  a worktree left behind is said, not fatal
            notes.append(f"the parent's worktree was not removed: {type(exc).__name__}")
    if done:
        record.env["ci_confirm"] = done
    return notes


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
