"""The submission path on the planted backwards (bench/h200_backward_planted.sh, stage
`score`): each planted flavor of tests/data/planted_bwd made a submission of its own (a
submission is one variant: the flavor's `-D` written into its source, the `[[flavor]]`
tables dropped), validated as `fa-harness submit` validates it, then scored by the
worker's scorer (harness.submissions.score_job.score_files) on small cases. Its forward is
right and must be scored; its backward must not be.

    python bench/backward_planted_score.py OUT_DIR [--plants first_call,far_write]
        [--no-score]

Writes OUT_DIR/<plant>/ (the submission), OUT_DIR/score-<plant>.json (the report) and
prints one PASS or FAIL line per plant; exit 1 when any line is FAIL. `--no-score` stops
after the validation without its compile (no GPU, no sandbox needed).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.core.cases import Case, MaskKind  # noqa: E402

PLANTED = ROOT / "tests" / "data" / "planted_bwd" / "planted_bwd"
# plant -> the define its flavor compiles with
PLANTS = {"first_call": "PLANT_FIRST_CALL_ONLY", "far_write": "PLANT_FAR_WRITE"}
# Small timing cases: the serial planted kernels are not for timing, only scored.
PERF = [Case(1, 4, 4, 512, 512, 64, "float16", MaskKind.NONE)]


def make_submission(plant: str, out: Path) -> Path:
    """OUT/<plant>/: the planted folder as one variant named `sub_<plant>`, its flavor's
    define at the top of the source."""
    folder = out / f"sub_{plant}"
    folder.mkdir(parents=True, exist_ok=True)
    manifest = (PLANTED / "manifest.toml").read_text().split("[[flavor]]", 1)[0]
    manifest = re.sub(r'(?m)^name = "planted_bwd"$', f'name = "sub_{plant}"', manifest)
    (folder / "manifest.toml").write_text(manifest)
    src = (PLANTED / "planted_bwd.cu").read_text()
    (folder / "planted_bwd.cu").write_text(f"#define {PLANTS[plant]} 1\n{src}")
    return folder


def judge(plant: str, report: dict) -> tuple[bool, str]:
    """Forward scored, backward not (its verdict red, no score). The first-call plant must
    fail in correctness on a repeat; the far write is red by the sanitizer's finding or,
    where the write landed in another tensor of the correctness run, by what it broke
    there (the line says which: the gate's tier shows the finding either way)."""
    bwd = report.get("backward") or {}
    fwd_ok = report.get("verdict") == "scored"
    bwd_red = bwd.get("verdict") not in (None, "scored") and bwd.get("score") is None
    msg = str(bwd.get("message", ""))
    why_ok = "repeat 1" in msg if plant == "first_call" else True
    named = "; the sanitizer named the write" if "Invalid __global__" in msg else ""
    line = (f"forward {report.get('verdict')}, backward {bwd.get('verdict')}{named}: "
            f"{msg[:300]}")
    return fwd_ok and bwd_red and why_ok, line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--plants", default=",".join(PLANTS))
    ap.add_argument("--no-score", action="store_true")
    ap.add_argument("--secret", type=int, default=4242)
    args = ap.parse_args(argv)
    from harness.core.grids import get_grid
    from harness.submissions.sources import pack_path
    from harness.submissions.submit import validate

    failed = False
    for plant in [p for p in args.plants.split(",") if p]:
        files = pack_path(make_submission(plant, args.out))
        validate(files, compile_sources=not args.no_score)
        print(f"validated sub_{plant}", flush=True)
        if args.no_score:
            continue
        from harness.submissions.score_job import score_files
        from harness.submissions.timed import ScoringOptions

        options = ScoringOptions(correctness_cases=get_grid("smoke"), perf_cases=PERF,
                                 perf_bwd_cases=PERF, min_samples=5, max_time_s=2.0,
                                 gpu_budget_s=300.0)
        report = score_files(files, options, secret=args.secret,
                             progress=lambda s, c: print(f"  {s} {c}", flush=True))
        doc = report.to_dict()
        (args.out / f"score-{plant}.json").write_text(json.dumps(doc, indent=1,
                                                                 default=str) + "\n")
        ok, line = judge(plant, doc)
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'} score sub_{plant}: {line}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
