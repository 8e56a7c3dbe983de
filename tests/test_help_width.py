"""Every command's --help fits an 80-column CI log and keeps its lists (exit codes)."""

from __future__ import annotations

import pytest

from harness.cli import build_parser
from harness.cli.helpfmt import refill


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(sub.choices)


@pytest.mark.parametrize("command", _commands())
def test_help_fits_80_columns(command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, wide


def test_ci_help_keeps_its_exit_codes_as_a_list(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ci", "--help"])
    lines = capsys.readouterr().out.splitlines()
    for code in ("0", "1", "2", "3", "130"):
        assert any(line.startswith(f"  {code}  ") for line in lines), code


def test_refill_keeps_items_examples_and_paragraphs():
    text = ("A paragraph that is long enough to be folded when the width is small.\n"
            "\n"
            "  1  an item whose text goes on\n"
            "     on a second line\n"
            "\n"
            "    fa-harness ci --kernels 'fa2*' --grid smoke,perf,decode --budget 5\n")
    out = refill(text, 30).splitlines()
    assert all(len(line) <= 30 for line in out if not line.startswith("    fa-harness"))
    item = next(i for i, line in enumerate(out) if line.startswith("  1  an item"))
    assert out[item + 1].startswith("     on") and "second line" in out[item + 1]
    assert "    fa-harness ci --kernels 'fa2*' --grid smoke,perf,decode --budget 5" in out
