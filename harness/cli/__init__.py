"""`fa-harness` command line: a thin layer over the library.

Every module `harness/cli/cmd_*.py` defines `register(subparsers)`, which adds its
sub-command(s) with `set_defaults(func=...)`; `func(args) -> int` returns the exit code.

Exit codes (the same for every command, harness.cli.errors):
  0  success, nothing failed or regressed
  1  a candidate failed, or a regression was found
  2  usage or input error (bad arguments, unreadable record, unreachable or damaged
     database, ...)
  3  not measured (`ci`): nothing failed, but an owned candidate was not measured, or
     nothing of the team's was found to judge
  130  interrupted (Ctrl-C, SIGINT): one line on stderr
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from harness.cli.errors import (
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_NOT_MEASURED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
)
from harness.cli.helpfmt import DocstringFormatter

__all__ = ["EXIT_FAIL", "EXIT_INTERRUPTED", "EXIT_NOT_MEASURED", "EXIT_OK", "EXIT_USAGE",
           "UsageError", "main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, exit 2 (argparse's default code)
        from harness.cli.console import plain

        print(f"fa-harness: error: {plain(message, lines=True)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fa-harness")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fa-harness", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fa-harness {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    import harness.cli as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if mod.name.startswith("cmd_"):
            before = set(sub.choices)
            module = importlib.import_module(f"harness.cli.{mod.name}")
            module.register(sub)
            # A command without a description of its own shows its module's whole
            # docstring (what it does, its exit codes), line breaks kept.
            for name in set(sub.choices) - before:
                p = sub.choices[name]
                if not p.description and module.__doc__:
                    p.description = module.__doc__.strip()
                    p.formatter_class = DocstringFormatter
    return parser


def _database_problem(exc: BaseException) -> str | None:
    """The one line for a database error no command caught (a damaged file met in the
    middle of a command, harness.records.db.database.DatabaseDamaged), else None. Only
    looked for when the database module was loaded: a command that never opened a
    database raised none."""
    database = sys.modules.get("harness.records.db.database")
    if database is not None and isinstance(exc, database.DatabaseError):
        return str(exc)
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None and isinstance(exc, sa_exc.DBAPIError):
        # The driver's first line, without SQLAlchemy's statement and parameters (data).
        first = str(getattr(exc, "orig", None) or type(exc).__name__).strip().splitlines()
        return f"database error: {first[0] if first else type(exc).__name__}"
    return None


def main(argv: list[str] | None = None) -> int:
    from harness.cli.console import plain
    from harness.paths import use_compile_caches

    command = "fa-harness"
    try:
        # Before torch, Triton or CuPy is imported by any command: their caches go under
        # the harness home (harness.paths), in this process and every child.
        use_compile_caches()
        args = build_parser().parse_args(argv)
        command = f"fa-harness {args.command}"
        from harness.cli._discoveryopt import run_command

        return int(run_command(args) or 0)
    except UsageError as e:
        # Messages quote what the user gave (paths, names, record fields) verbatim.
        print(f"{command}: error: {plain(e, lines=True)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Whatever was half done is rolled back (a database transaction) or left where a
        # later run finds it (the spool); say so in one line rather than a traceback.
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`fa-harness db current | head -2`): stop quietly. Python
        # would report the broken pipe again when it flushes stdout at exit, so point
        # stdout at /dev/null first (the recipe of the `signal` module's documentation).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAIL
    except Exception as e:  # noqa: BLE001 - re-raised unless a database problem
        line = _database_problem(e)
        if line is None:
            raise
        print(f"{command}: error: {plain(line, lines=True)}", file=sys.stderr)
        return EXIT_USAGE


def entry() -> None:
    """The `fa-harness` program: `main`, its code the process's exit status.

    After Ctrl-C the exit is immediate, streams flushed: a SIGINT that lands while
    C++ code evaluates Python (pybind11's exec, as torch's import does) marks the
    interpreter as stopped by an unhandled KeyboardInterrupt even though `main` caught it,
    and CPython then ends the process by SIGINT at exit (status -2, not the documented
    130). Nothing is left to clean up by then: `main` rolled back or spooled what it had."""
    code = main()
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
