"""bench/merge_records.py: records of one commit that split a grid become one record with
every result, and parts that do not belong together are refused with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "results/h200-20261201T124827Z-full-triton.json"  # a committed H200 record


def _split(tmp_path: Path) -> tuple[dict, list[Path]]:
    data = json.loads(REAL.read_text())
    parts = []
    for n, mask in enumerate(("none", "causal_br")):
        part = dict(data, uuid=f"00000000-0000-4000-8000-00000000000{n}",
                    results=[e for e in data["results"] if e["case"]["mask"] == mask],
                    env=dict(data["env"], argv=["run", "--cases", f"*-{mask}"]))
        parts.append(tmp_path / f"{mask}.json")
        parts[-1].write_text(json.dumps(part))
    return data, parts


def _merge(*args: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench/merge_records.py"), *map(str, args)],
                          text=True, capture_output=True, timeout=120)


def test_joins_the_parts_of_a_real_record(tmp_path):
    data, parts = _split(tmp_path)
    proc = _merge(tmp_path / "out.json", *parts)
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    want = sorted(e["case_id"] for e in data["results"] if e["case"]["mask"] in
                  ("none", "causal_br"))
    assert sorted(e["case_id"] for e in out["results"]) == want and len(want) == 80
    assert [m["argv"][-1] for m in out["env"]["merged_from"]] == ["*-none", "*-causal_br"]
    assert out["uuid"] not in {m["uuid"] for m in out["env"]["merged_from"]}
    assert out["commit"] == data["commit"]


def test_refuses_a_case_twice_and_another_commit(tmp_path):
    _, parts = _split(tmp_path)
    proc = _merge(tmp_path / "out.json", parts[0], parts[0])
    assert proc.returncode == 2 and "duplicate" in proc.stderr
    other = json.loads(parts[1].read_text()) | {"commit": "0" * 40}
    parts[1].write_text(json.dumps(other))
    proc = _merge(tmp_path / "out.json", *parts)
    assert proc.returncode == 2 and "not" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "out.json").exists()
