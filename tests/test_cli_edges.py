"""Bad input to the CLI as a user types it: one line on stderr, exit 2, no traceback, and
no database created by a command that only reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main


def _one_line_exit_2(capsys, argv: list[str], needle: str) -> None:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


@pytest.mark.parametrize(("argv", "needle"), [
    (["run", "--secret", "-1"], "--secret must be >= 0"),
    (["run", "--timeout", "-5"], "--timeout must be > 0"),
    (["run", "--min-time", "0"], "--min-time must be > 0"),
    (["ci", "--budget", "-1"], "--budget must be > 0"),
    (["ci", "--timeout", "0"], "--timeout must be > 0"),
    (["ci", "--secret", "-3"], "--secret must be >= 0"),
    (["leaderboard", "--limit", "-1"], "--limit must be >= 1"),
    (["worker", "--gpu", "7", "--drain"], "--gpu 7: this machine has"),
    (["worker", "--gpu", "-1", "--drain"], "--gpu must be >= 0"),
])
def test_bad_values_are_one_line_exit_2(capsys, argv, needle):
    _one_line_exit_2(capsys, argv, needle)


@pytest.mark.parametrize("argv", [["leaderboard"], ["token", "list"],
                                  ["worker", "--drain"], ["db", "current"],
                                  ["export", "--run", "latest", "-o", "x.json"]])
def test_reading_commands_never_create_a_database(tmp_path, capsys, argv):
    db = tmp_path / "no" / "such" / "dir" / "r.sqlite"
    _one_line_exit_2(capsys, [*argv, "--db", str(db)], "no database at")
    assert not (tmp_path / "no").exists()


def test_export_to_an_unwritable_path_is_one_line(tmp_path, capsys):
    from harness.records.db.store import open_db, store_record
    from harness.records.synthetic import make_record, specs_for

    db = tmp_path / "r.sqlite"
    with open_db(str(db)) as d:
        store_record(d, make_record(specs_for(), seed=1))
    _one_line_exit_2(capsys, ["export", "--run", "latest", "-o", "/proc/x.json", "--db",
                              str(db)], "cannot write /proc/x.json")


def _cli(*args: str, home: Path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "FA_HARNESS_HOME": str(home)}
    env.pop("FA_HARNESS_DB", None)
    return subprocess.run([sys.executable, "-m", "harness", *args], env=env, text=True,
                          capture_output=True, timeout=120, **kw)


def test_db_current_into_head_has_no_broken_pipe(tmp_path):
    db = tmp_path / "r.sqlite"
    assert _cli("db", "upgrade", "--db", str(db), home=tmp_path).returncode == 0
    env = {**os.environ, "FA_HARNESS_HOME": str(tmp_path)}
    proc = subprocess.run(f"{sys.executable} -m harness db current --db {db} | head -1",
                          shell=True, env=env, text=True, capture_output=True, timeout=120)
    assert proc.stdout.count("\n") == 1 and "revision" in proc.stdout
    assert "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_database_commands_do_not_import_torch(tmp_path):
    code = ("import sys; from harness.cli import main; "
            f"main(['db', 'current', '--db', {str(tmp_path / 'x.sqlite')!r}]); "
            "main(['leaderboard', '--db', 'nowhere.sqlite']); "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True,
                          timeout=120, env={**os.environ, "FA_HARNESS_HOME": str(tmp_path)})
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr


def test_run_stores_every_run_in_the_default_database(tmp_path):
    proc = _cli("run", "--kernels", "naive_model", "--cases", "*-fp16-none", home=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # It ends saying where the run went and what to try next.
    last = proc.stdout.strip().splitlines()[-2:]
    assert last[0] == f"stored as run 1 in sqlite:///{tmp_path / 'results.sqlite'}", last
    assert last[1].startswith("next: fa-harness dashboard, then open ") and "run=1" in last[1]
    assert (tmp_path / "results.sqlite").exists()
    # FA_HARNESS_DB is honoured
    other = tmp_path / "other.sqlite"
    env = {**os.environ, "FA_HARNESS_HOME": str(tmp_path), "FA_HARNESS_DB": str(other)}
    proc = subprocess.run([sys.executable, "-m", "harness", "run", "--kernels", "naive_model",
                           "--cases", "*-fp16-none"], env=env, text=True, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0 and other.exists(), proc.stderr
    proc = _cli("run", "--kernels", "naive_model", "--cases", "*-fp16-none", "--no-store",
                home=tmp_path / "h2")
    assert proc.returncode == 0 and "stored" not in proc.stdout
    assert not (tmp_path / "h2" / "results.sqlite").exists()


def test_every_command_help_says_what_it_does_in_whole_sentences(capsys):
    """`run --help` was cut mid-sentence and named no exit codes; `ci --help` had no
    description at all."""
    from harness.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        desc = (parser.description or "").strip()
        assert desc, name
        assert desc.rstrip('"').endswith((".", ")", ":")), (name, desc[-60:])
    for name in ("run", "ci", "kernels"):
        text = sub.choices[name].format_help()
        assert "Exit codes" in text, name
    assert "3  not measured" in sub.choices["ci"].format_help()


def test_the_cli_option_helpers_do_not_import_the_cli_package():
    """`harness.cli` and `harness.cli._discoveryopt` imported each other (lazily): the
    helpers take the exit codes and UsageError from `harness.cli.errors`, and no module
    import-linter's contract ignores anything for it."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "harness" / "cli"
    for mod in [root / "_discoveryopt.py", root / "_dbopt.py", *root.glob("cmd_*.py")]:
        for node in ast.walk(ast.parse(mod.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "harness.cli":
                raise AssertionError(f"{mod.name} imports from the harness.cli package")
    text = (root.parents[1] / "pyproject.toml").read_text()
    assert "harness.cli -> harness.cli._discoveryopt" not in text


def test_full_grid_cases_filter_the_candidates_own_grid(tmp_path, capsys):
    """`run --grid full --cases` filters each candidate's generated grid, which holds cases
    the shared `full` list does not (a GPU candidate's waves among them): a pattern that
    only such a case matches runs it instead of being refused."""
    from harness.candidates import registry
    from harness.core import grids

    shared = {c.id for c in grids.get_grid("full")}
    own = [c.id for c in grids.full_for(registry.get_candidate("fa2_model"))]
    only_own = next(i for i in own if i not in shared)
    out = tmp_path / "r.json"
    assert main(["run", "--grid", "full", "--kernels", "fa2_model", "--cases", only_own,
                 "--no-store", "--no-progress", "--json", str(out)]) == 0
    import json

    ran = [r["case_id"] for r in json.loads(out.read_text())["results"]]
    assert ran == [only_own]
    capsys.readouterr()


def test_full_grid_cases_matching_nothing_name_the_candidates(capsys):
    # fa2_model is a CPU candidate: it has no waves cases.
    _one_line_exit_2(capsys, ["run", "--grid", "full", "--kernels", "fa2_model", "--cases",
                              "b4h24*", "--no-store"],
                     "matches no case of grid full for fa2_model")


def test_cases_of_only_commas_are_refused(capsys):
    _one_line_exit_2(capsys, ["run", "--cases", " , ", "--no-store"], "names no pattern")
