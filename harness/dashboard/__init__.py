"""The fa-harness Streamlit dashboard: history, regressions, roofline, correctness, leaderboard.

It reads the results database through SQLAlchemy only; it never imports CuPy, torch or the
kernels, so it runs on any machine that can reach the database.
"""
