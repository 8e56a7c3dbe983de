"""The Overview's triage: the alert list's filters (the team's or the yardsticks', GPU
model, state, candidate; each in the URL, so a filtered list is a link) and the actions
on one step: acknowledge, accept as expected (a reason, and a link to what explains it),
reopen.

The dashboard's own engine is read-only. An action is a write through the records
library (harness.records.alerts.set_state) on an engine of its own, made only after the
token is verified (harness.submissions.tokens, as the Submit page checks its uploads):
the token's name is who changed the alert. No SQL here.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from harness.dashboard import ui
from harness.dashboard.data import Ctx, load

STATE_CHOICES = {"live": ("open", "acknowledged"), "open": ("open",),
                 "acknowledged": ("acknowledged",), "accepted": ("accepted",),
                 "recovered": ("recovered",), "withdrawn": ("withdrawn",), "all": ()}
STATE_LABELS = {"live": "open or acknowledged (the gate's list)", "all": "every state"}
OWNER_CHOICES = {"all": None, "team": True, "yardstick": False}
OWNER_LABELS = {"all": "the team's and yardsticks'", "team": "the team's",
                "yardstick": "yardsticks (peers, shipped variants)"}
ACTIONS = {"acknowledge": "acknowledged", "accept as expected": "accepted", "reopen": "open"}
_FLASH = "triage_flash"


@dataclass(frozen=True)
class Filters:
    state: tuple[str, ...]
    owned: bool | None
    gpu: str | None
    variant: str | None

    @property
    def args(self) -> tuple:
        """alert_list's arguments after `shown` (hashable: the query cache keys on them)."""
        return self.state, self.owned, self.gpu, self.variant


def filters(ctx: Ctx) -> Filters:
    names = ctx.q("gpu_names")
    cols = st.columns(4)
    state = ui.pick("State", list(STATE_CHOICES), "alert_state", where=cols[0],
                    fmt=lambda k: STATE_LABELS.get(k, k))
    owner = ui.pick("Whose", list(OWNER_CHOICES), "alert_owner", where=cols[1],
                    fmt=OWNER_LABELS.__getitem__)
    gpu = ui.pick("GPU", ["all", *names], "alert_gpu", where=cols[2],
                  fmt=lambda k: "every GPU" if k == "all" else names.get(k) or k)
    every = ctx.q("alert_list", 500)
    variants = sorted(set(every["variant"])) if len(every) else []
    variant = ui.pick("Candidate", ["all", *variants], "alert_variant", where=cols[3],
                      fmt=lambda k: "every candidate" if k == "all" else k)
    return Filters(STATE_CHOICES.get(state or "live", ()), OWNER_CHOICES.get(owner or "all"),
                   None if gpu in (None, "all") else gpu,
                   None if variant in (None, "all") else variant)


def _label(row: pd.Series) -> str:
    ids = ", ".join(f"#{i}" for i in row["ids"])
    return (f"{row['variant']} from {ui.short(row['first_bad'])} on "
            f"{', '.join(row['gpus'])} ({row['state']}; {ids})")


def actions(ctx: Ctx, rows: pd.DataFrame) -> None:
    """The triage form for one row (one step: every GPU model's alert of it)."""
    flash = st.session_state.pop(_FLASH, None)
    if flash:
        (st.success if flash[0] else st.error)(flash[1])
    if rows.empty:
        return
    with st.expander("Triage: acknowledge, accept as expected, reopen",
                     expanded=bool(flash and not flash[0])), st.form("triage"):
        pick = st.selectbox("Alert", list(range(len(rows))),
                            format_func=lambda i: _label(rows.iloc[i]))
        action = st.radio("Action", list(ACTIONS), horizontal=True)
        reason = st.text_input("Reason (needed to accept as expected)")
        link = st.text_input("Link (the pull request or issue that explains it)")
        token = st.text_input("Token", type="password",
                              help="A submission token (`fa-harness token create --name "
                                   "YOU`); its name is recorded as who changed the alert.")
        go = st.form_submit_button("Apply", type="primary")
    if not go or pick is None:
        return
    ids = list(rows.iloc[pick]["ids"])
    ok, message = apply(ctx.url, ids, ACTIONS[action], token, reason, link)
    st.session_state[_FLASH] = (ok, message)
    if ok:
        load.clear()  # every cached alert list is stale now
    st.rerun()


def apply(url: str, ids: list[int], state: str, token: str | None, reason: str | None,
          link: str | None) -> tuple[bool, str]:
    """Verify the token, then set `state` on the alerts `ids` through the records
    library; (done, what to say)."""
    from harness.records import alerts
    from harness.records.db.engine import make_engine
    from harness.submissions.tokens import TokenError, verify_token

    engine = make_engine(url)  # writable: the dashboard's cached engine is read-only
    try:
        try:
            who = verify_token(engine, token).name
        except TokenError as e:
            return False, f"Not changed: {e}"
        try:
            for i in ids:
                alerts.set_state(engine, i, state, who=who, reason=reason, link=link)
        except alerts.AlertError as e:
            return False, f"Not changed: {e}"
    finally:
        engine.dispose()
    return True, (f"Alert{'s' if len(ids) > 1 else ''} {', '.join(f'#{i}' for i in ids)} "
                  f"{state} by {who}.")
