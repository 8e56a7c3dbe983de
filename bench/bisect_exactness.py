"""How often `fa-harness bisect` names the exact first bad commit of a ranged alert.

Each trial simulates one alert whose range holds 2-8 commits after its last good one
(uniform), one of them (uniform) the true first bad commit, from which on the whole
kernel is slower by the step (2% or 5%) on every case. The candidate has 8-16 cases
(uniform), each with its own level (log-uniform over 0.05-5 ms). Every measurement of a
commit draws each case's median afresh: its level times exp(noise), the noise a Student t
with 2 degrees of freedom (the fit of the committed H200 residuals, harness.records.steps)
scaled so that its spread (1.4826 x the median absolute deviation, the robust standard
deviation harness.records.noise uses) is 0.5%, 1% or 1.5%. `--common S` adds a shift of the
whole run drawn the same way at spread S (a runner's run-to-run drift; 0 by default).

The search is `harness.records.bisect.bisect_range` as the command line runs it: both
ends measured first, `--max-builds` (default 10) distinct commits at most. Exact: the
culprit named is the true first bad commit. Per band the table gives the fraction exact
(with its 95% Wilson interval), the fraction that named a wrong commit, that named none
(a bound hit), and the mean builds and measurements per alert.

The search's settings can be changed to see what each one is worth: `--end-runs`
(timings of each end, 3), `--min-runs` (of each commit between before it is classified,
1), `--repeats` (most timings of one commit, 3), `--z`, `--trim` (of either tail of the
per-case values, 0.2; 0 is the plain geometric mean), `--no-pool`.

    python bench/bisect_exactness.py [--trials 2000] [--seed 1] [--max-builds 10]
        [--z 2.0] [--repeats 3] [--end-runs 3] [--min-runs 1] [--trim 0.2] [--no-pool]
        [--common 0.0]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.records.bisect import END_RUNS, bisect_range  # noqa: E402

T2_SPREAD = 1.4826 * math.sqrt(2.0 / 3.0)  # 1.4826 x the median |t2|: t2's spread at scale 1


def t2(rng: random.Random) -> float:
    """A Student t draw with 2 degrees of freedom: normal over sqrt(chi2_2 / 2)."""
    return rng.gauss(0.0, 1.0) / math.sqrt(rng.expovariate(1.0))


def wilson(k: int, n: int, zq: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + zq * zq / n
    c = (p + zq * zq / (2 * n)) / d
    h = zq * math.sqrt(p * (1 - p) / n + zq * zq / (4 * n * n)) / d
    return c - h, c + h


def trial(rng: random.Random, step: float, spread: float, args: argparse.Namespace
          ) -> tuple[str, int, int]:
    n = rng.randint(2, 8)
    commits = [f"{i:040x}" for i in range(n + 1)]
    culprit = rng.randint(1, n)
    cases = {f"case{j}": math.exp(rng.uniform(math.log(0.05), math.log(5.0)))
             for j in range(rng.randint(8, 16))}
    scale = spread / T2_SPREAD
    common = args.common / T2_SPREAD
    calls = 0

    def measure(commit: str) -> dict[str, float]:
        nonlocal calls
        calls += 1
        slow = 1.0 + step if int(commit, 16) >= culprit else 1.0
        shift = common * t2(rng) if common else 0.0
        return {c: v * slow * math.exp(scale * t2(rng) + shift) for c, v in cases.items()}

    res = bisect_range(commits, measure, max_builds=args.max_builds, z=args.z,
                       max_repeats=args.repeats, pool=not args.no_pool, end_runs=args.end_runs,
                       min_runs=args.min_runs)
    outcome = ("exact" if res.culprit == commits[culprit] else
               "wrong" if res.culprit is not None else "none")
    return outcome, res.builds, calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-builds", type=int, default=10)
    ap.add_argument("--z", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-pool", action="store_true")
    ap.add_argument("--common", type=float, default=0.0)
    ap.add_argument("--end-runs", type=int, default=END_RUNS)
    ap.add_argument("--min-runs", type=int, default=None,
                    help="timings of a commit between (default: bisect_range's, sized "
                         "from the ends' runs)")
    ap.add_argument("--trim", type=float, default=None)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    if args.trim is not None:
        import harness.records.bisect as core
        core.TRIM = args.trim
    print(f"{args.trials} alerts per band; range 2-8 commits, 8-16 cases, t2 noise; "
          f"max builds {args.max_builds}, z {args.z:g}, repeats {args.repeats}, "
          f"end runs {args.end_runs}, min runs {args.min_runs or 'sized from the ends'}"
          + (", no pooling" if args.no_pool else "")
          + (f", common-mode spread {args.common:.1%}" if args.common else ""))
    print("| step | spread | exact | 95% interval | wrong | none | builds | measurements |")
    print("|---|---|---|---|---|---|---|---|")
    for step in (0.02, 0.05):
        for spread in (0.005, 0.01, 0.015):
            counts = {"exact": 0, "wrong": 0, "none": 0}
            builds = calls = 0
            for _ in range(args.trials):
                outcome, b, c = trial(rng, step, spread, args)
                counts[outcome] += 1
                builds += b
                calls += c
            n = args.trials
            lo, hi = wilson(counts["exact"], n)
            print(f"| {step:.0%} | {spread:.1%} | {counts['exact'] / n:.1%} | "
                  f"{lo:.1%}-{hi:.1%} | {counts['wrong'] / n:.1%} | {counts['none'] / n:.1%} | "
                  f"{builds / n:.1f} | {calls / n:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
