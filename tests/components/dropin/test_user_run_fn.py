"""A stock user run_fn under the tfxkit Trainer: strategy scope, same weights as one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# Generous bound for a loaded 2-core machine (three runs at once here, next to
# another test worker); a hang fails instead of blocking the suite.
TIMEOUT_S = 900


def _start(workdir, strategy: dict, *flags: str) -> subprocess.Popen:
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
                *flags,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            # A file, not a pipe: a full pipe would stall one run while the test waits on another.
            stderr=log,
        )


class _Run:
    def __init__(self, workdir, strategy: dict, *flags: str):
        self.workdir = workdir
        self.proc = _start(workdir, strategy, *flags)

    def finish(self) -> tuple[int, str]:
        """Waits (bounded) for the run; returns its exit code and stderr."""
        try:
            self.proc.wait(timeout=TIMEOUT_S)
        finally:
            self.stop()
        with open(os.path.join(self.workdir, "stderr.log")) as f:
            return self.proc.returncode, f.read()

    def trained(self) -> dict:
        returncode, stderr = self.finish()
        assert returncode == 0, stderr[-4000:]
        assert os.path.isdir(os.path.join(self.workdir, "model", "Format-Serving"))
        with open(os.path.join(self.workdir, "model_run", "ran_under.json")) as f:
            return json.load(f)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """This module's Trainer runs, each in its own process, all started at once.

    Independent child processes: started together they take about half the
    wall time on two cores.
    """
    root = tmp_path_factory.mktemp("user_run_fn")
    started = {}
    try:
        for name, strategy, flags in (
            ("one", {"kind": "one_device"}, ()),
            ("mirrored", {"kind": "mirrored", "num_cpu_devices": 2}, ()),
            ("no_steps", {"kind": "one_device"}, ("--no-steps",)),
        ):
            started[name] = _Run(root / name, strategy, *flags)
        yield started
    finally:
        for run in started.values():
            run.stop()


@pytest.mark.multiprocess
def test_mirrored_user_run_fn_matches_one_device_at_the_same_global_batch(runs):
    one, mirrored = runs["one"].trained(), runs["mirrored"].trained()
    # The run_fn ran inside the configured strategy's scope, with tf_keras.
    assert (one["strategy"], one["replicas"]) == ("OneDeviceStrategy", 1)
    assert (mirrored["strategy"], mirrored["replicas"]) == ("MirroredStrategy", 2)
    assert one["keras"].startswith("tf_keras") and mirrored["keras"].startswith("tf_keras")
    for a, b in zip(one["weights"], mirrored["weights"], strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)
    # Training moved the weights: the comparison is not of two initialisations.
    assert not np.allclose(np.array(one["weights"][1]), 0.0)


@pytest.mark.multiprocess
def test_user_run_fn_without_step_counts_fails_naming_train_args(runs):
    # No train_args: fn_args.train_steps is None and the run_fn's
    # fit(steps_per_epoch=fn_args.train_steps) gets the repeating dataset with
    # no step count. Stock TFX fails at once (Keras refuses an INFINITE dataset
    # without steps); this used to train forever. The bounded wait bounds it.
    returncode, stderr = runs["no_steps"].finish()
    assert returncode != 0
    assert (
        "train_args.num_steps / eval_args.num_steps: not set, so fn_args.train_steps" in stderr
    ), stderr[-4000:]
    assert "infinite" in stderr
    assert not os.path.isdir(os.path.join(runs["no_steps"].workdir, "model", "Format-Serving"))
