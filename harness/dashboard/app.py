"""fa-harness dashboard entry point.

    fa-harness dashboard [--db URL] [--port N]
    streamlit run dashboard/app.py [-- --db URL]

Views are deep-linkable: `?page=history&variant=fa2_mma[,other]&case=...&gpu=nvidia-h200`,
`?page=run&run=42`, `?page=compare&gpu=...&base=<run or commit>&new=<run or commit>`
(`base_gpu=` for a base run on another GPU model). GPUs are named by model key or by the
name the GPU reports. Every page path (`/history`, `/run`, ...) takes the same parameters.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable
from inspect import signature
from pathlib import Path

# `streamlit run harness/dashboard/app.py` puts harness/dashboard/ on sys.path, not the
# directory holding the harness package.
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from sqlalchemy.exc import SQLAlchemyError  # noqa: E402

from harness.dashboard import (  # noqa: E402
    data,
    page_compare,
    page_correctness,
    page_history,
    page_leaderboard,
    page_overview,
    page_roofline,
    page_run,
    source,
    ui,
)
from harness.dashboard.source import DbState  # noqa: E402

SUBMIT_PAGE = Path(__file__).resolve().parent / "page_submit.py"

# key (url path and ?page= value), title, icon, renderer, needs runs in the database
PAGES: list[tuple[str, str, str, Callable[[data.Ctx], None], bool]] = [
    ("overview", "Overview", ":material/dashboard:", page_overview.render, True),
    ("history", "History", ":material/show_chart:", page_history.render, True),
    ("compare", "Compare", ":material/compare_arrows:", page_compare.render, True),
    ("roofline", "Roofline", ":material/roofing:", page_roofline.render, True),
    ("correctness", "Correctness", ":material/rule:", page_correctness.render, True),
    ("leaderboard", "Leaderboard", ":material/leaderboard:", page_leaderboard.render, False),
    ("run", "Run", ":material/receipt_long:", page_run.render, True),
]


def _db_message(probe: source.Probe) -> None:
    if probe.state in (DbState.UNREACHABLE, DbState.BAD_URL):
        st.error(probe.message)
    else:
        st.info(probe.message)


def _guarded(render: Callable[[data.Ctx], None], ctx: data.Ctx, probe: source.Probe,
             needs_runs: bool) -> None:
    usable = probe.ok or (probe.state is DbState.EMPTY and not needs_runs)
    if not usable:
        _db_message(probe)
        return
    try:
        render(ctx)
    except SQLAlchemyError as e:
        # A database that went away or changed under the page: one line, not a traceback.
        first = str(getattr(e, "orig", None) or e).strip().splitlines()
        st.error(f"Reading the database `{source.redact(ctx.url)}` failed: "
                 f"{first[0] if first else type(e).__name__}")


def _submit_page(ctx: data.Ctx) -> None:
    """The Submit page lives in its own file, loaded only when opened: it may be a plain
    page script, or define `render()` / `render(db_url)`."""
    try:
        scope = runpy.run_path(str(SUBMIT_PAGE), run_name="fa_harness_submit_page")
    except Exception as e:  # noqa: BLE001 - a broken optional page must not break the app
        st.error(f"The Submit page failed to load: {type(e).__name__}: {e}")
        return
    render = scope.get("render")
    # A statement, not a conditional expression: Streamlit's magic would write the
    # expression's value (None) on the page.
    if not callable(render):
        return
    if signature(render).parameters:
        render(ctx.url)
    else:
        render()


def _page(key: str, title: str, icon: str, fn: Callable[[], None], default: bool) -> st.Page:
    fn.__name__ = f"page_{key}"
    return st.Page(fn, title=title, icon=icon, url_path=key, default=default)


def main() -> None:
    st.set_page_config(page_title="fa-harness", page_icon=":material/bolt:", layout="wide")
    url = source.resolve_url(source.url_from_argv(sys.argv[1:]))
    probe = data.probe(url)
    pages: dict[str, st.Page] = {}
    ctx = data.Ctx(url, pages)  # filled below, before any page renders

    keys = [p[0] for p in PAGES] + (["submit"] if SUBMIT_PAGE.exists() else [])
    wanted = ui.param("page")
    if wanted is not None and wanted not in keys:
        st.warning(f"`page={wanted}` is not a page of this dashboard; showing the overview.")
        wanted = None
    wanted = wanted or "overview"

    for key, title, icon, render, needs_runs in PAGES:
        def run(render: Callable[[data.Ctx], None] = render, needs_runs: bool = needs_runs
                ) -> None:
            _guarded(render, ctx, probe, needs_runs)
        pages[key] = _page(key, title, icon, run, key == wanted)
    if "submit" in keys:
        pages["submit"] = _page("submit", "Submit", ":material/upload:",
                                lambda: _submit_page(ctx), wanted == "submit")
    nav = st.navigation(list(pages.values()))

    # `?page=` on another page's path (e.g. a link clicked on /history): go there, keeping
    # the other parameters; `page` itself is dropped, so this cannot loop.
    if nav.url_path and nav.url_path != wanted and ui.param("page") == wanted:
        rest = {k: v for k, v in st.query_params.to_dict().items() if k != "page"}
        st.switch_page(pages[wanted], query_params=rest)

    with st.sidebar:
        st.caption(f"Database: `{source.redact(url)}`")
        if not probe.ok:
            st.caption(probe.message)
    nav.run()


main()
