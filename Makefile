# fa-harness: set up, run, test.
#   make run       set up .venv (first time) and run the correctness suite on this machine
#   make test      the project's tests and the CPU suites (what CI runs)
#   make test-gpu  the GPU tests, on a machine with a CUDA GPU (not part of CI)

# Any Python >= 3.11: the newest one on PATH (override with `make PYTHON=...`).
PYTHON ?= $(shell for p in python3.14 python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
PYTEST_FLAGS ?= -n 2 --dist loadgroup -p no:cacheprovider --timeout 900 --durations=20

.PHONY: run test test-gpu lint clean

# torch goes in first, pinned, and only when absent: the CPU build of 2.13.0 lies on disk
# on the CPU machines (pip finds it there), while a plain `torch` requirement with no torch
# installed would pull a multi-GB CUDA build. With it installed, the project's `torch>=2.4`
# is already satisfied.
$(VENV): pyproject.toml
	@test -x $(BIN)/python || test -n "$(PYTHON)" || \
		{ echo "make: no Python >= 3.11 on PATH (set PYTHON=/path/to/python3.11+)" >&2; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,dashboard,postgres]'
	touch $(VENV)

run: $(VENV)
	$(BIN)/fa-harness run

# Four pytest runs: the tests, every CPU candidate on the smoke grid, then the
# algorithm models on the full adversarial grid (fast enough on the CPU) and, with the CPU
# peers (sdpa_math, eager flex_attention: about two minutes of the run), on the mods
# grid (score modifiers, head dims, input distributions: docs/score-mods.md). pytest's exit 5 (collected
# no test) means the command itself is broken: it fails, with a message saying so.
NO_TESTS = { rc=$$?; [ $$rc -ne 5 ] || echo "make test: pytest collected no tests" >&2; exit $$rc; }

# First the linters: ruff, and import-linter's contracts (the architecture's import rules,
# ARCHITECTURE.md). Then an nvcc build of every CUDA variant for sm_80 and sm_90 (registers and spills per
# entry; a compile error fails with the compiler's message; no GPU needed). Without nvcc
# (the CUDA toolkit) that step is skipped with one line; CI has nvcc and runs it.
# The PostgreSQL tests use $$FA_HARNESS_TEST_PG, else the local server CI uses
# (postgres@127.0.0.1:5432/test) when it answers, else they skip (tests/conftest.py).
test: $(VENV)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	@if command -v nvcc >/dev/null 2>&1; then \
		echo "$(BIN)/fa-harness kernels --compile --arch sm_80,sm_90"; \
		$(BIN)/fa-harness kernels --compile --arch sm_80,sm_90; \
	else echo "make test: nvcc not found: CUDA compile step skipped (install the CUDA toolkit for it)"; fi
	$(BIN)/pytest $(PYTEST_FLAGS) tests || $(NO_TESTS)
	$(BIN)/pytest $(PYTEST_FLAGS) harness/suites --fa-grid smoke || $(NO_TESTS)
	$(BIN)/pytest $(PYTEST_FLAGS) harness/suites --fa-grid full --fa-kernels '*_model' || $(NO_TESTS)
	$(BIN)/pytest $(PYTEST_FLAGS) harness/suites --fa-grid mods --fa-kernels '*_model,sdpa_math,flex_attention' || $(NO_TESTS)

# The GPU tests in two calls: first the ones that measure time (marked `exclusive`), with
# the GPU to themselves; then the rest (verdicts, compiles, correctness), which share it,
# GPU_JOBS at a time. No venv of its own: a GPU machine brings its own torch and CuPy
# (`GPU_PYTEST="python3 -m pytest" make test-gpu`).
GPU_PYTEST ?= $(if $(wildcard $(BIN)/pytest),$(BIN)/pytest,python3 -m pytest)
GPU_JOBS ?= 8
GPU_FLAGS ?= -p no:cacheprovider --timeout 300 -q -rfE --durations=15
test-gpu:
	$(GPU_PYTEST) tests -m "gpu and exclusive" $(GPU_FLAGS) || $(NO_TESTS)
	$(GPU_PYTEST) tests -m "gpu and not exclusive" -n $(GPU_JOBS) --dist loadgroup $(GPU_FLAGS) || $(NO_TESTS)

lint: $(VENV)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info
