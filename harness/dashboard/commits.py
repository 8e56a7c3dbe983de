"""Commit order and commit links.

A history is read in commit order, not in the order the runs happened to be made: a
re-run of an old commit belongs next to that commit. Each run records its commit and
the commit's first parent, so the order is recovered from the runs themselves: parents
before children, and commits unrelated by a recorded parent (a gap in the runs) by the
time of their first run. On one branch this is the branch's first-parent order.
"""

from __future__ import annotations

import heapq
from typing import Any
from urllib.parse import quote

import pandas as pd


def commit_order(runs: pd.DataFrame) -> dict[str, int]:
    """commit -> position (0 = oldest) for the commits of `runs` (columns commit,
    parent_commit, created_at). Runs without a commit are left out."""
    known = runs[runs["commit"].notna()]
    if known.empty:
        return {}
    first_seen = known.groupby("commit")["created_at"].min()
    parent_col = known.get("parent_commit")
    parents = parent_col.tolist() if parent_col is not None else [None] * len(known)
    parent: dict[str, str | None] = {}
    for commit, p in zip(known["commit"].tolist(), parents, strict=True):
        if commit not in parent or (parent[commit] is None and isinstance(p, str)):
            parent[commit] = p if isinstance(p, str) else None
    children: dict[str, list[str]] = {}
    ready: list[tuple[Any, str]] = []
    for commit, p in parent.items():
        if p is not None and p in parent and p != commit:
            children.setdefault(p, []).append(commit)
        else:
            ready.append((first_seen[commit], commit))
    heapq.heapify(ready)
    order: dict[str, int] = {}
    while ready:
        _, commit = heapq.heappop(ready)
        if commit in order:
            continue
        order[commit] = len(order)
        for child in children.get(commit, ()):
            heapq.heappush(ready, (first_seen[child], child))
    for commit in sorted(set(parent) - set(order), key=lambda c: first_seen[c]):
        order[commit] = len(order)  # a parent cycle (corrupt records): by time
    return order


def in_commit_order(df: pd.DataFrame) -> pd.DataFrame:
    """`df` (one row per run: commit, parent_commit, created_at, run_id) sorted in commit
    order, with `seq` (the commit's position) and `label` (its date and short commit,
    the x-axis tick of a history chart)."""
    if df.empty:
        return df.assign(seq=pd.Series(dtype="int64"), label=pd.Series(dtype="object"))
    order = commit_order(df)
    seq = df["commit"].map(order)
    # Runs without a commit go after the ordered ones, by time.
    missing = seq.isna()
    if missing.any():
        ranks = df.loc[missing, "created_at"].rank(method="first").astype("int64")
        seq = seq.where(~missing, len(order) - 1 + ranks)
    out = df.assign(seq=seq.astype("int64"))
    out = out.sort_values(["seq", "created_at", "run_id"], kind="stable")
    first = out.groupby("seq")["created_at"].transform("min")
    out["label"] = [f"{when:%Y-%m-%d} {str(c)[:7] if isinstance(c, str) else 'no commit'}"
                    for when, c in zip(pd.to_datetime(first), out["commit"], strict=True)]
    return out.reset_index(drop=True)


def commit_url(repository_url: str | None, commit: str | None) -> str | None:
    """The web page of `commit` in the repository (GitHub and GitLab both serve
    `<repository>/commit/<sha>`), or None when either is unknown."""
    # Not a string: a missing address in a pandas column is NaN, not None.
    if not isinstance(repository_url, str) or not isinstance(commit, str) or not commit:
        return None
    if not repository_url.startswith(("https://", "http://")):
        return None
    return f"{repository_url.rstrip('/')}/commit/{quote(commit, safe='')}"
