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


def _train(workdir, strategy: dict) -> dict:
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
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
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
