"""pytest plugin (entry point `fa_harness`): options and parametrization for the suites.

Options:
  --fa-grid NAME      case grid of the suites (smoke | full | perf | decode | perf-bwd |
                      serving | mods; default smoke), resolved as `fa-harness run` and
                      `ci` resolve it (harness.runs.grid_cases): the full grid per
                      candidate, perf-bwd through the candidates' backward
  --fa-kernels NAMES  comma-separated candidate names or globs (default: every candidate
                      available on this machine; naming one that is not available makes its
                      tests skip with the reason)
  --fa-secret N       secret mixed into the input seeds (default 0)
  --fa-repeats N      runs per case; > 1 adds the bitwise race check (default 1)
  --fa-db URL         store the session's results as a run record in this database (under
                      pytest-xdist, one record per worker)
  --fa-kernels-dir DIR  a folder of kernel variants, searched first (repeatable); then
                      FA_HARNESS_KERNELS, [tool.fa-harness] kernels-dirs in pyproject.toml,
                      then the shipped variants (harness.candidates.discovery)
  --fa-candidate MODULE:ATTR  a Python candidate to judge as well (repeatable)

From a kernel team's repository: `pytest --pyargs harness.suites --fa-grid smoke` runs the
installed suites over the team's kernels (named in its pyproject.toml).

A test that asks for the fixtures `fa_candidate_name` and `fa_case` is parametrized over
candidates x cases with ids like `fa2_model-b2h4-113x203-d64-fp16-causal_br`. The marker
`@pytest.mark.fa_grid("name")` overrides --fa-grid for one test. Parametrization is
deterministic (sorted candidates, fixed grids), as pytest-xdist requires; every test of a
case carries the xdist group of that case, so with `--dist loadgroup` one worker computes
a case's oracle once for all candidates.

This module is imported by every pytest run in an environment where fa-harness is
installed, so it imports nothing heavy (no torch, no discovery) until a fa-harness option
is given or a suite's test asks for candidates.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from harness.runs.grid_cases import GridCases

_RESULTS_KEY = pytest.StashKey[list]()
_PLAN_KEY = pytest.StashKey[dict]()
_BATCH_KEY = pytest.StashKey[dict]()
_GRIDS_KEY = pytest.StashKey[dict]()
# "CANDIDATE: no case of grid NAME: why" of the candidates a per-candidate grid gives no
# case (ordered, each once: every suite's test function asks for the same grid).
_NO_CASE_KEY = pytest.StashKey[dict]()
# The same lines from pytest-xdist's workers, whose terminals are not shown: the
# controller prints them in its summary.
_WORKERS_NO_CASE_KEY = pytest.StashKey[dict]()
_NO_CASE_OUTPUT = "fa_harness_no_case"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fa-harness", "FlashAttention harness suites")
    group.addoption("--fa-grid", default="smoke", help="case grid (default smoke)")
    group.addoption("--fa-kernels", default=None,
                    help="comma-separated candidate names or globs (default: all available)")
    group.addoption("--fa-secret", type=int, default=0, help="input seed secret (default 0)")
    group.addoption("--fa-repeats", type=int, default=1,
                    help="runs per case; > 1 also checks bitwise determinism")
    group.addoption("--fa-db", default=None, metavar="URL",
                    help="store this session's results in the database at URL")
    group.addoption("--fa-kernels-dir", action="append", default=[], metavar="DIR",
                    help="a folder of kernel variants, searched first (repeatable)")
    group.addoption("--fa-candidate", action="append", default=[], metavar="MODULE:ATTR",
                    help="a Python candidate to judge as well (repeatable)")


def pytest_configure(config: pytest.Config) -> None:
    from harness.paths import use_compile_caches

    # The suites' compiles go to the same caches as the CLI's (harness.paths).
    use_compile_caches()
    config.addinivalue_line("markers", "fa_grid(name): case grid of this test "
                                       "(overrides --fa-grid)")
    # The shipped suites mark their GPU tests; a team's repository has no ini entry for it.
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped cleanly without one)")
    config.stash[_RESULTS_KEY] = []
    # Bad option values stop the session at once with one line (exit 4), before collection.
    # Only options actually given are checked here: an unrelated session pays nothing.
    grid = config.getoption("--fa-grid")
    if grid != "smoke":
        from harness.core.grids import GRIDS

        if grid not in GRIDS:
            raise pytest.UsageError(f"--fa-grid: unknown grid {grid!r}; known: "
                                    f"{', '.join(GRIDS)}")
    if config.getoption("--fa-repeats") < 1:
        raise pytest.UsageError(f"--fa-repeats must be >= 1, got {config.getoption('--fa-repeats')}")
    if config.getoption("--fa-secret") < 0:
        raise pytest.UsageError(f"--fa-secret must be >= 0, got {config.getoption('--fa-secret')}")
    dirs, specs = config.getoption("--fa-kernels-dir"), config.getoption("--fa-candidate")
    if dirs or specs:
        from harness.candidates.discovery import DiscoveryError, configure

        try:
            configure(dirs, specs)
        except DiscoveryError as e:
            raise _usage(e) from None
    if config.getoption("--fa-kernels") or dirs or specs:
        selected_candidates(config)


def _usage(e: Exception) -> pytest.UsageError:
    """A discovery error in pytest's option names."""
    return pytest.UsageError("fa-harness: " + str(e).replace("--kernels-dir", "--fa-kernels-dir")
                             .replace("--candidate", "--fa-candidate"))


def _share_cores() -> None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and os.environ.get("PYTEST_XDIST_WORKER"):
        # Each xdist worker gets its share of the cores: torch's default (all cores per
        # process) oversubscribes the CPU and makes the CPU suites several times slower.
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def selected_candidates(config: pytest.Config) -> list:
    """The candidates the suites run: --fa-kernels, else every available one."""
    from harness.candidates import registry

    patterns = config.getoption("--fa-kernels")
    try:
        pool = registry.discover()
    except ValueError as e:  # DiscoveryError: a kernels folder missing, a name twice
        raise _usage(e) from None
    if not patterns:
        return [c for c in pool if registry.available(c)]
    try:
        return registry.select(pool + registry.discover(("planted",)), patterns)
    except ValueError as e:
        raise pytest.UsageError(f"--fa-kernels: {e}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not {"fa_candidate_name", "fa_case"} <= set(metafunc.fixturenames):
        return
    grid = _grid(metafunc.config, _grid_name(metafunc.definition))
    candidates = selected_candidates(metafunc.config)
    _share_cores()
    params = [pytest.param(c.name, case, id=f"{c.name}-{case.id}",
                           marks=pytest.mark.xdist_group(case.id))
              for c, case in grid.pairs(candidates)]
    no_case = metafunc.config.stash.setdefault(_NO_CASE_KEY, {})
    no_case.update(dict.fromkeys(grid.no_case_lines(candidates)))
    metafunc.parametrize(("fa_candidate_name", "fa_case"), params)


def _grid_name(node: pytest.Item) -> str:
    marker = node.get_closest_marker("fa_grid")
    return marker.args[0] if marker else node.config.getoption("--fa-grid")


def _grid(config: pytest.Config, name: str) -> GridCases:
    """Grid `name` resolved as `fa-harness run` and `ci` resolve it (harness.runs.grid_cases),
    once per session."""
    from harness.runs.grid_cases import resolve_grid

    grids = config.stash.setdefault(_GRIDS_KEY, {})
    if name not in grids:
        try:
            grids[name] = resolve_grid(name)
        except ValueError as e:
            raise pytest.UsageError(f"--fa-grid: {e}") from None
    return grids[name]


@pytest.fixture
def fa_candidate(fa_candidate_name: str):
    from harness.candidates.registry import get_candidate, unavailable_reason

    cand = get_candidate(fa_candidate_name)
    reason = unavailable_reason(cand)
    if reason:
        pytest.skip(f"{cand.name}: {reason}")
    return cand


def pytest_collection_finish(session: pytest.Session) -> None:
    """Remember which cases each candidate will run in this session (after -k and other
    deselection), so isolated candidates can run them in one child process."""
    plan: dict[str, list] = {}
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "fa_candidate_name" in params and "fa_case" in params:
            # Per test function: the perf suite's cases must not ride along with the
            # correctness suite's batch (an isolated CPU candidate would run them all).
            key = (params["fa_candidate_name"], getattr(item, "originalname", item.name))
            cases = plan.setdefault(key, [])
            if params["fa_case"] not in cases:
                cases.append(params["fa_case"])
    session.config.stash[_PLAN_KEY] = plan
    session.config.stash[_BATCH_KEY] = {}
    no_case = list(session.config.stash.get(_NO_CASE_KEY, {}))
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # sent to the controller when the worker is done
        workeroutput[_NO_CASE_OUTPUT] = no_case
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if plan:
        for line in _discovery_lines():
            reporter.write_line(line)
    # Printed even when nothing else runs: a candidate without a case of the grid would
    # otherwise just be missing from the session.
    for line in no_case:
        reporter.write_line(line)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist's controller, a worker done: keep its no-case lines (each once)."""
    lines = getattr(node, "workeroutput", {}).get(_NO_CASE_OUTPUT, [])
    config = getattr(node, "config", None)
    if lines and config is not None:
        config.stash.setdefault(_WORKERS_NO_CASE_KEY, {}).update(dict.fromkeys(lines))


def pytest_terminal_summary(terminalreporter: object, exitstatus: int,
                            config: pytest.Config) -> None:
    for line in config.stash.get(_WORKERS_NO_CASE_KEY, {}):
        terminalreporter.write_line(line)  # type: ignore[attr-defined]


@pytest.fixture
def fa_check(request: pytest.FixtureRequest):
    """fa_check(candidate, case) -> CaseResult, through the runner, recorded for --fa-db.

    An isolated candidate (CUDA variant, submission) runs all of its planned cases in one
    child process on first use (starting a child, CUDA and the compiled module once per
    candidate instead of once per test); each test then reads its own case's result."""
    config = request.config

    def check(candidate, case):
        from harness.execution.runner import run_correctness

        # A grid run through the backward (perf-bwd) is checked through it here too.
        opts = {"secret": config.getoption("--fa-secret"),
                "repeats": config.getoption("--fa-repeats"),
                "backward": _grid(config, _grid_name(request.node)).backward}
        batch = config.stash.get(_BATCH_KEY, {})
        if candidate.isolate:
            if (candidate.name, case) not in batch:
                key = (candidate.name, getattr(request.node, "originalname",
                                               request.node.name))
                planned = config.stash.get(_PLAN_KEY, {}).pop(key, None) or []
                cases = planned if case in planned else [case]  # the plan is used once
                for res in run_correctness([candidate], cases, **opts):
                    batch[(candidate.name, res.case)] = res
            res = batch.pop((candidate.name, case))
        else:
            (res,) = run_correctness([candidate], [case], **opts)
        config.stash[_RESULTS_KEY].append(res)
        return res

    return check


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Discovery notes and variant load errors, when discovery has already run (an
    fa-harness option was given); otherwise they are reported once the suites collect."""
    if "harness.candidates.registry" not in sys.modules:
        return None
    return _discovery_lines() or None


def _discovery_lines() -> list[str]:
    try:
        from harness.candidates import registry

        registry.discover()
        lines = [f"fa-harness: {n}" for n in registry.notes()]
        lines += [f"fa-harness: load error: {e}" for e in registry.load_errors()]
    except Exception as e:  # the header must never break collection; tests will show it
        lines = [f"fa-harness: discovery failed: {type(e).__name__}: {e}"]
    return lines


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    url = session.config.getoption("--fa-db", default=None)
    results = session.config.stash.get(_RESULTS_KEY, [])
    if not url or not results:
        return
    import torch

    from harness.records.db.store import DatabaseError, open_db, store_record
    from harness.records.record import RunRecord, spool
    from harness.runs.run_meta import gpu_meta

    grid = session.config.getoption("--fa-grid")
    rec = RunRecord.from_results(results, {
        "source": "ci", "grids": [grid],
        "gpu": gpu_meta() if torch.cuda.is_available() else None})
    from harness.records.db.engine import target_of

    kept = spool(rec, target=target_of(url))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    try:
        with open_db(url) as db:
            run_id = store_record(db, rec)
        kept.unlink(missing_ok=True)
        msg = f"fa-harness: stored {len(results)} result(s) as run {run_id}"
    except DatabaseError as e:
        msg = f"fa-harness: database not updated, record kept in {kept}: {e}"
    if reporter is not None:
        reporter.write_line(msg)
