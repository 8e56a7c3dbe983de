#!/usr/bin/env bash
# A foreign CUDA process holds the GPU while a real worker scores one honest submission
# (a step of bench/h200_workers.sh; needs OUT and FA_HARNESS_HOME from it).
set -u
db=$FA_HARNESS_HOME/shared.sqlite
python3 -c "import time, torch; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize(); time.sleep(40)" &
user=$!
sleep 6
python3 -m harness submit tests/data/submissions/good_rowwarp.cu --db "$db" --name shared-probe || true
python3 -m harness worker --db "$db" --gpu 0 --drain --busy-wait 3 --on-shared mark \
  --max-attempts 1 --quick --correctness-grid smoke --max-perf-cases 1 \
  --stop-at-first-failure --events "$OUT/shared-events.jsonl"
kill "$user" 2>/dev/null
python3 - "$db" <<'PY'
import json, sys
from sqlalchemy import create_engine, text
e = create_engine(f"sqlite:///{sys.argv[1]}")
with e.connect() as c:
  for r in c.execute(text("select id, status, verdict, score, message, detail from submissions")):
      d = json.loads(r.detail) if isinstance(r.detail, str) else r.detail
      print(json.dumps({"id": r.id, "status": r.status, "verdict": r.verdict,
                        "score": r.score, "message": (r.message or "")[:160],
                        "gpu_sharing": (d or {}).get("gpu_sharing")}))
PY

