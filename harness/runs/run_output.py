"""What `fa-harness run` leaves behind (harness.runs.run_grid): the partial record of each
result as it lands, the --json file, and the run record, written, spooled and stored.

Errors that are the user's to fix (a path that cannot be written) are raised as the
caller's usage error type (`usage`), so this module needs no front's exceptions."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

UsageType = Callable[[str], Exception]


def keeper(record: str | None, lines: Any, usage: UsageType) -> Callable[[Any], None]:
    """The per-result callback: the CI log's line (`lines`, None on a terminal) and, with
    --record FILE, each result appended to FILE.partial.jsonl as it lands, so a run cut
    short by its caller (a job's time limit) still leaves every settled case."""
    from harness.records.record import json_safe

    partial = Path(record + ".partial.jsonl") if record else None
    if partial is not None:
        try:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text("")
        except OSError as e:
            raise usage(f"cannot write {partial}: {e}") from None

    def keep(res: Any) -> None:
        if lines is not None:
            lines.on_result(res)
        if partial is not None:
            with partial.open("a") as f:
                f.write(json.dumps(json_safe(res.to_dict()), allow_nan=False) + "\n")

    return keep


def write_json(path: str | Path, grid: str, results: list[Any], usage: UsageType) -> None:
    from harness.execution.runner import summarize
    from harness.records.record import json_safe

    path = Path(path)
    data = {"grid": grid, "results": [r.to_dict() for r in results],
            "summary": [vars(row) for row in summarize(results)]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Strict JSON: an infinite error ratio (a NaN gradient) is the string "inf".
        path.write_text(json.dumps(json_safe(data), indent=1, allow_nan=False) + "\n")
    except OSError as e:
        raise usage(f"cannot write {path}: {e}") from None


def calibration_dict() -> dict[str, Any] | None:
    """This runner's saved ceilings (`fa-harness calibrate`), kept with the record so the
    roofline of a stored run does not depend on the machine it is viewed from."""
    from harness.measure.calibrate import CalibrationError, load_calibration

    try:
        cal = load_calibration()
    except CalibrationError as e:
        print(f"note: calibration not recorded: {e}", file=sys.stderr)
        return None
    return cal.to_dict() if cal is not None else None


def store_run(opts: Any, candidates: list[Any], results: list[Any], usage: UsageType) -> bool:
    """Write the run record (`opts.record`) and store it (`opts.db`, unless
    `opts.no_store`). The record is spooled before the database is touched, so an
    unreachable database loses nothing. False when the database named by the user could
    not take it."""
    import torch

    from harness.records.record import RecordError, RunRecord, spool
    from harness.runs.run_meta import gpu_meta, kernel_info

    meta = {"source": "cli", "grids": [opts.grid],
            "kernels": {c.name: kernel_info(c) for c in candidates},
            "gpu": gpu_meta() if torch.cuda.is_available() else None,
            "calibration": calibration_dict() if torch.cuda.is_available() else None}
    try:
        rec = RunRecord.from_results(results, meta)
        if opts.record:
            print(f"record written to {rec.write(opts.record)}")
    except (RecordError, OSError) as e:
        raise usage(f"cannot write the run record: {e}") from None
    if opts.no_store:
        return True
    from harness.records.db.engine import target_of
    from harness.records.db.store import DatabaseError, open_db, store_record

    # Named by the user (--db, $FA_HARNESS_DB): a database that cannot take the run is an
    # error. The default file: a warning, the record waits in the spool either way.
    named = bool(opts.db or os.environ.get("FA_HARNESS_DB"))
    kept = spool(rec, target=target_of(opts.db))
    try:
        with open_db(opts.db) as db:
            run_id = store_record(db, rec)
            where = db.display_url
    except DatabaseError as e:
        level = "error" if named else "warning"
        print(f"fa-harness run: {level}: database not updated, record kept in {kept}: {e}",
              file=sys.stderr)
        return not named
    kept.unlink(missing_ok=True)
    # The run's last lines: where it went, and the command that shows it (a first-time
    # user's `make run` ends here).
    print(f"stored as run {run_id} in {where}")
    db_opt = f" --db '{where}'" if opts.db else ""
    # The run's deep link is the whole hint: the line stays within an 80-column log.
    print(f"next: fa-harness dashboard{db_opt}, then open "
          f"http://127.0.0.1:8501/?page=run&run={run_id}")
    return True
