"""What a team's gate says at each commit of a long history: how often a commit that
changed nothing is red, and how soon a real slowdown is.

Each trial is a series of `--length` commits of one runner, stored and judged through
the real path of `fa-harness import` (harness.records.db.store.store_record, then
harness.records.baseline.judge_runs: the baseline, the noise model of the stored
history, the per-commit verdicts, the step search), exactly as `fa-harness ci` judges
the run it made. A commit's gate is red when any stored verdict of an owned candidate
fails (`Verdict.fails`: regression, correctness or precision), as GateOutcome.exit_code.

The runs: a committed `ci` record (`--template`: which owned candidates, passes and
cases the gate times by default, their samples) with each timed median, and its samples,
scaled per commit by exp(case residual + candidate residual [+ step]):
- the case residuals, drawn from the committed records' per-case log residuals of one
  noise band (bench/detection_steps.residual_pools: what moved between runs of
  unchanged code, series banded by their own spread);
- the candidate residual, one per commit and candidate, drawn from the same band's
  candidate pool (detection_steps.candidate_pools: the mean over a candidate's cases of
  one run's residuals), so the cases of one run move together as the real ones do (on an
  H100, fa3_wgmma's cases moved 0.58% run to run and their mean 0.52%). The case pool
  already holds a share of that common part, so each case is noisier here than in the
  records: a conservative simulation of false alarms.
- one chip (`--chips one`): every run on one GPU uuid, the pools of one chip's runs
  (`--per-chip` series); across chips (`--chips many`): a new GPU uuid every run and the
  pools of the whole committed history, as the project's H200 records are.
- each commit changes a candidate's source hash with probability `--source-changes`
  (a no-op for timing: the code of other candidates, docs, tests); a planted step always
  changes it (a step comes with a code change).
A planted step: the whole of one owned candidate (every case, both passes) or one case,
by 1, 2, 3 or 5%, from a commit in the last third of the series.

Reported per band: the share of no-op commits whose gate is red (per run, and per owned
candidate), the share of planted steps red at their own commit, and flagged within 2
commits (at the stepped candidate, or the stepped case).

    python bench/gate_verdicts.py [--trials 6] [--length 60] [--chips one|many|both]
        [--steps whole:2,case:5] [--bands all] [--json FILE] [--jobs 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import tempfile
import time
import uuid as uuidlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from detection_steps import BANDS, candidate_pools, residual_pools  # noqa: E402

TEMPLATE = "h100-20261206T135511Z-ci-aa1.json"
FAILING = ("regression", "correctness_regression", "precision_drift")


def _timed(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in rec["results"] if e.get("status") == "passed" and e.get("median_ms")]


def slim(template: dict[str, Any]) -> dict[str, Any]:
    """The template's timed entries only: a correctness-only entry is judged the same at
    every commit here (same status, same errors), and storing 150 of them a run would
    spend most of the benchmark's time."""
    return {**template, "results": _timed(template)}


def make_run(template: dict[str, Any], i: int, gpu: str, factors: dict[tuple, float],
             sources: dict[str, str], start: datetime) -> dict[str, Any]:
    """Commit `i` of a series: the template with its timed medians and samples scaled."""
    rec = copy.deepcopy(template)
    rec["uuid"] = str(uuidlib.uuid4())
    rec["commit"] = f"{i:040x}"
    rec["parent"] = f"{i - 1:040x}" if i else None
    rec["branch"] = "main"
    rec["created_at"] = (start + timedelta(minutes=10 * i)).isoformat()
    rec["gpu"] = {**rec["gpu"], "uuid": gpu}
    for name, src in sources.items():
        rec["kernels"][name] = {**rec["kernels"][name], "source_hash": src}
    for e in _timed(rec):
        f = factors[(e["kernel"], e.get("pass") or "fwd", e["case_id"])]
        e["median_ms"] *= f
        e["samples_ms"] = [x * f for x in e.get("samples_ms") or []]
        for k in ("min_ms", "iqr_ms"):
            if e.get(k) is not None:
                e[k] *= f
    return rec


def series(template: dict[str, Any], pools: tuple[list[float], list[float]], *, length: int,
           chips: str, step: tuple[str, float] | None, source_changes: float,
           rng: random.Random, confirm_runs: int = 0, with_parent: bool = True,
           same_chip: tuple[list[float], list[float]] | None = None
           ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of one trial and what was planted (module doc). With `confirm_runs`,
    each run also carries (under "_confirm") what that many confirmation runs of each
    candidate-pass would read at that commit, for two rounds: fresh draws of the case and
    candidate residuals (a fresh timing child draws its level anew), the step included,
    and (under "_parent") what as many timings of the parent commit's code on the same
    runner would read (harness.runs.gate_confirm). Across chips those stay on the run's
    chip: its first run's factor moved by the difference of two runs of one chip, drawn
    from `same_chip` (the band's one-chip pools). Drawn from generators of their own, so
    a seed gives the same series with or without."""
    case_pool, cand_pool = pools
    owned = sorted(k for k, v in template["kernels"].items() if v.get("owned"))
    keys = sorted({(e["kernel"], e.get("pass") or "fwd", e["case_id"]) for e in _timed(template)})
    groups = sorted({k[:2] for k in keys})
    k0 = rng.randrange(2 * length // 3, length - 2)
    planted: dict[str, Any] = {"commit": k0, "kind": None}
    if step:
        kind, size = step
        victim = rng.choice([k for k in owned if any(x[0] == k for x in keys)])
        case = rng.choice([x for x in keys if x[0] == victim]) if kind == "case" else None
        planted.update(kind=kind, size=size, variant=victim, case=case)
    sources = {k: f"src{rng.randrange(1 << 30):08x}" for k in template["kernels"]}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    one = f"GPU-{uuidlib.UUID(int=rng.getrandbits(128))}"
    runs = []
    factors_of: list[dict[tuple[str, str, str], float]] = []
    for i in range(length):
        for name in sources:
            if rng.random() < source_changes or (step and i == k0 and name == planted["variant"]):
                sources[name] = f"src{rng.randrange(1 << 30):08x}"
        common = {g: rng.choice(cand_pool) for g in groups}
        factors = {}
        for key in keys:
            f = math.exp(rng.choice(case_pool) + common[key[:2]])
            if step and i >= k0 and key[0] == planted["variant"] and (
                    planted["kind"] == "whole" or key == planted["case"]):
                f *= 1.0 + planted["size"]
            factors[key] = f
        gpu = one if chips == "one" else f"GPU-{uuidlib.UUID(int=rng.getrandbits(128))}"
        factors_of.append(factors)
        runs.append(make_run(template, i, gpu, factors, dict(sources), start))
    if confirm_runs:
        from harness.records.confirm import MAX_CONFIRM_RUNS

        crng = random.Random(f"{one}-{k0}")
        base = {(e["kernel"], e.get("pass") or "fwd", e["case_id"]): e["median_ms"]
                for e in _timed(template)}
        prng = random.Random(f"{one}-{k0}-parent")
        chip_case, chip_cand = same_chip or pools

        def stepped(key: tuple[str, str, str], at: int) -> float:
            hit = step and at >= k0 and key[0] == planted["variant"] and (
                planted["kind"] == "whole" or key == planted["case"])
            return 1.0 + planted["size"] if hit else 1.0

        def level(g: tuple[str, str], r: random.Random, cp: list[float], cc: list[float]
                  ) -> dict[tuple[str, str, str], float]:
            common = r.choice(cc)
            return {key: r.choice(cp) + common for key in keys if key[:2] == g}

        def draw(g: tuple[str, str], i: int, at: int, r: random.Random,
                 first: dict[tuple[str, str, str], float] | None) -> dict[str, list[float]]:
            """What `confirm_runs` + MAX_CONFIRM_RUNS fresh runs (two rounds, the second
            at most that long) of group g on run i's runner read at commit `at`'s code.
            One chip: fresh draws. Across chips the runner's chip stays: run i's factor
            moved by the difference of two runs of one chip (`first`: the one-chip
            level of run i's own timing)."""
            draws = [level(g, r, chip_case, chip_cand)
                     for _ in range(confirm_runs + MAX_CONFIRM_RUNS)]
            out = {}
            for key in (k for k in keys if k[:2] == g):
                if first is None:
                    out[key[2]] = [base[key] * math.exp(x[key]) * stepped(key, at)
                                   for x in draws]
                else:
                    chip = factors_of[i][key] / stepped(key, i)
                    out[key[2]] = [base[key] * chip * math.exp(x[key] - first[key])
                                   * stepped(key, at) for x in draws]
            return out

        for i, rec in enumerate(runs):
            rec["_first"] = confirm_runs  # the first round's size
            # The commit's own code, and (the gate times it in a worktree on the same
            # runner) its parent's.
            for g in groups:
                first = None if chips == "one" else level(g, crng, chip_case, chip_cand)
                rec.setdefault("_confirm", {})[f"{g[0]}|{g[1]}"] = draw(g, i, i, crng, first)
                if i and with_parent:
                    rec.setdefault("_parent", {})[f"{g[0]}|{g[1]}"] = draw(g, i, i - 1, prng,
                                                                           first)
    return runs, planted


def judge_series(runs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Store and judge every run as `fa-harness import` does; the verdicts per commit."""
    from sqlalchemy import select

    from harness.records.baseline import judge_runs
    from harness.records.confirm import (
        across_suspects,
        extend,
        preliminary,
        step_suspects,
        suspects,
        with_confirmations,
    )
    from harness.records.db.models import Comparison
    from harness.records.db.store import open_db, store_record
    from harness.records.record import RunRecord

    out = []
    with tempfile.TemporaryDirectory() as tmp, open_db(f"sqlite:///{tmp}/g.sqlite") as db:
        for rec in runs:
            more, parent = rec.get("_confirm"), rec.get("_parent")
            record = RunRecord.from_dict({k: v for k, v in rec.items()
                                          if k not in ("_confirm", "_parent", "_first")})
            found, again = [], []
            if more:  # the gate's confirmation runs (harness.runs.gate_confirm)
                report = preliminary(db, record)
                steps = step_suspects(db, record) if report else []
                if parent is not None and report is not None:  # across chips: all changed
                    steps += across_suspects(db, record)
                found = suspects(report, steps=steps)
                first = rec["_first"]
                _add(record, found, more, parent, 0, first, with_confirmations)
                again = extend(preliminary(db, record), found, first)
                _add(record, again, more, parent, first, first, with_confirmations)
            rid = store_record(db, record)
            judge_runs(db, [rid])
            with db.session() as s:
                rows = s.execute(
                    select(Comparison.variant, Comparison.pass_name, Comparison.case_id,
                           Comparison.verdict, Comparison.ratio, Comparison.detail)
                    .where(Comparison.run_id == rid)).all()
            out.append([{"kernel": n, "pass": p or "fwd", "case": c, "verdict": v, "ratio": r,
                         "detail": d} for n, p, c, v, r, d in rows]
                       + [{"kernel": None, "confirmed": f"{s.variant}|{s.pass_name}"}
                          for s in found]
                + [{"kernel": None, "extended": f"{s.variant}|{s.pass_name}"}
                   for s in again])
    return out


def _add(record: Any, found: list[Any], more: dict[str, Any], parent: dict[str, Any] | None,
         at: int, first: int, with_confirmations: Any) -> None:
    """A round of the confirmation runs of the suspects `found`: of each drawn list, the
    runs from `at` on, as many as the round times (`first`, or a second round's
    `Suspect.runs`)."""
    for what, field in ((more, "confirm_ms"), (parent or {}, "parent_ms")):
        got = {}
        for s in found:
            if field == "parent_ms" and s.step:
                continue  # no parent for a step
            for cid, ms in what.get(f"{s.variant}|{s.pass_name}", {}).items():
                n = max(first, s.runs or first) if at else first
                got[(s.variant, s.pass_name, cid)] = ms[at:at + n]
        with_confirmations(record, got, field)


def score(template: dict[str, Any], verdicts: list[list[dict[str, Any]]],
          planted: dict[str, Any]) -> dict[str, Any]:
    owned = {k for k, v in template["kernels"].items() if v.get("owned")}
    k0 = planted["commit"]
    noop = [i for i in range(1, len(verdicts)) if not planted["kind"] or not
            (k0 <= i <= k0 + 2)]
    def false(i: int, v: dict[str, Any]) -> bool:
        # The planted step's own verdicts after its window are a late call of a real
        # step, not a false alarm ("late").
        return v["verdict"] in FAILING and v["kernel"] in owned and not (
            _of_step(v, planted) and i > k0)

    confirmed = sum(1 for i in range(1, len(verdicts)) if any(
        v["kernel"] is None for v in verdicts[i]))
    extended = sum(1 for i in range(1, len(verdicts)) if any(
        v["kernel"] is None and "extended" in v for v in verdicts[i]))
    verdicts = [[v for v in vs if v["kernel"] is not None] for vs in verdicts]
    red = [i for i in noop if any(false(i, v) for v in verdicts[i])]
    late = [i for i in noop if i > k0 and not any(false(i, v) for v in verdicts[i]) and any(
        v["verdict"] in FAILING for v in verdicts[i])]
    per_cand = Counter(v["kernel"] for i in noop for v in verdicts[i] if false(i, v))
    out: dict[str, Any] = {"noop": len(noop), "red": len(red), "late": len(late),
                           "confirmed": confirmed, "extended": extended,
                           "red_candidates": dict(per_cand),
                           "candidate_commits": len(noop) * len(owned)}
    if planted["kind"]:
        def hit(i: int) -> bool:
            return any(v["verdict"] == "regression" and v["kernel"] == planted["variant"]
                       and (planted["kind"] == "whole" or
                            (v["pass"], v["case"]) == planted["case"][1:])
                       for v in verdicts[i])
        out["at_commit"] = hit(k0)
        out["within_2"] = any(hit(i) for i in range(k0, min(k0 + 3, len(verdicts))))
    return out


def _of_step(v: dict[str, Any], planted: dict[str, Any]) -> bool:
    """Whether verdict `v` is of the planted step's candidate (or case)."""
    return bool(planted["kind"]) and v["kernel"] == planted["variant"] and (
        planted["kind"] == "whole" or (v["pass"], v["case"]) == tuple(planted["case"][1:]))


def _show(template: dict[str, Any], verdicts: list[list[dict[str, Any]]],
          planted: dict[str, Any]) -> None:
    owned = {k for k, v in template["kernels"].items() if v.get("owned")}
    for i, vs in enumerate(verdicts):
        if planted["kind"] and planted["commit"] <= i <= planted["commit"] + 2:
            continue
        for v in vs:
            if v["verdict"] in FAILING and v["kernel"] in owned and not (
                    _of_step(v, planted) and i > planted["commit"]):
                d = v["detail"] or {}
                print(f"  commit {i}: {v['kernel']} {v['pass']} {v['case']} {v['ratio']:.4f} "
                      f"{ {k: d.get(k) for k in ('step', 'candidate', 'p_slower', 'history', 'run_to_run_spread', 'spread_pairs', 'base_window_runs', 'threshold') if k in d} }")


def _show_missed(verdicts: list[list[dict[str, Any]]], planted: dict[str, Any]) -> None:
    """The stepped candidate's timed verdicts from the step's commit to 2 after it."""
    k0 = planted["commit"]
    print(f"  missed: {planted['kind']} {planted['size']:.0%} of {planted['variant']} "
          f"{planted.get('case') or ''} at commit {k0}")
    for i in range(k0, min(k0 + 3, len(verdicts))):
        for v in verdicts[i]:
            if v["kernel"] != planted["variant"] or (
                    planted["kind"] == "case" and (v["pass"], v["case"]) !=
                    tuple(planted["case"][1:])):
                continue
            d = v["detail"] or {}
            print(f"    commit {i}: {v['pass']} {v['case']} {v['verdict']} "
                  f"{(v['ratio'] or 0):.4f} p={d.get('p_slower')} "
                  f"spread={d.get('run_to_run_spread')} bar={d.get('threshold')} "
                  f"window={d.get('base_window_runs')}")


def _show_late(verdicts: list[list[dict[str, Any]]], planted: dict[str, Any]) -> None:
    """The stepped candidate's verdicts at the step's commit, where it was not red there:
    each case's ratio, p, runs and window, and whether it was timed again."""
    k0 = planted["commit"]
    marks = [v for v in verdicts[k0] if v["kernel"] is None]
    name = planted["variant"]
    rounds = [m for m in marks if name in (m.get("confirmed") or m.get("extended") or "")]
    print(f"  late: whole {planted['size']:.0%} of {name} at commit {k0}; timed again: "
          f"{[(m.get('confirmed') and 'round 1') or 'round 2' for m in rounds] or 'no'}")
    for v in verdicts[k0]:
        if v["kernel"] != name:
            continue
        d = v["detail"] or {}
        print(f"    {v['pass']} {v['case']} {v['verdict']} {(v['ratio'] or 0):.4f} "
              f"p={d.get('p_slower')} runs={d.get('runs')} window={d.get('base_window_runs')} "
              f"spread={d.get('run_to_run_spread')}")


def _tails(results: Path) -> None:
    """How heavy the tails of real run-to-run noise are (harness.records.verdict_stats, 5.):
    each pool's residuals in robust spreads (1.4826 x median |r|; exact zeros, a series'
    own median point, left out), the share beyond 3 and 5 spreads, and a Student t fit."""
    import numpy as np
    from scipy import stats

    print("| chips | pool | band | residuals | beyond 3 spreads | beyond 5 | t fit: df |")
    print("|---|---|---|---|---|---|---|")
    for per_chip in (True, False):
        for name, pools in (("case", residual_pools(results, per_chip=per_chip, judged=True,
                                                    pattern="h*-*.json")),
                            ("candidate", candidate_pools(results, per_chip=per_chip,
                                                          judged=True, pattern="h*-*.json"))):
            for band, pool in pools.items():
                x = np.array([r for r in pool if r != 0.0])
                if len(x) < 10:
                    continue
                z = x / (1.4826 * float(np.median(np.abs(x))))
                df = stats.t.fit(z, floc=0)[0]
                print(f"| {'one' if per_chip else 'many'} | {name} | {band} | {len(x)} "
                      f"| {np.mean(np.abs(z) > 3):.1%} | {np.mean(np.abs(z) > 5):.1%} "
                      f"| {df:.2g} |")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=6, help="series per band and step")
    ap.add_argument("--length", type=int, default=60)
    ap.add_argument("--chips", choices=("one", "many", "both"), default="both")
    ap.add_argument("--steps", default="none,whole:0.01,whole:0.02,whole:0.03,whole:0.05,"
                                        "case:0.01,case:0.02,case:0.03,case:0.05")
    ap.add_argument("--source-changes", type=float, default=0.3)
    ap.add_argument("--template", default=TEMPLATE)
    ap.add_argument("--seed", type=int, default=20261206)
    ap.add_argument("--json", default=None)
    ap.add_argument("--show-red", action="store_true", help="print each false red verdict")
    ap.add_argument("--bands", default="all",
                    help="comma-separated band names (as printed), or all")
    ap.add_argument("--tails", action="store_true",
                    help="first, Student t fits of the residual pools in robust spreads")
    ap.add_argument("--show-missed", action="store_true",
                    help="print the stepped candidate's verdicts where a step was missed")
    ap.add_argument("--show-late", action="store_true",
                    help="print the stepped candidate's verdicts where a step was not red "
                         "at its commit")
    ap.add_argument("--draw-only", default="",
                    help="steps (as in --steps) whose series are drawn but not judged: "
                         "the rows after them get the series they would have")
    ap.add_argument("--no-parent", action="store_true",
                    help="confirmation runs without the parent commit's timings")
    ap.add_argument("--confirm-runs", type=int, default=None,
                    help="confirmation runs of a suspect candidate (default: the gate's, "
                         "harness.records.confirm.CONFIRM_RUNS; 0: none)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="series judged side by side (each in a process of its own)")
    args = ap.parse_args(argv)
    if args.confirm_runs is None:
        from harness.records.confirm import CONFIRM_RUNS

        args.confirm_runs = CONFIRM_RUNS
    rng = random.Random(args.seed)
    results = ROOT / "results"
    template = slim(json.loads((results / args.template).read_text()))
    if args.tails:
        _tails(results)
    steps: list[tuple[str, float] | None] = []
    for s in args.steps.split(","):
        steps.append(None if s == "none" else (s.split(":")[0], float(s.split(":")[1])))
    rows = []
    print("| chips | band | step | series | no-op commits | red (share) "
          "| owned candidate-commits red | red at its commit | flagged within 2 "
          "| its step red later | commits with confirmation runs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for chips in (("one", "many") if args.chips == "both" else (args.chips,)):
        per_chip = chips == "one"
        cases = residual_pools(results, per_chip=per_chip, judged=True, pattern="h*-*.json")
        cands = candidate_pools(results, per_chip=per_chip, judged=True, pattern="h*-*.json")
        one_cases = residual_pools(results, per_chip=True, judged=True, pattern="h*-*.json")
        one_cands = candidate_pools(results, per_chip=True, judged=True, pattern="h*-*.json")
        for *_, band in BANDS:
            if args.bands != "all" and band not in args.bands.split(","):
                continue
            if len(cases[band]) < 10 or len(cands[band]) < 10:
                print(f"| {chips} | {band} | - | too few residuals "
                      f"({len(cases[band])}, {len(cands[band])}) | | | | | | | |")
                continue
            for step in steps:
                t0 = time.monotonic()
                tot: Counter[str] = Counter()
                # Every series is drawn first, in order, so a seed gives the same
                # series whatever --jobs is.
                drawn = [series(template, (cases[band], cands[band]), length=args.length,
                                chips=chips, step=step, source_changes=args.source_changes,
                                rng=rng, confirm_runs=args.confirm_runs,
                                with_parent=not args.no_parent,
                                same_chip=(one_cases[band], one_cands[band]))
                         for _ in range(args.trials)]
                label = "none" if step is None else f"{step[0]}:{step[1]:g}"
                if label in args.draw_only.split(","):
                    continue  # drawn, so the rows after it get the same series
                with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
                    judged = list(pool.map(judge_series, [runs for runs, _ in drawn]))
                for (_runs, planted), verdicts in zip(drawn, judged, strict=True):
                    judged_all = verdicts
                    sc = score(template, verdicts, planted)
                    verdicts = [[v for v in vs if v["kernel"] is not None] for vs in verdicts]
                    if args.show_red:
                        _show(template, verdicts, planted)
                    if args.show_missed and planted["kind"] and not sc["within_2"]:
                        _show_missed(verdicts, planted)
                    if args.show_late and planted["kind"] and not sc["at_commit"]:
                        _show_late(judged_all, planted)
                    tot.update({"noop": sc["noop"], "red": sc["red"], "late": sc["late"],
                                "cand": sc["candidate_commits"],
                                "cand_red": sum(sc["red_candidates"].values()),
                                "confirmed": sc["confirmed"], "commits": len(verdicts) - 1,
                                "extended": sc["extended"],
                                "at": sc.get("at_commit", 0), "w2": sc.get("within_2", 0)})
                name = "none" if step is None else f"{step[0]} {step[1]:.0%}"
                at = "-" if step is None else f"{tot['at'] / args.trials:.0%}"
                w2 = "-" if step is None else f"{tot['w2'] / args.trials:.0%}"
                row = {"chips": chips, "band": band, "step": name, "series": args.trials,
                       "noop": tot["noop"], "red": tot["red"],
                       "candidate_commits": tot["cand"], "candidate_red": tot["cand_red"],
                       "at_commit": None if step is None else tot["at"] / args.trials,
                       "within_2": None if step is None else tot["w2"] / args.trials,
                       "late": tot["late"], "confirmed": tot["confirmed"],
                       "extended": tot["extended"],
                       "confirm_runs": args.confirm_runs, "parent": not args.no_parent,
                       "seconds": round(time.monotonic() - t0, 1)}
                rows.append(row)
                print(f"| {chips} | {band} | {name} | {args.trials} | {tot['noop']} "
                      f"| {tot['red']} ({tot['red'] / max(tot['noop'], 1):.1%}) "
                      f"| {tot['cand_red']} of {tot['cand']} | {at} | {w2} "
                      f"| {'-' if step is None else tot['late']} "
                      f"| {tot['confirmed']} of {tot['commits']} "
                      f"({tot['extended']} two rounds) |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1)
                                   + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
