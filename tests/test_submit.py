"""Submission validation, storing and the submit/token CLI (CPU; nvcc for compiles)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import func, select

from harness.cli import main
from harness.records.db import open_db
from harness.records.db.models import ApiToken, Submission
from harness.submissions import submit
from harness.submissions.tokens import TokenError, create_token, hash_token, verify_token

DATA = Path(__file__).parent / "data" / "submissions"
ROOT = Path(__file__).resolve().parent.parent
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@pytest.fixture(autouse=True)
def _sandbox_backend(monkeypatch):
    """These tests are about validation, not the sandbox (tested on its own in
    test_submit_hostile.py, and its absence below): on a machine without bubblewrap they
    compile under resource limits only, as an operator there would have to choose."""
    if shutil.which("bwrap") is None:
        monkeypatch.setenv("FA_HARNESS_SANDBOX", "rlimits")


@pytest.fixture
def db(tmp_path):
    d = open_db(str(tmp_path / "sub.sqlite"))
    yield d
    d.close()


def _reject(path: Path | dict, **kw) -> str:
    files = path if isinstance(path, dict) else submit.pack_path(path)
    with pytest.raises(submit.Rejected) as e:
        submit.validate(files, **kw)
    return str(e.value)


# ------------------------------------------------------------------ validation: rejections


def test_fifty_megabyte_source_is_refused_unread(tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    shutil.copy(DATA / "good_rowwarp.cu", big / "kernel.cu")
    with open(big / "huge.cu", "wb") as f:
        f.truncate(50 * 2**20)  # sparse: the check must use the size, not read 50 MB
    with pytest.raises(submit.Rejected, match=r"huge.cu: 52428800 bytes; the limit is 1048576"):
        submit.pack_path(big)


def test_total_size_and_file_count_limits(tmp_path):
    files = {f"k{i}.cu": "x" * (600 * 1024) for i in range(4)}
    with pytest.raises(submit.Rejected, match="bytes in all"):
        submit.check_files(files)
    many = {f"k{i}.cu": "x" for i in range(submit.MAX_FILES + 1)}
    with pytest.raises(submit.Rejected, match="at most 16"):
        submit.check_files(many)
    with pytest.raises(submit.Rejected, match="file names"):
        submit.check_files({"../evil.cu": "x"})


def test_system_include_rejected():
    assert "#include <stdio.h> is not allowed" in _reject(DATA / "system_include.cu")


@pytest.mark.parametrize("src,needle", [
    ('#include "other.h"\n', '#include other.h is not allowed'),
    ("#define INC <stdio.h>\n#include INC\n", "#include INC is not allowed"),
    ("%:include <stdio.h>\n", "digraph"),
    ("#\\\ninclude <stdio.h>\n", "#include <stdio.h> is not allowed"),
    ('_Pragma("once")\n', "_Pragma"),
    ("#embed \"x\"\n", "#embed is not allowed"),
    ("#pragma push_macro(\"FA_CHECK_ENTRY\")\n", "push_macro"),
    ("#define FA_MASK_CAUSAL 0\n", "may not be redefined"),
    ("template <> struct fa_same_type<int, long> {};\n", "entry-signature check"),
    ("__global__ void k(FaParams p) { cudaStreamCreateWithFlags(0, 0); }\n", "device runtime"),
])
def test_source_rules(src, needle):
    with pytest.raises(submit.Rejected) as e:
        submit.check_source("k.cu", src)
    assert needle in str(e.value)


def test_commented_out_include_is_fine():
    submit.check_source("k.cu", '// #include <stdio.h>\n/* #include <x>\n */\n'
                                '#include "fa_harness.h" // the header\n'
                                'const char* s = "#include <y>";\n')


@pytest.mark.parametrize("opt,needle", [
    ("-rdc=true", "relocatable device code"),
    ("--relocatable-device-code=true", "relocatable device code"),
    ("-I/usr/include", "not allowed"),
    ("-include", "not allowed"),
    ("-DFA_MASK_NONE=1", "harness names"),
    ("--output-file=/tmp/x", "not allowed"),
])
def test_compile_option_whitelist(opt, needle):
    with pytest.raises(submit.Rejected) as e:
        submit.check_compile_options([opt])
    assert needle in str(e.value)
    submit.check_compile_options(["--use_fast_math", "-DMY_TILE=64", "--maxrregcount=128",
                                  "-ftz=true"])


def test_rdc_and_dynamic_parallelism_rejected():
    assert "relocatable device code" in _reject(DATA / "rdc_option.cu")
    assert "dynamic parallelism" in _reject(DATA / "dynamic_parallelism.cu")


def test_redefining_the_signature_check_rejected():
    assert "#undef FA_CHECK_ENTRY" in _reject(DATA / "redefine_check.cu")


def test_launch_limits_evaluated_at_grid_cases():
    msg = _reject(DATA / "huge_grid.cu", compile_sources=False)
    assert "1000000000" in msg or "blocks" in msg
    assert "exceed the limit of 16777216 blocks per launch" in msg
    msg = _reject(DATA / "huge_smem.cu", compile_sources=False)
    assert "307200 bytes of shared memory" in msg and "232448" in msg


def test_block_limit_uses_the_largest_case():
    """A grid that is fine on small cases but not on the largest perf case is caught."""
    text = (DATA / "good_rowwarp.cu").read_text().replace(
        'grid = ["ceil_div(seqlen_q, rows_per_block)", "heads", "batch"]',
        'grid = ["max(1, seqlen_q * seqlen_k // 64)", "heads", "batch"]')
    msg = _reject({"big.cu": text}, compile_sources=False)
    # Fine up to the 2048-token perf cases (exactly 2^24 blocks), too large from 4096 on.
    assert "blocks at case" in msg and "4096x4096" in msg, msg


def test_manifest_errors_come_from_the_loader():
    text = (DATA / "good_rowwarp.cu").read_text().replace('algorithm = "ideal"',
                                                          'algorithm = "magic"')
    assert "algorithm" in _reject({"m.cu": text}, compile_sources=False)
    text = (DATA / "good_rowwarp.cu").read_text().replace(
        '"ceil_div(seqlen_q, rows_per_block)"', '"__import__(1)"')
    assert "not allowed" in _reject({"m.cu": text}, compile_sources=False)


def test_single_file_needs_manifest_header(tmp_path):
    f = tmp_path / "k.cu"
    f.write_text('#include "fa_harness.h"\n')
    with pytest.raises(submit.Rejected, match="fa-harness manifest"):
        submit.validate(submit.pack_path(f))


@needs_nvcc
@pytest.mark.nvcc
@pytest.mark.parametrize("name,needle", [
    ("syntax_error.cu", 'syntax_error.cu:91: error: expected a ";"'),
    ("missing_entry.cu", 'identifier "not_defined" is undefined'),
    ("wrong_signature.cu", "entry point 'rowwarp' must be"),
])
def test_compile_errors_rejected(name, needle):
    assert needle in _reject(DATA / name)


@needs_nvcc
@pytest.mark.nvcc
def test_good_submissions_validate(tmp_path):
    v = submit.validate(submit.pack_path(DATA / "good_rowwarp.cu"))
    assert v.name == "good_rowwarp" and v.limits["cases_checked"] > 0
    assert v.limits["threads"] == 128
    # A copy of a shipped variant folder validates the same way, its [backward] too (it
    # is scored on its own: tests/test_submit_backward*.py).
    folder = tmp_path / "fa2_mma"
    shutil.copytree(ROOT / "harness" / "kernels" / "fa2_mma", folder)
    v = submit.validate(submit.pack_path(folder))
    assert v.name == "fa2_mma" and v.limits["shared_bytes"] > 48 * 1024
    assert v.limits["backward"]["cases_checked"] > 0
    # Without it, a forward-only submission, as before.
    manifest = folder / "manifest.toml"
    text = manifest.read_text()
    manifest.write_text(text[:text.index("[backward]")])
    v = submit.validate(submit.pack_path(folder))
    assert v.name == "fa2_mma" and "backward" not in v.limits


# ------------------------------------------------------------------ storing and the CLI


def _counts(engine) -> dict[str, int]:
    """Row counts of every table except submissions (what a submission must not touch)."""
    from harness.records.db.models import Base

    with engine.connect() as c:
        return {t.name: c.execute(select(func.count()).select_from(t)).scalar_one()
                for t in Base.metadata.sorted_tables if t.name != "submissions"}


def test_cli_rejects_with_exit_2_and_records_rejection(db, tmp_path, capsys):
    before = _counts(db.engine)
    rc = main(["submit", str(DATA / "system_include.cu"), "--db", db.url])
    assert rc == 2
    err = capsys.readouterr().err
    assert "rejected" in err and "#include <stdio.h>" in err
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
        assert (row.status, row.verdict) == ("done", "rejected")
        assert "#include <stdio.h>" in row.message
        assert json.loads(row.source)  # kept for the submitter to see
    assert _counts(db.engine) == before


def test_cli_oversized_submission_not_kept(db, tmp_path, capsys):
    big = tmp_path / "big.cu"
    with open(big, "wb") as f:
        f.truncate(50 * 2**20)
    assert main(["submit", str(big), "--db", db.url]) == 2
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
        assert row.verdict == "rejected" and json.loads(row.source) == {}


@needs_nvcc
@pytest.mark.nvcc
def test_cli_queues_valid_submission_with_token(db, capsys):
    assert main(["token", "create", "--name", "alice", "--db", db.url]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("fah_")
    rc = main(["submit", str(DATA / "good_rowwarp.cu"), "--db", db.url, "--token", token])
    assert rc == 0, capsys.readouterr()
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
        assert (row.status, row.verdict, row.submitter) == ("queued", None, "alice")
        assert row.token_id is not None and row.manifest["name"] == "good_rowwarp"
        assert set(json.loads(row.source)) == {"good_rowwarp.cu"}


def test_cli_bad_token_is_usage_error(db, capsys):
    rc = main(["submit", str(DATA / "good_rowwarp.cu"), "--db", db.url, "--token", "fah_nope"])
    assert rc == 2 and "unknown submission token" in capsys.readouterr().err
    with db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Submission)) == 0


def test_tokens_stored_hashed_and_revocable(db):
    info, plain = create_token(db.engine, "bob")
    with db.sessions() as s:
        row = s.get(ApiToken, info.id)
        assert row.token_hash == hash_token(plain) and plain not in row.token_hash
    assert verify_token(db.engine, plain).name == "bob"
    with pytest.raises(TokenError, match="unknown"):
        verify_token(db.engine, plain + "x")
    assert main(["token", "revoke", "bob", "--db", db.url]) == 0
    with pytest.raises(TokenError, match="revoked"):
        verify_token(db.engine, plain)
    with pytest.raises(TokenError, match="required"):
        verify_token(db.engine, "")


def test_leaderboard_ranks_full_coverage_first(db, capsys):
    rows = [("partial", 9.0, {"coverage": {"timed": 1, "of": 48}}),
            ("full_fast", 1.5, {"coverage": {"timed": 48, "of": 48}}),
            ("full_slow", 0.8, {"coverage": {"timed": 48, "of": 48}})]
    with db.session() as s:
        for name, score, detail in rows:
            s.add(Submission(name=name, submitter="t", source="{}", source_hash="h",
                             status="done", verdict="scored", score=score, detail=detail,
                             message="ok"))
        s.add(Submission(name="cheat", submitter="t", source="{}", source_hash="h",
                         status="done", verdict="invalid", message="below floor"))
    assert main(["leaderboard", "--db", db.url, "--json", "--all"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out] == ["full_fast", "full_slow", "partial", "cheat"]
    assert [r["rank"] for r in out] == [1, 2, 3, None]
    assert main(["leaderboard", "--db", db.url]) == 0
    assert "full_fast" in capsys.readouterr().out


def test_deeply_nested_manifest_is_rejected_and_recorded(db, tmp_path, capsys):
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "manifest.toml").write_text('name = "deep"\nx = ' + "[" * 100_000
                                          + "]" * 100_000 + "\n")
    (folder / "k.cu").write_text('#include "fa_harness.h"\n')
    rc = main(["submit", str(folder), "--db", db.url])
    assert rc == 2
    err = capsys.readouterr().err
    assert "nested too deeply" in err and "Traceback" not in err
    with db.sessions() as s:
        row = s.scalars(select(Submission)).one()
        assert (row.status, row.verdict) == ("done", "rejected")
        assert "nested too deeply" in row.message


@needs_nvcc
@pytest.mark.nvcc
def test_a_host_without_a_sandbox_refuses_to_check_and_records_nothing(db, capsys,
                                                                        monkeypatch):
    """Without bubblewrap a submission cannot be compiled in isolation: that is the
    host's fault, so the submitter gets one line (exit 2) and no `rejected` verdict is
    recorded against them."""
    from harness.candidates import sandbox

    monkeypatch.setattr(sandbox, "_bwrap_works", lambda: False)
    monkeypatch.delenv(sandbox.ENV_VAR, raising=False)
    rc = main(["submit", str(DATA / "good_rowwarp.cu"), "--db", db.url])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "this machine cannot check submissions: bubblewrap (bwrap) is not installed" \
        in err[0] and "nothing was recorded" in err[0]
    with db.sessions() as s:
        assert s.scalars(select(Submission)).all() == []
