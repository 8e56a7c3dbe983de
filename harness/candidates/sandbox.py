"""Running the compiler on untrusted source: a private temporary folder, no host files
beyond the toolchain, no network, and limits on memory, CPU time, output and temporary disk.

Two backends, chosen by `FA_HARNESS_SANDBOX` (`auto`, the default, takes the first that
works):

* `bwrap` (bubblewrap): new user, mount, PID, network, IPC and UTS namespaces; the root is
  an empty tmpfs holding read-only binds of /usr, the toolchain's folder and the /bin /lib
  /lib64 /sbin links, the submission's folder (read-only, at /src), an output folder
  (/out) and a size-limited tmpfs at /tmp. No /etc, no /home, no /proc of the host, only
  /dev/null. A `#include "/etc/passwd"` or `__has_include("/etc/passwd")` asks that root,
  not the host.
* `rlimits`: only the private folder, a scrubbed environment and the limits below; the
  host's files stay readable. Validation refuses to use it unless `FA_HARNESS_SANDBOX=rlimits`
  names it on purpose (a runner without bubblewrap).

Both apply, through `setrlimit` in the child before exec: address space (`memory_bytes`),
CPU seconds, the largest file it may write (`output_bytes`), no core dumps; a wall-clock
deadline kills the whole process group. stdout and stderr go to a file under the same
size limit and only its first `read_bytes` are read back.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ENV_VAR = "FA_HARNESS_SANDBOX"
BACKENDS = ("bwrap", "rlimits")


class SandboxUnavailable(RuntimeError):
    """No sandbox backend that isolates files is usable here."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 180.0
    cpu_s: int = 180
    memory_bytes: int = 6 << 30  # address space; cicc reserves more than it touches
    output_bytes: int = 256 << 20  # any one file written (cubin, preprocessed text, log)
    tmp_bytes: int = 512 << 20  # the sandbox's /tmp (nvcc's tmpxft_* files)
    read_bytes: int = 1 << 20  # of the compiler's messages


@dataclass
class SandboxResult:
    returncode: int
    output: str  # stdout + stderr, first `read_bytes`, paths inside the sandbox
    backend: str
    wall_s: float
    timed_out: bool = False
    killed_by: str = ""  # "memory", "cpu", "output size", "wall clock" or ""
    files: dict[str, bytes] = field(default_factory=dict)  # what the command wrote to /out


def _preexec(limits: Limits) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.output_bytes, limits.output_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def toolchain_root(nvcc: str) -> Path:
    """The CUDA toolkit folder of `nvcc` (wrapper scripts such as /usr/local/bin/nvcc that
    `exec` the real one are followed)."""
    real = Path(nvcc).resolve()
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if real.stat().st_size < 4096:
            for word in real.read_text().split():
                if word.endswith("/nvcc") and Path(word).is_file():
                    real = Path(word).resolve()
                    break
    return real.parent.parent


def _bwrap_args(toolchain: Path, src: Path, out: Path, limits: Limits) -> list[str]:
    bwrap = shutil.which("bwrap")
    assert bwrap is not None
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib32", "/lib64", "/sbin"):
        p = Path(top)
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), top]
        elif p.is_dir():
            args += ["--ro-bind", top, top]
    if not str(toolchain).startswith("/usr/"):
        args += ["--ro-bind", str(toolchain), str(toolchain)]
    args += ["--dev-bind", "/dev/null", "/dev/null", "--proc", "/proc",
             "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp",
             "--ro-bind", str(src), "/src", "--bind", str(out), "/out",
             "--chdir", "/tmp", "--clearenv"]
    return args


@cache
def _bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="fa-sandbox-probe-") as tmp:
        t = Path(tmp)
        (t / "src").mkdir()
        (t / "out").mkdir()
        cmd = _bwrap_args(Path("/usr"), t / "src", t / "out", Limits()) + ["/bin/sh", "-c", "true"]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


def backend(*, require_isolation: bool = False) -> str:
    """The backend `run` will use. With `require_isolation`, `rlimits` is used only when
    FA_HARNESS_SANDBOX names it; otherwise SandboxUnavailable says why."""
    choice = os.environ.get(ENV_VAR, "auto").strip() or "auto"
    if choice not in ("auto", *BACKENDS):
        raise SandboxUnavailable(f"{ENV_VAR}={choice!r}: expected auto, bwrap or rlimits")
    if choice in ("auto", "bwrap") and _bwrap_works():
        return "bwrap"
    if choice == "bwrap" or (choice == "auto" and require_isolation):
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed or cannot create namespaces here, so "
            "submitted source cannot be compiled in isolation; install bubblewrap or set "
            f"{ENV_VAR}=rlimits to compile with resource limits only")
    return "rlimits"


def run(argv: Sequence[str], *, sources: dict[str, str], toolchain: Path,
        limits: Limits = Limits(), env: dict[str, str] | None = None,
        require_isolation: bool = False) -> SandboxResult:
    """Run `argv` with the files `sources` under /src (read-only) and an empty /out.
    In argv, the strings "/src", "/out" and "/tmp" name those folders (they are rewritten
    to the private host folders under the `rlimits` backend). Everything written is
    removed before returning; what was in /out comes back in `files`."""
    kind = backend(require_isolation=require_isolation)
    base = Path(tempfile.mkdtemp(prefix="fa-sandbox-"))
    try:
        # The source folder's name is recognisable in paths the compiler reports
        # (harness.submissions.preprocess) under either backend.
        src, out, tmp = base / "fa-sandbox-src", base / "out", base / "tmp"
        for d in (src, out, tmp):
            d.mkdir()
        for name, text in sources.items():
            (src / name).write_text(text)
        path = f"{toolchain / 'bin'}:/usr/bin:/bin"
        child_env = {"PATH": path, "TMPDIR": "/tmp", "HOME": "/tmp", "LC_ALL": "C"}
        child_env.update(env or {})
        if kind == "bwrap":
            cmd = _bwrap_args(toolchain, src, out, limits)
            for k, v in child_env.items():
                cmd += ["--setenv", k, v]
            cmd += list(argv)
            run_env: dict[str, str] = {"PATH": path}
        else:
            remap = {"/src": str(src), "/out": str(out), "/tmp": str(tmp)}
            cmd = [_remap(a, remap) for a in argv]
            run_env = {k: _remap(v, remap) for k, v in child_env.items()}
        log = base / "log"
        t0 = time.monotonic()
        timed_out = False
        with open(log, "wb") as fh:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fh,
                                    stderr=subprocess.STDOUT, env=run_env,
                                    cwd=str(tmp), start_new_session=True,
                                    preexec_fn=lambda: _preexec(limits))
            try:
                rc = proc.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
            # Compiler children left behind in the group (rlimits backend) go too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        wall = time.monotonic() - t0
        with open(log, "rb") as fh:
            text = fh.read(limits.read_bytes).decode("utf-8", "replace")
        if kind == "rlimits":
            for inside, host in (("/src", src), ("/out", out), ("/tmp", tmp)):
                text = text.replace(str(host), inside)
        files = {p.name: p.read_bytes() for p in out.iterdir()
                 if p.is_file() and p.stat().st_size <= limits.output_bytes}
        return SandboxResult(rc, text, kind, wall, timed_out,
                             _killed_by(rc, timed_out, text), files)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _remap(arg: str, remap: dict[str, str]) -> str:
    for inside, host in remap.items():
        if arg == inside or arg.startswith(inside + "/"):
            return host + arg[len(inside):]
        arg = arg.replace("=" + inside + "/", "=" + host + "/").replace(
            "-I" + inside, "-I" + host)
    return arg


def _killed_by(rc: int, timed_out: bool, text: str) -> str:
    if timed_out:
        return "wall clock"
    sig = -rc if rc < 0 else (rc - 128 if rc > 128 else 0)
    if sig == signal.SIGXCPU:
        return "cpu"
    if sig == signal.SIGXFSZ or "File size limit exceeded" in text:
        return "output size"
    if sig == signal.SIGKILL:
        return "memory"
    low = text.lower()
    if ("out of memory" in low or "std::bad_alloc" in low or "cannot allocate memory" in low
            or "memory exhausted" in low):
        return "memory"
    if "no space left on device" in low:
        return "temporary disk"
    return ""
