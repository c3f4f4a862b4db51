"""TFX's own example pipelines with the two-import swap, end to end through BeamDagRunner.

The penguin Keras and taxi native-Keras pipelines are taken from the tfx
wheel as they are, with only their `Transform` / `Trainer` imports changed
(and tiny step counts); every component must run, the model must be pushed,
and its serving signatures must be those the stock Trainer's model has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from components.layout import read_layout
from tests.components.dropin import tfx_examples

TRAIN_STEPS = 5


def _executed(root: str) -> set[str]:
    """Components that wrote outputs (an execution directory per output)."""
    pipeline_root = os.path.join(root, "pipeline_root")
    return set(os.listdir(pipeline_root))


def _run(example, workdir, data_root, swapped):
    """Runs the example in a child process (`run_example`); returns `(root, signatures)`."""
    root = str(workdir / ("swapped" if swapped else "stock"))
    spec = {
        "example": example.name,
        "code_dir": str(workdir / "code"),
        "root": root,
        "data_root": data_root,
        "swapped": swapped,
        "train_steps": TRAIN_STEPS,
        "result": str(workdir / f"{'swapped' if swapped else 'stock'}.result.json"),
    }
    spec_path = str(workdir / f"{'swapped' if swapped else 'stock'}.spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    run = subprocess.run(
        [sys.executable, "-m", "tests.components.dropin.run_example", spec_path],
        cwd=tfx_examples.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert run.returncode == 0, (
        f"the example run failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    )
    with open(spec["result"]) as f:
        result = json.load(f)
    # Resolvers write no outputs; every other node of the example's own DAG must have run.
    nodes = {n for n in result["nodes"] if "resolver" not in n}
    assert {"Transform", "Trainer", "Pusher"} <= nodes
    assert nodes <= _executed(root), f"not executed: {sorted(nodes - _executed(root))}"
    return root, result["signatures"]


@pytest.fixture
def penguin_data(tmp_path):
    if not os.path.isfile(tfx_examples.PENGUIN_CSV):
        pytest.skip(f"penguin data missing: {os.path.normpath(tfx_examples.PENGUIN_CSV)}")
    return tfx_examples.penguin_data_root(str(tmp_path))


def _check_swapped_run(root: str) -> None:
    pushed = tfx_examples.pushed_models(root)
    assert len(pushed) == 1, "the swapped pipeline pushed no model"
    graph_root = os.path.join(root, "pipeline_root", "Transform", "transform_graph")
    (graph,) = [os.path.join(graph_root, d) for d in os.listdir(graph_root)]
    # The tfxkit Transform wrote its ingestion-ready layout for the user's preprocessing_fn.
    assert read_layout(graph) is not None


# TFX's penguin run_fn creates its own MirroredStrategy. With several GPUs
# visible, strategy.kind auto picks mirrored, and a strategy cannot be created
# inside another one's scope: the Trainer refuses that run naming
# strategy.kind (README, "Bring your own pipeline").
@pytest.mark.skipif(
    len(tf.config.list_physical_devices("GPU")) > 1,
    reason="the penguin run_fn builds its own MirroredStrategy; with several GPUs auto picks "
    "mirrored, which the drop-in Trainer refuses to nest (run with CUDA_VISIBLE_DEVICES=0)",
)
@pytest.mark.multiprocess
@pytest.mark.e2e
def test_penguin_keras_example_swapped_pushes_a_model_with_the_stock_signature(
    tmp_path, penguin_data
):
    _, stock_signatures = _run(tfx_examples.PENGUIN, tmp_path, penguin_data, swapped=False)
    swapped, swapped_signatures = _run(tfx_examples.PENGUIN, tmp_path, penguin_data, swapped=True)
    _check_swapped_run(swapped)
    (stock_sigs,) = stock_signatures.values()
    (swapped_sigs,) = swapped_signatures.values()
    assert swapped_sigs == stock_sigs


@pytest.mark.multiprocess
@pytest.mark.e2e
def test_taxi_native_keras_example_swapped_pushes_a_model_with_the_stock_signature(tmp_path):
    swapped, signatures = _run(tfx_examples.TAXI, tmp_path, tfx_examples.TAXI_DATA, swapped=True)
    _check_swapped_run(swapped)
    (sigs,) = signatures.values()
    # The stock module's signatures (taxi_utils_native_keras.run_fn): raw tf.Examples in,
    # the probability out, and the transform signature for TFMA (as JSON lists).
    assert sigs["serving_default"] == [
        [["examples", ["string", [None]]]],
        [["outputs", ["float32", [None, 1]]]],
    ]
    assert "transform_features" in sigs
