"""Dashboard speed on a large history: 1,000,000 results (200 commits x 5 GPUs x 1,000
variant-case pairs) plus their comparison verdicts, in SQLite and in PostgreSQL.

    .venv/bin/python bench/dashboard_speed.py                     # both backends
    .venv/bin/python bench/dashboard_speed.py --backend sqlite --reuse
    .venv/bin/python bench/dashboard_speed.py --commits 20        # a quick, smaller run

For each backend it reports:
  - the bulk load (rows, seconds, database size);
  - the first (cold-cache) render of Overview, History, Compare, Roofline, Correctness and
    Run, timed in a fresh process
    through Streamlit's AppTest after the app's modules are imported (as in a running
    server), and the warm (cached) re-render; target: each first render under 2 s;
  - what the gate reads of this history for its newest run (the noise model and the
    step search's series), not a dashboard page but the same database;
  - a real server (`fa-harness dashboard`) driven by headless Chromium through Playwright
    (the dev extra): server start to the first page drawn (target: 5 s), then every
    page's first paint, navigation to its charts and tables drawn (target: 2 s each), and
    the server's resident memory after them (now / VmHWM peak); target: under 1 GB.
    Skipped without Playwright or Chromium.

PostgreSQL goes into its own database (`fa_dashboard_bench`, dropped and recreated), so
the `test` database of the server is left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the dashboard server and Chromium helpers

import dashboard_server  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from harness.dashboard.synth import SynthSpec, generate, synth_cases  # noqa: E402

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PG_DB = "fa_dashboard_bench"
H200 = "NVIDIA H200"

# Runs in a fresh interpreter: cold query caches, warm imports (like a started server).
_RENDER = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import altair, pandas, streamlit  # noqa: F401  (a running server has these loaded)
from streamlit.testing.v1 import AppTest
import harness.dashboard.page_overview, harness.dashboard.page_history, harness.dashboard.charts  # noqa: F401
import harness.dashboard.page_compare, harness.dashboard.page_roofline, harness.dashboard.page_correctness, harness.dashboard.page_run  # noqa: F401
imports = time.perf_counter() - t0
app, views = sys.argv[1], json.loads(sys.argv[2])
out = {"imports_s": imports}
for name, params in views:
    at = AppTest.from_file(app, default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = v
    t = time.perf_counter()
    at.run()
    dt = time.perf_counter() - t
    out[name] = {"s": round(dt, 3), "title": at.title[0].value if at.title else None,
                 "charts": len(at.get("vega_lite_chart")), "tables": len(at.dataframe),
                 "problems": [str(e.value)[:300] for e in at.exception],
                 "alerts": [str(e.value)[:200] for e in at.error]}
out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def prepare(backend: str, args: argparse.Namespace) -> str:
    if backend == "sqlite":
        return f"sqlite:///{Path(args.sqlite).resolve()}"
    admin = make_url(args.pg)
    return admin.set(database=PG_DB).render_as_string(hide_password=False)


def fresh(backend: str, url: str, args: argparse.Namespace) -> None:
    if backend == "sqlite":
        path = Path(make_url(url).database)
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return
    admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{PG_DB}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{PG_DB}"'))
    admin.dispose()


def size_mb(backend: str, url: str) -> float:
    if backend == "sqlite":
        path = Path(make_url(url).database)
        return sum(Path(f"{path}{s}").stat().st_size for s in ("", "-wal")
                   if Path(f"{path}{s}").exists()) / 2**20
    eng = create_engine(url)
    with eng.connect() as conn:
        n = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    eng.dispose()
    return n / 2**20


def views(spec: SynthSpec) -> list[tuple[str, dict[str, str]]]:
    bf16 = next(c.case_id for c in synth_cases(spec.cases) if "-bf16-" in c.case_id)
    return [
        ("overview", {}),
        ("history_default", {"page": "history"}),
        ("history_link", {"page": "history", "variant": "fa2_tc", "case": bf16, "gpu": H200}),
        ("history_two_variants", {"page": "history", "variant": "fa2_tc,fa2_cuda", "case": bf16,
                                  "gpu": H200}),
        ("compare", {"page": "compare"}),
        ("roofline", {"page": "roofline"}),
        ("correctness", {"page": "correctness"}),
        ("run", {"page": "run"}),
        ("overview_warm", {}),
    ]


def render_times(url: str, spec: SynthSpec) -> dict[str, Any]:
    env = dict(os.environ, FA_HARNESS_DB=url, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", _RENDER, str(ROOT / "harness" / "dashboard" / "app.py"),
         json.dumps(views(spec))], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=900)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# Every page in Chromium on a running server, the first visit (cold query caches) of each:
# name, query parameters, title, charts it must draw.
BROWSER_PAGES = [
    ("overview", {}, "Overview", 0),
    ("history", {"page": "history"}, "History", 1),
    ("compare", {"page": "compare"}, "Compare", 0),
    ("roofline", {"page": "roofline"}, "Roofline", 1),
    ("correctness", {"page": "correctness"}, "Correctness", 1),
    ("run", {"page": "run"}, "Run", 0),
    ("leaderboard", {"page": "leaderboard"}, "Leaderboard", 0),
    ("overview_warm", {}, "Overview", 0),
]


# Page state as the browser sees it: drawn charts (vega-embed renders into a canvas or an
# svg with a non-zero box), the page title, alerts, and whether Streamlit is still running.
_STATE_JS = """() => {
  const charts = [...document.querySelectorAll('.vega-embed canvas, .vega-embed svg')]
    .filter(e => e.getBoundingClientRect().width > 50 && e.getBoundingClientRect().height > 50);
  const h1 = document.querySelector('h1');
  const running = !!document.querySelector('[data-testid="stStatusWidget"]');
  const alerts = [...document.querySelectorAll('[data-testid="stAlert"]')].map(e => e.innerText);
  const exc = document.querySelectorAll('[data-testid="stException"]').length;
  return {charts: charts.length, title: h1 ? h1.innerText : null, running, alerts,
          exceptions: exc};
}"""


def capture(page: Any, url: str, *, want_charts: int, title: str, timeout_s: float,
            settle_s: float = 1.0) -> tuple[bytes, dict[str, Any], float]:
    """(png, state, seconds from navigation to the wanted state) of `url`: its charts
    drawn, its title shown, Streamlit idle; on timeout, what is there and inf seconds."""
    t0 = time.monotonic()
    # "commit": the clock is the page's own drawing, not the document's load event.
    page.goto(url, wait_until="commit")
    reached = float("inf")
    while time.monotonic() - t0 < timeout_s:
        state = page.evaluate(_STATE_JS)
        done = (state["charts"] >= want_charts and not state["running"]
                and state["title"] == title)
        if done or state["exceptions"]:
            reached = time.monotonic() - t0
            break
        time.sleep(0.1)
    time.sleep(settle_s)  # let the chart finish its draw before the capture
    return page.screenshot(), page.evaluate(_STATE_JS), reached


def browser(url: str, spec: SynthSpec, shots: Path) -> dict[str, Any]:
    """Server start to the first drawn page, then every page's first paint (navigation
    to the page drawn: its title, its charts, Streamlit idle), all in headless Chromium;
    target: the first page within 5 s of starting the server, each page within 2 s."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {"skipped": "no playwright (pip install -e '.[dev]')"}
    if dashboard_server.find_chromium() is None:
        return {"skipped": "no chromium (apt-get install chromium)"}
    res: dict[str, Any] = {}
    with sync_playwright() as pw:
        chromium = dashboard_server.launch(pw)
        page = chromium.new_page(viewport={"width": 1400, "height": 1100})
        t0 = time.perf_counter()
        with dashboard_server.serve(url) as server:
            res["server_health_s"] = round(time.perf_counter() - t0, 2)
            for i, (name, params, title, charts) in enumerate(BROWSER_PAGES):
                query = "&".join(f"{k}={v.replace(' ', '%20')}" for k, v in params.items())
                png, state, seconds = capture(page, f"{server.base}/?{query}",
                                              want_charts=charts, title=title, timeout_s=120)
                if i == 0:
                    res["start_to_first_page_s"] = round(res["server_health_s"] + seconds, 2)
                path = shots / f"{name}.png"
                path.write_bytes(png)
                res[name] = {"to_drawn_s": round(seconds, 2), "state": state,
                             "screenshot": str(path)}
            rss, peak = server.rss_bytes()
            res["server_rss_mb"] = round(rss / 2**20, 1)
            res["server_peak_rss_mb"] = round(peak / 2**20, 1)
        chromium.close()
    return res


def gate_reads(url: str) -> dict[str, Any]:
    """What `fa-harness ci` and `import` read of this history for the newest run: the
    noise model (harness.records.noise.from_db) and the step search's series of three
    candidates (harness.records.step_gate.history_from_db), each timed twice (seconds)."""
    from sqlalchemy import func, select
    from sqlalchemy.orm import sessionmaker

    from harness.records.db.database import Database
    from harness.records.db.models import Run
    from harness.records.noise import from_db
    from harness.records.step_gate import history_from_db

    engine = create_engine(url)
    db = Database(url, engine, sessionmaker(engine))
    try:
        with db.session() as s:
            last, gpu = s.execute(select(Run.id, Run.gpu_model_key).where(
                Run.created_at == select(func.max(Run.created_at)).scalar_subquery())).first()
        out: dict[str, Any] = {"noise_s": [], "steps_s": []}
        for _ in range(2):
            t = time.perf_counter()
            model = from_db(db, gpu, before_run_id=last)
            out["noise_s"].append(round(time.perf_counter() - t, 2))
            names = sorted({k[0] for k in model.points})[:3]
            t = time.perf_counter()
            history_from_db(db, gpu, upto_run_id=last, kernels=names)
            out["steps_s"].append(round(time.perf_counter() - t, 2))
        out["series"] = len(model.points)
        return out
    finally:
        engine.dispose()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    p.add_argument("--sqlite", default="/tmp/fa-dashboard-bench.sqlite")
    p.add_argument("--pg", default=PG_ADMIN, help="admin URL of the PostgreSQL server")
    p.add_argument("--commits", type=int, default=200)
    p.add_argument("--gpus", type=int, default=5)
    p.add_argument("--variants", type=int, default=10)
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--reuse", action="store_true", help="keep an existing bench database")
    p.add_argument("--no-browser", action="store_true")
    p.add_argument("--out", default="/tmp/fa-dashboard-bench", help="screenshots and JSON")
    args = p.parse_args()
    spec = SynthSpec(commits=args.commits, gpus=args.gpus, variants=args.variants,
                     cases=args.cases)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"spec": {"commits": spec.commits, "gpus": spec.gpus,
                                       "variants": spec.variants, "cases": spec.cases,
                                       "results": spec.results}}
    backends = ("sqlite", "postgresql") if args.backend == "both" else (args.backend,)
    for backend in backends:
        url = prepare(backend, args)
        r: dict[str, Any] = {}
        if not args.reuse:
            fresh(backend, url, args)
            t = time.perf_counter()
            engine = create_engine(url)
            r["rows"] = generate(engine, spec, bulk=True)
            engine.dispose()
            r["load_s"] = round(time.perf_counter() - t, 1)
        r["size_mb"] = round(size_mb(backend, url), 1)
        r["render"] = render_times(url, spec)
        r["gate_reads"] = gate_reads(url)
        if not args.no_browser:
            shots = out_dir / backend
            shots.mkdir(exist_ok=True)
            r["browser"] = browser(url, spec, shots)
        report[backend] = r
        print(json.dumps({backend: r}, indent=1, default=str), flush=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    ok = True
    for backend in backends:
        rr = report[backend]["render"]
        for view in [v for v, _ in views(spec) if not v.endswith("_warm")]:
            flag = "ok" if rr[view]["s"] < 2.0 and not rr[view]["problems"] else "SLOW/FAIL"
            ok &= flag == "ok"
            print(f"{backend:10s} first render {view:20s} {rr[view]['s']:6.2f} s  {flag}")
        g = report[backend]["gate_reads"]
        print(f"{backend:10s} gate reads: noise model {max(g['noise_s']):.2f} s, step "
              f"history {max(g['steps_s']):.2f} s ({g['series']} series)")
        b = report[backend].get("browser", {})
        if "start_to_first_page_s" in b:
            flag = "ok" if b["start_to_first_page_s"] <= 5.0 else "SLOW"
            ok &= flag == "ok"
            print(f"{backend:10s} server start to first page {b['start_to_first_page_s']:6.2f} s"
                  f"  {flag}")
        for name, *_ in BROWSER_PAGES:
            if name in b:
                t = b[name]["to_drawn_s"]
                flag = "ok" if t <= 2.0 else "SLOW"
                ok &= flag == "ok"
                print(f"{backend:10s} Chromium first paint {name:14s} {t:6.2f} s  {flag}")
        if "server_peak_rss_mb" in b:
            flag = "ok" if b["server_peak_rss_mb"] < 1024 else "OVER"
            ok &= flag == "ok"
            print(f"{backend:10s} server peak RSS {b['server_peak_rss_mb']:8.1f} MB   {flag}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
