"""`fa-harness bisect`: the first bad commit of a ranged alert, found by timing the commits
between its last good and its first bad one.

A request names the range and what to time: an alert (`--alert ID`: its commits, its
candidate, its cases, its GPU model) or all of it by hand (`--good C1 --bad C2 --kernel
K --cases PATTERN`). `prepare` checks it before anything is built: git present, the
repository clean (`--bad` defaults to HEAD, and uncommitted changes are not HEAD), the
last good commit an ancestor of the first bad one, the cases known; each failure is one
line (BisectUsageError, exit 2). `run_bisect` then searches the range
(harness.records.bisect.bisect_range) with the measure of harness.runs.bisect_measure
(a worktree per commit, the gate's timing path, each run stored as backfill), removes
every worktree whatever happens (an exception, Ctrl-C, SIGTERM), and, for an alert,
records the culprit (`alerts.set_culprit`) when the search ended on one commit.

`bisect_after_gate` is `fa-harness ci --bisect`: the open alerts of the team's candidates
that this gate run opened (not those it only confirmed: a bisection that did not end on
one commit is not run again at every later commit), whose range spans several commits,
each bisected in turn within the minutes given.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.records.bisect import (
    DEFAULT_MAX_BUILDS,
    END_RUNS,
    BisectError,
    BisectResult,
    bisect_range,
)
from harness.records.bisect_git import GitError

DEFAULT_MAX_MINUTES = 60.0
Log = Callable[[str], None]


class BisectUsageError(ValueError):
    """A request that cannot be bisected: one line, exit code 2."""


class BisectNotMeasured(RuntimeError):
    """Nothing can be timed on this runner (no working GPU): one line, exit code 3."""


@dataclass
class BisectRequest:
    repo: Path = field(default_factory=Path.cwd)
    alert_id: int | None = None
    good: str | None = None
    bad: str | None = None  # default HEAD (without an alert)
    kernel: str | None = None
    cases: str | None = None  # comma-separated case ids or shell globs
    db_url: str | None = None
    max_builds: int = DEFAULT_MAX_BUILDS
    max_minutes: float | None = DEFAULT_MAX_MINUTES
    min_time_s: float = 0.2
    timeout_s: float = 60.0
    kernels_dirs: list[str] = field(default_factory=list)
    store: bool = True
    end_runs: int = END_RUNS  # timings of each end
    # timings of a commit between before it is classified (None: sized from the ends'
    # runs, harness.records.bisect.runs_needed)
    min_runs: int | None = None


@dataclass
class Prepared:
    root: Path
    commits: list[str]  # last good, between, first bad
    kernel: str
    pass_name: str
    cases: list[str]
    alert: Any | None = None  # harness.records.alerts.Alert
    gpu_model_key: str | None = None


@dataclass
class BisectOutcome:
    prepared: Prepared
    result: BisectResult
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        p, r = self.prepared, self.result
        what = f"alert {p.alert.id}: " if p.alert is not None else ""
        head = (f"{what}{p.kernel} ({p.pass_name}), {len(p.cases)} case(s), "
                f"{len(p.commits) - 1} commit(s) after {p.commits[0][:12]}")
        out = [head, *(f"  {t.line()}" for t in r.tested)]
        if r.exact:
            out.append(f"first bad commit: {r.culprit} "
                       f"({r.builds} build(s); step {_pct(r.step)})")
        else:
            out.append(f"not narrowed to one commit: {r.reason}; the first bad commit is "
                       f"after {r.last_good[:12]}, at or before {r.first_bad[:12]}")
        return out + self.notes


def _pct(x: float | None) -> str:
    return f"{x - 1:+.2%}" if x else "unknown"


def _db(url: str | None) -> Any:
    from harness.records.db.store import DatabaseError, open_db

    try:
        return open_db(url, create=False)
    except DatabaseError as exc:
        raise BisectUsageError(f"database: {exc}") from None


def _alert(req: BisectRequest) -> Any:
    from harness.records.alerts import AlertError, get_alert

    db = _db(req.db_url)
    try:
        return get_alert(db, req.alert_id)
    except AlertError as exc:
        raise BisectUsageError(f"--alert {req.alert_id}: {exc}") from None
    finally:
        db.close()


def known_case_ids() -> list[str]:
    from harness.core.grids import GRIDS, get_grid

    ids: dict[str, None] = {}
    for name in GRIDS:
        for c in get_grid(name):
            ids.setdefault(c.id, None)
    return list(ids)


def expand_cases(spec: str, among: list[str] | None = None) -> list[str]:
    """Case ids from comma-separated ids and shell globs: a glob over `among` (else
    every grid's cases), an id as it is once it parses."""
    from harness.core.cases import Case

    out: dict[str, None] = {}
    pool: list[str] | None = among
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if any(ch in item for ch in "*?["):
            pool = pool if pool is not None else known_case_ids()
            hits = [c for c in pool if fnmatch.fnmatchcase(c, item)]
            if not hits:
                raise BisectUsageError(f"--cases {item}: matches no case")
            out.update(dict.fromkeys(hits))
            continue
        if among is not None and item not in among:
            raise BisectUsageError(f"--cases {item}: not a case of the alert")
        try:
            Case.from_id(item)
        except ValueError as exc:
            raise BisectUsageError(f"--cases {item}: {exc}") from None
        out[item] = None
    return list(out)


def _is_case(case_id: str) -> bool:
    """A case id that names one case (not a candidate's mean over its cases, "*")."""
    from harness.core.cases import Case

    try:
        Case.from_id(case_id)
    except ValueError:
        return False
    return True


def prepare(req: BisectRequest) -> Prepared:
    """The range, candidate and cases of a request, checked (module doc)."""
    from harness.records.bisect_git import commit_range, dirty, repo_root

    alert = None
    if req.alert_id is not None:
        if req.good or req.bad:
            raise BisectUsageError("--alert takes its range from the alert: leave out "
                                   "--good and --bad")
        alert = _alert(req)
        if alert.kind != "timing":
            raise BisectUsageError(f"--alert {alert.id} is a {alert.kind} alert: bisect "
                                   "times commits, it finds a timing step's culprit")
        if not alert.last_good_commit or not alert.first_bad_commit:
            raise BisectUsageError(f"--alert {alert.id} names no commit range")
        if req.kernel and req.kernel != alert.variant:
            raise BisectUsageError(f"--alert {alert.id} is of {alert.variant}, not "
                                   f"{req.kernel}")
        good, bad, kernel = alert.last_good_commit, alert.first_bad_commit, alert.variant
        cases = (expand_cases(req.cases, list(alert.cases)) if req.cases
                 else [c for c in alert.cases if _is_case(c)])
        pass_name = alert.pass_name or "fwd"
    else:
        if not req.good:
            raise BisectUsageError("name the range: --alert ID, or --good C1 [--bad C2]")
        if not req.kernel or not req.cases:
            raise BisectUsageError("without --alert, name --kernel and --cases")
        good, bad, kernel, pass_name = req.good, req.bad or "HEAD", req.kernel, "fwd"
        cases = expand_cases(req.cases)
    if not cases:
        raise BisectUsageError("no case to time")
    try:
        root = repo_root(req.repo)
        changed = dirty(root)
        if changed:
            raise BisectUsageError(
                f"{root} has uncommitted changes ({', '.join(changed[:3])}"
                f"{', ...' if len(changed) > 3 else ''}): commits are bisected, not the "
                "working tree; commit or set them aside first")
        commits = commit_range(root, good, bad)
    except GitError as exc:
        raise BisectUsageError(str(exc)) from None
    return Prepared(root, commits, kernel, pass_name, cases, alert,
                    alert.gpu_model_key if alert is not None else None)


def _placer(p: Prepared, db_url: str | None) -> Callable[[str, str | None], datetime | None]:
    """Where a backfill run of a commit of the range goes in `created_at` order (module
    doc of harness.runs.bisect_measure): between the newest stored run of the last
    good commit and the oldest of the first bad one on the GPU model, in range order."""
    from harness.records.db.store import DatabaseError, open_db, recent_runs
    from harness.runs.bisect_measure import BACKFILL_GRID

    def stored(runs: list[Any]) -> list[Any]:  # an earlier bisection's runs are not ends
        return [r for r in runs if list(r.grids or []) != [BACKFILL_GRID]]

    index = {c: i for i, c in enumerate(p.commits)}
    cache: dict[str | None, tuple[datetime, datetime] | None] = {}

    def ends(gpu: str | None) -> tuple[datetime, datetime] | None:
        if gpu not in cache:
            try:
                with open_db(db_url, create=False) as db:
                    bad = stored(recent_runs(db, gpu_model_key=gpu, commit=p.commits[-1],
                                             limit=100))
                    t_bad = min((r.created_at for r in bad), default=None)
                    good = (stored(recent_runs(db, gpu_model_key=gpu, commit=p.commits[0],
                                               before=t_bad, limit=100)) if t_bad else [])
            except DatabaseError:
                bad, good, t_bad = [], [], None
            cache[gpu] = (good[0].created_at, t_bad) if good and t_bad else None
        return cache[gpu]

    def place(commit: str, gpu: str | None) -> datetime | None:
        span = ends(gpu)
        if span is None or commit not in index:
            return None
        t0, t1 = span
        return t0 + (t1 - t0) * ((index[commit] + 0.5) / len(p.commits))

    return place


def _storer(db_url: str | None) -> Callable[[Any], str]:
    def store(record: Any) -> str:
        from harness.records.db.engine import target_of
        from harness.records.db.store import DatabaseError, local_origin, open_db, store_record
        from harness.records.record import spool

        try:
            with open_db(db_url) as db:
                # This runner timed it: trusted, as the gate's own runs, its origin "bisect".
                run_id = store_record(db, record, local_origin("bisect"))
                return f"stored as backfill run {run_id}"
        except DatabaseError as exc:
            path = spool(record, target=target_of(db_url))
            return f"database unavailable ({exc}); kept in {path}"
    return store


def run_bisect(req: BisectRequest, *, measure: Callable[[str], Any] | None = None,
               prepared: Prepared | None = None, log: Log = print) -> BisectOutcome:
    """Prepare (unless given), search, clean up, record the culprit (module doc).
    `measure` replaces the worktree measure (tests; it then stores nothing)."""
    from harness.records.bisect_git import interrupts_as_keyboard
    from harness.runs.bisect_measure import WorktreeMeasure

    p = prepared or prepare(req)
    if req.max_builds < 3:
        raise BisectUsageError(f"--max-builds {req.max_builds}: the two ends and one "
                               "commit between need 3")
    owned: WorktreeMeasure | None = None
    if measure is None:
        owned = WorktreeMeasure(
            p.root, p.kernel, p.cases, pass_name=p.pass_name, min_time_s=req.min_time_s,
            timeout_s=req.timeout_s, kernels_dirs=req.kernels_dirs,
            place=_placer(p, req.db_url) if req.store else None,
            store=_storer(req.db_url) if req.store else None,
            backfill={"alert": p.alert.id if p.alert is not None else None,
                      "range": [p.commits[0], p.commits[-1]]}, log=log)
        why = owned.ready()
        if why:
            raise BisectNotMeasured(why)
        measure = owned
    seconds = req.max_minutes * 60.0 if req.max_minutes and math.isfinite(req.max_minutes) \
        else None
    log(f"bisect {p.kernel} ({p.pass_name}) over {len(p.commits) - 1} commit(s) after "
        f"{p.commits[0][:12]}, {len(p.cases)} case(s); at most {req.max_builds} builds"
        + (f", {req.max_minutes:g} min" if seconds else ""))
    try:
        with interrupts_as_keyboard():
            result = bisect_range(p.commits, measure, max_builds=req.max_builds,
                                  max_seconds=seconds, end_runs=req.end_runs,
                                  min_runs=req.min_runs, log=lambda line: log(f"  {line}"))
    except (BisectError, GitError) as exc:  # GitError: a worktree could not be made
        raise BisectUsageError(str(exc)) from None
    finally:
        if owned is not None:
            owned.close()
    out = BisectOutcome(p, result)
    if p.alert is not None and result.exact and result.culprit:
        out.notes.append(_set_culprit(req.db_url, p.alert.id, result.culprit))
    return out


def _set_culprit(db_url: str | None, alert_id: int, commit: str) -> str:
    from harness.records.alerts import AlertError, set_culprit

    try:
        db = _db(db_url)
        try:
            set_culprit(db, alert_id, commit)
        finally:
            db.close()
    except (AlertError, BisectUsageError) as exc:
        return f"culprit not recorded on alert {alert_id}: {exc}"
    return f"alert {alert_id}: culprit {commit[:12]} recorded"


# ------------------------------------------------------------------ ci --bisect


def gate_alerts(db_url: str | None, run_id: int, gpu_model_key: str | None) -> list[Any]:
    """The open timing alerts of the team's candidates that run `run_id` opened and
    that name no culprit yet."""
    from harness.records.alerts import list_alerts

    db = _db(db_url)
    try:
        alerts = list_alerts(db, state="open", owned=True, gpu_model_key=gpu_model_key)
    finally:
        db.close()
    return [a for a in alerts if a.kind == "timing" and not a.culprit_commit
            and a.first_run_id == run_id
            and a.last_good_commit and a.first_bad_commit]


def bisect_after_gate(out: Any, *, db_url: str | None, max_minutes: float,
                      max_builds: int = DEFAULT_MAX_BUILDS, min_time_s: float = 0.2,
                      timeout_s: float = 60.0, kernels_dirs: list[str] | None = None,
                      repo: Path | None = None, log: Log = print) -> list[str]:
    """`ci --bisect` (module doc): lines for the log. Never changes the gate's exit code:
    what the gate decided stands, bisect only names a commit."""
    import time

    if out.run_id is None:
        return ["bisect: the run was not stored, so no alert is known"]
    try:
        alerts = gate_alerts(db_url, out.run_id, out.record.gpu_model_key)
    except Exception as exc:  # noqa: BLE001 - the gate's verdict must survive a bisect failure
        return [f"bisect: alerts not read: {exc}"]
    lines: list[str] = []
    deadline = time.monotonic() + max_minutes * 60.0
    for a in alerts:
        left = (deadline - time.monotonic()) / 60.0
        if left <= 0:
            lines.append(f"bisect: alert {a.id} left, --bisect's {max_minutes:g} min spent")
            continue
        req = BisectRequest(repo=repo or Path.cwd(), alert_id=a.id, db_url=db_url,
                            max_builds=max_builds, max_minutes=left, min_time_s=min_time_s,
                            timeout_s=timeout_s, kernels_dirs=list(kernels_dirs or []))
        try:
            p = prepare(req)
            if len(p.commits) <= 2:
                continue  # one commit apart: the alert names it already
            lines += run_bisect(req, prepared=p, log=log).lines()
        except (BisectUsageError, BisectNotMeasured) as exc:
            lines.append(f"bisect: alert {a.id}: {exc}")
    return lines
