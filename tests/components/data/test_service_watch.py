"""`service.watching_workers`: a training whose tf.data service workers are all lost fails
within `ingestion.service.worker_wait_seconds`, and one whose worker is replaced in time
trains on. Real processes: TensorFlow's dispatcher and workers on loopback
(`testkit.data_service.LocalService`: free ports, bounded starts, stopped on every path),
the penguins Trainer training in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tf_keras as keras

from components.data import service
from components.training import fit as training
from components.training import strategies
from testkit.data_service import LocalService
from testkit.local_cluster import teacher_builder
from tests.components.training import penguins

pytestmark = pytest.mark.multiprocess

# The step after which the test kills the worker: training has read from it.
KILL_AFTER_STEPS = 5
# Bound on the failure after the kill, beyond worker_wait_seconds: the
# trainer draining what it had buffered, the watch's poll and probes, the
# cancelled step returning (2 busy cores).
FAIL_SLACK_S = 30
# Bound on the training process of the first test (import, trace, fail; 2 busy cores).
CHILD_TIMEOUT_S = 240
# Bound on a replacement worker's start (it imports TensorFlow on 2 busy cores).
REPLACEMENT_START_S = 120


def _served(config, address: str, wait_seconds: int, train_steps: int):
    # cache none: training reads every step from the service (a cache would
    # leave the workers idle after the first pass).
    service = {"dispatcher": address, "compression": "none", "worker_wait_seconds": wait_seconds}
    return penguins.with_sections(
        config,
        ingestion={"deterministic": False, "cache": "none", "service": service},
        train={"train_steps": train_steps, "steps_per_epoch": 50},
    )


class _AfterSteps(keras.callbacks.Callback):
    """Calls `action` once, after `steps` training steps (counted across epochs)."""

    def __init__(self, steps: int, action):
        super().__init__()
        self._left = steps
        self._action = action
        self.at = None

    def on_train_batch_end(self, batch, logs=None):
        self._left -= 1
        if self._left == 0:
            self.at = time.monotonic()
            self._action()


def _fit(config, penguin_inputs, root: str, callback):
    inputs = training.TrainingInputs(**penguins.inputs_for(penguin_inputs, root, "run", config))
    choice = strategies.create_strategy(config.strategy, environ={})
    return training.fit(
        config, inputs, teacher_builder(config, inputs), choice=choice, callbacks=[callback]
    )


# The training of the first test, in a process of its own: a failed watch ends
# its process (see `service.watching_workers`). It kills the worker's process
# group after `KILL_AFTER_STEPS` steps, then prints what training raised.
LOST_CHILD = """
import json, os, signal, sys, time
from components.config import PipelineConfig
from components.training import fit as training, strategies
from testkit.local_cluster import teacher_builder
from tests.components.data.test_service_watch import KILL_AFTER_STEPS, _AfterSteps
job = json.loads(sys.argv[1])
config = PipelineConfig.from_json(job["config"])
inputs = training.TrainingInputs(**job["inputs"])
choice = strategies.create_strategy(config.strategy, environ={})
kill = _AfterSteps(KILL_AFTER_STEPS, lambda: os.killpg(job["worker_pid"], signal.SIGKILL))
try:
    training.fit(config, inputs, teacher_builder(config, inputs), choice=choice, callbacks=[kill])
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e),
                      "cause": type(e.__cause__).__name__, "after_kill": time.monotonic() - kill.at}),
          flush=True)
    raise
"""


def test_training_whose_workers_are_all_lost_fails_naming_the_dispatcher(tmp_path, penguin_inputs):
    wait = 5
    with LocalService(str(tmp_path / "service"), workers=1) as local:
        # More steps than the run can make before the bound: it can only fail.
        config = _served(penguins.penguins_config(), local.address, wait, train_steps=1_000_000)
        job = {
            "config": config.to_json(),
            "inputs": penguins.inputs_for(penguin_inputs, str(tmp_path), "run", config),
            "worker_pid": local.workers[0].pid,
        }
        done = subprocess.run(
            [sys.executable, "-c", LOST_CHILD, json.dumps(job)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        )
    assert done.returncode == service.WATCH_EXIT_STATUS, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The blocked step was cancelled: training raised, naming the dispatcher and the field.
    assert (result["error"], result["cause"]) == ("IngestionError", "CancelledError")
    assert wait <= result["after_kill"] < wait + FAIL_SLACK_S
    expected = (
        f"ingestion.service.worker_wait_seconds: Trainer: every tf.data service worker of the "
        f"dispatcher at grpc://{local.address} is lost (0 of 1 registered worker(s) answer "
        f"({local.workers[0].address}), 1 answered before) and training has waited {wait} s"
    )
    assert result["message"].startswith(expected)
    assert (
        f"python -m components.data.service worker --dispatcher {local.address}"
        in (result["message"])
    )
    # Said on stderr too, and the process ended instead of hanging on the lost worker.
    assert expected in done.stderr
    assert "ending the process (exit status 1) without destroying the input iterator" in (
        done.stderr
    )


def test_a_worker_replaced_within_the_bound_lets_training_finish(tmp_path, penguin_inputs):
    listening: list[float] = []

    def replace():
        local.workers[0].kill()

        # Started beside the trainer, which meanwhile drains its buffers and waits.
        def start():
            local.add_worker()
            listening.append(time.monotonic())

        threading.Thread(target=start, daemon=True).start()

    with LocalService(str(tmp_path / "service"), workers=1) as local:
        # A bound the replacement's start fits in, and steps that need it after the kill.
        config = _served(penguins.penguins_config(), local.address, 90, train_steps=150)
        kill = _AfterSteps(KILL_AFTER_STEPS, replace)
        _, results = _fit(config, penguin_inputs, str(tmp_path), kill)
        ended = time.monotonic()
        assert len(local.workers) == 2 and listening, "the replacement worker did not start"
    # Training went on after the replacement listened: it read from it.
    assert kill.at < listening[0] < ended
    assert np.isfinite(results["loss"])
    # The watch ended with the training.
    assert not any(t.name == "tfdata-worker-watch" for t in threading.enumerate())


# A user's run_fn under the drop-in Trainer's executor, in a process of its own:
# it reads fn_args.data_accessor through the service and kills the worker mid-fit
# (tests/components/trainer/service_user_module.py).
USER_RUN_FN_CHILD = """
import json, os, shutil, sys
from tfx.types import standard_artifacts
from components.trainer import executor
from testkit.artifacts import local_artifact, trainer_artifacts
job = json.loads(sys.argv[1])
inputs, outputs = trainer_artifacts(job["root"])
(examples,) = inputs["examples"]
for split in ("train", "eval"):
    os.makedirs(os.path.join(examples.uri, f"Split-{split}"))
    for path in job[f"{split}_files"]:
        shutil.copy(path, os.path.join(examples.uri, f"Split-{split}"))
graph = local_artifact(standard_artifacts.TransformGraph, job["root"], "graph")
shutil.copytree(job["transform_output"], graph.uri, dirs_exist_ok=True)
inputs["transform_graph"] = [graph]
try:
    executor.Executor().Do(inputs, outputs, job["exec_properties"])
except Exception as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
    raise
"""


def test_a_user_run_fn_reading_the_service_whose_workers_are_lost_fails_naming_the_dispatcher(
    tmp_path, penguin_inputs
):
    from components.config import IngestionConfig, ServiceConfig, StrategyConfig, payload
    from components.config.dropin import DropInSettings

    wait = 5
    with LocalService(str(tmp_path / "service"), workers=1) as local:
        served = ServiceConfig(
            dispatcher=local.address, compression="none", worker_wait_seconds=wait
        )
        settings = DropInSettings(
            strategy=StrategyConfig(kind="one_device"),
            ingestion=IngestionConfig(cache="none", deterministic=False, service=served),
        )
        job = {
            "root": str(tmp_path / "run"),
            "train_files": list(penguin_inputs.train_files),
            "eval_files": list(penguin_inputs.eval_files),
            "transform_output": penguin_inputs.transform_output,
            "exec_properties": {
                "custom_config": json.dumps(payload.encode({}, settings=settings)),
                # More steps than the run can make before the bound: it can only fail.
                "train_args": '{"num_steps": 1000000, "splits": ["train"]}',
                "eval_args": '{"num_steps": 1, "splits": ["eval"]}',
                "run_fn": "tests.components.trainer.service_user_module.run_fn",
            },
        }
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", USER_RUN_FN_CHILD, json.dumps(job)],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            env={
                **os.environ,
                "CUDA_VISIBLE_DEVICES": "",
                "KILL_PGID": str(local.workers[0].pid),
            },
        )
        took = time.monotonic() - started
    assert done.returncode == service.WATCH_EXIT_STATUS, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] == "IngestionError", result
    assert result["message"].startswith(
        f"ingestion.service.worker_wait_seconds: Trainer: every tf.data service worker of the "
        f"dispatcher at grpc://{local.address} is lost"
    )
    assert took < CHILD_TIMEOUT_S
    assert "ending the process (exit status 1) without destroying the input iterator" in (
        done.stderr
    )
