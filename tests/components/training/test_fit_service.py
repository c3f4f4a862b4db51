"""The Trainer fed by a tf.data service of real processes (TensorFlow's dispatcher and a
worker on loopback), one device in this process and mirrored over two logical CPUs in a
fresh one, as `training.fit` runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft

from components.testing.data_service import LocalService
from components.training import fit as training
from components.training import strategies
from components.training.inputs import make_datasets
from tests.components.training import penguins
from tests.conftest import data_file

pytestmark = pytest.mark.multiprocess
# Bound on the mirrored run's process (import + train on 2 busy cores).
CHILD_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    data_file(os.path.basename(penguins.PENGUINS_CSV))
    root = str(tmp_path_factory.mktemp("penguins_service"))
    config = penguins.penguins_config()
    data = penguins.materialize(config, os.path.join(root, "data"))
    with LocalService(os.path.join(root, "service"), workers=1) as local:
        yield config, data, root, local


def _on_service(config, local, **strategy):
    service = {"dispatcher": local.address, "compression": "none"}
    sections = {"ingestion": {"deterministic": False, "service": service}}
    if strategy:
        sections["strategy"] = strategy
    return penguins.with_sections(config, **sections)


def _ops(dataset: tf.data.Dataset) -> set[str]:
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())
    return {node.op for node in graph.node}


def test_one_device_trains_from_the_service(setup):
    config, data, root, local = setup
    served = _on_service(config, local)
    inputs = training.TrainingInputs(**penguins.inputs_for(data, root, "one_device", served))
    tft_output = tft.TFTransformOutput(data.transform_output)
    train, evaluation = make_datasets(served, inputs, tft_output)
    # Training data comes from the service; evaluation data is read here.
    assert any(op.startswith("DataServiceDataset") for op in _ops(train))
    assert not any(op.startswith("DataServiceDataset") for op in _ops(evaluation))
    choice = strategies.create_strategy(served.strategy, environ={})

    def build_and_compile():
        model = training.build_model(served, tft_output, served.teacher, "teacher")
        training.compile_classifier(model, served)
        return model

    _, results = training.fit(served, inputs, build_and_compile, choice=choice)
    assert np.isfinite(results["loss"]) and results["accuracy"] > 0.5


MIRRORED_CHILD = """
import json, sys
import tensorflow_transform as tft
from components.config import PipelineConfig
from components.training import fit as training, strategies
job = json.loads(sys.argv[1])
config = PipelineConfig.from_json(job["config"])
choice = strategies.create_strategy(config.strategy, environ={})
inputs = training.TrainingInputs(**job["inputs"])
tft_output = tft.TFTransformOutput(inputs.transform_output)
def build_and_compile():
    model = training.build_model(config, tft_output, config.teacher, "teacher")
    training.compile_classifier(model, config)
    return model
_, results = training.fit(config, inputs, build_and_compile, choice=choice)
print(json.dumps({"replicas": choice.strategy.num_replicas_in_sync,
                  "loss": float(results["loss"]), "accuracy": float(results["accuracy"])}))
"""


def test_mirrored_over_two_cpus_trains_from_the_service(setup):
    config, data, root, local = setup
    served = _on_service(config, local, kind="mirrored", num_cpu_devices=2)
    job = {
        "config": served.to_json(),
        "inputs": penguins.inputs_for(data, root, "mirrored", served),
    }
    done = subprocess.run(
        [sys.executable, "-c", MIRRORED_CHILD, json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert np.isfinite(result["loss"]) and result["accuracy"] > 0.5
