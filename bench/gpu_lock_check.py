"""On a GPU host: the GPU lock and NVML's view of other processes, checked for real.

    python bench/gpu_lock_check.py lock OUT     # a second worker on GPU 0 is refused
    python bench/gpu_lock_check.py nvml OUT     # another CUDA process is seen, then gone

Each writes OUT/<check>.json and exits 0 only when the check holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.measure.gpuinfo import compute_processes, visible_gpus  # noqa: E402
from harness.submissions.gpulock import GpuWatch  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
CUDA_USER = ("import sys, time, torch; x = torch.ones(1 << 20, device='cuda'); "
             "torch.cuda.synchronize(); print('up', flush=True); time.sleep(float(sys.argv[1]))")


def worker(db: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", "worker", "--db", db, "--gpu",
                             "0", *extra], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def check_lock(out: Path) -> bool:
    db = str(Path(tempfile.mkdtemp()) / "q.sqlite")
    # `worker` never creates a database (a typo must not start an empty queue): make it.
    subprocess.run([sys.executable, "-m", "harness", "db", "upgrade", "--db", db], env=ENV,
                   check=True, capture_output=True)
    holder = worker(db)  # no --drain: holds the GPU, polling the empty queue
    time.sleep(8)  # started, GPU locked, polling the empty queue
    second = worker(db, "--drain")
    try:
        text2, _ = second.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        second.kill()
        text2 = "(still running after 60 s)"
    holder.send_signal(signal.SIGKILL)  # no clean-up: the kernel frees the lock
    holder.wait()
    third = worker(db, "--drain")
    text3, _ = third.communicate(timeout=60)
    res = {"holder_alive_when_second_started": True,
           "second_rc": second.returncode, "second_output": text2.strip().splitlines()[-3:],
           "after_holder_killed_rc": third.returncode,
           "after_output": text3.strip().splitlines()[-2:]}
    ok = (second.returncode == 1 and "taken by another worker" in text2
          and third.returncode == 0)
    res["ok"] = ok
    (out / "lock.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return ok


def check_nvml(out: Path) -> bool:
    gpu = visible_gpus()[0]
    watch = GpuWatch(gpu.uuid, log=print)
    idle = watch.others_now()
    user = subprocess.Popen([sys.executable, "-c", CUDA_USER, "20"], env=ENV,
                            stdout=subprocess.PIPE, text=True)
    assert user.stdout.readline().strip() == "up"
    listed = [p.__dict__ for p in compute_processes(gpu.uuid)]
    watch.start()
    summary = watch.finish(settle_s=0.2, tries=1)
    same_ns = any(p["pid"] == user.pid for p in listed)
    user.kill()
    user.wait()
    gone_at = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 15:
        if not watch.others_now():
            gone_at = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.2)
    res = {"gpu": gpu.__dict__, "others_when_idle": idle, "listed_while_used": listed,
           "user_pid": user.pid, "nvml_pid_matches_ours": same_ns,
           "watch_summary": summary, "gone_after_kill_s": gone_at}
    ok = (not idle and len(listed) >= 1 and summary["shared"] and gone_at is not None)
    res["ok"] = ok
    (out / "nvml.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return ok


if __name__ == "__main__":
    what, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    sys.exit(0 if {"lock": check_lock, "nvml": check_nvml}[what](out) else 1)
