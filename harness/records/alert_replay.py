"""Alerts for a history judged before there were alerts: the stored verdicts replayed.

A database upgraded to migration 0006 holds its runs' verdicts (`comparisons`) but no
alert: the gate and `fa-harness import` sync alerts only for the runs they judge from then
on. `replay_alerts` walks the judged runs of a GPU model oldest first and hands each one's
stored flagging verdicts to `harness.records.alerts.sync_alerts`, as if it had been synced
when it was judged. Runs already synced are skipped there, so replaying twice, or after
new runs came in, changes nothing that was synced.

A stored run does not keep the record's `owned` marks, only each candidate's kind and, for
a gate run, the plan's owned candidates (`env.ci_plan.owned`): a peer is a yardstick, and
so is a candidate a gate run did not own (a shipped variant in a team's repository, a
declared yardstick); every other candidate is the team's, as `fa-harness import` judges
a stored record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from harness.records.alerts import KIND_OF, sync_alerts, transaction
from harness.records.db.models import AlertRow, Comparison, Run, Variant


@dataclass
class _Verdict:
    """What sync_alerts reads of a harness.records.compare.Verdict, from a stored row."""

    variant: str
    case_id: str
    verdict: str
    pass_name: str
    ratio: float | None
    detail: dict[str, Any] = field(default_factory=dict)
    base_uuid: str | None = None

    @property
    def new_median_ms(self) -> float | None:
        return self.detail.get("new_median_ms")


@dataclass
class _Report:
    gpu_model_key: str | None
    verdicts: list[_Verdict]


def replay_alerts(db: Any, *, gpu_model_key: str | None = None) -> int:
    """Sync the alerts of every judged run (of one GPU model, or all), oldest first;
    returns how many runs were handed to sync_alerts."""
    with transaction(db) as s:
        judged = select(Comparison.run_id).distinct().scalar_subquery()
        q = select(Run.id, Run.gpu_model_key, Run.env).where(Run.id.in_(judged))
        if gpu_model_key is not None:
            q = q.where(Run.gpu_model_key == gpu_model_key)
        runs = s.execute(q.order_by(Run.created_at, Run.id)).all()
        uuids = dict(s.execute(select(Run.id, Run.uuid)).all())
        peers = set(s.scalars(select(Variant.name).where(Variant.kind == "peer")))
    for run_id, gpu, env in runs:
        with transaction(db) as s:
            rows = s.execute(select(Comparison).where(
                Comparison.run_id == run_id, Comparison.verdict.in_(list(KIND_OF)))).scalars()
            verdicts = [_Verdict(c.variant, c.case_id, c.verdict, c.pass_name, c.ratio,
                                 dict(c.detail or {}), uuids.get(c.base_run_id))
                        for c in rows]
        sync_alerts(db, run_id, _Report(gpu, verdicts), owned=_owned(peers, env))
    return len(runs)


def _owned(peers: set[str], env: Any) -> Callable[[str], bool]:
    """The team's candidates of a stored run: not a peer, and owned by its gate's plan
    where it has one."""
    plan = (env or {}).get("ci_plan") if isinstance(env, dict) else None
    mine = plan.get("owned") if isinstance(plan, dict) else None
    planned = set(mine) if isinstance(mine, list) else None
    return lambda k: k not in peers and (planned is None or k in planned)


def backfill(db: Any) -> int:
    """Replay the stored verdicts once: when flagging verdicts are stored and no alert is
    (a database upgraded to migration 0006). The gate and `fa-harness import` call it
    before they sync a run, so an upgraded history gets its alerts with its next run.
    Returns how many runs were replayed (0 almost always)."""
    with transaction(db) as s:
        if s.execute(select(AlertRow.id).limit(1)).first() is not None:
            return 0
        flagged = s.execute(select(Comparison.id).where(
            Comparison.verdict.in_(list(KIND_OF))).limit(1)).first()
    return 0 if flagged is None else replay_alerts(db)
