"""`fa-harness` command line: a thin layer over the library.

Every module `harness/cli/cmd_*.py` defines `register(subparsers)`, which adds its
sub-command(s) with `set_defaults(func=...)`; `func(args) -> int` returns the exit code.

Exit codes (the same for every command, harness.cli.errors):
  0  success, nothing failed or regressed
  1  a candidate failed, or a regression was found
  2  usage or input error (bad arguments, unreadable record, unreachable database, ...)
  3  not measured (`ci`): nothing failed, but an owned candidate was not measured
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from harness.cli.errors import EXIT_FAIL, EXIT_NOT_MEASURED, EXIT_OK, EXIT_USAGE, UsageError

__all__ = ["EXIT_FAIL", "EXIT_NOT_MEASURED", "EXIT_OK", "EXIT_USAGE", "UsageError", "main"]


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
                    p.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    from harness.paths import use_compile_caches

    # Before torch, Triton or CuPy is imported by any command: their caches go under the
    # harness home (harness.paths), in this process and every child.
    use_compile_caches()
    parser = build_parser()
    args = parser.parse_args(argv)
    from harness.cli._discoveryopt import run_command

    try:
        return int(run_command(args) or 0)
    except UsageError as e:
        from harness.cli.console import plain

        # Messages quote what the user gave (paths, names, record fields) verbatim.
        print(f"fa-harness {args.command}: error: {plain(e, lines=True)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`fa-harness db current | head -2`): stop quietly. Python
        # would report the broken pipe again when it flushes stdout at exit, so point
        # stdout at /dev/null first (the recipe of the `signal` module's documentation).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
