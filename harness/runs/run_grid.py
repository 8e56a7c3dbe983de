"""`fa-harness run` conducted: the correctness suite over every candidate this machine can
run, then (perf/decode grids, on a GPU) the timing run, its record written and stored.

The command line parses and prints (harness.cli.cmd_run); everything between is here, so
the fronts that run a grid resolve it the same way (harness.runs.grid_cases) and describe
their runs the same way (harness.runs.run_meta). What reaches the terminal goes through
the `console` and `markup` the caller gives: this part does not know the CLI's console.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.runs.grid_cases import GridCases, resolve_grid
from harness.runs.run_output import keeper, store_run, write_json

MAX_FAILURES_SHOWN = 20


class RunUsageError(ValueError):
    """Bad input to a run (unknown grid or kernel, bad option): exit code 2."""


@dataclass
class RunOptions:
    grid: str = "smoke"
    backward: bool = False
    kernels: str | None = None  # comma-separated names or globs
    cases: str | None = None  # comma-separated case-id globs
    device: str | None = None  # "cpu" | "cuda"
    secret: int = 0
    repeats: int = 1
    timeout_s: float = 300.0
    baseline: str = "sdpa_flash"
    ncu: bool = False
    min_time_s: float | None = None
    json_path: str | None = None
    record: str | None = None
    db: str | None = None
    no_store: bool = False
    no_progress: bool = False
    sanitize: bool = False


@dataclass
class RunOutcome:
    # A case failed, crashed, timed out, errored or was invalid, a CUDA variant failed to
    # load, or the sanitizer found something.
    failed: bool = False
    # The database named by the user could not take the record (it waits in the spool).
    store_failed: bool = False
    results: list[Any] = field(default_factory=list)


def _check(opts: RunOptions) -> None:
    if opts.repeats < 1:
        raise RunUsageError("--repeats must be >= 1")
    if opts.secret < 0:
        raise RunUsageError(f"--secret must be >= 0, got {opts.secret}")
    if not opts.timeout_s > 0:
        raise RunUsageError(f"--timeout must be > 0 seconds, got {opts.timeout_s:g}")
    if opts.min_time_s is not None and not opts.min_time_s > 0:
        raise RunUsageError(f"--min-time must be > 0 seconds, got {opts.min_time_s:g}")


def select(opts: RunOptions, cuda: bool) -> list[Any]:
    """The candidates of this run: those --kernels names (planted bugs only when named),
    else every available one; on this device, the CPU only without a GPU."""
    from harness.candidates import registry

    pool = registry.discover()
    if opts.kernels:
        pool = pool + registry.discover(("planted",))
        try:
            chosen = registry.select(pool, opts.kernels)
        except ValueError as e:
            raise RunUsageError(str(e)) from None
    else:
        chosen = [c for c in pool if registry.available(c)]
    if opts.device:
        chosen = [c for c in chosen if c.device == opts.device]
    elif not cuda:
        chosen = [c for c in chosen if c.device == "cpu"]
    if not chosen:
        raise RunUsageError("no candidate to run (check --kernels / --device)")
    return chosen


def run_grid(opts: RunOptions, console: Any, markup: Callable[..., str]) -> RunOutcome:
    """Check (and on a timing grid, time) the candidates over `opts.grid`, write and store
    the record. `console.print` takes rich markup; `markup` makes foreign text safe in it."""
    import torch

    from harness.candidates import registry
    from harness.execution.runner import exit_code, summarize, summary_table

    try:
        grid = resolve_grid(opts.grid, [p.strip() for p in (opts.cases or "").split(",")
                                        if p.strip()])
    except ValueError as e:
        raise RunUsageError(str(e)) from None
    if opts.cases and not grid.patterns:
        raise RunUsageError(f"--cases {opts.cases!r} names no pattern")
    # A per-candidate grid holds cases its shared list does not (a GPU candidate's
    # waves): whether --cases matches one is known only once the candidates are.
    if grid.patterns and not grid.per_candidate and not grid.cases:
        raise RunUsageError(f"--cases {opts.cases!r} matches no case of grid {opts.grid}")
    _check(opts)
    cuda = torch.cuda.is_available()
    if opts.device == "cuda" and not cuda:
        raise RunUsageError("--device cuda: no CUDA device is available on this machine")
    backward = opts.backward or grid.backward
    if grid.timing and not cuda:
        console.print(f"timing needs a GPU: no CUDA device here, the {opts.grid} grid was not "
                      f"run (on a CPU machine use --grid smoke or --grid full)")
        return RunOutcome()
    if not cuda:
        console.print("no CUDA device here: running the CPU candidates only")
    candidates = select(opts, cuda)
    for note in registry.notes():
        console.print(f"note: {markup(note)}")
    for err in registry.load_errors():
        console.print(f"[red]variant load error:[/red] {markup(str(err), lines=True)}")

    failed = bool(registry.load_errors())
    if opts.sanitize:
        from harness.execution.sanitize import sanitize_candidates

        for line, found in sanitize_candidates(candidates):
            console.print(markup(line, lines=True))
            failed = failed or found
    results: list[Any] = []
    perf_results: list[Any] = []
    cases = list(grid.cases)
    if grid.timing:
        # The timing run checks every (candidate, case) once before sampling it, so a
        # separate correctness pass over these large cases would only do that work twice.
        perf_results = _perf(opts, candidates, cases, console, backward)
        console.print(summary_table(summarize(perf_results),
                                    title=f"checked before timing: grid {opts.grid}, "
                                          f"{len(cases)} cases"))
        _print_failures(console, markup, perf_results)
        failed = failed or exit_code(perf_results) != 0
    else:
        results = _correctness(opts, grid, candidates, backward, console, markup)
        failed = failed or exit_code(results) != 0
    out = RunOutcome(failed=failed, results=results + perf_results)
    if opts.json_path:
        write_json(opts.json_path, opts.grid, out.results, RunUsageError)
    out.store_failed = not store_run(opts, candidates, perf_results or results, RunUsageError)
    return out


def _correctness(opts: RunOptions, grid: GridCases, candidates: list[Any], backward: bool,
                 console: Any, markup: Callable[..., str]) -> list[Any]:
    from harness.execution.report import LineReport
    from harness.execution.runner import run_correctness, summarize, summary_table

    per_candidate = grid.for_candidate if grid.per_candidate else None
    tty = sys.stdout.isatty()
    counts = {c.name: len(grid.for_candidate(c)) for c in candidates}
    if grid.patterns and not any(counts.values()):
        raise RunUsageError(f"--cases {opts.cases!r} matches no case of grid {opts.grid} "
                            f"for {', '.join(counts)}")
    keep = keeper(opts.record, None if tty else LineReport(counts), RunUsageError)
    results = run_correctness(candidates, list(grid.cases), secret=opts.secret,
                              repeats=opts.repeats, cases_for=per_candidate,
                              progress=not opts.no_progress and tty and sys.stderr.isatty(),
                              timeout_s=opts.timeout_s, on_result=keep, backward=backward)
    console.print(summary_table(summarize(results),
                                title=f"{'backward ' if backward else ''}correctness: "
                                      f"grid {opts.grid}, "
                                      + (f"{len(results)} (candidate, case) pairs, "
                                         f"generated per candidate" if per_candidate
                                         else f"{len(grid.cases)} cases")))
    # A candidate with no case of a per-candidate grid has no row above: say why instead.
    for line in grid.no_case_lines(candidates):
        console.print(markup(line))
    if tty:  # in a pipe each failing case was printed as it happened
        _print_failures(console, markup, results)
    return results


def _print_failures(console: Any, markup: Callable[..., str], results: list[Any]) -> None:
    from harness.execution.runner import FAILING

    bad = [r for r in results if r.status in FAILING]
    for r in bad[:MAX_FAILURES_SHOWN]:
        console.print(f"[red]{r.status.value.upper()}[/red] {r.kernel} {r.case.id}: "
                      f"{markup(r.message, lines=True)}", soft_wrap=True)
    if len(bad) > MAX_FAILURES_SHOWN:
        console.print(f"... and {len(bad) - MAX_FAILURES_SHOWN} more failing case(s)")


def _perf(opts: RunOptions, candidates: list[Any], cases: list[Any], console: Any,
          backward: bool = False) -> list[Any]:
    """Time every GPU candidate over the grid (each case checked once before sampling; a
    case that fails its check is reported and not timed)."""
    from harness.execution.report import LineReport
    from harness.measure.perf import run_perf
    from harness.measure.perf_table import format_table

    timed = [c for c in candidates if c.device == "cuda"]
    if not timed:
        console.print("no GPU candidate to time")
        return []
    timing = ({"rule": {"min_time_s": opts.min_time_s}} if opts.min_time_s is not None
              else None)
    lines = None if sys.stdout.isatty() else LineReport({c.name: len(cases) for c in timed})
    keep = keeper(opts.record, lines, RunUsageError)
    results = run_perf(timed, cases, baseline=opts.baseline, ncu=opts.ncu,
                       timeout_s=opts.timeout_s, timing=timing, on_result=keep,
                       backward=backward)
    print(format_table(results, opts.baseline))
    return results
