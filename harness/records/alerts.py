"""Alerts with a life: one alert per step of a (GPU model, candidate, pass), and its triage.

The per-case verdicts of a comparison (harness.records.compare, `comparisons`) stay what
flags. A step, though, is flagged again at every later commit that confirms it
(harness.records.steps reports it for a few commits), on every case it moved; a person
acts on it once. `sync_alerts`, called once a run's verdicts are stored (the gate's
`finish`, `judge_runs` of an import), turns them into alerts:

- The flagging verdicts of the run (`regression` is a timing alert; `correctness_regression`
  and `precision_drift` a correctness one) are grouped by (GPU model, variant, pass, kind).
  A group with no live alert (open, acknowledged or accepted) opens one: its first bad and
  last good commit are the step's (`detail["step"]`, the most common among its cases)
  where the step search found one, else this run's commit and its baseline's; and for
  each case the level before and after (median ms; for a precision drift the error ratio).
- A live alert of the same series absorbs the group (the same step, seen again) unless
  most of its flagged cases are slower than the alert's level after by more than their
  threshold: a further step, which opens an alert of its own.
- Each live alert of the run's GPU model and branch (an alert keeps the branch that
  opened it) is then judged on this run's results of its cases, unless the run is of a
  commit run before the alert opened (a re-run of the last good one shows the old level,
  not a recovery): a case is "back" when its median is nearer the level before than the
  level after (for correctness: it passes), "held" otherwise. Cases not timed here
  (another grid, skipped, failed for a timing alert) are evidence of nothing. More held than
  back (or a flag absorbed) confirms the alert; more back than held closes it: `withdrawn`
  while no later run had confirmed it (it was one run's noise), else `recovered`. An
  accepted alert is only extended: its new level is the expected one.

Triage (`set_state`): acknowledge, accept as expected (with a reason and a link), reopen;
`set_culprit` records what `fa-harness bisect --alert ID` found. Every change is kept in
`detail["events"]`. The functions take a `Database` (harness.records.db.database), a
SQLAlchemy `Engine` or a database URL; this module imports neither the store nor the
judging code, so the dashboard may read (and, behind a token, write) alerts through it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from harness.records import alert_rules as rules
from harness.records.db.engine import make_engine, session_factory
from harness.records.db.models import (
    ALERT_STATES,
    AlertRow,
    CaseRow,
    Result,
    Run,
    Variant,
    utcnow,
)

KIND_OF = {"regression": "timing", "correctness_regression": "correctness",
           "precision_drift": "correctness"}
LIVE = ("open", "acknowledged", "accepted")
# What a person may set; recovered and withdrawn are the runs' to say.
MANUAL = ("open", "acknowledged", "accepted")
STATE_ORDER = {s: i for i, s in enumerate(ALERT_STATES)}


class AlertError(ValueError):
    """An alert that does not exist, or a triage change that is not allowed."""


@dataclass
class Alert:
    id: int
    gpu_model_key: str
    variant: str
    pass_name: str
    kind: str  # "timing" or "correctness"
    owned: bool  # the team's candidate; False for a yardstick (never fails the gate)
    state: str
    first_bad_commit: str | None  # the range: the step's, else the flagging run's commit
    last_good_commit: str | None  # ... and its baseline's; None where unknown
    first_run_id: int | None  # the run that opened it (detail["new_run_id"]: the run at
    last_run_id: int | None  # first_bad, detail["base_run_id"]: at last_good); the last
    cases: list[str]  # run that extended, confirmed or closed it; the cases it flagged
    worst_ratio: float | None
    worst_case: str | None
    who: str | None
    reason: str | None
    link: str | None
    culprit_commit: str | None
    created_at: datetime
    updated_at: datetime
    verdict: str = "regression"  # the flagging verdict (the worst, for correctness)
    confirmations: int = 0  # later runs that confirmed it
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """As the dashboard names a candidate: `fa2_mma`, `fa2_mma (bwd)`."""
        return self.variant if self.pass_name == "fwd" else f"{self.variant} ({self.pass_name})"

    @property
    def live(self) -> bool:
        return self.state in LIVE

    @property
    def bisect_command(self) -> str:
        return f"fa-harness bisect --alert {self.id}"

    def line(self) -> str:
        """One line for a summary or a log."""
        rng = f"{(self.last_good_commit or '?')[:12]}..{(self.first_bad_commit or '?')[:12]}"
        worst = (f", worst {self.worst_ratio:.3f}x on `{self.worst_case}`"
                 if self.worst_ratio is not None and self.kind == "timing" else
                 f", first `{self.worst_case}`" if self.worst_case else "")
        who = f" by {self.who}" if self.who and self.state != "open" else ""
        return (f"alert {self.id} [{self.state}{who}]: `{self.label}` {self.verdict} "
                f"on {len(self.cases)} case(s){worst}, commits {rng}; "
                f"`{self.bisect_command}`")


def _alert(row: AlertRow) -> Alert:
    return Alert(id=row.id, gpu_model_key=row.gpu_model_key, variant=row.variant,
                 pass_name=row.pass_name, kind=row.kind, owned=bool(row.owned),
                 state=row.state, first_bad_commit=row.first_bad_commit,
                 last_good_commit=row.last_good_commit, first_run_id=row.first_run_id,
                 last_run_id=row.last_run_id, cases=list(row.cases or []),
                 worst_ratio=row.worst_ratio, worst_case=row.worst_case, who=row.who,
                 reason=row.reason, link=row.link, culprit_commit=row.culprit_commit,
                 created_at=row.created_at, updated_at=row.updated_at, verdict=row.verdict,
                 confirmations=row.confirmations, detail=dict(row.detail or {}))


@contextmanager
def transaction(db: Any) -> Iterator[Session]:
    """One transaction on a Database (joining a `Database.transaction` held open), an
    Engine or a database URL."""
    engine: Engine = make_engine(db) if isinstance(db, str) else getattr(db, "engine", db)
    try:
        if hasattr(db, "session"):
            with db.session() as s:
                yield s
        else:
            with session_factory(engine)() as s, s.begin():
                yield s
    except SQLAlchemyError as exc:
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        raise AlertError(f"alerts: {first[0] if first else type(exc).__name__}") from exc
    finally:
        if isinstance(db, str):
            engine.dispose()


# ------------------------------------------------------------------------ reading


def get_alert(db: Any, alert_id: int) -> Alert:
    with transaction(db) as s:
        row = s.get(AlertRow, int(alert_id))
        if row is None:
            raise AlertError(f"no alert {alert_id}")
        return _alert(row)


def list_alerts(db: Any, *, state: str | Sequence[str] | None = None,
                owned: bool | None = None, gpu_model_key: str | None = None,
                variant: str | None = None) -> list[Alert]:
    """Alerts by state (open, acknowledged, accepted, recovered, withdrawn), then newest
    first. `state` may name several; `variant` is a name (`fa2_mma`) or a label
    (`fa2_mma (bwd)`)."""
    q = select(AlertRow)
    if state is not None:
        states = [state] if isinstance(state, str) else list(state)
        q = q.where(AlertRow.state.in_(states))
    if owned is not None:
        q = q.where(AlertRow.owned.is_(bool(owned)))
    if gpu_model_key is not None:
        q = q.where(AlertRow.gpu_model_key == gpu_model_key)
    if variant is not None:
        name, _, rest = variant.partition(" (")
        q = q.where(AlertRow.variant == name)
        if rest:
            q = q.where(AlertRow.pass_name == rest.rstrip(")"))
    with transaction(db) as s:
        rows = [_alert(r) for r in s.scalars(q)]
    rows.sort(key=lambda a: (STATE_ORDER.get(a.state, 9), -a.created_at.timestamp(), -a.id))
    return rows


def open_alerts(db: Any, gpu_model_key: str | None = None) -> list[Alert]:
    """What the gate's summary and the Overview list: the open and acknowledged alerts
    (of one GPU model), the team's first, then the yardsticks'."""
    rows = list_alerts(db, state=("open", "acknowledged"), gpu_model_key=gpu_model_key)
    return sorted(rows, key=lambda a: not a.owned)  # stable: newest first within each


# ------------------------------------------------------------------------ triage


def set_state(db: Any, alert_id: int, state: str, *, who: str, reason: str | None = None,
              link: str | None = None) -> Alert:
    """Acknowledge (`acknowledged`), accept as expected (`accepted`: a reason is
    required, a link to the change that explains it is welcome) or reopen (`open`)."""
    if state not in MANUAL:
        raise AlertError(f"state {state!r}: a person sets one of {', '.join(MANUAL)}")
    who = (who or "").strip()
    if not who:
        raise AlertError("say who changes the alert")
    reason = (reason or "").strip() or None
    link = (link or "").strip() or None
    if state == "accepted" and not reason:
        raise AlertError("accepting an alert as expected needs a reason")
    if link and not link.startswith(("https://", "http://")):
        raise AlertError("a link is a http(s) address")
    with transaction(db) as s:
        row = s.get(AlertRow, int(alert_id))
        if row is None:
            raise AlertError(f"no alert {alert_id}")
        row.state, row.who, row.reason, row.link = state, who, reason, link
        rules.event(row, state=state, who=who, reason=reason, link=link)
        s.flush()
        return _alert(row)


def set_culprit(db: Any, alert_id: int, commit: str) -> Alert:
    """The commit a bisection named (`fa-harness bisect --alert ID`)."""
    commit = (commit or "").strip()
    if not commit:
        raise AlertError("no commit given")
    with transaction(db) as s:
        row = s.get(AlertRow, int(alert_id))
        if row is None:
            raise AlertError(f"no alert {alert_id}")
        row.culprit_commit = commit
        rules.event(row, culprit=commit)
        s.flush()
        return _alert(row)


# ------------------------------------------------------------------------ syncing


def record_owned(record: Any) -> Callable[[str], bool]:
    """Owned or yardstick as the gate says it (GateOutcome._yardstick): a peer, or a
    candidate the record marks as not the team's, is a yardstick."""
    kernels = getattr(record, "kernels", None) or {}

    def owned(name: str) -> bool:
        info = kernels.get(name) or {}
        return info.get("kind") != "peer" and info.get("owned") is not False

    return owned


def _new_alert(s: Session, run: Run, gpu: str, key: tuple[str, str, str], flags: list[Any],
               owned: bool) -> AlertRow:
    variant, pass_name, kind = key
    steps = Counter((st["first_bad"], st["last_good"]) for v in flags
                    if isinstance(st := v.detail.get("step"), dict) and st.get("first_bad"))
    if steps:
        first_bad, last_good = steps.most_common(1)[0][0]
    else:
        base_uuid = next((v.base_uuid for v in flags if v.base_uuid), None)
        base = s.scalars(select(Run).where(Run.uuid == base_uuid)).first() if base_uuid else None
        first_bad = run.commit
        last_good = base.commit if base is not None else run.parent_commit
    now = utcnow()
    row = AlertRow(gpu_model_key=gpu, variant=variant, pass_name=pass_name, kind=kind,
                   verdict=flags[0].verdict, owned=owned, state="open",
                   first_bad_commit=first_bad, last_good_commit=last_good,
                   first_run_id=run.id, last_run_id=run.id, confirmations=0, cases=[],
                   detail={"levels": {}, "opened_by_run": run.id, "events": [],
                           "branch": run.branch},
                   created_at=now, updated_at=now)
    rules.absorb(row, flags, kind)
    # The runs that show the step (the dashboard's Compare): the newest of this GPU
    # model at the last good and at the first bad commit, of the run's own grids.
    row.detail = dict(row.detail, base_run_id=_run_at(s, gpu, last_good, run, before=True),
                      new_run_id=_run_at(s, gpu, first_bad, run) or run.id)
    s.add(row)
    return row


def _run_at(s: Session, gpu: str, commit: str | None, run: Run, *,
            before: bool = False) -> int | None:
    if not commit:
        return None
    q = (select(Run.id, Run.grids).where(Run.gpu_model_key == gpu, Run.commit == commit,
                                         Run.id <= run.id)
         .order_by(Run.created_at.desc(), Run.id.desc()))
    if before:
        q = q.where(Run.id != run.id)
    grids = set(run.grids or [])
    rows = s.execute(q.limit(50)).all()
    same = [r for r, g in rows if not grids or not g or grids & set(g)]
    return same[0] if same else (rows[0][0] if rows else None)


def _old_commit(s: Session, run: Run, row: AlertRow) -> bool:
    """A run of a commit already run before the alert opened (the last good commit or an
    earlier one, re-run later): it shows the level before the step, not that the step
    was undone."""
    if not run.commit or run.commit == row.first_bad_commit:
        return False
    if run.commit == row.last_good_commit:
        return True
    return s.execute(select(Run.id).where(
        Run.gpu_model_key == row.gpu_model_key, Run.commit == run.commit,
        Run.id < (row.first_run_id or 0)).limit(1)).first() is not None


def _results(s: Session, run_id: int, series: set[tuple[str, str]]
             ) -> dict[tuple[str, str], dict[str, tuple[str, float | None, float | None]]]:
    """(variant, pass) -> case id -> (status, median ms, error ratio) of one run."""
    out: dict[tuple[str, str], dict[str, tuple[str, float | None, float | None]]] = {}
    if not series:
        return out
    q = (select(Variant.name, Result.pass_name, CaseRow.case_id, Result.status,
                Result.median_ms, Result.err_ratio)
         .join(Variant, Variant.id == Result.variant_id)
         .join(CaseRow, CaseRow.id == Result.case_pk)
         .where(Result.run_id == run_id, Variant.name.in_(sorted({v for v, _ in series}))))
    for name, pass_name, case_id, status, median, err in s.execute(q):
        if (name, pass_name) in series:
            out.setdefault((name, pass_name), {})[case_id] = (status, median, err)
    return out


def sync_alerts(db: Any, run_id: int, report: Any, *,
                owned: Callable[[str], bool]) -> list[Alert]:
    """Open, extend, confirm, withdraw or recover the alerts of run `run_id`'s GPU model
    from its stored verdicts (`report`: the harness.records.compare.Report whose verdicts
    were stored for it; module doc). Returns the alerts this run opened or changed.
    A run already synced changes nothing."""
    groups: dict[tuple[str, str, str], list[Any]] = {}
    for v in report.verdicts:
        kind = KIND_OF.get(v.verdict)
        if kind is not None:
            groups.setdefault((v.variant, v.pass_name, kind), []).append(v)
    changed: dict[int, AlertRow] = {}
    with transaction(db) as s:
        run = s.get(Run, int(run_id))
        if run is None:
            raise AlertError(f"no run {run_id}")
        gpu = run.gpu_model_key or report.gpu_model_key
        if s.get_bind().dialect.name == "postgresql":
            # Two CI jobs of one GPU model finishing together must not both open the
            # same step (SQLite's BEGIN IMMEDIATE already serialises the writers).
            key = int.from_bytes(hashlib.sha256(f"alerts/{gpu}".encode()).digest()[:8],
                                 "big", signed=True)
            s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
        rows = list(s.scalars(select(AlertRow).where(AlertRow.gpu_model_key == gpu)
                              .order_by(AlertRow.id)))
        if any(run.id in rules.runs_of(r) for r in rows):
            return []  # synced already
        # A branch's runs speak for its own alerts only: a pull request's run without
        # main's step must not withdraw main's alert, nor its own step open one on main.
        mine = [r for r in rows if (r.detail or {}).get("branch") in (None, run.branch)]
        live = {(r.variant, r.pass_name, r.kind): r for r in mine if r.state in LIVE}
        closed = {(r.variant, r.pass_name, r.kind, r.first_bad_commit): r
                  for r in mine if r.state not in LIVE}
        absorbed: set[int] = set()
        for key, flags in groups.items():
            row = live.get(key)
            if row is not None:
                levels = (row.detail or {}).get("levels") or {}
                known = [v for v in flags if v.case_id in levels]
                further = [v for v in known if rules.further(row, v)]
                if len(further) * 2 > len(known):
                    row = None  # mostly beyond its level: a step of its own
                    flags = further
                else:
                    rules.absorb(row, flags, key[2])
                    absorbed.add(row.id)
                    continue
            new = _new_alert(s, run, gpu, key, flags, owned(key[0]))
            old = closed.get((*key, new.first_bad_commit))
            if old is not None:
                # The same step as one closed earlier (the step search confirming what one
                # run's noise seemed to undo): that alert again, not a second one.
                s.expunge(new)
                old.state = "open"
                rules.absorb(old, flags, key[2])
                rules.event(old, state="open", why=f"flagged again by run {run.id}")
                row = old
                absorbed.add(row.id)
            else:
                s.flush()
                row = new
            changed[row.id] = row
        results = _results(s, run.id, {(r.variant, r.pass_name) for r in live.values()})
        for row in live.values():
            if row.id in changed or run.id < (row.first_run_id or 0) or _old_commit(
                    s, run, row):
                continue  # opened by this run, stored before it, or a re-run from before
            held, back = rules.outcome(row, results.get((row.variant, row.pass_name), {}))
            if row.id in absorbed or held > back:
                row.confirmations += 1
            elif back > held and row.state != "accepted":
                state = "recovered" if row.confirmations else "withdrawn"
                row.state = state
                rules.event(row, state=state, why=f"run {run.id}: {back} case(s) back at the "
                                             f"level before, {held} held")
            else:
                continue  # nothing of it measured here
            row.last_run_id, row.updated_at = max(row.last_run_id or 0, run.id), utcnow()
            changed[row.id] = row
        for row in changed.values():
            rules.touch(row, run.id)
        s.flush()
        return [_alert(r) for r in sorted(changed.values(), key=lambda r: r.id)]
