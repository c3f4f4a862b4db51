"""Shared fixtures: shipped configs and small variants of them, pipeline runs built once
per test run; the shuffled-order option and the order pytest-xdist workers get."""

from __future__ import annotations

import dataclasses
import fcntl
import gzip
import json
import os
import random
import shutil
import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import pytest

from components.config import PipelineConfig
from pipelines.configs import load_config
from testkit.tiny import tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "tests", "data")


def data_file(*parts: str) -> str:
    """A file the repository ships for tests (`tests/data/`, see its README)."""
    path = os.path.join(DATA, *parts)
    if not os.path.exists(path):
        raise FileNotFoundError(f"test data missing from the repository: {path}")
    return path


def closed_address() -> str:
    """A loopback address nothing listens on: a cluster task that is gone."""
    import portpicker

    return f"127.0.0.1:{portpicker.pick_unused_port()}"


@pytest.fixture
def listening():
    """A loopback address that accepts connections: a cluster task that is up."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


SHUFFLE_ENV = "TFXKIT_TEST_SHUFFLE_SEED"
T = TypeVar("T")


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle-seed",
        type=int,
        default=None,
        help=f"run the tests in a shuffled order, reproducible from this seed: modules in a "
        f"random order, the tests of each module in a random order (module fixtures are built "
        f"once). Default: ${SHUFFLE_ENV}, else the file order.",
    )


def shuffle_seed(config) -> int | None:
    seed = config.getoption("--shuffle-seed")
    if seed is None and os.environ.get(SHUFFLE_ENV, "").strip():
        seed = int(os.environ[SHUFFLE_ENV])
    return seed


def shuffled_by_module(items: Sequence[T], seed: int, module_of: Callable[[T], str]) -> list[T]:
    """`items` in a seeded random order that keeps each module's items together."""
    rng = random.Random(seed)
    by_module: dict[str, list[T]] = {}
    for item in items:
        by_module.setdefault(module_of(item), []).append(item)
    modules = sorted(by_module)
    rng.shuffle(modules)
    for module in modules:
        rng.shuffle(by_module[module])
    return [item for module in modules for item in by_module[module]]


def module_of(item) -> str:
    return item.nodeid.split("::", 1)[0]


# The modules that take longest (measured on two cores), longest first: under
# pytest-xdist they are handed out before the rest, so none of them starts
# last and leaves one worker running alone. Only the order depends on it.
LONGEST_MODULES = (
    "tests/pipelines/test_reliability_proceeds.py",
    "tests/components/dropin/test_tfx_examples_e2e.py",
    "tests/components/training/test_fit.py",
    "tests/pipelines/test_local_runner.py",
    "tests/pipelines/test_reliability_kills.py",
    "tests/components/dropin/test_user_run_fn.py",
    "tests/pipelines/test_reliability.py",
    "tests/pipelines/test_distillation_pipeline.py",
    "tests/components/training/test_faults.py",
    "tests/components/distiller/test_component.py",
    "tests/components/distiller/test_student_strategies.py",
    "tests/components/transform/test_executor.py",
    "tests/pipelines/test_fashion_mnist_pipeline.py",
    "tests/test_packaging.py",
    "tests/components/distillation/test_model.py",
    "tests/components/compat/test_legacy_keras.py",
)


def longest_first(items: Sequence[T], module_of: Callable[[T], str]) -> list[T]:
    """`items` with LONGEST_MODULES' items first, in that order; the rest keep theirs."""
    rank = {module: i for i, module in enumerate(LONGEST_MODULES)}
    return sorted(items, key=lambda item: rank.get(module_of(item), len(rank)))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    seed = shuffle_seed(config)
    if seed is not None:
        items[:] = shuffled_by_module(items, seed, module_of)
    elif hasattr(config, "workerinput"):  # a pytest-xdist worker
        items[:] = longest_first(items, module_of)


def pytest_configure(config):
    # Under pytest-xdist (`--dist loadscope`) the workers are handed whole
    # modules in the collection order (longest first, or the seeded order),
    # which xdist would otherwise re-sort by number of tests.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_report_header(config):
    seed = shuffle_seed(config)
    return None if seed is None else f"test order: shuffled, seed {seed} (--shuffle-seed {seed})"


@pytest.fixture(scope="session")
def taxi_config() -> PipelineConfig:
    return load_config("taxi")


@pytest.fixture(scope="session")
def digits_config() -> PipelineConfig:
    return load_config("digits")


def once_per_run(tmp_path_factory, name: str, build: Callable[[str], Any]) -> Any:
    """`build(directory)`, run once per test run whatever the number of workers.

    Under pytest-xdist every worker has its own session, so a session fixture
    would run once per worker. The workers of one run share the parent of
    their base temporary directories: the first to ask builds `<it>/<name>`
    under a lock while the others wait, then every one reads the result back.
    Without workers it is a directory of this session's base temporary
    directory. A failed build leaves no result, so the next asker tries again.

    Args:
      build: Fills the (empty) directory it is given; returns JSON data.

    Returns:
      `build`'s result, as read back from JSON, and the same in every worker.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    result_file = base / f"{name}.json"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result_file.exists():
            directory = base / name
            shutil.rmtree(directory, ignore_errors=True)  # an earlier attempt's leftovers
            directory.mkdir()
            result = build(str(directory))
            partial = base / f"{name}.json.partial"
            partial.write_text(json.dumps(result))
            os.replace(partial, result_file)
        return json.loads(result_file.read_text())


@pytest.fixture(scope="session")
def penguin_inputs(tmp_path_factory):
    """The penguins Trainer inputs (`testkit.penguins.materialize` of
    `penguins_config()`: real TFT output, train and eval files), written once
    per test run (see `once_per_run`). Read-only: a test writes under its own
    directory.

    Returns:
      `testkit.penguins.Materialized`.
    """
    from testkit import penguins

    data_file(os.path.basename(penguins.PENGUINS_CSV))

    def build(directory: str) -> dict:
        data = penguins.materialize(penguins.penguins_config(), os.path.join(directory, "data"))
        return dataclasses.asdict(data)

    fields = once_per_run(tmp_path_factory, "penguin_inputs", build)
    return penguins.Materialized(
        fields["transform_output"], tuple(fields["train_files"]), tuple(fields["eval_files"])
    )


def digits_distillation_config(digits_config: PipelineConfig) -> PipelineConfig:
    """Tiny digits, distilled from two teachers, with a gate the student cannot pass."""
    config = tiny(digits_config)
    return dataclasses.replace(
        config,
        distillation=dataclasses.replace(config.distillation, enabled=True, num_teachers=2),
        evaluation=dataclasses.replace(config.evaluation, min_accuracy=1.0),
    )


@pytest.fixture(scope="session")
def digits_distillation_run(tmp_path_factory, digits_config):
    """One tiny digits run with distillation from two teachers, shared by the
    distiller component tests and the gate tests (once per test run, see
    `once_per_run`): they read it and change nothing (a test that runs again
    does so on a copy).

    The student must reach accuracy 1.0 (`evaluation.min_accuracy`), which
    20 steps cannot, so this run is not blessed and pushes nothing.

    Returns:
      `(output_dir, config, summary)`.
    """
    from pipelines import local_runner

    config = digits_distillation_config(digits_config)

    def run(output: str) -> dict:
        return {"output": output, "summary": local_runner.run(config, output, runner="beam")}

    result = once_per_run(tmp_path_factory, "digits_distillation", run)
    return result["output"], config, result["summary"]


# Bound on one tiny pipeline run started as a child process.
CLI_RUN_TIMEOUT_SECONDS = 2400


@pytest.fixture(scope="session")
def tiny_taxi_run(tmp_path_factory, taxi_config):
    """The tiny taxi pipeline on the taxi CSV's first rows and the reliability
    catalogue's eight features (`reliability_cases.baseline_config`), started through the
    console script as a user starts it (`tfxkit run --config FILE --output DIR`),
    once per test run (see `once_per_run`): it pushed one model. The taxi tests
    of tests/pipelines/test_local_runner.py read it, and every reliability test
    (tests/pipelines/test_reliability*.py) starts from it. Nothing changes it:
    a test that runs again does so on its own copy.

    Returns:
      A mapping: `output` (the run's directory), `config` (`PipelineConfig`),
      `summary` (its summary.json), `stdout` and `stderr` (the console).
    """
    import subprocess
    import sys

    import yaml

    from components.config import to_dict
    from testkit.reliability_cases import baseline_config

    def run(work: str) -> dict:
        config = baseline_config(tiny(taxi_config), work)
        config_path = os.path.join(work, "tiny_taxi.yaml")
        with open(config_path, "w") as f:
            yaml.safe_dump(to_dict(config), f)
        out = os.path.join(work, "out")
        result = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "run", "--config", config_path]
            + ["--output", out],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": REPO},
            capture_output=True,
            text=True,
            timeout=CLI_RUN_TIMEOUT_SECONDS,
        )
        assert result.returncode == 0, result.stderr[-5000:]
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        assert summary["pushed_model"], summary
        return {
            "output": out,
            "config": config.to_json(),
            "summary": summary,
            "stdout": result.stdout,
            "stderr": result.stderr,
        }

    result = once_per_run(tmp_path_factory, "tiny_taxi_run", run)
    return {**result, "config": PipelineConfig.from_json(result["config"])}


@pytest.fixture(scope="session")
def reliability_baseline(tiny_taxi_run):
    """Where every reliability test starts: the tiny taxi run (`tiny_taxi_run`).

    Returns:
      `(output_dir, config)`.
    """
    return tiny_taxi_run["output"], tiny_taxi_run["config"]


def write_fashion_idx(directory, sizes=None, seed=0, learnable=False) -> dict:
    """Writes tiny Fashion-MNIST IDX files (gzip, the published format) into `directory`.

    Images are random noise; with `learnable`, dim noise with one bright band
    of rows whose place is the label's, so a model can learn them.

    Returns:
      split -> (images uint8 [n, 28, 28], labels uint8 [n]) as written.
    """
    from components.data import fashion_mnist

    sizes = sizes or {"train": 5, "eval": 3}
    rng = np.random.default_rng(seed)
    written = {}
    for split, (images_name, labels_name) in fashion_mnist.FILES.items():
        labels = (np.arange(sizes[split]) % 10).astype(np.uint8)
        if learnable:
            images = rng.integers(0, 64, size=(sizes[split], 28, 28), dtype=np.uint8)
            for image, label in zip(images, labels, strict=True):
                image[4 + 2 * label : 6 + 2 * label] = 255
        else:
            images = rng.integers(0, 256, size=(sizes[split], 28, 28), dtype=np.uint8)
        for name, array in ((images_name, images), (labels_name, labels)):
            header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            with gzip.open(os.path.join(directory, name), "wb") as f:
                f.write(header + array.tobytes())
        written[split] = (images, labels)
    return written


# Shipped configs the Kubeflow tests compile.
COMPILED_CONFIGS = ("taxi", "digits")


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """Shipped name -> (config, kfp component loaded from the compiled file, path),
    compiled once per test run (see `once_per_run`)."""
    from kfp import components as kfp_components

    from pipelines import kubeflow_runner

    def compile_all(directory: str) -> dict[str, str]:
        return {
            name: kubeflow_runner.compile_pipeline(
                load_config(name), os.path.join(directory, f"{name}.yaml")
            ).path
            for name in COMPILED_CONFIGS
        }

    paths = once_per_run(tmp_path_factory, "kfp", compile_all)
    return {
        name: (load_config(name), kfp_components.load_component_from_file(path), path)
        for name, path in paths.items()
    }


def needs_prism() -> tuple[str | None, list]:
    """Beam's Prism binary (`testkit.prism.location`) and the marks of a test module that
    runs pipelines on it: skipped without it, end to end, several processes."""
    from testkit.prism import location

    prism = location()
    skip = pytest.mark.skipif(
        prism is None, reason="Beam's Prism runner is not built: `make prism` (needs Go)"
    )
    return prism, [skip, pytest.mark.e2e, pytest.mark.multiprocess]
