"""The list of flagged verdicts, as the Run page and the Overview show it: what regressed,
in which commit range (base..new), with links to both commits when the run recorded its
repository, to the History of the case and to the Compare of the two runs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from harness.dashboard import commits, tables, ui
from harness.dashboard.data import Ctx

# In view without scrolling sideways: tables.show puts the link columns first.
COLUMNS = ["verdict", "variant", "case_id", "commits", "history", "compare", "ratio",
           "p_value", "gpu_model_key", "base commit", "new commit", "run"]
LINKS = ("history", "compare", "run")


def table(ctx: Ctx, flags: pd.DataFrame) -> pd.DataFrame:
    """`flags` from queries.flagged_in_runs -> one row per flagged verdict, links added."""
    if flags.empty:
        return pd.DataFrame(columns=COLUMNS)
    urls = ctx.q("repository_urls", tuple(sorted({int(r) for r in flags["run_id"]})))
    out = flags.copy()
    out["commits"] = [f"{ui.short(b)}..{ui.short(n)}" for b, n in
                      zip(out["base_commit"], out["commit"], strict=True)]
    repo = out["run_id"].map(lambda r: urls.get(int(r)))
    out["base commit"] = [commits.commit_url(u, c) for u, c in
                          zip(repo, out["base_commit"], strict=True)]
    out["new commit"] = [commits.commit_url(u, c) for u, c in
                         zip(repo, out["commit"], strict=True)]
    out["history"] = [ui.history_href(v, c, g) for v, c, g in
                      zip(out["variant"], out["case_id"], out["gpu_model_key"], strict=True)]
    out["compare"] = [ui.compare_href(b, n) if pd.notna(b) else None
                      for b, n in zip(out["base_run_id"], out["run_id"], strict=True)]
    out["run"] = out["run_id"].map(ui.run_href)
    return out[COLUMNS]


def show(ctx: Ctx, flags: pd.DataFrame, key: str = "flag_list") -> None:
    shown = table(ctx, flags)
    # History, Compare and run open in this tab (tables.show); a commit is a page of the
    # repository's site, outside the dashboard.
    tables.show(ctx, shown, key=key, links=LINKS, hide_index=True, column_config={
        "gpu_model_key": "GPU", "commits": "base..new",
        "base commit": ui.COMMIT_LINK, "new commit": ui.COMMIT_LINK,
        "ratio": st.column_config.NumberColumn("time ratio", format="%.3f"),
        "p_value": st.column_config.NumberColumn("p", format="%.2g")})
    if shown["new commit"].isna().all():
        st.caption("Commit links appear when a run records its repository (`fa-harness ci` "
                   "does, from GITHUB_SERVER_URL/GITHUB_REPOSITORY or GitLab's "
                   "CI_PROJECT_URL).")
