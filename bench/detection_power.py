"""How well does the regression rule separate a real 3% slowdown from noise?

Synthetic sample sets stand in for two runs of one (kernel, case): each sample is the true
time times (1 + noise), noise with a 1.5% standard deviation. For each sample count per
side (the timing method stops after 10 to 50 samples) it reports the share of pairs
flagged as a regression when the new run is 3% slower (power, target >= 95%) and when
both runs are identical (false alarms, target <= 1%), for

- `harness.records.compare` (ratio beyond 2% AND Mann-Whitney U p < 0.01 AND separated median
  intervals AND beyond each run's own level range: rule 4, `level_bar`), the same without
  rule 4, and
- a plain 5% threshold on the ratio of medians (what many dashboards do).

Noise models: `gauss` (normal), `tailed` (normal plus 5% of samples 5-20% slow: preemption,
clock dips) and `drift` (gauss plus a per-run offset of 0.5% sd: the run-to-run shift no
sample count can average away; it bounds what any rule on one pair of runs can do) and
`levels` (gauss, each quarter of a run's samples at one of two levels 2% apart, drawn at
random: what an H100 showed in `ci` runs of 2026-12-06, results/h100-20261206).

    python bench/detection_power.py [--trials 2000] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.records.compare import DEFAULT_POLICY, Policy, compare_samples  # noqa: E402
from harness.records.sample_stats import level_bar  # noqa: E402

NOISE = 0.015
SLOWDOWN = 0.03


def draw(rng: np.random.Generator, n: int, scale: float, model: str) -> list[float]:
    z = rng.standard_normal(n) * NOISE
    if model == "tailed":
        hit = rng.random(n) < 0.05
        z = z + hit * rng.uniform(0.05, 0.20, n)
    if model == "drift":
        z = z + rng.standard_normal() * 0.005
    if model == "levels":
        z = z + 0.02 * np.repeat(rng.random(4) < 0.5, -(-n // 4))[:n]
    return list(scale * (1.0 + z))


def flagged_rule(base: list[float], new: list[float], policy: Policy, *,
                 levels: bool = True) -> bool:
    level = level_bar([base], new, policy.min_samples) if levels else None
    return compare_samples(base, new, policy, level=level)[0] == "regression"


def flagged_plain(base: list[float], new: list[float]) -> bool:
    return float(np.median(new)) / float(np.median(base)) > 1.05


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sizes", default="10,20,30,50")
    ap.add_argument("--models", default="gauss,tailed,drift,levels")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    sizes = [int(s) for s in args.sizes.split(",")]
    t0 = time.perf_counter()
    print(f"noise sd {NOISE:.1%} per sample, slowdown {SLOWDOWN:.0%}, {args.trials} pairs per "
          f"cell; policy {DEFAULT_POLICY}")
    print()
    print("| noise | samples/side | rule: 3% flagged | rule: identical flagged "
          "| without rule 4: 3% | without rule 4: identical "
          "| plain 5%: 3% flagged | plain 5%: identical flagged |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        for n in sizes:
            hit = fa = hit3 = fa3 = hit5 = fa5 = 0
            for _ in range(args.trials):
                base = draw(rng, n, 1.0, model)
                slow = draw(rng, n, 1.0 + SLOWDOWN, model)
                same = draw(rng, n, 1.0, model)
                hit += flagged_rule(base, slow, DEFAULT_POLICY)
                fa += flagged_rule(base, same, DEFAULT_POLICY)
                hit3 += flagged_rule(base, slow, DEFAULT_POLICY, levels=False)
                fa3 += flagged_rule(base, same, DEFAULT_POLICY, levels=False)
                hit5 += flagged_plain(base, slow)
                fa5 += flagged_plain(base, same)
            t = args.trials
            print(f"| {model} | {n} | {hit / t:.1%} | {fa / t:.2%} | {hit3 / t:.1%} "
                  f"| {fa3 / t:.2%} | {hit5 / t:.1%} | {fa5 / t:.2%} |")
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
