"""`--kernels-dir` and `--candidate`, shared by every command that takes candidates.

`harness.cli.main` applies them (harness.candidates.discovery.configure) before the
command runs, so a folder that does not exist or a `module:attr` that cannot be imported
is one line and exit 2 before any work starts, and every child process discovers the
same candidates."""

from __future__ import annotations

import argparse


def add_discovery_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernels-dir", action="append", default=[], metavar="DIR",
                   dest="kernels_dirs",
                   help="a folder of kernel variants, searched first (repeatable); then "
                        "FA_HARNESS_KERNELS, [tool.fa-harness] kernels-dirs in "
                        "pyproject.toml, then the shipped variants")
    p.add_argument("--candidate", action="append", default=[], metavar="MODULE:ATTR",
                   dest="candidate_specs",
                   help="a Python candidate (a harness.candidates.python_candidate."
                        "PythonKernel) to judge as well (repeatable)")


def apply(args: argparse.Namespace) -> None:
    """Configure discovery from the parsed options (no-op for other commands)."""
    if not hasattr(args, "kernels_dirs"):
        return
    from harness.candidates.discovery import configure

    configure(args.kernels_dirs, args.candidate_specs)
