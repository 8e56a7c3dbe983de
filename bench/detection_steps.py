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

`--source-changes Q`: each commit changes the candidate's source with probability Q, the
planted step's commit always (a step comes with a change to the code), and the detector
is told which (its prior of where a step began); without it the detector knows nothing of
sources. In the committed H200 records 22 of 74 consecutive commits of a candidate (30%)
changed its source hash.

A series of an odd number of runs has one residual of exactly 0 (its own median), so the
pools hold more points exactly at the level than noise does (19% of the 0.5-1.5% band's);
`--exclude-median-points` leaves those out, a check of how much the table owes to them.

`--yardstick NAME`: does a ratio to a yardstick timed in the same run take out the
chip-to-chip and run-to-run noise? NAME is a peer (`sdpa_flash`, `sdpa_cudnn`, ...),
`peers` (the geometric mean of the SDPA peers the run timed) or `others` (of every other
kernel it timed: a common-mode run effect), on the same pass, case and timing mode, at
one source hash across the series (a yardstick whose code changed would show as a step).
Only the runs that timed it count. First the run-to-run spreads of those series, raw and
normalised; then the table twice over the same series, banded by their raw spread: the
raw medians, and the medians over the yardstick's. Both pools are built the same way (log
residuals about the series' median), and a planted step scales the candidate only: the
normalised series moves by the whole step, its yardstick not at all.

`--judged`: only the series of the candidates the gate judges (every candidate but the
SDPA peers, which it times as yardsticks and never flags); most of the noisiest band's
series are the peers' short decode shapes.

`--records GLOB` pools other records (`h100-*.json`: the H100 runs); `--per-chip` keys each
series by the GPU's uuid as well, so its residuals are what one chip's runs moved by: the
noise of a team's fixed runner, where the committed history mixes a new chip almost every
run.

    python bench/detection_steps.py [--trials 1000] [--length 30] [--seed N]
        [--exclude-median-points] [--yardstick NAME] [--common-mode] [--per-candidate]
        [--source-changes Q] [--judged] [--records GLOB] [--per-chip] [--json FILE]
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.records.noise import relative_spread  # noqa: E402
from harness.records.steps import MIN_CASES, find_steps  # noqa: E402

BANDS = ((0.0, 0.005, "spread < 0.5%"), (0.005, 0.015, "0.5-1.5%"), (0.015, 1.0, "> 1.5%"))
STEPS = (0.0, 0.01, 0.02, 0.03, 0.05)
RECORDS = "h200-*.json"  # the records pooled unless --records names others
NEAR = 3  # a change point this close to the planted commit is the detector's try at it


def _entries(rec: dict) -> dict[tuple, tuple[float, str]]:
    """(kernel, pass, case, timing mode) -> (median, source hash) of a record's passed,
    timed results."""
    kernels = rec.get("kernels") or {}
    out = {}
    for e in rec["results"]:
        m = e.get("median_ms")
        if e.get("status") == "passed" and m and m > 0:
            src = (kernels.get(e["kernel"]) or {}).get("source_hash") or ""
            out[(e["kernel"], e.get("pass") or "fwd", e["case_id"], e.get("timing_mode"))] = \
                (float(m), src)
    return out


def _yardstick_names(rec: dict, yardstick: str, kernel: str) -> list[str]:
    """The kernels a `yardstick` stands for in `rec`: one peer by name, "peers" (every
    SDPA peer) or "others" (every other kernel of the run: a common-mode run effect)."""
    if yardstick not in ("peers", "others"):
        return [yardstick] if yardstick != kernel else []
    kinds = {k: (v or {}).get("kind") for k, v in (rec.get("kernels") or {}).items()}
    return [k for k in sorted(kinds) if k != kernel and (
        yardstick == "others" or kinds[k] == "peer" or k.startswith("sdpa_"))]


def timed_series(results: Path, yardstick: str | None = None, *, judged: bool = False,
                 pattern: str = RECORDS, per_chip: bool = False
                 ) -> dict[tuple, list[tuple[str, float, float]]]:
    """Like with like: (candidate, source, pass, case, timing mode, grids, kind of run) ->
    [(created_at, median, yardstick median)], oldest first. With `yardstick` (a peer's
    name, or "peers": the geometric mean of the SDPA peers timed in the run), only the
    runs that timed it on the same pass, case and timing mode count, and the key also
    holds which yardsticks at which source hashes (an unchanged yardstick: a series
    normalised by a yardstick whose code changed would show that change as a step);
    without one the yardstick median is 1. `judged`: only the candidates the gate
    judges, not the SDPA peers (yardsticks: harness.candidates.registry.owned).
    `pattern`: the records read (file names under `results`); `per_chip`: the key also
    holds the GPU's uuid, so a series is one chip's runs (a fixed runner)."""
    series: dict[tuple, list[tuple[str, float, float]]] = {}
    for p in sorted(results.glob(pattern)):
        rec = json.loads(p.read_text())
        entries = _entries(rec)
        kinds = {k: (v or {}).get("kind") for k, v in (rec.get("kernels") or {}).items()}
        for (kernel, pass_name, case, mode), (m, src) in entries.items():
            if judged and kinds.get(kernel, "peer") == "peer":
                continue
            yard, ident = 1.0, ()
            if yardstick:
                names = [n for n in _yardstick_names(rec, yardstick, kernel)
                         if (n, pass_name, case, mode) in entries]
                if not names or kernel.startswith("sdpa_"):  # the peers are yardsticks
                    continue
                ys = [entries[(n, pass_name, case, mode)] for n in names]
                yard = math.exp(statistics.fmean(math.log(y) for y, _ in ys))
                ident = tuple((n, h) for n, (_, h) in zip(names, ys, strict=True))
            chip = (rec.get("gpu") or {}).get("uuid") if per_chip else None
            key = (kernel, src, pass_name, case, mode, tuple(rec.get("grids") or ()),
                   rec.get("source"), chip, ident)
            series.setdefault(key, []).append((rec["created_at"], m, yard))
    return {k: sorted(v) for k, v in series.items() if len(v) >= 3}


def band_of(spread: float) -> str:
    return next(name for lo, hi, name in BANDS if lo <= spread < hi)


def residual_pools(results: Path, *, exclude_median_points: bool = False,
                   yardstick: str | None = None, normalised: bool = False,
                   judged: bool = False, pattern: str = RECORDS,
                   per_chip: bool = False) -> dict[str, list[float]]:
    """Each band's pooled log residuals (module doc). `normalised`: of the candidate's
    median over its yardstick's in the same run; the band is the raw series' spread
    either way, so the raw and normalised pools of one yardstick hold the same series."""
    pools: dict[str, list[float]] = {name: [] for *_, name in BANDS}
    for pts in timed_series(results, yardstick, judged=judged, pattern=pattern,
                            per_chip=per_chip).values():
        raw = [m for _, m, _ in pts]
        meds = [m / y for _, m, y in pts] if normalised else raw
        logs = [math.log(m) for m in meds]
        mean = statistics.median(logs)
        res = [x - mean for x in logs]
        if exclude_median_points and len(logs) % 2:
            res.remove(0.0)
        pools[band_of(relative_spread(raw) or 0.0)] += res
    return pools


def candidate_pools(results: Path, *, min_cases: int = MIN_CASES, judged: bool = False,
                    pattern: str = RECORDS, per_chip: bool = False
                    ) -> dict[str, list[float]]:
    """Each band's pooled residuals of candidates, not cases: per (candidate, source,
    pass, timing mode, grids, kind of run) timed in at least 3 runs, the mean over its
    cases of each run's log residual (about the case's own median), so whatever the cases of one run share (the chip, its clock, the
    run's state) stays in. A code change moves every case of the candidate at once; this
    is the noise of their mean (harness.records.steps.candidate_series). Banded by the
    median spread of the cases themselves, so a band holds the candidates whose cases
    are that noisy. A run counts with the cases it timed (at least `min_cases`)."""
    groups: dict[tuple, dict[str, list[tuple[str, float]]]] = {}
    for key, pts in timed_series(results, judged=judged, pattern=pattern,
                                 per_chip=per_chip).items():
        logs = [math.log(m) for _, m, _ in pts]
        mid = statistics.median(logs)
        groups.setdefault(key[:3] + key[4:], {})[key[3]] = [
            (when, x - mid) for (when, _, _), x in zip(pts, logs, strict=True)]
    pools: dict[str, list[float]] = {name: [] for *_, name in BANDS}
    for cases in groups.values():
        per_run: dict[str, list[float]] = {}
        for pts in cases.values():
            for when, r in pts:
                per_run.setdefault(when, []).append(r)
        mean = [statistics.fmean(v) for v in per_run.values() if len(v) >= min_cases]
        if len(mean) < 3:
            continue
        mid = statistics.median(mean)
        spread = statistics.median(relative_spread([math.exp(r) for _, r in pts]) or 0.0
                                   for pts in cases.values())
        pools[band_of(spread)] += [x - mid for x in mean]
    return pools


def spreads(results: Path, yardstick: str, pattern: str = RECORDS
            ) -> dict[str, list[tuple[float, float, float, list[tuple[float, float]]]]]:
    """Per band (of the raw spread), each series that has the yardstick: its run-to-run
    spread raw, normalised and the yardstick's own (harness.records.noise.relative_spread),
    and the (candidate, yardstick) log residuals of its runs. A ratio is quieter than the
    candidate only where the two residuals are correlated: the variance of the ratio's is
    var(c) + var(y) - 2 cov(c, y)."""
    out: dict[str, list] = {name: [] for *_, name in BANDS}
    for pts in timed_series(results, yardstick, pattern=pattern).values():
        raw = relative_spread([m for _, m, _ in pts]) or 0.0
        c = [math.log(m) for _, m, _ in pts]
        y = [math.log(v) for _, _, v in pts]
        mc, my = statistics.median(c), statistics.median(y)
        out[band_of(raw)].append((raw, relative_spread([m / v for _, m, v in pts]) or 0.0,
                                  relative_spread([v for _, _, v in pts]) or 0.0,
                                  [(a - mc, b - my) for a, b in zip(c, y, strict=True)]))
    return out


def _spread_table(results: Path, yardstick: str, pattern: str = RECORDS) -> None:
    import numpy as np

    print(f"| noise band (raw spread) | series | run-to-run spread, median: raw "
          f"| / {yardstick} | the yardstick's own | lower normalised "
          f"| correlation of residuals |")
    print("|---|---|---|---|---|---|---|")
    for band, rows in spreads(results, yardstick, pattern).items():
        if not rows:
            continue
        res = np.array([r for *_, rs in rows for r in rs])
        corr = float(np.corrcoef(res[:, 0], res[:, 1])[0, 1])
        print(f"| {band} | {len(rows)} | {statistics.median(r[0] for r in rows):.3%} "
              f"| {statistics.median(r[1] for r in rows):.3%} "
              f"| {statistics.median(r[2] for r in rows):.3%} "
              f"| {sum(r[1] < r[0] for r in rows)} | {corr:.2f} ({len(res)} runs) |")
    print()


def common_mode(results: Path, pattern: str = RECORDS) -> dict[str, Any]:
    """Is the run-to-run noise common to the kernels of a run? From the log residuals of
    the raw series (about each series' median): the correlation of two kernels' residuals
    on the same case in the same run (every pair, and pairs whose medians both exceed
    0.1 ms), the run effect (each run's median residual over its series), and per band the
    spread of consecutive runs of a series on one chip (both GPU uuids equal) and across
    chips (the A/A pairs of harness.records.noise), and within one run: how far the
    medians of the first and the second half of a run's samples lie apart (a run of at
    least 20 samples), the noise that timing longer in the same process would average."""
    import numpy as np

    recs = [json.loads(p.read_text()) for p in sorted(results.glob(pattern))]
    gpu = {r["created_at"]: (r.get("gpu") or {}).get("uuid") for r in recs}
    samples = {(r["created_at"], e["kernel"], e.get("pass") or "fwd", e["case_id"],
                e.get("timing_mode")): e.get("samples_ms") or []
               for r in recs for e in r["results"]}
    cells: dict[tuple, list[tuple[str, float, float]]] = {}
    per_run: dict[str, list[float]] = {}
    chips: dict[str, dict[bool, list[float]]] = {name: {False: [], True: []}
                                                for *_, name in BANDS}
    halves: dict[str, list[float]] = {name: [] for *_, name in BANDS}
    for key, pts in timed_series(results, pattern=pattern).items():
        logs = [math.log(m) for _, m, _ in pts]
        mid = statistics.median(logs)
        for when, _, _ in pts:
            s = samples.get((when, key[0], key[2], key[3], key[4])) or []
            if len(s) >= 20:
                h = len(s) // 2
                halves[band_of(relative_spread([m for _, m, _ in pts]) or 0.0)].append(
                    abs(math.log(statistics.median(s[h:]) / statistics.median(s[:h]))))
        for (when, m, _), x in zip(pts, logs, strict=True):
            cells.setdefault((key[2:7], when), []).append((key[0], x - mid, m))
            per_run.setdefault(when, []).append(x - mid)
        band = chips[band_of(relative_spread([m for _, m, _ in pts]) or 0.0)]
        for (ta, _, _), (tb, _, _), a, b in zip(pts, pts[1:], logs, logs[1:], strict=False):
            if gpu.get(ta) and gpu.get(tb):
                band[gpu[ta] != gpu[tb]].append(abs(b - a))
    pairs = [(a[1], b[1], min(a[2], b[2])) for v in cells.values()
             for i, a in enumerate(v) for b in v[i + 1:] if a[0] != b[0]]
    arr = np.array(pairs)
    long = arr[arr[:, 2] > 0.1]

    def scale(d: list[float]) -> float | None:  # harness.records.noise's spread of pairs
        return 1.4826 * statistics.median(d) / math.sqrt(2.0) if len(d) >= 2 else None

    return {"pairs": len(arr), "correlation": float(np.corrcoef(arr[:, 0], arr[:, 1])[0, 1]),
            "pairs_over_0.1ms": len(long),
            "correlation_over_0.1ms": float(np.corrcoef(long[:, 0], long[:, 1])[0, 1]),
            "run_effect": {w: statistics.median(v) for w, v in sorted(per_run.items())},
            "chips": {b: {"one chip": (len(d[False]), scale(d[False])),
                          "across chips": (len(d[True]), scale(d[True])),
                          "halves of one run": (len(halves[b]), scale(halves[b]))}
                      for b, d in chips.items()}}


def _print_common_mode(results: Path, pattern: str = RECORDS) -> None:
    cm = common_mode(results, pattern)
    effects = list(cm["run_effect"].values())
    print(f"correlation of two kernels' residuals, same case, same run: "
          f"{cm['correlation']:.3f} ({cm['pairs']} pairs); both over 0.1 ms: "
          f"{cm['correlation_over_0.1ms']:.3f} ({cm['pairs_over_0.1ms']} pairs)")
    print(f"run effect (a run's median residual), {len(effects)} runs: "
          f"{min(effects):+.3%} to {max(effects):+.3%}")
    for band, kinds in cm["chips"].items():
        print(f"{band}: consecutive runs " + ", ".join(
            f"{kind} {s:.3%} ({n} pairs)" if s is not None else f"{kind} - ({n} pairs)"
            for kind, (n, s) in kinds.items()))
    print()


def trial(pool: list[float], step: float, length: int, rng: random.Random,
          source_changes: float | None = None) -> tuple[bool, int, str, int]:
    """(detected, false steps, why a planted step was missed ("" if it was not), the
    detected step's range in commits) of one series."""
    k = rng.randrange(length // 4, length - length // 4)
    meds = [math.exp(rng.choice(pool)) * ((1 + step) if (step and i >= k) else 1.0)
            for i in range(length)]
    commits = [f"c{i}" for i in range(length)]
    changed = None if source_changes is None else \
        [i == k and bool(step) or rng.random() < source_changes for i in range(length)]
    rejected: list[tuple[int, str]] = []
    found = find_steps(commits, meds, rejected=rejected, changed=changed)
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


def _table(pools: dict[str, list[float]], label: str, args: argparse.Namespace,
           rng: random.Random) -> list[dict]:
    rows = []
    for *_, band in BANDS:
        pool, name = pools[band], f"{band}{label}"
        if len(pool) < 10:
            print(f"| {name} | {len(pool)} | - | too few residuals | - | - | - |")
            continue
        for step in STEPS:
            hits = falses = width = 0
            misses: Counter[str] = Counter()
            for _ in range(args.trials):
                h, f, why, w = trial(pool, step, args.length, rng, args.source_changes)
                hits += h
                falses += f
                width += w
                if why:
                    misses[why] += 1
            det = "-" if not step else f"{hits / args.trials:.1%}"
            fa = f"{falses / (args.trials * args.length):.2%}" if not step else "-"
            why = ", ".join(f"{n} {c}" for c, n in misses.most_common()) if step else "-"
            rng_w = f"{width / hits:.2f}" if hits else "-"
            rows.append({"band": name, "residuals": len(pool), "step": step,
                         "detected": None if not step else hits / args.trials,
                         "false_per_commit": falses / (args.trials * args.length)
                         if not step else None,
                         "misses": dict(misses), "range": width / hits if hits else None})
            print(f"| {name} | {len(pool)} | {step:.0%} | {det} | {fa} | {why or '-'} "
                  f"| {rng_w} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--length", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--exclude-median-points", action="store_true")
    ap.add_argument("--yardstick", default=None,
                    help="a peer (sdpa_flash, sdpa_cudnn, ...), 'peers' or 'others': the "
                         "table of the series that have it, raw and normalised by it")
    ap.add_argument("--common-mode", action="store_true",
                    help="first, how much of the noise the kernels of a run share")
    ap.add_argument("--per-candidate", action="store_true",
                    help="also the table of candidates' series: the mean over a "
                         "candidate's cases per run (a step planted in all of them)")
    ap.add_argument("--source-changes", type=float, default=None, metavar="Q",
                    help="each commit changes the candidate's source with probability Q "
                         "(the planted step's commit always): the detector told which")
    ap.add_argument("--judged", action="store_true",
                    help="only the series of candidates the gate judges, not the SDPA "
                         "peers (yardsticks it never flags)")
    ap.add_argument("--records", default=RECORDS, metavar="GLOB",
                    help="the records under results/ whose noise is pooled")
    ap.add_argument("--per-chip", action="store_true",
                    help="a series is one chip's runs (a fixed runner), not every run "
                         "of the GPU model")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    results = ROOT / "results"
    if args.common_mode:
        _print_common_mode(results, args.records)
    if args.yardstick:
        _spread_table(results, args.yardstick, args.records)
    variants = [("", False)] if not args.yardstick else \
        [(", raw", False), (f", / {args.yardstick}", True)]
    print("| noise band | residuals | step | detected within 2 commits "
          "| false alerts per commit | misses (trials) | range (commits) |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for label, normalised in variants:
        pools = residual_pools(results, exclude_median_points=args.exclude_median_points,
                               yardstick=args.yardstick, normalised=normalised,
                               judged=args.judged, pattern=args.records,
                               per_chip=args.per_chip)
        rows += _table(pools, label, args, rng)
    if args.per_candidate:
        rows += _table(candidate_pools(results, judged=args.judged, pattern=args.records,
                                       per_chip=args.per_chip), ", per candidate", args, rng)
    if args.json:
        Path(args.json).write_text(json.dumps({"trials": args.trials, "length": args.length,
                                               "seed": args.seed, "yardstick": args.yardstick,
                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
