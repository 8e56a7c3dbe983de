"""`fa-harness compare BASE NEW [--json] [--db URL]`: regression verdicts between two runs.

BASE and NEW are record files or stored runs (id, uuid or "latest"). Exit 0 when nothing
regressed, 1 when something did (timing, correctness or precision), 2 on bad input
(unreadable record, unknown run, unreachable database, runs of different GPU models)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.cli._dbopt import add_db_option, open_or_fail
from harness.cli.console import plain
from harness.cli.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare two runs (record files or stored run ids)")
    p.add_argument("base", metavar="BASE", help="record file, or run id/uuid/'latest'")
    p.add_argument("new", metavar="NEW", help="record file, or run id/uuid/'latest'")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("--threshold", type=float, default=None,
                   help="practical threshold on the ratio (default 0.02)")
    p.add_argument("--alpha", type=float, default=None,
                   help="Mann-Whitney U p-value bound (default 0.01)")
    add_db_option(p)
    p.set_defaults(func=cmd_compare)


def _is_file_ref(ref: str) -> bool:
    return ref.endswith(".json") or Path(ref).exists()


def cmd_compare(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from harness.cli.cmd_import import load_any
    from harness.records.compare import DEFAULT_POLICY, CompareError, compare_records
    from harness.records.record import RecordError

    policy = DEFAULT_POLICY
    if args.threshold is not None:
        if not 0 <= args.threshold < 1:
            raise UsageError("--threshold must be in [0, 1)")
        policy = replace(policy, threshold=args.threshold)
    if args.alpha is not None:
        if not 0 < args.alpha <= 1:
            raise UsageError("--alpha must be in (0, 1]")
        policy = replace(policy, alpha=args.alpha)
    records = {}
    db = None
    try:
        for side in ("base", "new"):
            ref = getattr(args, side)
            if _is_file_ref(ref):
                records[side] = load_any(Path(ref))
            else:
                from harness.records.db.store import DatabaseError, load_record

                db = db or open_or_fail(args.db, create=False)
                try:
                    records[side] = load_record(db, ref)
                except DatabaseError as exc:
                    raise UsageError(str(exc)) from None
    except RecordError as exc:
        raise UsageError(str(exc)) from None
    finally:
        if db is not None:
            db.close()
    try:
        report = compare_records(records["base"], records["new"], policy)
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, sort_keys=True, default=str))
    else:
        # Candidate and case names come from stored records, written by anyone.
        print(plain(report.markdown(), lines=True), end="")
    return 1 if report.regressed else 0
