"""The served-model gate end to end: a run that does not match the model its pipeline
serves is not pushed, and says why; a better one is."""

from __future__ import annotations

import dataclasses
import io
import os

import pytest

from pipelines import local_runner
from testkit.tiny import tiny

# The first run learns slowly, so the config's own learning rate (0.002) beats
# it by a margin that run-to-run noise on 307 eval examples cannot close (at
# 2e-4 the two once tied at 276 of 307).
FIRST_LEARNING_RATE = 5e-5
# A learning rate at which 20 steps leave the network about where it started
# (chance: 1 in 10 digits), far below what the first run served.
NO_LEARNING_RATE = 1e-7


def _digits_alone(digits_config, **train):
    """Tiny digits without distillation (one Trainer, the candidate), served gate on at
    threshold 0: each run must match the model its pipeline serves."""
    config = tiny(digits_config, **train)
    return dataclasses.replace(
        config,
        distillation=dataclasses.replace(config.distillation, enabled=False),
        evaluation=dataclasses.replace(config.evaluation, change_threshold=0.0),
    )


def _versions(output, config):
    serving = local_runner.paths_for(config, output).serving_dir
    return sorted(os.listdir(serving)) if os.path.isdir(serving) else []


@pytest.mark.e2e
def test_a_worse_model_is_not_pushed_and_a_better_one_is(tmp_path, digits_config):
    output = str(tmp_path)
    first_config = _digits_alone(digits_config, learning_rate=FIRST_LEARNING_RATE)
    first = local_runner.run(first_config, output, stream=io.StringIO())
    # First run: nothing served yet (the Resolver resolves nothing), so TFX's
    # Evaluator drops the change threshold and min_accuracy alone decides.
    assert first["pushed_model"], first
    assert first["gates"]["Evaluator"]["baseline_accuracy"] is None, first["gates"]
    served_accuracy = first["metrics"]["accuracy"]

    console = io.StringIO()
    worse = local_runner.run(
        _digits_alone(digits_config, learning_rate=NO_LEARNING_RATE), output, stream=console
    )
    assert worse["status"] == "succeeded" and worse["pushed_model"] is None, worse
    assert worse["blessed"] is False
    gate = worse["gates"]["Evaluator"]
    assert gate["against"] == "served" and gate["baseline_accuracy"] == pytest.approx(
        served_accuracy
    )
    expected = (
        f"accuracy {gate['accuracy']:.4f} is below the served model's {served_accuracy:.4f} "
        "(evaluation.change_threshold 0.0)"
    )
    assert worse["not_pushed"] == expected
    assert f"Not pushed: {expected}" in console.getvalue().splitlines()
    assert len(_versions(output, first_config)) == 1

    better = local_runner.run(_digits_alone(digits_config), output, stream=io.StringIO())
    assert better["pushed_model"], better
    assert better["gates"]["Evaluator"]["baseline_accuracy"] == pytest.approx(served_accuracy)
    assert better["metrics"]["accuracy"] > served_accuracy
    assert len(_versions(output, first_config)) == 2
