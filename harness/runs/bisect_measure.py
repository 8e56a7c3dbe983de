"""One commit of a bisection measured the gate's way, and its run stored as backfill.

`WorktreeMeasure(commit)` checks the commit out in a git worktree (harness.records.
bisect_git; one at a time, kept while the same commit is timed again) and runs this
module as a child process there (`python -P -m harness.runs.bisect_measure`): the
candidates are discovered from the worktree's kernel folders and `[tool.fa-harness]`
(the command line's `--kernels-dir`s inside the repository mapped into the worktree),
the one named candidate is selected as the gate selects (`gate_run.select_candidates`)
and only the alerted cases are timed by the gate's timing path (`measure.perf.run_perf`:
checked, then timed in an isolated child, with the runner's calibration and the gate's
stopping rule). `-P` keeps the worktree off `sys.path`: the fa-harness that times is the
installed one, whatever the commit holds. The child writes a run record; the parent
reads each case's median from it.

**Backfill.** Each measurement is stored as a run of its commit, so the history and the
step search (harness.records.steps) see the commits no gate timed:
- `grids` is `["bisect"]` and `branch` is empty. A gate's baseline is the parent
  commit's run or the recent runs of the baseline branch, in both cases only runs that
  share a grid with the gate's (`db.queries.baseline_runs`): a backfill run, which times
  a few cases of one candidate, is never a later commit's baseline.
- `created_at` places the run in commit order: between the stored runs of the range's
  last good and first bad commit, in the order of the range (the history orders runs by
  `created_at`, and a run stored now would put an old commit after the newest). The time
  it was really measured is `env.backfill.measured_at`. Without stored runs of both
  ends on the GPU model that order is unknown, and the run is not stored (said so).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

BACKFILL_GRID = "bisect"
CHILD_SLACK_S = 600.0  # the child's start, discovery, compiles, on top of the cases' deadline

Place = Callable[[str, str | None], datetime | None]  # (commit, GPU model) -> created_at
Store = Callable[[Any], str]  # a RunRecord -> a line saying where it went


def medians(record: Any, kernel: str, pass_name: str = "fwd") -> dict[str, float]:
    """case id -> median ms of the passed, timed results of `kernel` in `record`."""
    return {e["case_id"]: float(e["median_ms"]) for e in record.results
            if e["kernel"] == kernel and e.get("pass", "fwd") == pass_name
            and e["status"] == "passed" and e.get("median_ms")}


def map_into(path: str, root: Path, tree: Path) -> str:
    """A folder inside the repository `root`, the same folder inside the worktree `tree`;
    one outside it, as it is."""
    p = Path(path).expanduser().resolve()
    try:
        return str(tree / p.relative_to(root.resolve()))
    except ValueError:
        return str(p)


class WorktreeMeasure:
    """measure(commit) -> {case id: median ms} (harness.records.bisect.Measure)."""

    def __init__(self, root: Path, kernel: str, cases: Sequence[str], *,
                 pass_name: str = "fwd", min_time_s: float = 0.2, timeout_s: float = 60.0,
                 kernels_dirs: Sequence[str] = (), place: Place | None = None,
                 store: Store | None = None, backfill: dict[str, Any] | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.root, self.kernel, self.cases = root, kernel, list(cases)
        self.pass_name, self.min_time_s, self.timeout_s = pass_name, min_time_s, timeout_s
        self.kernels_dirs = list(kernels_dirs)
        self.place, self.store, self.log = place, store, log
        self.backfill = dict(backfill or {})
        self._stack = ExitStack()
        self._commit: str | None = None
        self._tree: Path | None = None
        self.worktrees_made = 0
        self._said_unplaced = False
        # The source hash of the kernel the last call timed (None: not timed): what a
        # caller checks it timed the code it meant (harness.runs.gate_confirm).
        self.last_source: str | None = None

    def _checkout(self, commit: str) -> Path:
        from harness.records.bisect_git import worktree

        if self._commit != commit or self._tree is None:
            self.close()
            self._tree = self._stack.enter_context(worktree(self.root, commit))
            self._commit = commit
            self.worktrees_made += 1
        return self._tree

    def close(self) -> None:
        """Remove the worktree held (bisect_run calls it in a `finally`)."""
        self._stack.close()
        self._commit, self._tree = None, None

    def _env(self, tree: Path) -> dict[str, str]:
        from harness.candidates.discovery import ENV_CONFIG, ENV_KERNELS

        env = dict(os.environ)
        env.pop(ENV_CONFIG, None)  # the parent's folders are the main checkout's
        if env.get(ENV_KERNELS):
            env[ENV_KERNELS] = ":".join(map_into(d, self.root, tree)
                                        for d in env[ENV_KERNELS].split(":") if d)
        return env

    def ready(self) -> str | None:
        """Why nothing can be timed on this machine (no working CUDA GPU), else None:
        said before any worktree is made."""
        from harness.runs.gate_run import gpu_state

        gpu, why = gpu_state()
        return None if gpu else f"no working CUDA GPU here ({why}): bisect times commits"

    def __call__(self, commit: str) -> dict[str, float]:
        record = self._run_child(self._checkout(commit), commit)
        self.last_source = None
        if record is None:
            return {}
        self.last_source = (record.kernels.get(self.kernel) or {}).get("source_hash")
        got = medians(record, self.kernel, self.pass_name)
        self._keep(record, commit)
        return got

    def _run_child(self, tree: Path, commit: str) -> Any | None:
        """The child's run record of `commit` checked out at `tree`; None (said why) when
        it could not time it."""
        from harness.records.bisect_git import git
        from harness.records.record import RunRecord

        parent = git(["rev-parse", f"{commit}^"], tree, check=False).stdout.strip() or None
        with tempfile.TemporaryDirectory(prefix="fa-harness-bisect-out-") as tmp:
            out = Path(tmp) / "record.json"
            cmd = [sys.executable, "-P", "-m", "harness.runs.bisect_measure",
                   "--kernel", self.kernel, "--cases", ",".join(self.cases),
                   "--commit", commit, "--pass", self.pass_name,
                   "--min-time", str(self.min_time_s), "--timeout", str(self.timeout_s),
                   "--out", str(out)]
            for d in self.kernels_dirs:
                cmd += ["--kernels-dir", map_into(d, self.root, tree)]
            if parent:
                cmd += ["--parent", parent]
            limit = self.timeout_s * max(1, len(self.cases)) + CHILD_SLACK_S
            try:
                proc = subprocess.run(cmd, cwd=tree, env=self._env(tree), timeout=limit,
                                      capture_output=True, text=True)
            except subprocess.TimeoutExpired:
                self.log(f"{commit[:12]}: not measured, the child took more than {limit:.0f} s")
                return None
            if proc.returncode != 0 or not out.exists():
                why = (proc.stderr or proc.stdout).strip().splitlines()
                self.log(f"{commit[:12]}: not measured: {why[-1] if why else 'no record'}")
                return None
            return RunRecord.read(out)

    def _keep(self, record: Any, commit: str) -> None:
        from harness.records.record import iso_utc

        record.env["backfill"] = {**self.backfill, "measured_at": record.created_at,
                                  "kernel": self.kernel}
        when = self.place(commit, record.gpu_model_key) if self.place else None
        if when is None:
            if not self._said_unplaced:  # once: it holds for every commit of the range
                self.log("runs not stored: no stored runs of both ends of the range on "
                         "this GPU model, so their place in commit order is unknown")
                self._said_unplaced = True
            return
        record.created_at = iso_utc(when)
        if self.store is not None:
            self.log(f"{commit[:12]}: {self.store(record)}")


# --------------------------------------------------------------------------- the child


def child(argv: Sequence[str] | None = None) -> int:
    """Discover, select, time; write the record (exit 0), else one line on stderr."""
    from harness.candidates import registry
    from harness.candidates.discovery import DiscoveryError, configure
    from harness.core.cases import Case
    from harness.measure.perf import PerfUnavailable, run_perf
    from harness.records.record import RunRecord, environment
    from harness.runs.gate_options import GateUsageError
    from harness.runs.gate_run import select_candidates
    from harness.runs.run_meta import calibration_object, gpu_meta, kernel_info, plain_dict

    ap = argparse.ArgumentParser(prog="harness.runs.bisect_measure")
    ap.add_argument("--kernel", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--parent", default=None)
    ap.add_argument("--pass", dest="pass_name", default="fwd", choices=("fwd", "bwd"))
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--kernels-dir", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        configure(args.kernels_dir)
        pool = registry.discover()
        cands = select_candidates(pool, [args.kernel])
        cases = [Case.from_id(c) for c in args.cases.split(",") if c]
    except (DiscoveryError, GateUsageError, ValueError) as exc:
        print(f"{args.commit[:12]}: {exc}", file=sys.stderr)
        return 2
    notes: list[str] = []
    calibration = calibration_object(notes)
    try:
        results = run_perf(cands, cases, calibration=calibration, timeout_s=args.timeout,
                           timing={"rule": {"min_time_s": args.min_time}},
                           backward=args.pass_name == "bwd",
                           log=lambda line: print(line, file=sys.stderr, flush=True))
    except PerfUnavailable as exc:
        print(f"{args.commit[:12]}: {exc}", file=sys.stderr)
        return 3
    env = environment()
    env["bisect_notes"] = notes
    meta = {"source": "ci", "grids": [BACKFILL_GRID], "commit": args.commit,
            "parent": args.parent, "branch": None, "env": env, "gpu": gpu_meta(),
            "calibration": plain_dict(calibration),
            "kernels": {c.name: kernel_info(c) for c in cands}}
    RunRecord.from_results(results, meta).write(args.out)
    print(json.dumps({"results": len(results)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(child())
