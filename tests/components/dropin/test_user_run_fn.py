"""A stock user run_fn under the tfxkit Trainer: strategy scope, same weights as one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# Generous bound for a loaded 2-core machine; a hang fails instead of blocking the suite.
TIMEOUT_S = 300


def _run(workdir, strategy: dict, *flags: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
    }
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.components.dropin.run_trainer",
            str(workdir),
            json.dumps(strategy),
            *flags,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return result


def _train(workdir, strategy: dict) -> dict:
    result = _run(workdir, strategy)
    assert result.returncode == 0, result.stderr[-4000:]
    assert os.path.isdir(os.path.join(workdir, "model", "Format-Serving"))
    with open(os.path.join(workdir, "model_run", "ran_under.json")) as f:
        return json.load(f)


@pytest.mark.multiprocess
def test_mirrored_user_run_fn_matches_one_device_at_the_same_global_batch(tmp_path):
    one = _train(tmp_path / "one", {"kind": "one_device"})
    mirrored = _train(tmp_path / "mirrored", {"kind": "mirrored", "num_cpu_devices": 2})
    # The run_fn ran inside the configured strategy's scope, with tf_keras.
    assert (one["strategy"], one["replicas"]) == ("OneDeviceStrategy", 1)
    assert (mirrored["strategy"], mirrored["replicas"]) == ("MirroredStrategy", 2)
    assert one["keras"].startswith("tf_keras") and mirrored["keras"].startswith("tf_keras")
    for a, b in zip(one["weights"], mirrored["weights"], strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)
    # Training moved the weights: the comparison is not of two initialisations.
    assert not np.allclose(np.array(one["weights"][1]), 0.0)


def test_user_run_fn_without_step_counts_fails_naming_train_args(tmp_path):
    # No train_args: fn_args.train_steps is None and the run_fn's
    # fit(steps_per_epoch=fn_args.train_steps) gets the repeating dataset with
    # no step count. Stock TFX fails at once (Keras refuses an INFINITE dataset
    # without steps); this used to train forever. The subprocess timeout bounds it.
    result = _run(tmp_path, {"kind": "one_device"}, "--no-steps")
    assert result.returncode != 0
    assert (
        "train_args.num_steps / eval_args.num_steps: not set, so fn_args.train_steps"
        in result.stderr
    ), result.stderr[-4000:]
    assert "infinite" in result.stderr
    assert not os.path.isdir(os.path.join(tmp_path, "model", "Format-Serving"))
