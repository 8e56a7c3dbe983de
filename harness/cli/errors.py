"""The exit codes every command shares, and the one error type a command raises for bad
input (printed as one line by `harness.cli.main`, exit 2). Its own module, so that the
option helpers and the commands need not import the CLI package's entry point.

  0  success, nothing failed or regressed
  1  a candidate failed, or a regression was found
  2  usage or input error (bad arguments, unreadable record, unreachable or damaged
     database, ...)
  3  not measured (`ci`): nothing failed, but an owned candidate was not measured, or
     nothing of the team's was found to judge
  130  interrupted (Ctrl-C, SIGINT): one line on stderr
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NOT_MEASURED = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C stopped


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
