"""`fa-harness run`: the correctness suite over every candidate this machine can run,
then (perf/decode grids, on a GPU) the timing run.

Every run is stored in the results database (--db, else $FA_HARNESS_DB, else the default
SQLite file; --no-store to skip). Without a terminal (a CI log) it prints one line per
failing case and one per finished candidate as they land; the progress bar is for
terminals only.

Exit codes: 0 every case passed or was skipped; 1 a case failed, crashed, timed out,
errored or was invalid, or a CUDA variant failed to load; 2 bad arguments, or the database
named by --db / $FA_HARNESS_DB unreachable (the run record then waits in the spool)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.cli._discoveryopt import add_discovery_options
from harness.cli.console import markup
from harness.cli.errors import EXIT_FAIL, EXIT_OK, EXIT_USAGE, UsageError

MAX_FAILURES_SHOWN = 20


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="check (and on a GPU, time) candidates over a case grid")
    p.add_argument("--grid", default="smoke",
                   help="smoke | full | perf | decode | perf-bwd | serving | mods (default "
                        "smoke; perf-bwd times the candidates' backward; mods: "
                        "docs/score-mods.md)")
    p.add_argument("--backward", action="store_true",
                   help="judge (and on a timing grid, time) each candidate's backward "
                        "(dQ, dK, dV) instead of its forward; candidates without one skip")
    p.add_argument("--kernels", default=None, metavar="NAMES",
                   help="comma-separated candidate names or globs (default: all available)")
    p.add_argument("--cases", default=None, metavar="PATTERNS",
                   help="keep only the grid's cases whose id matches one of these "
                        "comma-separated globs (e.g. '*-fp16-*')")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="only candidates on this device (default: every available one)")
    p.add_argument("--secret", type=int, default=0,
                   help="secret mixed into the input seeds (default 0: public inputs)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per case; > 1 also requires bitwise-equal outputs (race check)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="per-case deadline of isolated candidates (default 300 s)")
    p.add_argument("--baseline", default="sdpa_flash",
                   help="candidate the perf table compares against (default sdpa_flash)")
    p.add_argument("--ncu", action="store_true", help="perf: measure DRAM bytes with ncu")
    p.add_argument("--min-time", type=float, default=None, metavar="S",
                   help="perf: minimum sampling time per measurement (default: the timing "
                        "method's 0.5 s); at least 20 samples are always taken")
    p.add_argument("--json", dest="json_path", metavar="FILE", default=None,
                   help="write every result as JSON to FILE")
    p.add_argument("--record", metavar="FILE", default=None,
                   help="write a versioned run record (harness.records.record) to FILE")
    p.add_argument("--db", metavar="URL", default=None,
                   help="store the run record in this database (SQLAlchemy URL or SQLite "
                        "path); default $FA_HARNESS_DB, else $FA_HARNESS_HOME/results.sqlite")
    p.add_argument("--no-store", action="store_true",
                   help="do not store the run in the results database")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--sanitize", action="store_true",
                   help="first run every CUDA variant under compute-sanitizer (memcheck, "
                        "racecheck, initcheck, synccheck) on a few small cases; a finding "
                        "fails the run")
    add_discovery_options(p)
    p.set_defaults(func=run)


def _console():
    from harness.cli.cmd_kernels import wide_console

    return wide_console()


def _select(args: argparse.Namespace, cuda: bool) -> list:
    from harness.candidates import registry

    pool = registry.discover()
    if args.kernels:
        pool = pool + registry.discover(("planted",))  # planted bugs only when named
        try:
            chosen = registry.select(pool, args.kernels)
        except ValueError as e:
            raise UsageError(str(e)) from None
    else:
        chosen = [c for c in pool if registry.available(c)]
    if args.device:
        chosen = [c for c in chosen if c.device == args.device]
    elif not cuda:
        chosen = [c for c in chosen if c.device == "cpu"]
    if not chosen:
        raise UsageError("no candidate to run (check --kernels / --device)")
    return chosen


def run(args: argparse.Namespace) -> int:
    import torch

    from harness.candidates import registry
    from harness.core.grids import get_grid
    from harness.execution.report import LineReport
    from harness.execution.runner import exit_code, run_correctness, summarize, summary_table

    try:
        cases = get_grid(args.grid)
    except ValueError as e:
        raise UsageError(str(e)) from None
    pats = [p.strip() for p in (args.cases or "").split(",") if p.strip()]
    if args.cases and not pats:
        raise UsageError(f"--cases {args.cases!r} names no pattern")
    if pats and args.grid != "full":
        # The full grid is generated per candidate (below), and holds cases the shared
        # list does not (a GPU candidate's waves), so it is filtered there.
        cases = [c for c in cases if _matches(c.id, pats)]
        if not cases:
            raise UsageError(f"--cases {args.cases!r} matches no case of grid {args.grid}")
    if args.repeats < 1:
        raise UsageError("--repeats must be >= 1")
    if args.secret < 0:
        raise UsageError(f"--secret must be >= 0, got {args.secret}")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.min_time is not None and not args.min_time > 0:
        raise UsageError(f"--min-time must be > 0 seconds, got {args.min_time:g}")
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        raise UsageError("--device cuda: no CUDA device is available on this machine")
    console = _console()
    from harness.core.grids import TIMING_GRIDS, grid_pass

    timing_grid = args.grid in TIMING_GRIDS
    backward = args.backward or grid_pass(args.grid) == "bwd"
    if timing_grid and not cuda:
        console.print(f"timing needs a GPU: no CUDA device here, the {args.grid} grid was not "
                      f"run (on a CPU machine use --grid smoke or --grid full)")
        return EXIT_OK
    if not cuda:
        console.print("no CUDA device here: running the CPU candidates only")
    candidates = _select(args, cuda)
    for note in registry.notes():
        console.print(f"note: {markup(note)}")
    for err in registry.load_errors():
        console.print(f"[red]variant load error:[/red] {markup(str(err), lines=True)}")

    code = EXIT_FAIL if registry.load_errors() else EXIT_OK
    if args.sanitize:
        from harness.execution.sanitize import sanitize_candidates

        for line, found in sanitize_candidates(candidates):
            console.print(markup(line, lines=True))
            if found:
                code = EXIT_FAIL
    results: list = []
    perf_results: list = []
    if timing_grid:
        # The timing run checks every (candidate, case) once before sampling it, so a
        # separate correctness pass over these large cases would only do that work twice.
        perf_results = _perf(args, candidates, cases, console, backward)
        console.print(summary_table(summarize(perf_results),
                                    title=f"checked before timing: grid {args.grid}, "
                                          f"{len(cases)} cases"))
        _print_failures(console, perf_results)
        code = max(code, exit_code(perf_results))
    else:
        # The full grid is generated per candidate from what it declares.
        per_candidate = None
        if args.grid == "full":
            from harness.core.grids import cases_for

            def per_candidate(c):  # noqa: ANN001, ANN202 - a Candidate -> its cases
                return [k for k in cases_for("full", c) if not pats or _matches(k.id, pats)]
        tty = sys.stdout.isatty()
        counts = {c.name: len(per_candidate(c) if per_candidate else cases) for c in candidates}
        if pats and not any(counts.values()):
            raise UsageError(f"--cases {args.cases!r} matches no case of grid full for "
                             f"{', '.join(counts)}")
        keep = _keeper(args, None if tty else LineReport(counts))
        results = run_correctness(candidates, cases, secret=args.secret,
                                  repeats=args.repeats, cases_for=per_candidate,
                                  progress=not args.no_progress and tty and sys.stderr.isatty(),
                                  timeout_s=args.timeout, on_result=keep, backward=backward)
        console.print(summary_table(summarize(results),
                                    title=f"{'backward ' if backward else ''}correctness: "
                                          f"grid {args.grid}, "
                                          + (f"{len(results)} (candidate, case) pairs, "
                                             f"generated per candidate" if per_candidate
                                             else f"{len(cases)} cases")))
        if tty:  # in a pipe each failing case was printed as it happened
            _print_failures(console, results)
        code = max(code, exit_code(results))
    all_results = results + perf_results
    if args.json_path:
        _write_json(Path(args.json_path), args, all_results)
    if not _record(args, candidates, perf_results or results):
        return EXIT_USAGE  # the database was unreachable (the record is kept in the spool)
    return code


def _matches(case_id: str, patterns: list[str]) -> bool:
    """Whether a case id matches one of the --cases globs."""
    import fnmatch

    return any(fnmatch.fnmatchcase(case_id, p) for p in patterns)


def _print_failures(console: Any, results: list) -> None:
    from harness.execution.runner import FAILING

    bad = [r for r in results if r.status in FAILING]
    for r in bad[:MAX_FAILURES_SHOWN]:
        console.print(f"[red]{r.status.value.upper()}[/red] {r.kernel} {r.case.id}: "
                      f"{markup(r.message, lines=True)}", soft_wrap=True)
    if len(bad) > MAX_FAILURES_SHOWN:
        console.print(f"... and {len(bad) - MAX_FAILURES_SHOWN} more failing case(s)")


def _perf(args: argparse.Namespace, candidates: list, cases: list, console: Any,
          backward: bool = False) -> list:
    """Time every GPU candidate over the grid (each case checked once before sampling; a
    case that fails its check is reported and not timed)."""
    from harness.measure.perf import run_perf
    from harness.measure.perf_table import format_table

    timed = [c for c in candidates if c.device == "cuda"]
    if not timed:
        console.print("no GPU candidate to time")
        return []
    timing = {"rule": {"min_time_s": args.min_time}} if args.min_time is not None else None
    from harness.execution.report import LineReport

    lines = None if sys.stdout.isatty() else LineReport({c.name: len(cases) for c in timed})
    keep = _keeper(args, lines)
    results = run_perf(timed, cases, baseline=args.baseline, ncu=args.ncu,
                       timeout_s=args.timeout, timing=timing, on_result=keep,
                       backward=backward)
    print(format_table(results, args.baseline))
    return results


def _keeper(args: argparse.Namespace, lines: Any) -> Any:
    """The per-result callback: the CI log's line (`lines`, None on a terminal) and, with
    --record FILE, each result appended to FILE.partial.jsonl as it lands, so a run cut
    short by its caller (a job's time limit) still leaves every settled case."""
    from harness.records.record import json_safe

    partial = Path(args.record + ".partial.jsonl") if args.record else None
    if partial is not None:
        try:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text("")
        except OSError as e:
            raise UsageError(f"cannot write {partial}: {e}") from None

    def keep(res: Any) -> None:
        if lines is not None:
            lines.on_result(res)
        if partial is not None:
            with partial.open("a") as f:
                f.write(json.dumps(json_safe(res.to_dict()), allow_nan=False) + "\n")

    return keep


def _write_json(path: Path, args: argparse.Namespace, results: list) -> None:
    from harness.execution.runner import summarize
    from harness.records.record import json_safe

    data = {"grid": args.grid, "results": [r.to_dict() for r in results],
            "summary": [vars(row) for row in summarize(results)]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Strict JSON: an infinite error ratio (a NaN gradient) is the string "inf".
        path.write_text(json.dumps(json_safe(data), indent=1, allow_nan=False) + "\n")
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e}") from None


def _calibration_dict() -> dict | None:
    """This runner's saved ceilings (`fa-harness calibrate`), kept with the record so the
    roofline of a stored run does not depend on the machine it is viewed from."""
    from harness.measure.calibrate import CalibrationError, load_calibration

    try:
        cal = load_calibration()
    except CalibrationError as e:
        print(f"note: calibration not recorded: {e}", file=sys.stderr)
        return None
    return cal.to_dict() if cal is not None else None


def _record(args: argparse.Namespace, candidates: list, results: list) -> bool:
    """Write the run record (--record) and store it (--db). The record is spooled before
    the database is touched, so an unreachable database loses nothing. False when the
    database could not take it."""
    import torch

    from harness.records.record import RecordError, RunRecord, spool
    from harness.records.run_meta import gpu_meta, kernel_info

    meta = {"source": "cli", "grids": [args.grid],
            "kernels": {c.name: kernel_info(c) for c in candidates},
            "gpu": gpu_meta() if torch.cuda.is_available() else None,
            "calibration": _calibration_dict() if torch.cuda.is_available() else None}
    try:
        rec = RunRecord.from_results(results, meta)
        if args.record:
            print(f"record written to {rec.write(args.record)}")
    except (RecordError, OSError) as e:
        raise UsageError(f"cannot write the run record: {e}") from None
    if args.no_store:
        return True
    import os

    from harness.records.db.engine import target_of
    from harness.records.db.store import DatabaseError, open_db, store_record

    # Named by the user (--db, $FA_HARNESS_DB): a database that cannot take the run is an
    # error. The default file: a warning, the record waits in the spool either way.
    named = bool(args.db or os.environ.get("FA_HARNESS_DB"))
    kept = spool(rec, target=target_of(args.db))
    try:
        with open_db(args.db) as db:
            run_id = store_record(db, rec)
    except DatabaseError as e:
        level = "error" if named else "warning"
        print(f"fa-harness run: {level}: database not updated, record kept in {kept}: {e}",
              file=sys.stderr)
        return not named
    kept.unlink(missing_ok=True)
    print(f"stored as run {run_id}")
    return True
