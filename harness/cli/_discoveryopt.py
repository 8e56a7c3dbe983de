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


def run_command(args: argparse.Namespace) -> int:
    """Configure discovery from the parsed options (commands that take candidates), then
    run the command. A kernels folder or candidate that is missing or defined twice
    (DiscoveryError, wherever discovery meets it) is a usage error: one line, exit 2."""
    from harness.candidates.discovery import DiscoveryError, configure
    from harness.cli.errors import UsageError

    try:
        if hasattr(args, "kernels_dirs"):
            configure(args.kernels_dirs, args.candidate_specs)
        return args.func(args)
    except DiscoveryError as e:
        raise UsageError(str(e)) from None
