"""How well the step detector (harness.records.steps) finds planted slowdowns in series
made of real H200 run-to-run noise, and how often it alerts on series with none.

The noise: every (candidate, source hash, pass, case, timing mode, kind of run) of the
committed H200 records (results/h200-*.json) timed in at least 3 runs, its log medians
minus their median: what moved between runs of unchanged code measured the same way. The
series are sorted into bands by their own spread (harness.records.noise.relative_spread);
each band's residuals are pooled. A trial draws `--length` commits from one band's pool
(bootstrap), plants a step of s% at a random commit (none for the A/A rows) and runs
`find_steps`:
- detected: a regression step whose first bad commit is within 2 commits after the
  planted one (its last good commit at or before it);
- false alerts per commit: the steps found in A/A series, per commit;
- misses, by cause: no change point near the planted commit ("no cut": none within 3
  commits), one that a rule rejected (the 1% floor, the spreads, the U test), or a step
  found whose first bad commit is before the planted one ("early") or more than 2 after;
- range: the mean number of commits from last good to first bad of the detected steps
  (1 for a step named exactly), what a bisect has left to search.

A series of an odd number of runs has one residual of exactly 0 (its own median), so the
pools hold more points exactly at the level than noise does (19% of the 0.5-1.5% band's);
`--exclude-median-points` leaves those out, a check of how much the table owes to them.

    python bench/detection_steps.py [--trials 1000] [--length 30] [--seed N]
        [--exclude-median-points] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.records.noise import relative_spread  # noqa: E402
from harness.records.steps import find_steps  # noqa: E402

BANDS = ((0.0, 0.005, "spread < 0.5%"), (0.005, 0.015, "0.5-1.5%"), (0.015, 1.0, "> 1.5%"))
STEPS = (0.0, 0.01, 0.02, 0.03, 0.05)
NEAR = 3  # a change point this close to the planted commit is the detector's try at it


def residual_pools(results: Path, *, exclude_median_points: bool = False
                   ) -> dict[str, list[float]]:
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
        res = [x - mean for x in logs]
        if exclude_median_points and len(logs) % 2:
            res.remove(0.0)
        for lo, hi, name in BANDS:
            if lo <= s < hi:
                pools[name] += res
    return pools


def trial(pool: list[float], step: float, length: int, rng: random.Random
          ) -> tuple[bool, int, str, int]:
    """(detected, false steps, why a planted step was missed ("" if it was not), the
    detected step's range in commits) of one series."""
    k = rng.randrange(length // 4, length - length // 4)
    meds = [math.exp(rng.choice(pool)) * ((1 + step) if (step and i >= k) else 1.0)
            for i in range(length)]
    commits = [f"c{i}" for i in range(length)]
    rejected: list[tuple[int, str]] = []
    found = find_steps(commits, meds, rejected=rejected)
    if not step:
        return False, len(found), "", 0
    regs = [(int(s.last_good[1:]), int(s.first_bad[1:])) for s in found
            if s.direction == "regression"]
    for lo, hi in regs:
        if k <= hi <= k + 2 and lo < k + 2:
            return True, 0, "", hi - lo
    near = [(abs(hi - k), lo, hi) for lo, hi in regs if abs(hi - k) <= 2 * NEAR]
    if near:
        return False, 0, "early" if min(near)[2] < k else "late", 0
    why = [(abs(b - k), rule) for b, rule in rejected if abs(b - k) <= NEAR]
    return False, 0, min(why)[1] if why else "no cut", 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--length", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--exclude-median-points", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    pools = residual_pools(ROOT / "results", exclude_median_points=args.exclude_median_points)
    rows = []
    print("| noise band | residuals | step | detected within 2 commits "
          "| false alerts per commit | misses (trials) | range (commits) |")
    print("|---|---|---|---|---|---|---|")
    for *_, band in BANDS:
        pool = pools[band]
        if len(pool) < 10:
            print(f"| {band} | {len(pool)} | - | too few residuals | - | - | - |")
            continue
        for step in STEPS:
            hits = falses = width = 0
            misses: Counter[str] = Counter()
            for _ in range(args.trials):
                h, f, why, w = trial(pool, step, args.length, rng)
                hits += h
                falses += f
                width += w
                if why:
                    misses[why] += 1
            det = "-" if not step else f"{hits / args.trials:.1%}"
            fa = f"{falses / (args.trials * args.length):.2%}" if not step else "-"
            why = ", ".join(f"{n} {c}" for c, n in misses.most_common()) if step else "-"
            rng_w = f"{width / hits:.2f}" if hits else "-"
            rows.append({"band": band, "residuals": len(pool), "step": step,
                         "detected": None if not step else hits / args.trials,
                         "false_per_commit": falses / (args.trials * args.length)
                         if not step else None,
                         "misses": dict(misses), "range": width / hits if hits else None})
            print(f"| {band} | {len(pool)} | {step:.0%} | {det} | {fa} | {why or '-'} "
                  f"| {rng_w} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"trials": args.trials, "length": args.length,
                                               "seed": args.seed, "rows": rows},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
