"""The compute-sanitizer stage without a GPU: the report parser on reports in the layouts
compute-sanitizer prints (tests/data/sanitizer, written after NVIDIA's documentation and
published captures; the GPU script bench/h200_submissions.sh saves real ones), the choice of
cases, and the path where the tool is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.candidate import Support
from harness.core.cases import MaskKind
from harness.execution import sanitize

DATA = Path(__file__).parent / "data" / "sanitizer"


def _parse(tool: str, name: str, names=frozenset()) -> sanitize.ToolReport:
    return sanitize.parse(tool, (DATA / name).read_text(), set(names))


def test_memcheck_out_of_bounds_write_is_one_line_with_its_distance():
    r = _parse("memcheck", "memcheck_oob.txt", {"far_writer.cu"})
    assert r.status == "findings" and r.errors == 2
    assert r.summary == ("memcheck: 2 errors: Invalid __global__ write of size 2 bytes in "
                         "far_writer+0x1f0 at far_writer.cu:41 (3,145,728 bytes after an "
                         "allocation of 116,992 bytes)")
    assert "libcuda" not in r.summary and "\n" not in r.summary


def test_racecheck_race_names_both_accesses():
    r = _parse("racecheck", "racecheck_race.txt", {"racy_rows.cu"})
    assert r.status == "findings" and r.errors == 1
    assert "Race reported between Write access in racy_rows+0x3a0 at racy_rows.cu:52" in r.summary
    assert "and Read access" in r.summary


@pytest.mark.parametrize("tool,name", [("memcheck", "memcheck_clean.txt"),
                                       ("racecheck", "racecheck_clean.txt")])
def test_clean_reports(tool, name):
    r = _parse(tool, name)
    assert (r.status, r.errors, r.summary) == ("clean", 0, "")


def test_initcheck_location_on_its_own_line_and_host_path_dropped():
    r = _parse("initcheck", "initcheck_uninit.txt", {"kernel.cu"})
    assert r.status == "findings"
    assert "Uninitialized __global__ memory read of size 4 bytes" in r.summary
    assert "at kernel.cu:30" in r.summary and "/tmp/" not in r.summary


def test_synccheck_barrier_error():
    r = _parse("synccheck", "synccheck_barrier.txt", {"divergent.cu"})
    assert r.status == "findings" and "Barrier error detected" in r.summary


def test_a_report_without_summary_is_a_failure_not_clean():
    r = _parse("memcheck", "target_died.txt")
    assert r.status == "failed" and "CompileError" in r.summary


def test_source_lines_outside_the_submission_are_not_named():
    r = _parse("memcheck", "memcheck_oob.txt", {"other.cu"})
    assert "far_writer.cu" not in r.summary and "far_writer+0x1f0" in r.summary


def test_tool_absent_is_said_and_nothing_runs(monkeypatch, tmp_path):
    monkeypatch.setenv(sanitize.ENV_VAR, str(tmp_path / "no-such-compute-sanitizer"))
    rep = sanitize.sanitize(str(tmp_path), Support(), set())
    assert rep.status == "unavailable"
    assert [t.tool for t in rep.tools] == list(sanitize.TOOLS)
    assert all(t.status == "unavailable" for t in rep.tools) and rep.finding is None


def test_cases_cover_tails_masks_and_gqa_of_what_is_declared():
    cases = sanitize.sanitizer_cases(Support())
    assert {c.mask for c in cases} == set(MaskKind)
    assert any(c.heads != c.kv_heads for c in cases)
    assert any(c.seqlen_q % 64 and c.seqlen_k % 64 for c in cases)
    narrow = Support(dtypes=frozenset({"bfloat16"}), head_dims=frozenset({128}),
                     masks=frozenset({MaskKind.CAUSAL_BR}), gqa=False)
    ncases = sanitize.sanitizer_cases(narrow)
    assert ncases and all(c.dtype == "bfloat16" and c.head_dim == 128 and
                          c.mask is MaskKind.CAUSAL_BR and c.heads == c.kv_heads
                          for c in ncases)


def test_tools_run_in_parallel_and_a_finding_is_reported(tmp_path):
    """A stand-in for compute-sanitizer that prints the captured reports: the command
    line it gets, the parallel runs and the stage's verdict."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {tmp_path}/calls
case "$2" in
  memcheck) cat {DATA}/memcheck_oob.txt ;;
  racecheck) cat {DATA}/racecheck_clean.txt ;;
  *) cat {DATA}/memcheck_clean.txt ;;
esac
""")
    fake.chmod(0o755)
    rep = sanitize.sanitize(str(tmp_path / "variant"), Support(), {"far_writer.cu"},
                            sanitizer=str(fake))
    assert rep.status == "findings"
    assert rep.finding.tool == "memcheck" and "3,145,728 bytes after" in rep.finding.summary
    assert [t.status for t in rep.tools] == ["findings", "clean", "clean", "clean"]
    # the tools' runs (the padding probe, `--help`, is not one of them)
    calls = [c for c in (tmp_path / "calls").read_text().splitlines() if "--tool" in c]
    assert sorted(c.split()[1] for c in calls) == sorted(sanitize.TOOLS)
    assert all("harness.execution.sanitize_target" in c and "--cases" in c for c in calls)
    assert "raw" not in rep.to_dict()["tools"][0]
    assert not any("--trusted" in c for c in calls)  # a submission: built in the sandbox


def test_memcheck_pads_every_allocation_and_the_tier_chooses_tools(tmp_path):
    """A write far past its buffer can land in another live allocation: memcheck gets
    `--padding` where the tool offers it, and torch's caching allocator is off in the
    target, so every tensor is an allocation of its own. The fast tier (the CI gate's)
    runs memcheck, initcheck and racecheck on fewer cases."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = "--help" ]; then echo "  --padding arg   Size in bytes of padding buffers"; exit 0; fi
echo "$@ cache=$PYTORCH_NO_CUDA_MEMORY_CACHING" >> {tmp_path}/calls
cat {DATA}/memcheck_clean.txt
""")
    fake.chmod(0o755)
    sanitize._supports_padding.cache_clear()
    rep = sanitize.sanitize(str(tmp_path / "variant"), Support(), set(), sanitizer=str(fake),
                            tier="fast", trusted=True)
    assert rep.status == "clean"
    calls = (tmp_path / "calls").read_text().splitlines()
    tools = sorted(c.split()[1] for c in calls)
    assert tools == ["initcheck", "memcheck", "racecheck"]
    mem = next(c for c in calls if c.split()[1] == "memcheck")
    assert f"--padding {sanitize.PADDING_BYTES}" in mem
    assert all(c.endswith("cache=1") and "--trusted" in c for c in calls)
    assert len(rep.cases) <= 3


def test_racecheck_gets_a_lighter_case_set():
    from harness.core.candidate import Support
    from harness.execution.sanitize import racecheck_cases, sanitizer_cases

    sup = Support()
    full, race = sanitizer_cases(sup), racecheck_cases(sup)
    assert 1 <= len(race) <= 3 < len(full)
    assert all(c.batch == 1 and c.heads <= 2 for c in race)
    assert any(c.seqlen_q > 64 and c.seqlen_k > 64 for c in race)  # partial tiles, >1 tile
    blocks = sum(c.batch * c.heads * c.seqlen_q for c in race)
    assert blocks * 4 <= sum(c.batch * c.heads * c.seqlen_q for c in full)


def test_racecheck_analysis_report_from_the_h200():
    # racy_rows.cu under `--racecheck-report analysis` on the H200 (about 3 million
    # hazards behind 6 analysed races): one line naming the write, its line, the read.
    r = _parse("racecheck", "racecheck_analysis_h200.txt", {"racy_rows.cu"})
    assert r.status == "findings" and r.errors == 6
    assert r.summary == ("racecheck: 6 errors: Race reported between Write access in "
                         "rowwarp+0x1740 at racy_rows.cu:82 and Read access")
