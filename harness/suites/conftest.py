"""The suites run on the fa-harness pytest plugin (options --fa-grid, --fa-kernels,
--fa-secret, --fa-repeats, --fa-db; parametrization over candidates x cases)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # The plugin is registered through the package's pytest11 entry point; without an
    # installed package the suites would collect nothing useful, so say how to fix it.
    if not config.pluginmanager.has_plugin("fa_harness"):
        raise pytest.UsageError("the fa-harness pytest plugin is not loaded: install the "
                                "project first (`make .venv`, or pip install -e .)")
