"""Does pytest-benchmark's median (the pytest front, timed by the device clock) agree
with harness.measure.timing's median for the same call? Target: within 3%, on a short (~20 us)
and a long (~2 ms) kernel.

    python bench/benchmark_agreement.py [--candidate sdpa_flash] [--cases ID,ID] [--out F]

pytest-benchmark runs in a subprocess on a generated test file (its --benchmark-json is
read back); harness.measure.timing.measure runs here. Prints both medians and their ratio;
exit 1 when a ratio is off by more than --tolerance.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SHORT = "b1h16-1024x1024-d64-fp16-none"  # ~20 us for SDPA flash on an H200
LONG = "b4h16-4096x4096-d128-fp16-none"  # ~1.7 ms

TEST_FILE = '''
import pytest

from harness.core.cases import Case
from harness.measure.bench_fixture import benchmark_device_time
from harness.candidates.registry import get_candidate
from harness.measure.timing import DEVICE_CLOCK


@pytest.mark.benchmark(timer=DEVICE_CLOCK)
@pytest.mark.parametrize("case_id", {case_ids!r})
def test_agreement(benchmark, case_id):
    benchmark_device_time(benchmark, get_candidate({candidate!r}), Case.from_id(case_id))
'''


def pytest_benchmark_medians(candidate: str, case_ids: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        test = Path(tmp) / "test_agreement_bench.py"
        test.write_text(textwrap.dedent(TEST_FILE.format(case_ids=case_ids,
                                                         candidate=candidate)))
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "pytest", str(test), "-q", "-p", "no:cacheprovider",
               f"--rootdir={tmp}", f"--benchmark-json={out}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
            raise SystemExit("pytest-benchmark run failed")
        data = json.loads(out.read_text())
    medians = {}
    for b in data["benchmarks"]:
        medians[b["params"]["case_id"]] = b["stats"]["median"] * 1e3  # seconds -> ms
    return medians


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", default="sdpa_flash")
    ap.add_argument("--cases", default=f"{SHORT},{LONG}")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--out", default="benchmark_agreement.json")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("benchmark_agreement: needs a CUDA GPU", file=sys.stderr)
        return 2
    from harness.candidates.registry import get_candidate
    from harness.core.cases import Case
    from harness.measure.perf import time_case

    case_ids = [c.strip() for c in args.cases.split(",") if c.strip()]
    cand = get_candidate(args.candidate)
    pb = pytest_benchmark_medians(args.candidate, case_ids)
    rows = []
    for cid in case_ids:
        t = time_case(cand, Case.from_id(cid))
        ratio = pb[cid] / t.median_ms
        rows.append({"case": cid, "harness_median_ms": t.median_ms,
                     "pytest_benchmark_median_ms": pb[cid], "ratio": ratio,
                     "harness_samples": len(t.samples_ms), "harness_noise": t.rel_noise,
                     "agree": abs(ratio - 1) <= args.tolerance})
    print(f"{'case':34} {'harness ms':>11} {'pytest-bm ms':>13} {'ratio':>7}  within "
          f"{args.tolerance:.0%}")
    for r in rows:
        print(f"{r['case']:34} {r['harness_median_ms']:11.4f} "
              f"{r['pytest_benchmark_median_ms']:13.4f} {r['ratio']:7.4f}  "
              f"{'yes' if r['agree'] else 'NO'}")
    Path(args.out).write_text(json.dumps({"candidate": args.candidate, "rows": rows,
                                          "gpu": torch.cuda.get_device_name()}, indent=2))
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
