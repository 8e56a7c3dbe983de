"""`fa-harness kernels`: every candidate with what it supports and where it came from, and
every source searched with what it gave.

`--compile` builds everything before a gate needs it, every CPU core busy: each CUDA
variant with nvcc for `--arch` (registers and spills per entry point, a line as each
lands; no GPU needed), and on a GPU runner everything `fa-harness ci` will compile there
(each variant with NVRTC for this GPU, each Python candidate's Triton/Inductor kernels in
the order the gate calls them), into the compile caches under the harness home
(harness.paths). `--cache-key` prints a key for a CI cache of that folder that changes
when a source or the toolchain does.

Exit codes: 0 when everything listed loads (and compiles); 1 when a variant fails to load
or to compile; 2 on bad arguments (or a bad [tool.fa-harness] setting, an empty kernels
folder)."""

from __future__ import annotations

import argparse
import json
import re

from harness.cli._discoveryopt import add_discovery_options
from harness.cli.console import markup
from harness.cli.errors import EXIT_FAIL, EXIT_OK, UsageError
from harness.cli.helpfmt import DocstringFormatter

ARCH_RE = re.compile(r"^sm_\d+[af]?\Z")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="list candidates and what they support; --compile "
                                       "builds the CUDA variants", description=__doc__,
                       formatter_class=DocstringFormatter)
    p.add_argument("--compile", action="store_true",
                   help="compile every CUDA variant with nvcc (no GPU needed) and, on a GPU, "
                        "warm the compile caches for everything `ci` runs here")
    p.add_argument("--cache-key", action="store_true",
                   help="print the compile cache's key (sources and toolchain) and exit")
    p.add_argument("--arch", default="sm_80,sm_90", help="archs for --compile "
                                                          "(default sm_80,sm_90)")
    p.add_argument("--planted", action="store_true", help="also list the planted-bug models")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_discovery_options(p)
    p.set_defaults(func=run)


def _fmt_set(values, all_values=None) -> str:
    if values is None:
        return "any"
    vals = sorted(values) if all(isinstance(v, int) for v in values) else sorted(values, key=str)
    if all_values is not None and set(values) >= set(all_values):
        return "all"
    return ",".join(str(getattr(v, "value", v)) for v in vals)


def _backward(c, dtypes: str, head_dims: str) -> dict:
    """What a candidate declares of its backward. It is declared over the forward's
    support (a manifest's `[backward]`, a Python candidate's `backward`), so its dtypes and
    head dims are the forward's, its masks the forward's unless it names fewer
    (`Support.backward_masks`); a case it refuses beyond that is skipped with the reason
    (`Candidate.supports_backward`: a library backend tries it)."""
    from harness.core.cases import MaskKind

    s = c.support
    if not s.backward:
        return {"supported": False, "deterministic": None, "dtypes": None,
                "head_dims": None, "masks": None}
    masks = s.masks if s.backward_masks is None else s.backward_masks
    return {"supported": True, "deterministic": s.backward_deterministic, "dtypes": dtypes,
            "head_dims": head_dims, "masks": _fmt_set(masks, MaskKind)}


def _bwd_cell(b: dict) -> str:
    if not b["supported"]:
        return "no"
    return "det" if b["deterministic"] else "nondet"


def describe(c) -> dict:
    """What a candidate declares, as plain data (the table's and --json's rows)."""
    from harness.candidates.registry import origin, owned, unavailable_reason
    from harness.core.cases import DTYPE_SHORT, MaskKind

    s = c.support
    dtypes = ",".join(DTYPE_SHORT.get(d, d) for d in sorted(s.dtypes))
    return {
        "name": c.name, "kind": c.kind, "device": c.device, "algorithm": c.algorithm,
        "origin": origin(c),
        # what the CI gate makes of it: the team's own (timed with a floor) or a yardstick
        "role": "owned" if owned(c) else "yardstick",
        "dtypes": dtypes,
        "head_dims": _fmt_set(s.head_dims),
        "masks": _fmt_set(s.masks, MaskKind),
        "gqa": s.gqa,
        "lse": (f"yes ({s.masked_lse} masked)" if s.writes_lse else "no"),
        # the axes a candidate must declare to run (docs/score-mods.md, docs/fp8.md)
        "extras": ",".join(name for name, on in (
            ("softcap", s.softcap), ("alibi", s.alibi), ("sinks", s.sinks),
            ("d_v", s.head_dim_v), ("fp8", s.fp8), ("fp8_kv", s.fp8_kv)) if on) or "none",
        "deterministic": s.deterministic,
        # dQ, dK, dV: whether it has one, whether its repeats are bitwise equal
        "backward": _backward(c, dtypes, _fmt_set(s.head_dims)),
        "isolate": c.isolate,
        "tiles": dict(c.tiles),
        "available": unavailable_reason(c) or "yes",
        "description": c.description,
    }


def run(args: argparse.Namespace) -> int:
    from harness.candidates import registry

    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    bad = [a for a in archs if not ARCH_RE.match(a)]
    if bad or not archs:
        raise UsageError(f"--arch wants names like sm_80,sm_90a; got {args.arch!r}")
    kinds = registry.DEFAULT_KINDS + (("planted",) if args.planted else ())
    if args.cache_key:
        from harness.candidates.cache_key import cache_key

        print(cache_key(registry.discover(registry.DEFAULT_KINDS)))
        return EXIT_OK
    rows = [describe(c) for c in registry.discover(registry.DEFAULT_KINDS)]
    if args.planted:
        rows += [describe(c) for c in registry.discover(("planted",))]
    errors = [str(e) for e in registry.load_errors()]
    notes = registry.notes()
    code = EXIT_FAIL if errors else EXIT_OK
    from harness.candidates.discovery import sources

    srcs = [s.line() for s in sources()]
    reports: list = []
    warmed: list = []
    if not args.json:
        _print_table(rows, errors, notes, srcs)
    if args.compile:
        reports, warmed, compile_code = _compile(archs, quiet=args.json)
        code = max(code, compile_code)
    if args.json:
        print(json.dumps({"candidates": rows, "load_errors": errors, "notes": notes,
                          "sources": srcs, "kinds": list(kinds),
                          "compile": [r.to_dict() for r in reports],
                          "warm_up": warmed}, indent=1))
        return code
    if reports:
        from harness.candidates.compile import format_reports

        print(format_reports(reports))
    return code


def _compile(archs: list[str], *, quiet: bool) -> tuple[list, list, int]:
    """nvcc builds (where nvcc is), then the warm-up for this GPU (where one is); a line
    as each lands unless `quiet` (--json)."""
    import os

    import torch

    from harness.candidates.compile import compile_all_nvcc, nvcc_path
    from harness.candidates.nvcc import report_line

    gpu = torch.cuda.is_available()
    if nvcc_path() is None and not gpu:
        raise UsageError("--compile needs nvcc on PATH (or a GPU to build for)")

    def say(line: str) -> None:
        if not quiet:
            print(line, flush=True)

    reports: list = []
    if nvcc_path() is not None:
        say(f"nvcc: every variant for {', '.join(archs)}, {os.cpu_count() or 1} at a time")
        reports = compile_all_nvcc(archs, on_report=lambda r, t: say(report_line(r, t)))
    else:
        say("nvcc not found: the nvcc builds are skipped (the GPU warm-up follows)")
    code = EXIT_FAIL if any(not r.ok for r in reports) else EXIT_OK
    warmed: list = []
    if gpu:
        from harness.candidates import registry
        from harness.execution.warmup import warm_up
        from harness.paths import cache_dir
        from harness.runs.gate_prepare import ci_warm_tasks

        tasks = ci_warm_tasks(registry.discover(registry.DEFAULT_KINDS))
        jobs = os.cpu_count() or 1
        say(f"warm-up for this GPU: {len(tasks)} task(s), {jobs} at a time, into {cache_dir()}")
        for res in warm_up(tasks, parallel=jobs, log=say):
            warmed.append({"candidate": res.task.name, "what": res.task.what,
                           "cases": len(res.task.cases), "seconds": round(res.seconds, 1),
                           "failures": res.failures})
            if not res.ok and res.task.what == "compile":
                code = EXIT_FAIL
    return reports, warmed, code


def wide_console():
    """The terminal's width, or in a pipe `COLUMNS` / 100 columns (harness.cli.console)."""
    from harness.cli.console import console

    return console()


def _origin_cell(origin: str, narrow: bool) -> str:
    """The shipped variants' folder is the same for all (--json has the paths); in a
    narrow table every origin is its source alone (a kernels folder's path, an entry
    point's module are in the "from" lines under the table)."""
    if origin.startswith("shipped:"):
        return "shipped"
    if narrow:
        return origin.split(": ", 1)[0].split(" (", 1)[0]
    return origin


def _print_table(rows: list[dict], errors: list[str], notes: list[str],
                 srcs: list[str] = ()) -> None:
    from rich.table import Table

    console = wide_console()
    t = Table(title="candidates")
    cols: tuple[str, ...] = ("name", "kind", "role", "device", "algorithm", "dtypes",
                             "head_dims", "masks", "gqa", "lse", "extras", "bwd",
                             "available", "origin")
    # Fourteen columns do not fit a narrow terminal: keep the whole names and what decides
    # a run (kind, backward, availability, origin), and say where the rest is.
    narrow = console.width < 140
    if narrow:
        cols = ("name", "kind", "role", "bwd", "available", "origin")
        t.caption = "what each supports: a wider terminal, or --json"
    # bwd: no backward, or one whose repeats are bitwise equal (det) or not (nondet); it
    # runs the forward's dtypes and head dims.
    for col in cols:  # names stay whole; the long lists fold
        t.add_column(col.replace("_", " "),
                     no_wrap=col in ("name", "kind", "role", "device", "bwd"), overflow="fold")
    for r in rows:
        avail = r["available"]
        cells = {**r, "available": "yes" if avail == "yes" else
                 "no (needs CUDA)" if avail.startswith("needs a CUDA GPU") else f"no: {avail}",
                 # The shipped variants' folder is the same for all; --json has the paths.
                 "origin": _origin_cell(r["origin"], narrow),
                 "bwd": _bwd_cell(r["backward"])}
        t.add_row(*(("yes" if cells[c] else "no") if isinstance(cells[c], bool)
                    else markup(str(cells[c])) for c in cols))
    console.print(t)
    for line in srcs:  # every source searched, with what it gave (nothing, too)
        console.print(f"from {markup(line)}", soft_wrap=True)
    for n in notes:
        console.print(f"note: {markup(n)}")
    for e in errors:
        console.print(f"[red]variant load error:[/red] {markup(e, lines=True)}", soft_wrap=True)
