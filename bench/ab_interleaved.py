"""Two or more kernels timed in turns on the same inputs, so that a clock or thermal drift
of the GPU during the run falls on all of them alike.

    python bench/ab_interleaved.py --kernels fa3_prev,fa3_wgmma,sdpa_cudnn \\
        --cases 'b*-d128-*' --baseline fa3_prev --rounds 5

`fa-harness run --grid perf` times one candidate after the other: on the H200 one case's
samples have been seen to move 7% within a run as the clock settled (results/ records),
more than the few percent a kernel change is after. Here each case is checked once per
kernel (the harness's check, public inputs), then timed in ROUNDS rounds; a round times
every kernel once, by the one timing method (`harness.measure.timing.measure`, with a
shorter stopping rule: --min-time), starting with a different kernel each round. The
table gives, per case and kernel, the median over the rounds of TFLOP/s and of the time
ratio against the baseline within each round (the baseline's time over the kernel's:
above 1, faster than the baseline), with the rounds' lowest and highest ratio, and the
median SM clock of its turns (NVML; "-" without it): on a power-capped GPU two kernels of
one round can run 10% apart in clock, and the ratio then says so much about power as
about the kernel.

A kernel may be named with score modifiers, NAME@MODS (e.g. fa3_wgmma@sc30,
fa3_wgmma@sink, fa3_wgmma@sc30-sink): it is then checked and timed on each case with those
modifiers appended to its id (harness.core.cases.Case.from_id), with the same shape and
the same FLOP count, so that the ratio to the baseline on the plain case is what the
modifiers cost.

Exit status: 0 when every (kernel, case) passed its check and was timed, 1 when one did
not (it is then not timed, or no sample of its was kept), 2 on bad arguments (an unknown kernel, no case matching, modifiers that are
not a case id's, fewer than 1 round, a --min-time that is not positive).
"""

from __future__ import annotations

import argparse
import fnmatch
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", required=True, help="comma-separated candidate names")
    ap.add_argument("--baseline", help="the kernel the ratios are against (default: the first)")
    ap.add_argument("--grid", default="perf")
    ap.add_argument("--cases", default="*", help="comma-separated case-id globs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.1, help="seconds of samples per turn")
    args = ap.parse_args(argv)
    if args.rounds < 1 or not args.min_time > 0:
        print("error: --rounds must be at least 1 and --min-time positive", file=sys.stderr)
        return 2

    from harness.candidates.registry import available, get_candidate
    from harness.core.cases import Case, make_inputs
    from harness.core.check import check_case
    from harness.core.flops import attention_flops
    from harness.core.grids import get_grid
    from harness.core.iomodel import ideal_bytes
    from harness.core.results import Status
    from harness.measure.perf import make_launch, output_buffers, timing_sets
    from harness.measure.timing import StopRule, measure

    names = [n for n in args.kernels.split(",") if n]
    mods = {n: n.partition("@")[2] for n in names}  # NAME@MODS: the case's modifiers
    try:
        by_label = {n: get_candidate(n.partition("@")[0]) for n in names}
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    kernels = list(by_label.values())
    missing = [k.name for k in kernels if not available(k)]
    if missing:
        print(f"error: not available here: {', '.join(missing)}", file=sys.stderr)
        return 2
    baseline = args.baseline or names[0]
    if baseline not in names:
        print(f"error: baseline {baseline!r} is not among --kernels", file=sys.stderr)
        return 2
    globs = [g for g in args.cases.split(",") if g]
    cases = [c for c in get_grid(args.grid) if any(fnmatch.fnmatch(c.id, g) for g in globs)]
    if not cases:
        print(f"error: no case of grid {args.grid!r} matches {args.cases!r}", file=sys.stderr)
        return 2
    for n in names:
        try:
            if mods[n]:
                Case.from_id(f"{cases[0].id}-{mods[n]}")
        except ValueError as e:
            print(f"error: {n}: not a case's modifiers: {e}", file=sys.stderr)
            return 2
    rule = StopRule(min_time_s=args.min_time, max_time_s=max(2.0, 4 * args.min_time))

    failed = False
    w = max(len(n) for n in names)
    print(f"{'case':40} {'kernel':{w}} {'TFLOP/s':>8} {'MHz':>5} {'/ ' + baseline:>12} "
          f"{'rounds min-max':>16}")
    medians: dict[str, list[tuple[int, float]]] = {}   # kernel -> (head dim, median ratio)
    for case in cases:
        runnable = []
        of = {n: Case.from_id(f"{case.id}-{mods[n]}") if mods[n] else case for n in names}
        for n, k in by_label.items():
            if k.supports(of[n]):
                continue
            res = check_case(k, of[n], device="cuda")
            if res.status is not Status.PASSED:
                print(f"{of[n].id:40} {n:{w}} {res.status.value}: {res.message}")
                failed = True
                continue
            runnable.append(n)
        if not runnable:
            continue
        n_sets = timing_sets(ideal_bytes(case), "cold")
        sets = {}
        launches = {}
        for n in runnable:
            if of[n].id not in sets:
                sets[of[n].id] = [make_inputs(of[n], "cuda", draw=i) for i in range(n_sets)]
            out, lse = output_buffers(by_label[n], of[n])
            launches[n] = make_launch(by_label[n], of[n], sets[of[n].id], out, lse)
        ms: dict[str, list[float]] = {n: [] for n in runnable}
        mhz: dict[str, list[float]] = {n: [] for n in runnable}
        for r in range(args.rounds):
            order = runnable[r % len(runnable):] + runnable[:r % len(runnable)]
            for n in order:
                if n not in ms:
                    continue
                t = measure(launches[n], n_sets=n_sets, rule=rule)
                if t.median_ms is None:  # every sample dropped (throttled): said, not timed
                    print(f"{of[n].id:40} {n:{w}} no sample kept "
                          f"({t.dropped_throttled} dropped as throttled)")
                    failed = True
                    del ms[n]
                    continue
                ms[n].append(t.median_ms)
                if t.sm_clock_mhz is not None:
                    mhz[n].append(t.sm_clock_mhz)
        runnable = [n for n in runnable if n in ms]
        flops = attention_flops(case)
        for n in runnable:
            base = ms[baseline] if baseline in ms and n != baseline else None
            print(row(case.id, n, w, flops, ms[n], mhz[n], base), flush=True)
            if base is not None:
                medians.setdefault(n, []).append(
                    (case.head_dim, statistics.median(per_round(base, ms[n]))))
    for line in summary(medians, baseline):
        print(line)
    return 1 if failed else 0


def summary(medians: dict[str, list[tuple[int, float]]], baseline: str) -> list[str]:
    """Under the table, per kernel: the median over the cases of each case's median ratio
    to the baseline, their range and how many are at or above 1, over every case and per
    head dim (one case moves by more than 1% between rounds on a power-capped GPU; the
    median over cases is what an A/B decides on)."""
    if not medians:
        return []
    lines = [f"over the cases, each case's median / {baseline}: median (range), >= 1.0"]
    for name, got in medians.items():
        dims = sorted({d for d, _ in got})
        groups = [("all", [r for _, r in got])]
        if len(dims) > 1:
            groups += [(f"d{d}", [r for dd, r in got if dd == d]) for d in dims]
        for label, rs in groups:
            lines.append(f"  {name} {label} ({len(rs)}): {statistics.median(rs):.3f} "
                         f"({min(rs):.3f}-{max(rs):.3f}), {sum(r >= 1.0 for r in rs)} >= 1.0")
    return lines


def per_round(base_ms: list[float], ms: list[float]) -> list[float]:
    """Each round's time ratio, the baseline's over the kernel's (> 1: faster)."""
    return [b / m for b, m in zip(base_ms, ms, strict=True)]


def row(case_id: str, name: str, width: int, flops: int, ms: list[float],
        mhz: list[float], base_ms: list[float] | None) -> str:
    """One line of the table: the rounds' median TFLOP/s, median clock ("-" without
    NVML), and against the baseline's times of the same rounds the median ratio and its
    range (none for the baseline itself)."""
    tflops = flops / (statistics.median(ms) * 1e-3) / 1e12
    clock = f"{statistics.median(mhz):5.0f}" if mhz else f"{'-':>5}"
    ratio = ""
    if base_ms is not None:
        per = per_round(base_ms, ms)
        ratio = f"{statistics.median(per):12.3f} {min(per):7.3f}-{max(per):<8.3f}"
    return f"{case_id:40} {name:{width}} {tflops:8.1f} {clock} {ratio}"


if __name__ == "__main__":
    sys.exit(main())
