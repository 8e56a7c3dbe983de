"""Where does the run-to-run noise of a timed case come from? Time each (candidate, case)
`--repeats` times in three ways on one GPU and compare the spread of the medians:

- same:    in this process, the same input sets every time (`measure` called again);
- fresh:   in this process, new input sets and output buffers every time, with a spacer
           allocation of a random size kept alive before them, so that they land at
           other device addresses (one placement per timing: the timing method before
           `harness.measure.perf.placed_sets`);
- placed:  as fresh, with the timing method's placements: every input set with its own
           outputs behind spacers of random size, so one timing samples many placements;
- process: in `--repeats` child processes one after the other, each timing every pair
           once (a new CUDA context, allocator, module load and clock history).

The stored records already say that a run's own samples do not move: the medians of the
first and second half of a run's samples differ by about 0.1% (docs/regressions.md),
while the same case on the same chip moves by 0.6-2.7% from one gate run to the next.
If `process` spreads like those runs and `same` and `fresh` do not, the noise comes with
the process: only timing a suspect case again in a new process averages it away. If
`fresh` spreads like `process`, it comes with where the buffers lie, and timing over
several placements within one run would do. Each measurement also keeps the median SM
clock of its samples (`Timing.sm_clock_mhz`), so a spread that follows the clock shows.

Default pairs: the teaching kernels on the 1k-key decode case, the noisiest owned series
of the committed H200 records, and fa2_mma on the same case as a quiet control. The
timing rule is the gate's (`--min-time`, 0.2 s). Results are written to `--out` after
each way (a killed run keeps what it had).

    python bench/retiming_noise.py [--pairs fa1:CASE ...] [--repeats 10] [--min-time 0.2]
                                   [--ways same,fresh,process] [--out retiming_noise.json]

Exit codes: 0 done, 2 bad input or no CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DECODE = "b1h32k8-1x1024-d128-fp16-none"
PAIRS = tuple(f"{k}:{DECODE}" for k in ("fa1", "naive", "fa2_simt", "template", "fa2_mma"))
WAYS = ("same", "fresh", "placed", "process")


def parse_pairs(items: list[str]) -> list[tuple[str, str]]:
    """"candidate:case id" items as pairs; ValueError names the malformed one."""
    from harness.core.cases import Case

    out = []
    for item in items:
        name, sep, case = item.partition(":")
        if not (sep and name and case):
            raise ValueError(f"--pairs: {item!r} is not CANDIDATE:CASE_ID")
        try:
            Case.from_id(case)
        except Exception as e:  # the case parser's own message names what is wrong
            raise ValueError(f"--pairs: {case!r} is not a case id ({e})") from e
        out.append((name, case))
    return out


def spread(medians: list[float]) -> dict[str, Any]:
    """How far the medians of one way lie apart: their count, median, coefficient of
    variation, robust relative spread (IQR / 1.349 / median, the timing method's noise
    measure) and max / min - 1."""
    from harness.measure.sampling import rel_noise

    if not medians:
        return {"n": 0}
    mid = statistics.median(medians)
    cv = statistics.stdev(medians) / statistics.fmean(medians) if len(medians) > 1 else None
    return {"n": len(medians), "median_ms": mid, "cv": cv,
            "robust": rel_noise(medians) if len(medians) > 1 else None,
            "range": max(medians) / min(medians) - 1.0}


def _one(timing: Any) -> dict[str, Any]:
    return {"median_ms": timing.median_ms, "sm_clock_mhz": timing.sm_clock_mhz,
            "rel_noise": timing.rel_noise, "samples": len(timing.samples_ms)}


def _same(cand: Any, case: Any, repeats: int, rule: Any) -> list[dict[str, Any]]:
    from harness.core.cases import make_inputs
    from harness.core.iomodel import ideal_bytes
    from harness.measure.perf import make_launch, output_buffers, timing_sets
    from harness.measure.timing import measure

    n = timing_sets(ideal_bytes(case), "cold")
    sets = [make_inputs(case, "cuda", draw=i) for i in range(n)]
    out, lse = output_buffers(cand, case)
    launch = make_launch(cand, case, sets, out, lse)
    return [_one(measure(launch, n_sets=n, rule=rule)) for _ in range(repeats)]


def _fresh(cand: Any, case: Any, repeats: int, rule: Any, rng: random.Random,
           placements: bool = False) -> list[dict[str, Any]]:
    import torch

    from harness.measure.perf import time_case

    spacers, out = [], []
    for _ in range(repeats):
        # Kept alive to the end, so the caching allocator cannot hand the next input sets
        # the blocks the last ones had.
        spacers.append(torch.empty(rng.randrange(1, 64) << 20, dtype=torch.uint8,
                                   device="cuda"))
        out.append(_one(time_case(cand, case, rule={"min_time_s": rule.min_time_s},
                                  placements=placements)))
    return out


def measure_in_this_process(pairs: list[tuple[str, str]], ways: list[str], repeats: int,
                            min_time_s: float, seed: int) -> dict[str, dict[str, list]]:
    """{pair: {way: [measurement]}} for the in-process ways."""
    from harness.candidates.registry import get_candidate
    from harness.core.cases import Case
    from harness.measure.timing import StopRule

    rule = StopRule(min_time_s=min_time_s)
    rng = random.Random(seed)
    out: dict[str, dict[str, list]] = {}
    for name, case_id in pairs:
        cand, case = get_candidate(name), Case.from_id(case_id)
        got = out.setdefault(f"{name}:{case_id}", {})
        if "same" in ways:
            got["same"] = _same(cand, case, repeats, rule)
        if "fresh" in ways:
            got["fresh"] = _fresh(cand, case, repeats, rule, rng)
        if "placed" in ways:
            got["placed"] = _fresh(cand, case, repeats, rule, rng, placements=True)
    return out


def measure_in_children(pairs: list[tuple[str, str]], repeats: int, min_time_s: float,
                        work: Path, limit_s: float) -> dict[str, list]:
    """{pair: [measurement]}: `repeats` children, each timing every pair once."""
    out: dict[str, list] = {f"{n}:{c}": [] for n, c in pairs}
    for i in range(repeats):
        dest = work / f"child-{i}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--ways", "same",
               "--repeats", "1", "--min-time", str(min_time_s), "--out", str(dest),
               "--pairs", *[f"{n}:{c}" for n, c in pairs]]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, timeout=limit_s, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            print(f"  child {i}: past its {limit_s:g} s, killed")
            continue
        if proc.returncode != 0:
            print(f"  child {i}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
            continue
        got = json.loads(dest.read_text())["measurements"]
        for pair, ways in got.items():
            out[pair] += ways["same"]
        print(f"  child {i}: {time.monotonic() - t0:.1f} s")
    return out


def summary(measurements: dict[str, dict[str, list]]) -> dict[str, dict[str, Any]]:
    """Per pair and way: the spread of the medians (`spread`) and the clocks seen."""
    out: dict[str, dict[str, Any]] = {}
    for pair, ways in measurements.items():
        for way, ms in ways.items():
            s = spread([m["median_ms"] for m in ms if m.get("median_ms")])
            clocks = [m["sm_clock_mhz"] for m in ms if m.get("sm_clock_mhz")]
            s["clock_mhz"] = [min(clocks), max(clocks)] if clocks else None
            out.setdefault(pair, {})[way] = s
    return out


def table(summ: dict[str, dict[str, Any]]) -> list[str]:
    """The summary as Markdown rows, one per pair and way."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.2%}"

    rows = ["| candidate:case | way | n | median ms | CV | robust | max/min - 1 | SM clock MHz |",
            "|---|---|---|---|---|---|---|---|"]
    for pair, ways in summ.items():
        for way in WAYS:
            s = ways.get(way)
            if not s or not s.get("n"):
                continue
            clk = s.get("clock_mhz")
            rows.append(f"| {pair} | {way} | {s['n']} | {s['median_ms']:.4f} | {pct(s['cv'])} "
                        f"| {pct(s['robust'])} | {pct(s['range'])} "
                        f"| {'-' if not clk else f'{clk[0]:.0f}-{clk[1]:.0f}'} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", nargs="+", default=list(PAIRS), metavar="CANDIDATE:CASE")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child-limit", type=float, default=120.0,
                    help="seconds one child may take (start, compile caches, timing)")
    ap.add_argument("--out", default="retiming_noise.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        pairs = parse_pairs(args.pairs)
        ways = [w for w in args.ways.split(",") if w]
        bad = [w for w in ways if w not in WAYS]
        if bad or not ways:
            raise ValueError(f"--ways: {','.join(bad) or 'none'}; choose from {','.join(WAYS)}")
        if args.repeats < 2 and not args.child:
            raise ValueError("--repeats: at least 2 (a spread needs two medians)")
    except ValueError as e:
        print(f"retiming_noise: {e}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("retiming_noise: needs a CUDA GPU", file=sys.stderr)
        return 2
    from harness.measure.gpuinfo import gpu_identity

    out = Path(args.out)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(),
                              "gpu_uuid": gpu_identity().uuid, "repeats": args.repeats,
                              "min_time_s": args.min_time, "ways": ways}

    def save(measurements: dict[str, dict[str, list]]) -> None:
        result["measurements"] = measurements
        result["summary"] = summary(measurements)
        out.write_text(json.dumps(result, indent=1) + "\n")

    inproc = [w for w in ways if w != "process"]
    measurements = measure_in_this_process(pairs, inproc, args.repeats, args.min_time,
                                           args.seed) if inproc else \
        {f"{n}:{c}": {} for n, c in pairs}
    save(measurements)
    if args.child:
        return 0
    if "process" in ways:
        with tempfile.TemporaryDirectory(prefix="retiming-") as work:
            for pair, ms in measure_in_children(pairs, args.repeats, args.min_time,
                                                Path(work), args.child_limit).items():
                measurements[pair]["process"] = ms
        save(measurements)
    print(f"{result['gpu']}, {args.repeats} medians per way, rule >= {args.min_time:g} s")
    print("\n".join(table(result["summary"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
