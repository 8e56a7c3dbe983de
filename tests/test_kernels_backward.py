"""`fa-harness kernels` says what each candidate declares of its backward: a `bwd` column
(no / det / nondet) in the table, at 80 columns through a pipe too, and a `backward` field
in --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.cli import main

PLANTED = Path(__file__).parent / "data" / "planted_bwd"


def test_json_has_each_candidates_backward(capsys):
    assert main(["kernels", "--json", "--kernels-dir", str(PLANTED)]) == 0
    rows = {c["name"]: c for c in json.loads(capsys.readouterr().out)["candidates"]}
    assert rows["planted_bwd"]["backward"] == {"supported": True, "deterministic": False,
                                               "dtypes": "bf16,fp16", "head_dims": "any",
                                               "masks": "all"}
    assert rows["planted_bwd_first_call"]["backward"]["supported"] is True
    assert rows["fa2_mma_det"]["backward"] == {"supported": True, "deterministic": True,
                                               "dtypes": "bf16,fp16", "head_dims": "64,128",
                                               "masks": "causal_br,causal_tl,key_padding,none"}
    assert rows["template"]["backward"] == {"supported": False, "deterministic": None,
                                            "dtypes": None, "head_dims": None,
                                            "masks": None}
    assert rows["fa2_model"]["backward"]["deterministic"] is True


def test_the_table_shows_the_backward_at_80_columns_through_a_pipe(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(COLUMNS="80", CUDA_VISIBLE_DEVICES="", FA_HARNESS_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "harness", "kernels", "--kernels-dir",
                           str(PLANTED)], capture_output=True, text=True, timeout=300,
                          env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    table = [ln for ln in proc.stdout.splitlines() if ln[:1] in "┏┃┡│└"]
    assert table and max(len(ln) for ln in table) <= 80, proc.stdout
    assert "bwd" in table[1]
    cells = {}
    for ln in table:
        parts = [p.strip() for p in ln.split("│")[1:-1]]
        if parts and parts[0]:
            cells[parts[0]] = parts
    header = [p.strip() for p in table[1].split("┃")[1:-1]]
    col = header.index("bwd")
    # names whole, one row each; the backward as declared
    assert cells["planted_bwd_first_call"][col] == "nondet"
    assert cells["fa2_mma_det"][col] == "det"
    assert cells["template"][col] == "no"
    # the origin is its source alone (the folder is in the "from" lines under the table)
    assert cells["planted_bwd"][header.index("origin")].startswith("--kernels")
