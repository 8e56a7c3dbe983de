"""Submissions end to end on a GPU: submit the shipped fa2_mma (from a copy of its folder),
the honest test kernel and every bad or cheating kernel of tests/data/submissions, run a
worker until the queue is empty, print the table of submissions and verdicts.

    python bench/submissions_demo.py [--db URL] [--correctness-grid full|smoke]
        [--perf-grid perf] [--max-perf-cases 4] [--case-timeout 60] [--json FILE]

Without --db a fresh SQLite file in a temporary folder is used. Correctness stops at the
first failing case (cheats fail fast); timing uses a reduced sample count (--quick rules)
and at most --max-perf-cases perf cases, so the whole demo takes minutes, not hours.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.records.db import open_db  # noqa: E402
from harness.submissions import submit  # noqa: E402
from harness.submissions.ranking import leaderboard_rows  # noqa: E402
from harness.submissions.worker import WorkerConfig, work  # noqa: E402

DATA = ROOT / "tests" / "data" / "submissions"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db")
    ap.add_argument("--correctness-grid", default="full")
    ap.add_argument("--perf-grid", default="perf")
    ap.add_argument("--max-perf-cases", type=int, default=4)
    ap.add_argument("--case-timeout", type=float, default=60.0)
    ap.add_argument("--gpu", type=int, default=None)
    ap.add_argument("--only", nargs="*", help="submit only these files (names in tests/data)")
    ap.add_argument("--json", help="also write the table as JSON here")
    ap.add_argument("--no-sanitize", action="store_true", help="skip compute-sanitizer")
    ap.add_argument("--skip-fa2", action="store_true",
                    help="do not submit the copy of kernels/fa2_mma")
    ap.add_argument("--race-repeats", type=int, default=3,
                    help="runs per correctness case compared bitwise (default 3)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fa-demo-"))
    db = open_db(args.db or str(tmp / "demo.sqlite"))
    print(f"database: {db.display_url}")

    entries: list[tuple[str, Path]] = []
    if not args.skip_fa2:
        folder = tmp / "fa2_mma"
        shutil.copytree(ROOT / "harness" / "kernels" / "fa2_mma", folder)
        entries.append(("fa2_mma (copy of kernels/fa2_mma)", folder))
    for f in sorted(DATA.glob("*.cu")):
        if args.only and f.name not in args.only:
            continue
        entries.append((f.name, f))

    t0 = time.time()
    for label, path in entries:
        files, rejection = None, None
        try:
            files = submit.pack_path(path)
        except submit.Rejected as e:
            rejection = str(e)
        res = submit.submit_files(db.engine, files, name=label, submitter="demo",
                                  token_id=None, rejection=rejection)
        state = "queued" if res.accepted else f"rejected: {res.message.splitlines()[0][:100]}"
        print(f"  submitted {res.id:3d} {label}: {state}")
    print(f"validation of {len(entries)} submissions: {time.time() - t0:.1f} s")

    config = WorkerConfig(
        gpu=args.gpu, case_timeout_s=args.case_timeout, job_timeout_s=1800.0,
        scoring={"correctness_grid": args.correctness_grid, "perf_grid": args.perf_grid,
                 "max_perf_cases": args.max_perf_cases, "stop_at_first_failure": True,
                 "min_samples": 5, "min_time_s": 0.05, "max_time_s": 2.0,
                 "sanitize": not args.no_sanitize, "race_repeats": args.race_repeats})
    t1 = time.time()
    n = work(db.engine, config, drain=True, log=lambda m: print("  worker:", m, flush=True))
    print(f"worker scored {n} job(s) in {time.time() - t1:.1f} s")

    rows = leaderboard_rows(db.engine, include_all=True, limit=1000)
    rows.sort(key=lambda r: r["id"])
    from rich.console import Console
    from rich.table import Table

    table = Table(title="submissions and verdicts")
    for col in ("id", "submission", "verdict", "score", "coverage", "message"):
        table.add_column(col, overflow="fold")
    for r in rows:
        score = f"{r['score']:.3f}x" if r["score"] is not None else "-"
        table.add_row(str(r["id"]), r["name"], r["verdict"] or r["status"], score,
                      r["coverage"] or "-", (r["message"] or "").splitlines()[0][:160]
                      if r["message"] else "")
    Console(width=200).print(table)
    details = _details(db)
    for r in rows:
        r.update(details.get(r["id"], {}))
        san = r.get("sanitizer")
        if san:
            tools = ", ".join(f"{t['tool']} {t['status']} {t['wall_s']:.1f}s"
                              for t in san["tools"])
            print(f"  sanitizer {r['id']:3d} {r['name']}: {san['status']} in "
                  f"{san['wall_s']:.1f} s ({tools})")
            for t in san["tools"]:
                if t["summary"]:
                    print(f"      {t['summary'][:200]}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    db.close()
    return 0


def _details(db) -> dict[int, dict]:
    """Per submission: the sanitizer stage, suspicious marks and the floor's GPU entry."""
    from sqlalchemy import select

    from harness.records.db.models import Submission

    out: dict[int, dict] = {}
    with db.sessions() as s:
        for row in s.scalars(select(Submission)):
            d = row.detail or {}
            out[row.id] = {"sanitizer": d.get("sanitizer"), "suspicious": d.get("suspicious"),
                           "floor_gpu": d.get("floor_gpu"), "full_message": row.message,
                           "correctness": d.get("correctness")}
    return out


if __name__ == "__main__":
    sys.exit(main())
