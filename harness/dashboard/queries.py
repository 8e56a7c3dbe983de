"""Every database read the dashboard makes, as plain functions of an Engine.

The results table grows by (variants x cases) rows per run and per GPU, a million rows is
a normal history, so every query here is shaped to touch a bounded number of rows through
an index, and aggregates in SQL:
  - per-run views (Compare, Roofline, Correctness, Run) read one run via ix_results_run;
  - the History series reads one (variant, case) via ix_results_variant_case;
  - Overview reads only the latest run per (GPU, branch), found in the small runs table;
  - regression flags come from the comparisons table through ix_comparisons_verdict,
    since flagged verdicts are the rare ones.
No function loads all results. Functions return pandas DataFrames (or small dicts) so the
Streamlit layer can cache them; nothing here imports Streamlit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pandas as pd
from sqlalchemy import (
    Engine,
    Select,
    String,
    and_,
    case,
    cast,
    distinct,
    func,
    inspect,
    literal,
    or_,
    select,
)
from sqlalchemy.orm import aliased

from harness.dashboard.schema import CaseRow, Comparison, Result, Run, Variant, rarely

# Verdicts that mean "something got worse" (flagged in red everywhere).
FLAGGED = ("regression", "correctness_regression", "precision_drift")
GOOD = ("improvement", "correctness_fixed")
NOT_OK = ("failed", "crashed", "timeout", "error", "invalid")


# A candidate's backward is an entry of its own: every page names it "<variant> (bwd)"
# (its forward keeps the plain name), so that no table, series or ranking mixes the passes.
_PASS_SUFFIX = re.compile(r"^(?P<name>.+) \((?P<pass>bwd)\)$")


def _label(name_col: Any, pass_col: Any) -> Any:
    return case((pass_col == "fwd", name_col),
                else_=name_col + literal(" (", String) + pass_col + literal(")", String))


RESULT_LABEL = _label(Variant.name, Result.pass_name).label("variant")
COMPARISON_LABEL = _label(Comparison.variant, Comparison.pass_name).label("variant")


def split_label(label: str) -> tuple[str, str]:
    """("fa2_mma (bwd)") -> ("fa2_mma", "bwd"); a plain name is its forward."""
    m = _PASS_SUFFIX.match(label)
    return (m["name"], m["pass"]) if m else (label, "fwd")


def _frame(engine: Engine, stmt: Select[Any]) -> pd.DataFrame:
    with engine.connect() as conn:
        res = conn.execute(stmt)
        # Plain tuples: a SQLAlchemy Row has attributes named after its columns, and pandas
        # takes a row's `.dtype` (the case's dtype column, "float16") as the dtype to
        # convert every value of the frame to.
        return pd.DataFrame([tuple(r) for r in res.fetchall()], columns=list(res.keys()))


# --- catalogue: small tables -------------------------------------------------------------


def summary(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            select(func.count(Run.id), func.min(Run.created_at), func.max(Run.created_at))
        ).one()
        variants = conn.execute(select(func.count(distinct(Variant.name)))).scalar_one()
        cases = conn.execute(select(func.count(CaseRow.id))).scalar_one()
        gpus = conn.execute(select(func.count(distinct(Run.gpu_model_key)))).scalar_one()
    return {"runs": int(row[0]), "first": row[1], "last": row[2], "variants": int(variants),
            "cases": int(cases), "gpus": int(gpus)}


def gpu_names(engine: Engine) -> dict[str, str]:
    """GPU model key -> the name the GPU reports (`nvidia-h200` -> `NVIDIA H200`), the
    model with the most runs first: the pickers open on it (a team's main runner), not on
    whichever model sorts first by name, which may hold a single run and nothing to compare
    it with."""
    stmt = (select(Run.gpu_model_key, func.max(Run.gpu_name))
            .where(Run.gpu_model_key.is_not(None)).group_by(Run.gpu_model_key)
            .order_by(func.count(Run.id).desc(), Run.gpu_model_key))
    with engine.connect() as conn:
        return {k: (n or k) for k, n in conn.execute(stmt)}


def branches(engine: Engine) -> list[str]:
    stmt = select(Run.branch).distinct().where(Run.branch.is_not(None))
    with engine.connect() as conn:
        return sorted(conn.execute(stmt).scalars())


def variant_names(engine: Engine) -> list[str]:
    """Every candidate name, a backward's as "<variant> (bwd)"; variants stored without
    any result (only named in a record's kernels) under their plain name."""
    # The passes other than the forward are rare rows: found through ix_results_pass_variant
    # (a DISTINCT over every result's label read a million rows for the History's picker).
    with engine.connect() as conn:
        other = set(conn.execute(
            select(RESULT_LABEL).select_from(Variant)
            .join(Result, Result.variant_id == Variant.id)
            # Two index ranges; a `!=` walks the whole index.
            .where(rarely(engine, or_(Result.pass_name < "fwd", Result.pass_name > "fwd")))
            .distinct()).scalars())
        plain = set(conn.execute(select(Variant.name).distinct()).scalars())
        # A variant named only by its backward results keeps no plain entry.
        fwd = {n for n in plain if not any(split_label(w)[0] == n for w in other)} | set(
            conn.execute(select(Variant.name).where(
                Variant.name.in_([split_label(w)[0] for w in other]),
                select(Result.id).where(Result.variant_id == Variant.id,
                                        Result.pass_name == "fwd").exists())).scalars())
    return sorted(other | fwd)


def case_ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(select(CaseRow.case_id).order_by(CaseRow.case_id)).scalars())


def timed_pair(engine: Engine) -> tuple[str, str] | None:
    """(variant, case) of the newest timed result of a kernel under test (a CUDA variant
    or Python candidate, not an SDPA peer or a CPU model; any variant when there is none):
    History opens on a line that can be drawn, not on the alphabetically first pair (a
    correctness-only smoke case of a variant that is never timed draws nothing)."""
    with engine.connect() as conn:
        for own in (True, False):
            stmt = (select(RESULT_LABEL, CaseRow.case_id).select_from(Variant)
                    .join(Result, Result.variant_id == Variant.id)
                    .join(CaseRow, CaseRow.id == Result.case_pk)
                    .join(Run, Run.id == Result.run_id)
                    .where(Result.median_ms.is_not(None))
                    .order_by(Run.created_at.desc(), Run.id.desc(), Variant.name,
                              Result.pass_name, CaseRow.case_id)
                    .limit(1))
            if own:
                stmt = stmt.where(Variant.kind.not_in(("peer", "model")))
            row = conn.execute(stmt).first()
            if row:
                return (row[0], row[1])
    return None


def runs_list(engine: Engine, gpu: str | None = None, limit: int = 500) -> pd.DataFrame:
    """The most recent runs (newest first), optionally on one GPU model."""
    stmt = select(Run.id, Run.commit, Run.branch, Run.created_at, Run.gpu_model_key,
                  Run.gpu_name, Run.source, Run.grids)
    if gpu:
        stmt = stmt.where(Run.gpu_model_key == gpu)
    return _frame(engine, stmt.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit))


def resolve_run(engine: Engine, token: str, gpu: str | None = None) -> int | None:
    """A run from a deep-link value: a run id, or a commit (prefix) on `gpu` (newest run)."""
    token = token.strip()
    if not token:
        return None
    with engine.connect() as conn:
        if token.isdigit():
            found = conn.execute(select(Run.id).where(Run.id == int(token))).scalar()
            if found is not None:
                return int(found)
        if len(token) < 4 or any(c not in "0123456789abcdefABCDEF" for c in token):
            return None
        stmt = select(Run.id).where(Run.commit.like(token.lower() + "%"))
        if gpu:
            stmt = stmt.where(Run.gpu_model_key == gpu)
        found = conn.execute(stmt.order_by(Run.created_at.desc(), Run.id.desc()).limit(1)).scalar()
        return None if found is None else int(found)


# --- overview ----------------------------------------------------------------------------


def latest_runs(engine: Engine) -> pd.DataFrame:
    """The newest run of every (GPU model, branch, grids): a perf run and a decode run of
    one commit are both shown, neither hides the other."""
    # The grids list as text: JSON values have no equality on PostgreSQL.
    grids = cast(Run.grids, String)
    rn = func.row_number().over(
        partition_by=(Run.gpu_model_key, Run.branch, grids),
        order_by=(Run.created_at.desc(), Run.id.desc()),
    ).label("rn")
    sub = select(Run.id, Run.commit, Run.branch, Run.gpu_model_key, Run.gpu_name,
                 Run.created_at, Run.source, Run.grids, grids.label("grids_key"), rn).subquery()
    stmt = (select(sub.c.id, sub.c.commit, sub.c.branch, sub.c.gpu_model_key, sub.c.gpu_name,
                   sub.c.created_at, sub.c.source, sub.c.grids)
            .where(sub.c.rn == 1)
            .order_by(sub.c.gpu_model_key, sub.c.branch, sub.c.grids_key))
    return _frame(engine, stmt)


def status_counts(engine: Engine, run_ids: Sequence[int]) -> pd.DataFrame:
    """run_id x status -> count, for a few runs."""
    if not run_ids:
        return pd.DataFrame(columns=["run_id", "status", "n"])
    stmt = (select(Result.run_id, Result.status, func.count().label("n"))
            .where(Result.run_id.in_(list(run_ids)))
            .group_by(Result.run_id, Result.status))
    return _frame(engine, stmt)


def flagged_in_runs(engine: Engine, run_ids: Sequence[int]) -> pd.DataFrame:
    """Regression-type verdicts recorded for these runs, with the commits of both runs
    (the base..new range the regression came in)."""
    if not run_ids:
        return pd.DataFrame(columns=["run_id", "base_run_id", "variant", "case_id", "verdict",
                                     "ratio", "p_value", "gpu_model_key", "commit",
                                     "base_commit"])
    new, base = aliased(Run), aliased(Run)
    stmt = (select(Comparison.run_id, Comparison.base_run_id, COMPARISON_LABEL,
                   Comparison.case_id, Comparison.verdict, Comparison.ratio, Comparison.p_value,
                   new.gpu_model_key, new.commit, base.commit.label("base_commit"))
            .join(new, new.id == Comparison.run_id)
            .outerjoin(base, base.id == Comparison.base_run_id)
            .where(Comparison.run_id.in_(list(run_ids)), Comparison.verdict.in_(FLAGGED))
            .order_by(Comparison.run_id, Comparison.variant, Comparison.case_id))
    return _frame(engine, stmt)


def repository_urls(engine: Engine, run_ids: Sequence[int]) -> dict[int, str]:
    """The repository web address each of these runs recorded (`env.repository_url`, set by
    `fa-harness ci` from the CI system), for commit links; runs without one are left out."""
    if not run_ids:
        return {}
    stmt = select(Run.id, Run.env).where(Run.id.in_(list(run_ids)))
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    out = {}
    for run_id, env in rows:
        url = (env or {}).get("repository_url") if isinstance(env, dict) else None
        if isinstance(url, str) and url.startswith(("https://", "http://")):
            out[int(run_id)] = url.rstrip("/")
    return out


def recent_flags(engine: Engine, limit: int = 50) -> pd.DataFrame:
    """The newest regression-type verdicts anywhere in the history."""
    # Pick the few newest flagged rows first, then join their runs (joining first makes
    # the planner walk every run).
    newest = (select(Comparison.id, Comparison.run_id, Comparison.created_at,
                     COMPARISON_LABEL, Comparison.case_id, Comparison.verdict,
                     Comparison.ratio, Comparison.p_value)
              .where(rarely(engine, Comparison.verdict.in_(FLAGGED)))
              .order_by(Comparison.created_at.desc(), Comparison.id.desc())
              .limit(limit).subquery())
    stmt = (select(newest.c.run_id, Run.commit, Run.branch, Run.gpu_model_key, Run.created_at,
                   newest.c.variant, newest.c.case_id, newest.c.verdict, newest.c.ratio,
                   newest.c.p_value)
            .join(Run, Run.id == newest.c.run_id)
            .order_by(newest.c.created_at.desc(), newest.c.id.desc()))
    return _frame(engine, stmt)


def best_tflops(engine: Engine, run_ids: Sequence[int]) -> pd.DataFrame:
    """Best passing TFLOP/s of every variant in each of these runs (with the case count)."""
    if not run_ids:
        return pd.DataFrame(columns=["run_id", "variant", "best_tflops", "passed"])
    stmt = (select(Result.run_id, RESULT_LABEL,
                   func.max(Result.tflops).label("best_tflops"),
                   func.count().label("passed"))
            .join(Variant, Variant.id == Result.variant_id)
            .where(Result.run_id.in_(list(run_ids)), Result.status == "passed")
            .group_by(Result.run_id, Variant.name, Result.pass_name))
    return _frame(engine, stmt)


# --- history -----------------------------------------------------------------------------


def series(engine: Engine, variant: str, case_id: str, gpu: str,
           branch: str | None = None) -> pd.DataFrame:
    """One (variant, case, GPU) over time: one row per run, oldest first. `variant` is
    a label of `variant_names` (a backward's: "<variant> (bwd)")."""
    name, pass_name = split_label(variant)
    case_pk = select(CaseRow.id).where(CaseRow.case_id == case_id).scalar_subquery()
    stmt = (select(Run.id.label("run_id"), Run.commit, Run.parent_commit, Run.branch,
                   Run.created_at, Run.grids, Run.gpu_model_key,
                   Variant.source_hash, Result.status, Result.median_ms, Result.min_ms,
                   Result.iqr_ms, Result.rel_noise, Result.tflops, Result.flops,
                   Result.err_ratio, Result.out_err, Result.base_err)
            .join(Run, Run.id == Result.run_id)
            .join(Variant, Variant.id == Result.variant_id)
            .where(Variant.name == name, Result.pass_name == pass_name,
                   Result.case_pk == case_pk, Run.gpu_model_key == gpu)
            .order_by(Run.created_at, Run.id))
    if branch:
        stmt = stmt.where(Run.branch == branch)
    return _frame(engine, stmt)


def series_flags(engine: Engine, variant: str, case_id: str) -> pd.DataFrame:
    """Non-neutral verdicts recorded for one (variant, case), any run."""
    name, pass_name = split_label(variant)
    stmt = (select(Comparison.run_id, Comparison.base_run_id, Comparison.verdict,
                   Comparison.ratio, Comparison.p_value)
            .where(Comparison.variant == name, Comparison.pass_name == pass_name,
                   Comparison.case_id == case_id,
                   rarely(engine, Comparison.verdict.in_(FLAGGED + GOOD))))
    return _frame(engine, stmt)


def err_ratio_history(engine: Engine, variant: str, gpu: str) -> pd.DataFrame:
    """Worst error ratio and failure count of one variant per run on one GPU."""
    name, pass_name = split_label(variant)
    failed = func.sum(case((Result.status.in_(NOT_OK), 1), else_=0))
    stmt = (select(Run.id.label("run_id"), Run.commit, Run.parent_commit, Run.created_at,
                   cast(Run.grids, String).label("grids"),
                   func.max(Result.err_ratio).label("max_err_ratio"),
                   failed.label("not_ok"), func.count().label("cases"))
            .join(Run, Run.id == Result.run_id)
            .join(Variant, Variant.id == Result.variant_id)
            .where(Variant.name == name, Result.pass_name == pass_name,
                   Run.gpu_model_key == gpu)
            .group_by(Run.id, Run.commit, Run.parent_commit, Run.created_at,
                      cast(Run.grids, String))
            .order_by(Run.created_at, Run.id))
    return _frame(engine, stmt)


# --- one run -----------------------------------------------------------------------------


_RUN_COLUMNS = ("id", "uuid", "commit", "parent_commit", "branch", "created_at", "source",
                "gpu_name", "gpu_uuid", "gpu_model_key", "driver", "cuda", "torch", "cupy",
                "python", "hostname", "clocks", "calibration", "grids", "schema_version",
                "record_sha256", "env")
# Migration 0007's: a database not yet upgraded has no origins (its runs are trusted).
_ORIGIN_COLUMNS = ("origin", "trusted")


def run_detail(engine: Engine, run_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        have = {c["name"] for c in inspect(conn).get_columns(Run.__tablename__)}
        names = [*_RUN_COLUMNS, *(c for c in _ORIGIN_COLUMNS if c in have)]
        cols = [getattr(Run, c) for c in names]
        row = conn.execute(select(*cols).where(Run.id == run_id)).mappings().first()
    return None if row is None else dict(row)


def run_results(engine: Engine, run_id: int) -> pd.DataFrame:
    """Every result of one run, with its variant and case (thousands of rows at most)."""
    stmt = (select(RESULT_LABEL, Variant.kind, Variant.source_hash,
                   CaseRow.case_id, CaseRow.batch, CaseRow.heads, CaseRow.seqlen_q,
                   CaseRow.seqlen_k, CaseRow.head_dim, CaseRow.dtype, CaseRow.mask,
                   Result.status, Result.message, Result.out_err, Result.base_err,
                   Result.err_ratio, Result.lse_err, Result.median_ms, Result.min_ms,
                   Result.iqr_ms, Result.rel_noise, Result.tflops, Result.flops,
                   Result.bytes_model, Result.bytes_ideal, Result.bytes_read,
                   Result.bytes_write, Result.registers, Result.spills, Result.shared_bytes)
            .select_from(Result)
            .join(Variant, Variant.id == Result.variant_id)
            .join(CaseRow, CaseRow.id == Result.case_pk)
            .where(Result.run_id == run_id)
            .order_by(Variant.name, Result.pass_name, CaseRow.case_id))
    return _frame(engine, stmt)


def run_comparisons(engine: Engine, run_id: int) -> pd.DataFrame:
    stmt = (select(Comparison.base_run_id, COMPARISON_LABEL, Comparison.case_id,
                   Comparison.verdict, Comparison.ratio, Comparison.p_value)
            .where(Comparison.run_id == run_id))
    return _frame(engine, stmt)


def compile_resources(engine: Engine, run_id: int) -> pd.DataFrame:
    """Registers, spills and shared memory per variant in one run (worst over its cases)."""
    stmt = (select(Variant.name.label("variant"), Variant.source_hash,
                   func.max(Result.registers).label("registers"),
                   func.max(Result.spills).label("spills"),
                   func.max(Result.shared_bytes).label("shared_bytes"))
            .join(Variant, Variant.id == Result.variant_id)
            .where(Result.run_id == run_id)
            .group_by(Variant.name, Variant.source_hash)
            .order_by(Variant.name))
    return _frame(engine, stmt)


def run_failures(engine: Engine, run_id: int) -> pd.DataFrame:
    stmt = (select(RESULT_LABEL, CaseRow.case_id, Result.status,
                   Result.message, Result.err_ratio)
            .select_from(Result)
            .join(Variant, Variant.id == Result.variant_id)
            .join(CaseRow, CaseRow.id == Result.case_pk)
            .where(and_(Result.run_id == run_id, Result.status.in_(NOT_OK)))
            .order_by(Variant.name, Result.pass_name, CaseRow.case_id))
    return _frame(engine, stmt)
