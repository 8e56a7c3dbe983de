"""Submissions: validation before queueing, the queue, the worker, scoring, ranking and
tokens. No host code of a submission ever runs."""
