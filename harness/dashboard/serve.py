"""`python -m harness.dashboard.serve run dashboard/app.py [streamlit options] [-- --db URL]`:
`streamlit run` with the dashboard's libraries imported before the server starts.

Streamlit imports a page's modules on the first script run, so without this the first
visitor after a start waits for pandas, Altair, SQLAlchemy and the query layer to load
(seconds on a small CI machine). Importing them here moves that cost to start-up, before
`/_stcore/health` answers.
"""

from __future__ import annotations

import sys


def preload() -> None:
    import altair  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401

    import harness.dashboard.charts  # noqa: F401
    import harness.dashboard.data  # noqa: F401
    import harness.dashboard.queries  # noqa: F401


def main() -> None:
    preload()
    from streamlit.web import cli

    sys.argv = ["streamlit", *sys.argv[1:]]
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
