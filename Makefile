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
BENCHES ?= ingestion strategies distillation gradient_checkpointing reliability faults tfdata_service service_wire service_codes augment scale shuffle_quality

# Two stacks: 1.16 (TFX 1.16 / TF 2.16 / tf_keras; .venv from requirements.lock)
# and current (TFX 1.21 / TF 2.21 / Keras 3; requirements-current.lock, in a venv
# under ~/.cache/tfxkit, inside a cached Debian 13 root where the host's glibc
# is older than 2.39: .ci/stack-root.sh). Unset, STACK is the newest stack the
# host installs natively, and `.ci/stack-root.sh choose` prints which and why
# (TFXKIT_GLIBC=2.41 forces the glibc it sees). `make test STACK=current` chooses.
ifndef STACK
STACK := $(shell .ci/stack-root.sh choose)
endif
ifeq ($(STACK),current)
SETUP  := stack-venv
PY     := .ci/stack-root.sh run python
TFXKIT := .ci/stack-root.sh run tfxkit
RUFF   := .ci/stack-root.sh run ruff
else ifeq ($(STACK),1.16)
SETUP  := $(STAMP)
PY     := $(BIN)/python
TFXKIT := $(BIN)/tfxkit
RUFF   := $(BIN)/ruff
else
$(error STACK=$(STACK): choose STACK=current or STACK=1.16)
endif

.PHONY: setup stack-venv run test test-fast bench bench-report lint format lock clean fashion-mnist prism

setup: $(SETUP)

# The current stack's venv (and the Debian 13 root where needed), built once.
stack-venv:
	.ci/stack-root.sh venv

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
	$(TFXKIT) run --config $(CONFIG) --runner $(RUNNER) --output $(OUTPUT)

# --dist loadscope: a module's tests stay on one worker, so its module
# fixtures are built once; session fixtures that run a pipeline are built once
# for all workers (tests/conftest.py, once_per_run). The 25 slowest tests are
# listed at the end: the suite's time is a target (README, Tests).
test: setup fashion-mnist prism
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope --durations=25 $(PYTEST_ARGS)

# The fast loop: unit and component tests, without whole pipelines (marker
# e2e) or multi-process clusters (marker multiprocess); pyproject.toml
# documents the markers. Under 4 minutes here (docs/development.md).
test-fast: setup fashion-mnist
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope -m "not e2e and not multiprocess" $(PYTEST_ARGS)

# Beam's Prism runner, for the tests that run every Beam stage on a portable runner
# (testkit/prism.py): built once per machine from the Go module proxy into the cache the
# current stack's root also sees (a few minutes on 2 cores). v2.77.0: at v2.73.0 a
# Transform's sharded write failed in one of two runs here, its file sink's
# initialisation side input read empty (Beam issue 36563); without Go the tests skip.
PRISM_VERSION := v2.77.0
PRISM_DIR := $(or $(TFXKIT_STACK_CACHE),$(HOME)/.cache/tfxkit)/prism/$(PRISM_VERSION)
prism:
	@test -x $(PRISM_DIR)/prism || { \
		if command -v go >/dev/null; then \
			echo "building Beam's Prism runner $(PRISM_VERSION) into $(PRISM_DIR)"; \
			GOBIN=$(PRISM_DIR) GOFLAGS=-mod=mod go install github.com/apache/beam/sdks/v2/go/cmd/prism@$(PRISM_VERSION) \
				|| echo "could not build Prism; the tests that need it are skipped"; \
		else \
			echo "no Go toolchain: the tests that run Beam stages on Prism are skipped"; \
		fi; }

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
	set -e; for b in $(BENCHES); do echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py; done

# Every committed result's headline, with its commit, date and machine, and
# whether the product or the benchmark changed since (stale); runs nothing.
bench-report: setup
	$(PY) -m testkit.results

# Format check, then lint: both gate CI (.ci/run) before the tests.
LINT_PATHS := components pipelines testkit tests benchmarks
lint: setup
	$(RUFF) format --check $(LINT_PATHS)
	$(RUFF) check $(LINT_PATHS)

format: setup
	$(RUFF) format $(LINT_PATHS)
	$(RUFF) check --fix $(LINT_PATHS)

# Re-resolve the stack's lock: 1.16 for Python 3.11 on manylinux x86-64 from
# requirements.in; current for the Debian 13 root's Python 3.13 and glibc 2.41.
lock: setup
ifeq ($(STACK),current)
	.ci/stack-root.sh run uv pip compile -q --python-version 3.13 --python-platform x86_64-manylinux_2_39 \
		requirements-current.in -o requirements-current.lock
else
	$(BIN)/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
		requirements.in -o requirements.lock
endif

clean:
	rm -rf $(VENV) runs .pytest_cache
