"""`python -m harness.dashboard.serve run dashboard/app.py [streamlit options] [-- --db URL]`:
`streamlit run` with the dashboard's libraries imported before the server starts.

Streamlit imports a page's modules on the first script run, so without this the first
visitor after a start waits for pandas, Altair, SQLAlchemy and the query layer to load
(seconds on a small CI machine). Importing them here moves that cost to start-up, before
`/_stcore/health` answers. So are the other first-time costs a first visitor would wait
for: the database driver's import, and Altair's first chart validation.
"""

from __future__ import annotations

import sys


def _db_driver(argv: list[str]) -> None:
    """Import the database's driver (psycopg for PostgreSQL): building an engine does, and
    connects nothing."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from harness.dashboard import source

    try:
        script_args = argv[argv.index("--") + 1:] if "--" in argv else []
        source.make_engine(source.resolve_url(source.url_from_argv(script_args))).dispose()
    except (ArgumentError, NoSuchModuleError, ImportError):
        pass  # the page reports a bad URL or a missing driver, in words


def preload(argv: list[str] | None = None) -> None:
    import inspect

    import altair
    import pandas
    import pyarrow  # noqa: F401

    # Every module a page draws with (app.py imports them on the first run).
    import harness.dashboard.alerts  # noqa: F401
    import harness.dashboard.charts  # noqa: F401
    import harness.dashboard.data  # noqa: F401
    import harness.dashboard.page_compare  # noqa: F401
    import harness.dashboard.page_correctness  # noqa: F401
    import harness.dashboard.page_history  # noqa: F401
    import harness.dashboard.page_leaderboard  # noqa: F401
    import harness.dashboard.page_overview  # noqa: F401
    import harness.dashboard.page_roofline  # noqa: F401
    import harness.dashboard.page_run  # noqa: F401
    import harness.dashboard.queries  # noqa: F401

    # Streamlit's first drawn element asks inspect.stack() whether it runs in a REPL; the
    # first such lookup maps every loaded module to its file (a tenth of a second that the
    # first visitor waited for). Mapping them now leaves later lookups incremental.
    inspect.getmodule(inspect.currentframe())
    # Altair validates a chart against the Vega-Lite schema; the first validation in a
    # process builds what later ones reuse (a third of a second for the History chart).
    altair.Chart(pandas.DataFrame({"x": [0.0]})).mark_line().encode(x="x:Q", y="x:Q").to_dict()
    _db_driver(sys.argv if argv is None else argv)


def main() -> None:
    preload()
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
