"""Hostile submissions as an attacker writes them, judged by the real nvcc in the sandbox:
each is refused within the sandbox's limits, no message carries host file text, and no
temporary file is left behind."""

from __future__ import annotations

import glob
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from harness.candidates import sandbox
from harness.submissions import submit

pytestmark = [pytest.mark.nvcc,
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH"),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bwrap not installed")]

DATA = Path(__file__).parent / "data" / "submissions"
HOST_TEXT = ("root:x:", "/bin/bash", "/bin/sh", "nologin", "daemon:")
GOOD = (DATA / "good_rowwarp.cu").read_text()


def _with(body_before: str = "", body_after: str = "", replace: tuple[str, str] | None = None
          ) -> dict[str, str]:
    """good_rowwarp.cu with attack text around its `#include "fa_harness.h"`."""
    text = GOOD
    if replace:
        text = text.replace(*replace)
    marker = '#include "fa_harness.h"\n'
    head, tail = text.split(marker, 1)
    return {"good_rowwarp.cu": head + marker + body_before + tail + body_after}


SPLICE = '#define F "/etc/passwd"\n#\\ \ninclude F\n'
RAW_STRING = ('static const char* hide = R"(" /* )";\n'
              '#define F "/etc/passwd"\n#include F\n// */\n')
ATTACKS = {
    "splice": _with(SPLICE),
    "raw_string": _with(RAW_STRING),
    "has_include": _with('#if __has_include("/etc/passwd")\n#error present\n#else\n'
                         '#error absent\n#endif\n'),
    "has_include_hidden": _with('static const char* h = R"(" /* )";\n'
                                '#if __has_\\ \ninclude("/etc/passwd")\n#error present\n'
                                '#endif\n// */\n'),
    "pragma_dependency": _with('#pragma GCC dependency "/etc/passwd"\n'),
    "pragma_dependency_hidden": _with('static const char* h = R"(" /* )";\n'
                                      '#pragma GCC \\ \ndependency "/etc/passwd"\n// */\n'),
    "dev_zero": _with('#define Z "/dev/zero"\n#\\ \ninclude Z\n'),
    "system_include": _with('#define S <stdint.h>\n#\\ \ninclude S\n'),
    "undef_check": _with('static const char* h = R"(" /* )";\n#undef FA_CHECK_ENTRY\n'
                         '#define FA_CHECK_ENTRY(x) static_assert(true, "")\n// */\n',
                         replace=("void rowwarp(FaParams p)", "void rowwarp(int p)")),
    "device_launch": _with('static const char* h = R"(" /* )";\n'
                           'extern "C" __device__ cudaError_t cudaLaunchDeviceV2(void*, '
                           'cudaStream_t);\n__global__ void spawn(FaParams p) { '
                           'cudaLaunchDeviceV2(nullptr, 0); }\n// */\n'),
    "line_rename": _with('static const char* h = R"(" /* )";\n#line 1 "fa_harness.h"\n'
                         '#undef FA_CHECK_ENTRY\n#define FA_CHECK_ENTRY(x)\n// */\n'),
    "template_bomb": _with('template <int N> struct B { static const int v = B<N - 1>::v + '
                           'B<N - 2>::v; };\ntemplate <> struct B<0> { static const int v = 1; };'
                           '\ntemplate <> struct B<1> { static const int v = 1; };\n'
                           'static const int boom = B<100000>::v;\n'),
    "macro_bomb": _with("#define A0 x x x x x x x x x x x x x x x x\n"
                        + "".join(f"#define A{i} A{i-1} A{i-1} A{i-1} A{i-1} A{i-1} A{i-1} "
                                  f"A{i-1} A{i-1}\n" for i in range(1, 12))
                        + "int bomb[] = { A11 };\n"),
}


@pytest.fixture(autouse=True)
def private_tmp(tmp_path, monkeypatch):
    """The harness's own temporary folders go to a private TMPDIR, so what is left behind
    is attributable (other processes on the machine may use /tmp at the same time)."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def _tmp_leftovers() -> set[str]:
    """Everything in the private TMPDIR, and nvcc's tmpxft_* files in /tmp named after the
    sources compiled here (nvcc puts the source's name in them)."""
    mine = set(glob.glob(f"{tempfile.gettempdir()}/*"))
    for stem in ("good_rowwarp", "fa+tu"):
        mine |= set(glob.glob(f"/tmp/tmpxft_*{stem}*"))
    return mine


@pytest.mark.parametrize("backend", ["bwrap", "rlimits"])
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_refused_without_host_text_or_leftovers(name, backend, monkeypatch):
    # Under `rlimits` the host's files are readable: the preprocessor's report and the
    # message filter must refuse and stay silent on their own.
    monkeypatch.setenv(sandbox.ENV_VAR, backend)
    before = _tmp_leftovers()
    t0 = time.monotonic()
    with pytest.raises(submit.Rejected) as exc:
        submit.validate(ATTACKS[name], compile_timeout_s=60)
    elapsed = time.monotonic() - t0
    message = str(exc.value)
    assert message and len(message.splitlines()) <= 6, message
    for text in HOST_TEXT:
        assert text not in message, message
    assert elapsed < 150, f"{name} took {elapsed:.0f} s"
    assert _tmp_leftovers() <= before


def test_host_path_include_asks_the_sandbox_not_the_host():
    msg = str(pytest.raises(submit.Rejected, submit.validate, ATTACKS["splice"]).value)
    assert msg.startswith("preprocessing failed: good_rowwarp.cu:")
    assert "No such file" in msg  # the sandbox has no /etc


def test_spliced_include_of_a_toolchain_file_is_refused_by_what_was_entered():
    files = _with(SPLICE.replace("/etc/passwd", "/usr/include/stdio.h"))
    msg = str(pytest.raises(submit.Rejected, submit.validate, files).value)
    assert msg.startswith("good_rowwarp.cu:") and "other than" in msg


def test_undef_of_the_entry_check_is_seen_as_a_directive():
    msg = str(pytest.raises(submit.Rejected, submit.validate, ATTACKS["undef_check"]).value)
    assert "#undef FA_CHECK_ENTRY" in msg


def test_sandbox_sees_no_host_files(tmp_path):
    tool = sandbox.toolchain_root(shutil.which("nvcc"))
    res = sandbox.run(["/bin/sh", "-c", "cat /etc/passwd; ls /home /root; echo done"],
                      sources={}, toolchain=tool, require_isolation=True)
    assert res.backend == "bwrap"
    assert "root:x:" not in res.output and "done" in res.output


def test_sandbox_limits_stop_a_memory_hog():
    tool = sandbox.toolchain_root(shutil.which("nvcc"))
    limits = sandbox.Limits(wall_s=20, cpu_s=20, memory_bytes=256 << 20)
    res = sandbox.run(["/usr/bin/python3", "-c", "x = bytearray(1 << 30)"], sources={},
                      toolchain=tool, limits=limits, require_isolation=True)
    assert res.returncode != 0 and "MemoryError" in res.output


def test_sandbox_wall_clock_kills_the_group():
    tool = sandbox.toolchain_root(shutil.which("nvcc"))
    t0 = time.monotonic()
    res = sandbox.run(["/bin/sh", "-c", "sleep 30 & sleep 30"], sources={}, toolchain=tool,
                      limits=sandbox.Limits(wall_s=1, cpu_s=5), require_isolation=True)
    assert res.timed_out and res.killed_by == "wall clock"
    assert time.monotonic() - t0 < 10


def test_device_launch_is_refused_by_the_linker_step():
    msg = str(pytest.raises(submit.Rejected, submit.validate, ATTACKS["device_launch"]).value)
    assert "unresolved extern function '__cudaCDP2LaunchDeviceV2'" in msg


def test_good_submission_still_validates():
    v = submit.validate({"good_rowwarp.cu": GOOD})
    assert v.name == "good_rowwarp"


def test_worker_build_is_a_sandboxed_cubin_cached_by_source(tmp_path, monkeypatch,
                                                           private_tmp):
    from harness.candidates.sandboxed_compile import build_cubin
    from harness.submissions.submit import load_spec

    monkeypatch.setenv("FA_HARNESS_CUBIN_CACHE", str(tmp_path / "cache"))
    spec = load_spec({"good_rowwarp.cu": GOOD}, tmp_path / "w")
    before = _tmp_leftovers()
    cubin = build_cubin(spec, (9, 0))
    assert cubin[:4] == b"\x7fELF"
    (cached,) = (tmp_path / "cache").iterdir()
    assert cached.read_bytes() == cubin
    assert build_cubin(spec, (9, 0)) == cubin  # from the cache
    assert _tmp_leftovers() <= before


def test_the_worker_builds_submissions_in_the_sandbox(tmp_path):
    from harness.execution.isolate import build_candidate

    cand = submit.load_candidate({"good_rowwarp.cu": GOOD}, tmp_path)
    assert cand.sandboxed_build is True
    path = str(tmp_path / "single" / "good_rowwarp.cu")
    assert build_candidate("x", {"variant_path": path, "sandboxed_build": True}).sandboxed_build
