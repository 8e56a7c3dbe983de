"""How well the step detector (harness.records.steps) finds planted slowdowns in series
made of real H200 run-to-run noise, and how often it alerts on series with none.

The noise: every (candidate, source hash, pass, case, timing mode, kind of run) of the
committed H200 records (results/h200-*.json) timed in at least 3 runs, its log medians
minus their median: what moved between runs of unchanged code measured the same way. The series are sorted into bands
by their own spread (harness.records.noise.relative_spread); each band's residuals are
pooled. A trial draws `--length` commits from one band's pool (bootstrap), plants a step
of s% at a random commit (none for the A/A rows) and runs `find_steps`:
- detected: a regression step whose first bad commit is within 2 commits after the
  planted one (its last good commit at or before it);
- false alerts per commit: the steps found in A/A series, per commit.

    python bench/detection_steps.py [--trials 1000] [--length 30] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.records.noise import relative_spread  # noqa: E402
from harness.records.steps import find_steps  # noqa: E402

BANDS = ((0.0, 0.005, "spread < 0.5%"), (0.005, 0.015, "0.5-1.5%"), (0.015, 1.0, "> 1.5%"))
STEPS = (0.0, 0.01, 0.02, 0.03, 0.05)


def residual_pools(results: Path) -> dict[str, list[float]]:
    series: dict[tuple, list[tuple[str, float]]] = {}
    for p in sorted(results.glob("h200-*.json")):
        rec = json.loads(p.read_text())
        kernels = rec.get("kernels") or {}
        for e in rec["results"]:
            m = e.get("median_ms")
            if e.get("status") != "passed" or not m or m <= 0:
                continue
            src = (kernels.get(e["kernel"]) or {}).get("source_hash") or ""
            # Like with like: the same code, pass, case, timing mode and kind of run (a
            # gate's run and a perf run sample differently).
            key = (e["kernel"], src, e.get("pass") or "fwd", e["case_id"],
                   e.get("timing_mode"), tuple(rec.get("grids") or ()), rec.get("source"))
            series.setdefault(key, []).append((rec["created_at"], float(m)))
    pools: dict[str, list[float]] = {name: [] for *_, name in BANDS}
    for pts in series.values():
        if len(pts) < 3:
            continue
        meds = [m for _, m in sorted(pts)]
        s = relative_spread(meds) or 0.0
        logs = [math.log(m) for m in meds]
        mean = statistics.median(logs)
        for lo, hi, name in BANDS:
            if lo <= s < hi:
                pools[name] += [x - mean for x in logs]
    return pools


def trial(pool: list[float], step: float, length: int, rng: random.Random
          ) -> tuple[bool, int]:
    """(detected, false steps) of one series."""
    k = rng.randrange(length // 4, length - length // 4)
    meds = [math.exp(rng.choice(pool)) * ((1 + step) if (step and i >= k) else 1.0)
            for i in range(length)]
    commits = [f"c{i}" for i in range(length)]
    found = find_steps(commits, meds)
    if not step:
        return False, len(found)
    hit = any(s.direction == "regression" and k <= int(s.first_bad[1:]) <= k + 2
              and int(s.last_good[1:]) < k + 2 for s in found)
    return hit, 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--length", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    pools = residual_pools(ROOT / "results")
    rows = []
    print("| noise band | residuals | step | detected within 2 commits | false alerts per commit |")
    print("|---|---|---|---|---|")
    for *_, band in BANDS:
        pool = pools[band]
        if len(pool) < 10:
            print(f"| {band} | {len(pool)} | - | too few residuals | - |")
            continue
        for step in STEPS:
            hits = falses = 0
            for _ in range(args.trials):
                h, f = trial(pool, step, args.length, rng)
                hits += h
                falses += f
            det = "-" if not step else f"{hits / args.trials:.1%}"
            fa = f"{falses / (args.trials * args.length):.2%}" if not step else "-"
            rows.append({"band": band, "residuals": len(pool), "step": step,
                         "detected": None if not step else hits / args.trials,
                         "false_per_commit": falses / (args.trials * args.length)
                         if not step else None})
            print(f"| {band} | {len(pool)} | {step:.0%} | {det} | {fa} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"trials": args.trials, "length": args.length,
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
