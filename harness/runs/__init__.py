"""Runs: what `fa-harness run`, `fa-harness ci`, `fa-harness bisect` and the pytest plugin
share to conduct a run: grid names resolved to cases, the plan, the prepare and timing
phases, the gate's flow, and what a record says about the run beside its results."""
