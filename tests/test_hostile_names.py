"""Names and text that someone else wrote, on their way to a terminal: rich markup and
control characters shown as text, names matched whole (no trailing newline), and token
commands that never guess whether "1" is a name or an id."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from harness.cli import main
from harness.records.db import open_db
from harness.records.db.models import ApiToken, Submission
from harness.submissions import submit
from harness.submissions.tokens import TokenError, create_token, verify_token

CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home
TITLE = "\x1b]0;owned\x07"  # retitle the terminal window


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # whole cells in the tables, none folded


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "names.sqlite"))
    yield d
    d.close()


def _sub(s, name: str, submitter: str = "t", message: str = "ok", **kw) -> None:
    kw.setdefault("status", "done")
    kw.setdefault("verdict", "invalid")
    s.add(Submission(name=name, submitter=submitter, source="{}", source_hash="h",
                     message=message, **kw))


# ------------------------------------------------------------------ printing


def test_leaderboard_all_survives_markup_in_names(db, capsys):
    # Rows stored before names were checked (or by another tool): the board is everyone's,
    # one row must not stop it.
    with db.session() as s:
        _sub(s, "[/]", submitter="[bold]eve", message="[/red] closing tag",
             verdict="scored", score=1.2, detail={"coverage": {"timed": 1, "of": 48}})
        _sub(s, "[link=http://x]click[/link]", submitter="[/]")
        _sub(s, "plain_name")
    assert main(["leaderboard", "--db", db.url, "--all"]) == 0
    out = capsys.readouterr().out
    assert "[/]" in out and "[bold]eve" in out and "[/red] closing tag" in out
    assert "[link=http://x]click[/link]" in out and "plain_name" in out


def test_escape_sequences_in_names_are_shown_escaped(db, capsys):
    with db.session() as s:
        _sub(s, f"a{CLEAR}b", submitter=f"x{TITLE}y", message="bell\x07 and\r return")
        s.add(ApiToken(name=f"tok{CLEAR}", token_hash="0" * 64, revoked=False))
    assert main(["leaderboard", "--db", db.url, "--all"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "a\\x1b[2J\\x1b[Hb" in out and "x\\x1b]0;owned\\x07y" in out
    assert main(["token", "list", "--db", db.url]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "tok\\x1b[2J\\x1b[H" in out


def test_error_messages_quote_paths_escaped(db, tmp_path, capsys):
    missing = tmp_path / f"gone{CLEAR}.json"
    assert main(["import", str(missing), "--db", db.url]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "gone\\x1b[2J\\x1b[H.json" in err


def test_import_prints_file_names_escaped(tmp_path, capsys):
    from harness.records.synthetic import make_record, specs_for

    path = tmp_path / f"run{TITLE}.json"
    make_record(specs_for(), seed=1).write(path)
    url = f"sqlite:///{tmp_path / 'i.sqlite'}"
    assert main(["import", str(path), "--db", url, "--trusted"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "run\\x1b]0;owned\\x07.json" in out


# ------------------------------------------------------------------ names matched whole


def test_trailing_newline_names_are_refused(db):
    from harness.candidates.variant_spec import IDENT_RE
    from harness.submissions.sources import _NAME_OK, _SUB_NAME_OK

    # manifest name (the submission's name)
    with pytest.raises(submit.Rejected, match="field 'name'"):
        submit.read_manifest({"manifest.toml": 'name = "kernel\\n"\n', "k.cu": ""})
    assert submit.read_manifest({"manifest.toml": 'name = "kernel"\n', "k.cu": ""})
    # file names and variant names: the patterns themselves
    assert _NAME_OK.match("k.cu") and not _NAME_OK.match("k.cu\n")
    assert _SUB_NAME_OK.match("kernel") and not _SUB_NAME_OK.match("kernel\n")
    assert IDENT_RE.match("fa2") and not IDENT_RE.match("fa2\n")
    # token names
    with pytest.raises(TokenError, match="token name"):
        create_token(db.engine, "alice\n")
    with pytest.raises(TokenError, match="token name"):
        create_token(db.engine, "[/]")
    assert create_token(db.engine, "alice")[0].name == "alice"


def test_display_name_with_newline_is_recorded_as_rejected(db):
    files = {"manifest.toml": 'name = "kernel"\n', "k.cu": ""}
    res = submit.submit_files(db.engine, files, name="nice\n", submitter="t", token_id=None,
                              compile_sources=False)
    assert not res.accepted and "display name" in res.message
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
        assert "\n" not in row.name and row.verdict == "rejected"


# ------------------------------------------------------------------ tokens: id or name


def test_token_revoke_never_guesses_between_name_and_id(db, capsys):
    first, first_plain = create_token(db.engine, "alice")  # id 1
    named_one, named_one_plain = create_token(db.engine, "1")
    assert first.id == 1 and named_one.id != 1
    # NAME is a name: the token named "1" goes, token id 1 stays
    assert main(["token", "revoke", "1", "--db", db.url]) == 0
    with pytest.raises(TokenError, match="revoked"):
        verify_token(db.engine, named_one_plain)
    assert verify_token(db.engine, first_plain).id == 1
    # --id is an id
    assert main(["token", "revoke", "--id", "1", "--db", db.url]) == 0
    with pytest.raises(TokenError, match="revoked"):
        verify_token(db.engine, first_plain)
    capsys.readouterr()
    # both, or neither: refused, nothing revoked
    third, third_plain = create_token(db.engine, "carol")
    assert main(["token", "revoke", "carol", "--id", str(third.id), "--db", db.url]) == 2
    assert main(["token", "revoke", "--db", db.url]) == 2
    assert "NAME, or --id N" in capsys.readouterr().err
    assert verify_token(db.engine, third_plain).name == "carol"
    # a name that matches nothing says how to revoke by id
    assert main(["token", "revoke", "99", "--db", db.url]) == 2
    assert "--id" in capsys.readouterr().err


@pytest.mark.parametrize("kernel", [f"fa2{CLEAR}", "[/]", "fa2\n", "fa2 (bwd)", ":red[x]"])
def test_record_kernel_names_are_names(kernel, tmp_path, capsys):
    # A record's candidate names reach every page and log: one that is not a name is
    # refused at import with the record, like any other invalid field.
    from harness.records.synthetic import make_record, specs_for

    data = make_record(specs_for(), seed=1).to_dict()
    data["results"][0]["kernel"] = kernel
    data["kernels"][kernel] = {}
    path = tmp_path / "k.json"
    path.write_text(json.dumps(data))
    url = f"sqlite:///{tmp_path / 'k.sqlite'}"
    assert main(["import", str(path), "--db", url]) == 2
    err = capsys.readouterr().err
    assert "is not a candidate name" in err and "\x1b" not in err
