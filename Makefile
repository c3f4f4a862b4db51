# Two commands do all set-up on a fresh machine: `make run` and `make test`.
# Both create .venv from requirements.lock on first use; later calls only
# check a stamp file and spend no time on installs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
UV_VERSION := $(shell sed -n 's/^uv==//p' requirements.lock)
CONFIG ?= fashion_mnist
OUTPUT ?= runs
RUNNER ?= beam
# Test workers (pytest-xdist); 0 runs every test in the pytest process.
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?=
BENCHES ?= ingestion strategies distillation gradient_checkpointing reliability faults tfdata_service

.PHONY: setup run test test-fast bench bench-report lint format lock clean fashion-mnist

setup: $(STAMP)

# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE
# is set (as on this project's machines) Python never caches one either, so every
# process would compile TensorFlow, TFX and Beam from source again: about 20 s
# of each process's start (importing the stack: 30 s without, 10 s with).
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip sync -q --compile-bytecode --python $(BIN)/python requirements.lock
	# TFX declares Requires-Python <3.11; its pinned dependencies are in the lock.
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --ignore-requires-python \
		tfx==1.16.0 ml-pipelines-sdk==1.16.0
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	touch $(STAMP)

run: setup fashion-mnist
	$(BIN)/tfxkit run --config $(CONFIG) --runner $(RUNNER) --output $(OUTPUT)

# --dist loadscope: a module's tests stay on one worker, so its module
# fixtures are built once; session fixtures that run a pipeline are built once
# for all workers (tests/conftest.py, once_per_run). The 25 slowest tests are
# listed at the end: the suite's time is a target (README, Tests).
test: setup fashion-mnist
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --durations=25 $(PYTEST_ARGS)

# The fast loop: unit and component tests, without whole pipelines (marker
# e2e) or multi-process clusters (marker multiprocess); pyproject.toml
# documents the markers. Under 4 minutes here (docs/development.md).
test-fast: setup fashion-mnist
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope -m "not e2e and not multiprocess" $(PYTEST_ARGS)

# Fashion-MNIST ships in Debian (dataset-fashion-mnist). Root installs it when
# missing; anyone else is told how (see components/data/fashion_mnist.py).
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist
fashion-mnist:
	@test -d $(FASHION_MNIST_DIR) || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; } \
				|| echo "could not install dataset-fashion-mnist; tests that need the real images are skipped"; \
		else \
			echo "Fashion-MNIST is not installed: 'sudo apt-get install -y dataset-fashion-mnist', or see docs/data-path.md (Built-in datasets)"; \
		fi; }

# Each benchmark prints JSON lines, its headline figures last.
bench: setup
	set -e; for b in $(BENCHES); do echo "== benchmarks/$$b.py"; $(BIN)/python benchmarks/$$b.py; done

# Every committed result's headline, with its commit, date and machine, and
# whether the product or the benchmark changed since (stale); runs nothing.
bench-report: setup
	$(BIN)/python -m testkit.results

# Format check, then lint: both gate CI (.ci/run) before the tests.
LINT_PATHS := components pipelines testkit tests benchmarks
lint: setup
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/ruff check $(LINT_PATHS)

format: setup
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

# Re-resolve the lock for Python 3.11 on manylinux x86-64 from requirements.in.
lock: setup
	$(BIN)/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements.in -o requirements.lock

clean:
	rm -rf $(VENV) runs .pytest_cache
