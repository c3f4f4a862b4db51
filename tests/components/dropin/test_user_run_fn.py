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


def _start(workdir, strategy: dict) -> subprocess.Popen:
    os.makedirs(workdir, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": ROOT,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "CUDA_VISIBLE_DEVICES": "",
    }
    env.pop("TF_CONFIG", None)
    with open(os.path.join(workdir, "stderr.log"), "w") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.components.dropin.run_trainer",
                str(workdir),
                json.dumps(strategy),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            # A file, not a pipe: a full pipe would stall one run while the test waits on the other.
            stderr=log,
        )


def _train_side_by_side(runs: dict) -> dict:
    """Trains each `name: (workdir, strategy)` in its own process, all at once."""
    procs = {
        name: (workdir, _start(workdir, strategy)) for name, (workdir, strategy) in runs.items()
    }
    try:
        out = {}
        for name, (workdir, proc) in procs.items():
            proc.wait(timeout=TIMEOUT_S)
            with open(os.path.join(workdir, "stderr.log")) as f:
                assert proc.returncode == 0, f"{name}: {f.read()[-4000:]}"
            assert os.path.isdir(os.path.join(workdir, "model", "Format-Serving"))
            with open(os.path.join(workdir, "model_run", "ran_under.json")) as f:
                out[name] = json.load(f)
        return out
    finally:
        for _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)


@pytest.mark.multiprocess
def test_mirrored_user_run_fn_matches_one_device_at_the_same_global_batch(tmp_path):
    runs = _train_side_by_side(
        {
            "one": (tmp_path / "one", {"kind": "one_device"}),
            "mirrored": (tmp_path / "mirrored", {"kind": "mirrored", "num_cpu_devices": 2}),
        }
    )
    one, mirrored = runs["one"], runs["mirrored"]
    # The run_fn ran inside the configured strategy's scope, with tf_keras.
    assert (one["strategy"], one["replicas"]) == ("OneDeviceStrategy", 1)
    assert (mirrored["strategy"], mirrored["replicas"]) == ("MirroredStrategy", 2)
    assert one["keras"].startswith("tf_keras") and mirrored["keras"].startswith("tf_keras")
    for a, b in zip(one["weights"], mirrored["weights"], strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)
    # Training moved the weights: the comparison is not of two initialisations.
    assert not np.allclose(np.array(one["weights"][1]), 0.0)
