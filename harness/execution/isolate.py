"""Run a candidate's cases in a child process, so a crash or a hang is a verdict.

`run_isolated(name, cases, mode=..., options=..., timeout_s=...)` spawns a child
(multiprocessing "spawn": a fresh interpreter, no inherited CUDA context), which rebuilds
the candidate by name (from the registry, from a variant folder, or from a factory import
path), runs the cases one by one and streams each `CaseResult` back over a pipe.

What the parent turns into results:
- a case that passes its deadline (`timeout_s`, counted from the child's "start" message
  for that case) -> `timeout`; the child is killed with SIGKILL;
- a child that dies (segfault, abort, os._exit) -> `crashed`, with the exit signal or code
  and the tail of the child's stderr (redirected to a temporary file, so native crash
  output such as faulthandler's traceback or a CUDA abort message is kept);
- a child that catches a CUDA error (illegal address, launch failure: the context is then
  unusable) reports the error text as a `crashed` result and exits on its own;
- a child whose resident host memory passes `options["max_rss_mb"]` -> `crashed` with the
  measured RSS (RLIMIT_AS does not suit CUDA processes, which reserve huge virtual
  ranges, so a watchdog samples the child's RSS instead; device memory is not covered:
  CUDA reports its own out-of-memory error, which the child turns into a result).
After a crash, an exception or the memory watchdog a fresh child continues with the
remaining cases. After a hang or a lost CUDA context it does not: the candidate's remaining
cases are reported `skipped` with `not run: <case> hung for N s` (or `... lost its CUDA
context`), so a hanging kernel costs one timeout per candidate, not one per case, and a
broken kernel is not re-tried case by case into the same failure.

Options (all optional):
  factory        "module:function" called as function(name) -> Candidate
  variant_path   a kernel variant folder or annotated .cu file (submissions, variants
                 outside kernels/), loaded by harness.candidates.variants
  case_fn        "module:function" called as function(candidate, case, options) ->
                 CaseResult, replacing the mode's default (check_case / check + timing)
  device         "cuda" | "cpu" (default: the candidate's own device)
  secret, repeats  passed to harness.core.check.check_case
  timing         dict of harness.measure.perf.time_case options (mode, n_sets, rule fields)
  startup_timeout_s  time allowed to import and build the candidate (default 600 s:
                 NVRTC/nvcc compiles happen there)
  max_rss_mb     host memory watchdog limit
  threads        torch's intra-op threads in the child (children run side by side)
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from harness.core.cases import Case
from harness.core.faults import is_cuda_fatal
from harness.core.results import CaseResult, Status
from harness.execution import procs

DEFAULT_STARTUP_TIMEOUT_S = 600.0
POLL_S = 0.1
STDERR_TAIL_LINES = 15
MAX_RESTARTS_WITHOUT_PROGRESS = 2

def import_object(path: str) -> Any:
    """"package.module:attr" -> the object."""
    mod, sep, attr = path.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"expected 'module:attribute', got {path!r}")
    obj: Any = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------- child side


def build_candidate(name: str, options: dict[str, Any]):
    """The candidate the child runs: factory, variant folder, or registry name."""
    if options.get("factory"):
        return import_object(options["factory"])(name)
    path = options.get("variant_path") or options.get("variant_dir")
    if path:
        from harness.candidates.cuda_candidate import CudaVariant
        from harness.candidates.variants import load_variant

        spec = load_variant(path)
        # `name` may be one of the folder's [[flavor]]s; any other name (a submission's
        # id) is the folder's variant itself.
        cand = CudaVariant.from_spec(spec.flavor(name) or spec)
        cand.sandboxed_build = bool(options.get("sandboxed_build"))
        return cand
    from harness.candidates.registry import get_candidate

    return get_candidate(name)


def _cuda_health() -> str | None:
    """None when the CUDA context (if any) still works, else the error text."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _default_case_fn(mode: str) -> Callable[[Any, Case, dict[str, Any]], CaseResult]:
    def check(candidate: Any, case: Case, options: dict[str, Any]) -> CaseResult:
        from harness.core.check import check_case

        device = options.get("device") or candidate.device
        return check_case(candidate, case, device=device, secret=int(options.get("secret", 0)),
                          repeats=int(options.get("repeats", 1)))

    if mode == "check":
        return check
    # Other modes come as a `case_fn` import path (the perf run passes
    # harness.measure.perf:check_then_time), so this layer never imports the ones above it.
    raise ValueError(f"mode must be 'check' (or give options['case_fn']), not {mode!r}")


def _child_main(conn: Connection, name: str, case_dicts: list[dict], mode: str,
                options: dict[str, Any], log_path: str,
                go_conn: Connection | None = None) -> None:
    # Native crash output (segfault traceback, CUDA abort text) must land in the file the
    # parent reads, so redirect the file descriptors, not just sys.stderr.
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    import faulthandler

    faulthandler.enable(all_threads=False)
    try:
        if options.get("threads"):
            # Children side by side (the gate's parallel correctness): each gets its
            # share of the cores instead of every one of them starting a thread per core.
            import torch

            torch.set_num_threads(int(options["threads"]))
        candidate = build_candidate(name, options)
        case_fn = (import_object(options["case_fn"]) if options.get("case_fn")
                   else _default_case_fn(mode))
    except BaseException as e:
        conn.send(("build_error", f"{type(e).__name__}: {e}".strip()))
        traceback.print_exc()
        conn.close()
        os._exit(0)
    conn.send(("ready", None))
    if go_conn is not None:
        # Built and waiting: the parent says when it is this candidate's turn (the timing
        # children start side by side, then run one after the other).
        try:
            go_conn.recv()
        except (EOFError, OSError):
            os._exit(0)
    for d in case_dicts:
        idx, case = d["idx"], Case.from_dict(d["case"])
        conn.send(("start", idx))
        fatal = None
        try:
            res = case_fn(candidate, case, options)
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            status = Status.CRASHED if is_cuda_fatal(text) else Status.ERROR
            res = CaseResult(kernel=name, case=case, status=status, message=text)
        health = _cuda_health()
        if health is not None or is_cuda_fatal(res.message or ""):
            fatal = health or res.message
            if res.status not in (Status.CRASHED,):
                res.status = Status.CRASHED
                res.message = f"CUDA error (context lost): {fatal}"
        conn.send(("result", idx, res.to_dict()))
        if fatal is not None:
            conn.close()
            os._exit(3)  # a broken CUDA context cannot run the next case: start afresh
    conn.send(("done", None))
    conn.close()


# ---------------------------------------------------------------- parent side


def _rss_mb(pid: int) -> float | None:
    # The child's own memory, not its tree's: a compile it runs (nvcc) is not the kernel's.
    return procs.rss_mb(pid)


def _tail(path: str, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    kept = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def _death_message(exitcode: int | None, log_path: str) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            how = f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    tail = _tail(log_path)
    return f"child process {how}" + (f"; stderr tail:\n{tail}" if tail else "")


class _Child:
    def __init__(self, name: str, items: list[tuple[int, Case]], mode: str,
                 options: dict[str, Any], gated: bool = False) -> None:
        ctx = mp.get_context("spawn")
        fd, self.log_path = tempfile.mkstemp(prefix="fa-harness-child-", suffix=".log")
        os.close(fd)
        self.conn, child_conn = ctx.Pipe(duplex=False)
        go_recv, self.go_send = ctx.Pipe(duplex=False) if gated else (None, None)
        payload = [{"idx": i, "case": c.to_dict()} for i, c in items]
        self.proc = ctx.Process(target=_child_main, name=f"fa-harness:{name}",
                                args=(child_conn, name, payload, mode, options, self.log_path,
                                      go_recv),
                                daemon=True)
        self.proc.start()
        child_conn.close()
        if go_recv is not None:
            go_recv.close()

    def go(self) -> None:
        if self.go_send is not None:
            with contextlib.suppress(OSError):
                self.go_send.send(True)

    def kill(self) -> None:
        # The whole tree: a compiler or helper the candidate started must not outlive it.
        # Not the group: a spawned child shares its parent's process group.
        if self.proc.is_alive():
            procs.kill_tree(self.proc.pid)
        self.proc.join(10)

    def close(self) -> None:
        self.kill()
        self.conn.close()
        if self.go_send is not None:
            self.go_send.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)


def run_isolated(candidate_name: str, cases: Sequence[Case], *, mode: str = "check",
                 options: dict[str, Any] | None = None, timeout_s: float = 300.0,
                 on_result: Callable[[CaseResult], None] | None = None,
                 turn: Callable[[], None] | None = None) -> list[CaseResult]:
    """Results in the order of `cases`, one per case, whatever happened to the child.

    `turn`: the first child starts and builds the candidate, then waits; `turn()` is
    called (in this thread) once it is ready, and returns when the child may run its
    cases. So several candidates' children can start side by side and still run one after
    the other (the timing phase). `turn()` is called exactly once, also when no child
    ever got ready (then after its results are settled)."""
    options = dict(options or {})
    _default_case_fn(mode)  # validate the mode in the parent: a typo is a usage error
    startup_timeout = float(options.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S))
    max_rss = options.get("max_rss_mb")
    cases = list(cases)
    results: dict[int, CaseResult] = {}
    pending = list(range(len(cases)))

    def settle(idx: int, res: CaseResult) -> None:
        results[idx] = res
        pending.remove(idx)
        if on_result is not None:
            on_result(res)

    def make(idx: int, status: Status, message: str) -> CaseResult:
        return CaseResult(kernel=candidate_name, case=cases[idx], status=status, message=message)

    def give_up(why: str) -> None:
        for i in list(pending):
            settle(i, make(i, Status.SKIPPED, f"not run: {why}"))

    waiting = turn  # called once: at the first child's "ready", or when none will come

    def take_turn() -> None:
        nonlocal waiting
        if waiting is not None:
            w, waiting = waiting, None
            w()

    try:
        return _supervise(candidate_name, cases, mode, options, timeout_s, startup_timeout,
                          max_rss, results, pending, settle, make, give_up, take_turn,
                          gated=turn is not None)
    finally:
        take_turn()


def _supervise(candidate_name: str, cases: list[Case], mode: str, options: dict[str, Any],
               timeout_s: float, startup_timeout: float, max_rss: Any,
               results: dict[int, CaseResult], pending: list[int],
               settle: Callable[[int, CaseResult], None],
               make: Callable[[int, Status, str], CaseResult],
               give_up: Callable[[str], None], take_turn: Callable[[], None], *,
               gated: bool) -> list[CaseResult]:
    """run_isolated's loop: children until every case is settled."""
    no_progress = 0
    while pending:
        child = _Child(candidate_name, [(i, cases[i]) for i in pending], mode, options,
                       gated=gated)
        gated = False  # a restarted child (after a crash) runs at once: its turn is now
        current: int | None = None
        lost: str | None = None  # why the rest of this candidate's cases are not run
        deadline = time.monotonic() + startup_timeout
        progressed = False
        eof = False  # the child's end of the pipe is closed: it has exited or is exiting
        try:
            while True:
                ready = wait([child.proc.sentinel] if eof else
                             [child.conn, child.proc.sentinel], timeout=POLL_S)
                if not eof and child.conn in ready:
                    try:
                        msg = child.conn.recv()
                    except (EOFError, OSError):
                        msg, eof = None, True
                    if msg is not None:
                        kind = msg[0]
                        if kind == "ready":
                            if child.go_send is not None:
                                take_turn()
                                child.go()
                                deadline = time.monotonic() + startup_timeout
                            continue
                        if kind == "start":
                            current = msg[1]
                            deadline = time.monotonic() + timeout_s
                        elif kind == "result":
                            res = CaseResult.from_dict(msg[2])
                            settle(msg[1], res)
                            current, progressed = None, True
                            if res.status is Status.CRASHED and is_cuda_fatal(res.message):
                                lost = f"{res.case.id} lost its CUDA context"
                            deadline = time.monotonic() + startup_timeout
                        elif kind == "build_error":
                            for i in list(pending):
                                settle(i, make(i, Status.ERROR,
                                               f"could not build candidate: {msg[1]}"))
                            return [results[i] for i in range(len(cases))]
                        elif kind == "done":
                            break
                        continue
                if not child.proc.is_alive() and (eof or not child.conn.poll()):
                    child.proc.join(5)
                    why = _death_message(child.proc.exitcode, child.log_path)
                    if current is not None:
                        settle(current, make(current, Status.CRASHED, why))
                        progressed = True
                        if is_cuda_fatal(why):  # died of a CUDA error: do not re-try it
                            lost = f"{cases[current].id} lost its CUDA context"
                    elif not progressed:
                        # died before running anything: building it kills it, every time
                        for i in list(pending):
                            settle(i, make(i, Status.ERROR, f"could not build candidate: {why}"))
                    break
                if max_rss and current is not None:
                    rss = _rss_mb(child.proc.pid)
                    if rss is not None and rss > float(max_rss):
                        child.kill()
                        settle(current, make(current, Status.CRASHED,
                                             f"host memory limit exceeded: RSS {rss:.0f} MiB > "
                                             f"{float(max_rss):.0f} MiB; child killed"))
                        progressed = True
                        break
                if time.monotonic() > deadline:
                    child.kill()
                    if current is not None:
                        settle(current, make(current, Status.TIMEOUT,
                                             f"no result within {timeout_s:g} s; child killed "
                                             "(SIGKILL)"))
                        progressed = True
                        lost = f"{cases[current].id} hung for {timeout_s:g} s"
                    else:
                        for i in list(pending):
                            settle(i, make(i, Status.ERROR,
                                           f"candidate not ready within {startup_timeout:g} s"))
                    break
        finally:
            child.close()
        if lost is not None:
            give_up(lost)
        if progressed:
            no_progress = 0
        else:
            no_progress += 1
            if no_progress > MAX_RESTARTS_WITHOUT_PROGRESS and pending:
                for i in list(pending):
                    settle(i, make(i, Status.ERROR, "child exits without running cases"))
    return [results[i] for i in range(len(cases))]
