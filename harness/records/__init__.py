"""Records: the versioned run record, the results database (SQLAlchemy, Alembic), regression
compare, alerts and their steps, bisecting's search, and imports. Conducting a run (the
gate's flow, its plan) is harness.runs."""
