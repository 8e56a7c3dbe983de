"""`fa-harness run` read as a CI job reads it: through a pipe, no terminal. A result line
for each finished candidate arrives while the run is still going, and tables fit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.cli import main


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="0", **kw)
    return env


def test_run_through_a_pipe_prints_a_result_line_before_it_ends(tmp_path):
    # Two CPU models on the smoke grid: the first one's line must come before the end.
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", "--kernels", "naive_model,fa2_model",
         "--no-store"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_env(FA_HARNESS_HOME=str(tmp_path)))
    assert proc.stdout is not None
    first_line_at = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if first_line_at is None and line.startswith("ok   "):
            first_line_at = time.monotonic()
    proc.wait(timeout=600)
    ended_at = time.monotonic()
    text = "".join(lines)
    assert proc.returncode == 0, text
    assert first_line_at is not None, text
    # the first candidate's line, then the second candidate ran for a while
    assert ended_at - first_line_at > 0.5, text
    assert "ok   fa2_model: passed" in text and "ok   naive_model: passed" in text
    # in a pipe the table is 100 columns wide, with whole names
    widths = {len(ln.rstrip("\n")) for ln in lines if ln.startswith(("┏", "└"))}
    assert widths and max(widths) <= 100, widths


@pytest.mark.parametrize("columns", [80, 100])
def test_summary_table_fits_and_keeps_names_whole(columns, monkeypatch, capsys):
    from harness.core.cases import Case, MaskKind
    from harness.core.results import CaseResult, Status
    from harness.execution.runner import summarize, summary_table

    monkeypatch.setenv("COLUMNS", str(columns))
    case = Case(2, 16, 4, 1023, 2049, 128, "bfloat16", MaskKind.KEY_PADDING, 0)
    names = ["sdpa_efficient", "splitkv_model", "a_team_kernel_with_a_long_name"]
    res = [CaseResult(n, case, s, "x") for n in names
           for s in (Status.PASSED, Status.FAILED, Status.TIMEOUT)]
    from harness.cli.console import console

    console().print(summary_table(summarize(res)))
    out = capsys.readouterr().out
    assert max(len(ln) for ln in out.splitlines()) <= columns
    for n in names:
        assert any(n in ln for ln in out.splitlines()), (n, out)


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("fa-harness ") and out.count("\n") == 1


def test_a_candidate_line_fits_80_columns():
    from harness.execution.report import candidate_line

    short = candidate_line("fa2_model", {"passed": 25}, 0.73, "b2h4-64x64-d64-fp16-none")
    assert short == "ok   fa2_model: passed 25; worst error ratio 0.73 (b2h4-64x64-d64-fp16-none)"
    long = candidate_line("flex_attention", {"passed": 25}, 1.12,
                          "b1h4-256x256-d128-bf16-causal_br")
    assert long.splitlines() == ["ok   flex_attention: passed 25",
                                 "     worst error ratio 1.12 (b1h4-256x256-d128-bf16-causal_br)"]
    assert all(len(ln) <= 80 for ln in (short + "\n" + long).splitlines())
