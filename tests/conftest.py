"""Shared fixtures: shipped configs and small variants of them."""

from __future__ import annotations

import dataclasses
import gzip
import os
import struct

import numpy as np
import pytest

from components.config import PipelineConfig
from pipelines.configs import load_config

SHARED_DATA = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data"
)


@pytest.fixture(scope="session")
def taxi_config() -> PipelineConfig:
    return load_config("taxi")


@pytest.fixture(scope="session")
def digits_config() -> PipelineConfig:
    return load_config("digits")


def tiny(config: PipelineConfig, **train_overrides) -> PipelineConfig:
    """The same pipeline with step counts small enough for tests."""
    train = dataclasses.replace(
        config.train,
        train_steps=20,
        eval_steps=2,
        steps_per_epoch=10,
        checkpoint_every_steps=10,
        warmup_steps=min(config.train.warmup_steps, 5),
        **train_overrides,
    )
    # Thresholds any model passes: a tiny run tests the plumbing, not quality.
    evaluation = dataclasses.replace(config.evaluation, min_accuracy=0.0, max_accuracy_drop=1.0)
    # A patient student stays patient: twice the teacher's tiny step count.
    student_steps = 40 if config.distillation.student_train_steps else 0
    # The scratch baseline is one more Trainer per run: the tests that check
    # it turn it back on.
    distillation = dataclasses.replace(
        config.distillation, student_train_steps=student_steps, scratch_baseline=False
    )
    return dataclasses.replace(
        config, train=train, evaluation=evaluation, distillation=distillation
    )


@pytest.fixture(scope="session")
def digits_distillation_run(tmp_path_factory, digits_config):
    """One tiny digits run with distillation from two teachers, shared by the
    distiller component tests and the gate tests.

    The student must reach accuracy 1.0 (`evaluation.min_accuracy`), which
    20 steps cannot, so this run is not blessed and pushes nothing.

    Returns:
      `(output_dir, config, summary)`.
    """
    from pipelines import local_runner

    config = tiny(digits_config)
    config = dataclasses.replace(
        config,
        distillation=dataclasses.replace(config.distillation, enabled=True, num_teachers=2),
        evaluation=dataclasses.replace(config.evaluation, min_accuracy=1.0),
    )
    output = str(tmp_path_factory.mktemp("digits_distillation"))
    return output, config, local_runner.run(config, output, runner="beam")


def write_fashion_idx(directory, sizes=None, seed=0) -> dict:
    """Writes tiny Fashion-MNIST IDX files (gzip, the published format) into `directory`.

    Returns:
      split -> (images uint8 [n, 28, 28], labels uint8 [n]) as written.
    """
    from components import fashion_mnist

    sizes = sizes or {"train": 5, "eval": 3}
    rng = np.random.default_rng(seed)
    written = {}
    for split, (images_name, labels_name) in fashion_mnist.FILES.items():
        images = rng.integers(0, 256, size=(sizes[split], 28, 28), dtype=np.uint8)
        labels = (np.arange(sizes[split]) % 10).astype(np.uint8)
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
    """Shipped name -> (config, kfp component loaded from the compiled file, path), compiled once."""
    from kfp import components as kfp_components

    from pipelines import kubeflow_runner

    directory = tmp_path_factory.mktemp("kfp")
    out = {}
    for name in COMPILED_CONFIGS:
        config = load_config(name)
        path = kubeflow_runner.compile_pipeline(config, str(directory / f"{name}.yaml")).path
        out[name] = (config, kfp_components.load_component_from_file(path), path)
    return out
