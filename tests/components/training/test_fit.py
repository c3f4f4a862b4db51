"""The Trainer under strategies: equivalence, accumulation, crash recovery, chief export.

Data: the 334 real Palmer penguins rows through the real TFT
`preprocessing_fn` (see `penguins.py`), one train file, no shuffling and a
deterministic element order, so every strategy sees the same examples in
each global batch. The reference is single-device training in this process;
strategies that need logical CPU devices or a cluster run in subprocesses
(`worker.py`) with free ports, bounded waits, and are always killed.

Equivalence tolerance: weights after 6 Adam steps agree within `ATOL`
(observed differences are ~1e-7: float summation order of the all-reduce).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest
import tensorflow as tf
import tf_keras as keras

from components.config import ConfigError, payload
from components.config.payload import CONFIG_KEY
from components.trainer import run_fn
from components.training import cluster, strategies, task
from components.training import fit as training
from components.training.cluster import parse_tf_config
from components.training.models import accumulate_gradients
from tests.components.training import penguins
from tests.conftest import closed_address

ATOL = 1e-5
# Bound on every wait for a subprocess (import + train + export on 2 busy cores).
PROCESS_TIMEOUT_S = 300
# Worker processes see no GPU: the strategies under test here place replicas
# on logical CPU devices, and the expectations (devices, equal weights) are
# the CPU's on every host.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


# --------------------------------------------------------------------------- #
# Fixtures and helpers
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def penguin_data(tmp_path_factory, penguin_inputs):
    root = str(tmp_path_factory.mktemp("penguins"))
    return penguins.penguins_config(), penguin_inputs, root


def inputs_for(penguin_data, name, config) -> training.TrainingInputs:
    _, data, root = penguin_data
    return training.TrainingInputs(**penguins.inputs_for(data, root, name, config))


def as_task(config):
    """A trainer's task on one CPU device (`one_device`) around `config`."""
    return task.Task("Trainer", one_device(), payload.Payload(config=config))


def one_device():
    """One device, pinned to the CPU.

    The equivalence tests compare against subprocesses that train on logical
    CPU devices (`CPU_ONLY`); on a host with a GPU the default device would
    be the GPU, whose float math (TF32 matmuls among it) differs by more
    than `ATOL`.
    """
    choice = strategies.create_strategy(penguins.penguins_config().strategy, environ={})
    return dataclasses.replace(
        choice, strategy=tf.distribute.OneDeviceStrategy("/cpu:0"), devices=("/cpu:0",)
    )


@pytest.fixture(scope="module")
def reference(penguin_data):
    """Single-device training at the global batch of 32: weights, eval results, export."""
    config = penguin_data[0]
    inputs = inputs_for(penguin_data, "reference", config)
    model, results = run_fn.run(as_task(config), inputs)
    return {
        "weights": penguins.layer_weights(model),
        "results": results,
        "inputs": inputs,
        "model": model,
    }


def teacher_builder(config, penguin_data):
    """The teacher exactly as `run_fn` builds it, for runs that need no export."""
    import tensorflow_transform as tft

    def build_and_compile():
        tft_output = tft.TFTransformOutput(penguin_data[1].transform_output)
        model = training.build_model(config, tft_output, config.teacher, "teacher")
        training.compile_classifier(model, config)
        return model

    return build_and_compile


def assert_same_weights(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, atol=ATOL, err_msg=name)


def start_worker(jobs, root, name, env=None, log=None, unset=()) -> tuple[subprocess.Popen, str]:
    """Starts `worker.py` on `jobs`; `env` is added to this process's environment, `unset` removed."""
    result = os.path.join(root, f"{name}.result.json")
    spec = penguins.write_spec(
        os.path.join(root, f"{name}.spec.json"), {"jobs": jobs, "result": result}
    )
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.components.training.worker", spec],
        cwd=REPO_ROOT,
        env={**inherited, **CPU_ONLY, **(env or {})},
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    return process, result


def wait_all(processes, timeout=PROCESS_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    for p in processes:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))


def kill_all(processes) -> None:
    for p in processes:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


def run_jobs(jobs, root, name) -> list[dict]:
    """Runs `jobs` in one fresh process and returns their results."""
    with open(os.path.join(root, f"{name}.log"), "w") as log:
        process, result = start_worker(jobs, root, name, log=log)
        try:
            wait_all([process])
        finally:
            kill_all([process])
    assert process.returncode == 0, open(os.path.join(root, f"{name}.log")).read()[-3000:]
    with open(result) as f:
        return json.load(f)


def serve(serving_dir, n=5):
    model = tf.saved_model.load(serving_dir)
    examples = penguins.raw_examples(penguins.read_rows()[:n])
    return {
        k: v.numpy()
        for k, v in model.signatures["serving_default"](examples=tf.constant(examples)).items()
    }


def assert_serves(serving_dir):
    out = serve(serving_dir)
    assert out["probabilities"].shape == (5, 3) and out["probabilities"].dtype == np.float32
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, rtol=1e-5)


def saved_models_under(root) -> list[str]:
    return sorted(d for d, _, files in os.walk(root) if "saved_model.pb" in files)


# --------------------------------------------------------------------------- #
# Mirrored / central storage over 2 logical CPU devices (one fresh process)
# --------------------------------------------------------------------------- #

MIRRORED = {"kind": "mirrored", "num_cpu_devices": 2}


@pytest.fixture(scope="module")
def mirrored_runs(penguin_data):
    config, data, root = penguin_data
    variants = {
        "probe_auto": (
            penguins.with_sections(config, strategy={"kind": "auto", "num_cpu_devices": 2}),
            "probe",
        ),
        "mirrored": (penguins.with_sections(config, strategy=MIRRORED), "run"),
        "mirrored_accum": (
            penguins.with_sections(
                config,
                strategy=MIRRORED,
                train={"grad_accum_steps": 2},
                ingestion={"batch_size": 16},
            ),
            "run",
        ),
        "central_storage": (
            penguins.with_sections(
                config, strategy={"kind": "central_storage", "num_cpu_devices": 2}
            ),
            "run",
        ),
        "odd_batch": (
            penguins.with_sections(config, strategy=MIRRORED, ingestion={"batch_size": 33}),
            "run",
        ),
    }
    jobs = [
        {
            "kind": kind,
            "config": cfg.to_json(),
            "inputs": penguins.inputs_for(data, root, name, cfg),
            "weights": os.path.join(root, f"{name}.npz"),
        }
        for name, (cfg, kind) in variants.items()
    ]
    results = dict(zip(variants, run_jobs(jobs, root, "mirrored"), strict=True))
    for name, result in results.items():
        result["job"] = next(j for j in jobs if j["weights"].endswith(f"{name}.npz"))
    return results


@pytest.mark.multiprocess
def test_mirrored_over_two_logical_cpus_matches_single_device(mirrored_runs, reference):
    run = mirrored_runs["mirrored"]
    assert "error" not in run, run.get("traceback")
    assert (run["kind"], run["class"], run["replicas"]) == ("mirrored", "MirroredStrategy", 2)
    assert run["devices"] == ["/cpu:0", "/cpu:1"]
    assert run["iterations"] == 6
    assert_same_weights(dict(np.load(run["job"]["weights"])), reference["weights"])
    # Metrics are aggregated across replicas: the same numbers as one device.
    for key in ("loss", "accuracy"):
        assert run["results"][key] == pytest.approx(reference["results"][key], abs=1e-5)
    assert_serves(run["job"]["inputs"]["serving_model_dir"])


@pytest.mark.multiprocess
def test_central_storage_matches_single_device(mirrored_runs, reference):
    run = mirrored_runs["central_storage"]
    assert "error" not in run, run.get("traceback")
    assert (run["class"], run["replicas"]) == ("CentralStorageStrategy", 2)
    assert_same_weights(dict(np.load(run["job"]["weights"])), reference["weights"])


@pytest.mark.multiprocess
def test_auto_with_several_logical_cpus_is_mirrored(mirrored_runs):
    probe = mirrored_runs["probe_auto"]
    assert (probe["kind"], probe["replicas"], probe["class"]) == ("mirrored", 2, "MirroredStrategy")


@pytest.mark.multiprocess
def test_gradient_accumulation_under_mirrored_matches_one_big_batch(mirrored_runs, reference):
    run = mirrored_runs["mirrored_accum"]
    assert "error" not in run, run.get("traceback")
    assert run["iterations"] == 6  # optimizer updates, each over 2 micro-batches of 16
    assert_same_weights(dict(np.load(run["job"]["weights"])), reference["weights"])


@pytest.mark.multiprocess
def test_batch_not_divisible_by_replicas_fails_before_training(mirrored_runs):
    run = mirrored_runs["odd_batch"]
    assert run["error"].startswith(
        "StrategyError: ingestion.batch_size: 33 does not split evenly over the 2 replicas in sync of strategy 'mirrored'; "
        "use a multiple of 2 (e.g. 34)"
    )
    assert not os.path.exists(run["job"]["inputs"]["model_run_dir"])


# --------------------------------------------------------------------------- #
# Gradient accumulation, mixed precision, bad input (this process, one device)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_gradient_accumulation_single_device_matches_one_big_batch(
    penguin_data, reference, micro_batches
):
    config = penguins.with_sections(
        penguin_data[0],
        train={"grad_accum_steps": micro_batches},
        ingestion={"batch_size": 32 // micro_batches},
    )
    model, _ = training.fit(
        config,
        inputs_for(penguin_data, f"accum{micro_batches}", config),
        teacher_builder(config, penguin_data),
        choice=one_device(),
    )
    assert int(model.optimizer.iterations.numpy()) == 6
    assert_same_weights(penguins.layer_weights(model), reference["weights"])


def test_mixed_bfloat16_keeps_logits_float32_and_serves(penguin_data):
    config = penguins.with_sections(penguin_data[0], train={"mixed_precision": "mixed_bfloat16"})
    inputs = inputs_for(penguin_data, "bf16", config)
    model, results = run_fn.run(as_task(config), inputs)
    assert model.get_layer("hidden_0").compute_dtype == "bfloat16"
    assert model.get_layer("logits").compute_dtype == "float32"
    assert all(v.dtype == tf.float32 for v in model.trainable_weights)
    assert np.isfinite(results["loss"])
    # The policy is scoped to training: later layers (the export's) are float32.
    assert keras.mixed_precision.global_policy().name == "float32"
    assert_serves(inputs.serving_model_dir)


def test_mixed_float16_scales_the_loss_also_when_accumulating(penguin_data):
    config = penguins.with_sections(
        penguin_data[0],
        train={"mixed_precision": "mixed_float16", "grad_accum_steps": 2},
        ingestion={"batch_size": 16},
    )
    model, results = training.fit(
        config,
        inputs_for(penguin_data, "fp16", config),
        teacher_builder(config, penguin_data),
        choice=one_device(),
    )
    assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert model.get_layer("hidden_0").compute_dtype == "float16"
    assert int(model.optimizer.iterations.numpy()) == 6
    assert np.isfinite(results["loss"])
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_accumulation_steps_below_one_fail_before_reading_data(penguin_data):
    config = penguin_data[0]
    # Validated when the config is built, so no Trainer ever sees the value.
    with pytest.raises(ConfigError, match=r"^train\.grad_accum_steps: expected an integer >= 1"):
        dataclasses.replace(config.train, grad_accum_steps=0)


def test_accumulation_needs_a_model_that_supports_it(penguin_data):
    config = penguins.with_sections(
        penguin_data[0], train={"grad_accum_steps": 2}, ingestion={"batch_size": 16}
    )

    def plain_model():
        inputs = keras.Input((1,), name="culmen_length_mm_xf")
        model = keras.Model(inputs, keras.layers.Dense(3)(inputs), name="plain")
        model.compile(
            optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        return model

    with pytest.raises(
        ConfigError,
        match=r"^train\.grad_accum_steps: model 'plain' \(Functional\) cannot accumulate",
    ):
        training.fit(
            config, inputs_for(penguin_data, "plain", config), plain_model, choice=one_device()
        )


def test_accumulate_gradients_equals_the_big_batch_gradient():
    """The helper custom train_steps use: N stacked micro-batches = one batch N times larger."""
    rng = np.random.RandomState(0)
    x, y = rng.normal(size=(12, 3)).astype("float32"), rng.normal(size=(12, 1)).astype("float32")
    layer = keras.layers.Dense(1)
    layer.build((None, 3))

    def loss_fn(batch):
        features, targets = batch
        return tf.reduce_mean(tf.square(layer(features) - targets))

    with tf.GradientTape() as tape:
        big = loss_fn((x, y))
    expected = tape.gradient(big, layer.trainable_variables)
    stacked = (tf.reshape(x, (4, 3, 3)), tf.reshape(y, (4, 3, 1)))
    accumulated = tf.function(
        lambda data: accumulate_gradients(loss_fn, data, layer.trainable_variables, 4)
    )(stacked)
    for a, e in zip(accumulated, expected, strict=True):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)


def choice_in(cluster_: dict, task_type: str, index: int = 0, kind: str = "multi_worker_mirrored"):
    """A trainer's strategy choice in a cluster (no strategy: only its place matters)."""
    tf_config = parse_tf_config(
        json.dumps({"cluster": cluster_, "task": {"type": task_type, "index": index}})
    )
    return strategies.StrategyChoice(
        kind=kind,
        role=strategies.ROLE_TRAINER,
        reason="",
        strategy=None,
        tf_config=tf_config,
        coordinator=object() if kind == "parameter_server" else None,
    )


def test_a_lost_worker_is_reraised_naming_it_and_the_backup_training_resumes_from():
    lost = closed_address()
    choice = choice_in({"worker": [closed_address(), lost]}, "worker", 0)
    heartbeat = (
        "Graph execution error:\n\nCollective ops is aborted by: Error reported from /job:worker/task:1: "
        "Task /job:worker/replica:0/task:1 heartbeat timeout. This indicates that the remote task has failed"
    )
    with pytest.raises(cluster.PeerLost) as raised:
        with training.naming_lost_peers(choice, "/backups/b1"):
            raise tf.errors.UnavailableError(None, None, heartbeat)
    assert str(raised.value) == (
        f"Trainer: worker:0 of the multi_worker_mirrored cluster lost worker:1 ({lost}) "
        "(UnavailableError: Collective ops is aborted by: Error reported from /job:worker/task:1: "
        "Task /job:worker/replica:0/task:1 heartbeat timeout. This indicates that the remote task has "
        "failed); the whole group restarts (kubeflow.max_restarts) and resumes from the last backup "
        "in /backups/b1"
    )
    assert isinstance(raised.value.__cause__, tf.errors.UnavailableError)


def test_a_lost_parameter_server_is_named_and_a_stuck_collective_said_so(listening):
    ps = closed_address()
    choice = choice_in(
        {"chief": [closed_address()], "worker": [listening], "ps": [ps]},
        "chief",
        kind="parameter_server",
    )
    with pytest.raises(cluster.PeerLost, match=rf"lost ps:0 \({ps}\) .*the parameter server's"):
        with training.naming_lost_peers(choice, "/backups/b2"):
            raise tf.errors.UnavailableError(
                None, None, "Failed copying input tensor to /job:ps/replica:0/task:0/device:CPU:0"
            )
    # Every peer answers, nothing named: a collective timed out on a stuck peer.
    stuck = choice_in({"worker": [listening, closed_address()]}, "worker", 1)
    with pytest.raises(cluster.PeerLost, match=r"a collective timed out .*one is alive but stuck"):
        with training.naming_lost_peers(stuck, "/backups/b3"):
            raise tf.errors.DeadlineExceededError(None, None, "Collective has timed out")


def test_errors_of_a_single_process_are_not_about_peers():
    with pytest.raises(tf.errors.UnavailableError):
        with training.naming_lost_peers(one_device(), "/backups/b4"):
            raise tf.errors.UnavailableError(None, None, "no cluster")


def test_run_fn_without_tfxkit_config_fails(penguin_data):
    from tfx.components.trainer.fn_args_utils import FnArgs

    with pytest.raises(ValueError, match="custom_config carries no tfxkit config"):
        run_fn.run_fn(FnArgs(custom_config={}))


# --------------------------------------------------------------------------- #
# Multi-worker: two real worker processes
# --------------------------------------------------------------------------- #


@pytest.mark.multiprocess
def test_two_worker_processes_match_single_device_and_only_the_chief_exports(
    penguin_data, reference
):
    config, data, root = penguin_data
    config = penguins.with_sections(
        config, strategy={"kind": "multi_worker_mirrored", "workers": 2}
    )
    inputs = penguins.inputs_for(data, root, "multi_worker", config)
    cluster = {"worker": [f"localhost:{portpicker.pick_unused_port()}" for _ in range(2)]}
    processes, logs = [], []
    try:
        for index in range(2):
            logs.append(open(os.path.join(root, f"multi_worker{index}.log"), "w"))
            env = {
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}}
                )
            }
            # The TFX entry point, exactly as each TFJob replica's executor calls it.
            job = {"kind": "run_fn", "config": config.to_json(), "inputs": inputs}
            processes.append(
                start_worker([job], root, f"multi_worker{index}", env=env, log=logs[-1])[0]
            )
        wait_all(processes)
    finally:
        kill_all(processes)
        for log in logs:
            log.close()
    for index, p in enumerate(processes):
        assert p.returncode == 0, open(os.path.join(root, f"multi_worker{index}.log")).read()[
            -3000:
        ]
    chief_log = open(os.path.join(root, "multi_worker0.log")).read()
    assert "Strategy: multi_worker_mirrored (2 replica(s)" in chief_log and "chief yes" in chief_log
    assert "chief no" in open(os.path.join(root, "multi_worker1.log")).read()
    # Exactly one serving model (the chief's, in the artifact); the other
    # worker's task-specific copy and every backup are gone.
    run_root = os.path.dirname(inputs["serving_model_dir"])
    assert saved_models_under(run_root) == [inputs["serving_model_dir"]]
    assert os.listdir(inputs["model_run_dir"]) == []
    exported = keras.models.load_model(inputs["serving_model_dir"])
    assert_same_weights(penguins.layer_weights(exported), reference["weights"])
    assert_serves(inputs["serving_model_dir"])


# --------------------------------------------------------------------------- #
# TrainJob replicas: two worker processes with only a JobSet pod's environment
# --------------------------------------------------------------------------- #

# Generous: two processes import TensorFlow and TFX and train on 2 shared cores.
JOBSET_TIMEOUT_S = 900


def wait_until_done_or_failed(processes, timeout) -> list[int]:
    """Waits for every process, stopping early when one fails; returns the indices still running.

    A worker whose peer died would otherwise wait in collective setup until
    `timeout`; the caller kills what is left and reports every log.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in processes]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            break
        time.sleep(0.5)
    return [i for i, p in enumerate(processes) if p.poll() is None]


def read_tail(path, chars=4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError as e:
        return f"<no log: {e}>"


def read_results(path) -> list[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


@pytest.mark.multiprocess
def test_trainjob_replicas_derive_tf_config_from_the_jobset_env_and_train_alike(
    penguin_data, reference
):
    """Replicas started as a TrainJob starts them (JobSet env, no TF_CONFIG) train as TFJob's do."""
    from components.kubernetes import env as kenv

    config, data, root = penguin_data
    config = penguins.with_sections(
        config, strategy={"kind": "multi_worker_mirrored", "workers": 2}
    )
    inputs = penguins.inputs_for(data, root, "jobset", config)
    jobset, pod_port = "penguins-trainer-3f2a", 2222
    ports = [portpicker.pick_unused_port() for _ in range(2)]
    # The pods' DNS names (`<jobset>-node-0-<index>.<jobset>`) -> free local ports.
    aliases = {
        f"{jobset}-node-0-{i}.{jobset}:{pod_port}": f"127.0.0.1:{port}"
        for i, port in enumerate(ports)
    }
    names = [f"jobset_worker{i}" for i in range(2)]
    logs = [os.path.join(root, f"{name}.log") for name in names]
    processes, results, still_running = [], [], []
    try:
        for index, name in enumerate(names):
            # What the runtime's downward API and the Trainer step give a pod, and nothing else.
            env = {
                kenv.JOBSET_NAME: jobset,
                kenv.REPLICATED_JOB: "node",
                kenv.JOB_INDEX: "0",
                kenv.COMPLETION_INDEX: str(index),
                kenv.REPLICAS: kenv.format_replicas({"node": 2}),
                kenv.TF_PORT: str(pod_port),
                kenv.HOST_ALIASES: json.dumps(aliases),
            }
            jobs = [
                {"kind": "tf_config"},
                {
                    "kind": "run",
                    "config": config.to_json(),
                    "inputs": inputs,
                    "weights": os.path.join(root, f"{name}.npz"),
                },
            ]
            with open(logs[index], "w") as log:
                process, result = start_worker(
                    jobs,
                    root,
                    name,
                    env=env,
                    log=log,
                    unset=(
                        "TF_CONFIG",
                        kenv.ORCHESTRATOR,
                        kenv.TFJOB_INVOCATION,
                        kenv.RUNTIME_PODS,
                    ),
                )
            processes.append(process)
            results.append(result)
        still_running = wait_until_done_or_failed(processes, JOBSET_TIMEOUT_S)
    finally:
        kill_all(processes)
    outcome = [read_results(r) for r in results]
    killed = f" (killed: still running after {JOBSET_TIMEOUT_S}s)"
    report = "\n".join(
        f"--- worker {i}: exit {p.returncode}{killed if i in still_running else ''}, "
        f"results {json.dumps(outcome[i])[:3000]}\n{read_tail(logs[i])}"
        for i, p in enumerate(processes)
    )
    assert not still_running and all(p.returncode == 0 for p in processes), report
    assert all(len(o) == 2 for o in outcome), report
    expected_cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    for index, (derived, trained) in enumerate(outcome):
        assert derived["tf_config"] == {
            "cluster": expected_cluster,
            "task": {"type": "worker", "index": index},
        }, report
        assert "error" not in trained, report
        assert (trained["kind"], trained["class"], trained["replicas"]) == (
            "multi_worker_mirrored",
            tf.distribute.MultiWorkerMirroredStrategy.__name__,
            2,
        ), report
        assert trained["is_chief"] == (index == 0), report
        assert trained["iterations"] == config.train.train_steps, report
    # The two replicas share one all-reduced model, the one single-device training gets.
    weights = [dict(np.load(os.path.join(root, f"{name}.npz"))) for name in names]
    assert_same_weights(weights[1], weights[0])
    assert_same_weights(weights[0], reference["weights"])
    # Only the chief exported; the other replica's copy and the backups are gone.
    assert saved_models_under(os.path.dirname(inputs["serving_model_dir"])) == [
        inputs["serving_model_dir"]
    ], report
    assert os.listdir(inputs["model_run_dir"]) == [], report


# --------------------------------------------------------------------------- #
# Parameter server: 1 ps (its own process, the real run_fn) + 2 workers + coordinator
# --------------------------------------------------------------------------- #


@pytest.mark.multiprocess
def test_parameter_server_cluster_trains_and_the_chief_export_serves(penguin_data):
    config, data, root = penguin_data
    config = penguins.with_sections(
        config,
        strategy={
            "kind": "parameter_server",
            "workers": 2,
            "parameter_servers": 1,
            "steps_per_execution": 2,
        },
    )
    inputs = penguins.inputs_for(data, root, "parameter_server", config)
    cluster = {
        "chief": [f"localhost:{portpicker.pick_unused_port()}"],
        "worker": [f"localhost:{portpicker.pick_unused_port()}" for _ in range(2)],
        "ps": [f"localhost:{portpicker.pick_unused_port()}"],
    }

    def task(task_type, index=0):
        return {"cluster": cluster, "task": {"type": task_type, "index": index}}

    processes = []
    ps_log = open(os.path.join(root, "ps.log"), "w")
    chief_log = open(os.path.join(root, "ps_chief.log"), "w")
    try:
        # The ps task runs the Trainer's run_fn unchanged: it serves until killed.
        ps_job = {"kind": "run_fn", "config": config.to_json(), "inputs": inputs}
        processes.append(
            start_worker(
                [ps_job], root, "ps_task", env={"TF_CONFIG": json.dumps(task("ps"))}, log=ps_log
            )[0]
        )
        # The workers' servers share the coordinator's process (in-process
        # servers: fewer interpreters on two cores); then the chief trains.
        jobs = [
            {"kind": "ps_servers", "tf_configs": [task("worker", 0), task("worker", 1)]},
            {
                "kind": "run",
                "config": config.to_json(),
                "inputs": inputs,
                "weights": os.path.join(root, "ps.npz"),
                "env": {"TF_CONFIG": json.dumps(task("chief"))},
            },
        ]
        chief, result = start_worker(jobs, root, "ps_chief", log=chief_log)
        processes.append(chief)
        wait_all([chief])
        assert processes[0].poll() is None, "the ps task stopped serving"
    finally:
        kill_all(processes)
        ps_log.close()
        chief_log.close()
    assert chief.returncode == 0, open(os.path.join(root, "ps_chief.log")).read()[-3000:]
    run = json.load(open(result))[1]
    assert "error" not in run, run.get("traceback")
    assert (run["kind"], run["class"], run["is_chief"]) == (
        "parameter_server",
        "ParameterServerStrategyV2",
        True,
    )
    assert run["iterations"] == 6
    assert "serving as ps:0" in open(os.path.join(root, "ps.log")).read()
    assert saved_models_under(os.path.dirname(inputs["serving_model_dir"])) == [
        inputs["serving_model_dir"]
    ]
    assert_serves(inputs["serving_model_dir"])


# --------------------------------------------------------------------------- #
# Fault tolerance: SIGKILL after the first backup, then run again
# --------------------------------------------------------------------------- #


class StepProbe(keras.callbacks.Callback):
    """Records the optimizer step training starts from and the steps it runs."""

    def __init__(self):
        super().__init__()
        self.start_step, self.steps_run = None, 0

    def on_train_begin(self, logs=None):
        self.start_step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        self.steps_run += 1


@pytest.mark.multiprocess
def test_killed_trainer_resumes_from_its_backup_and_exports(penguin_data):
    config, data, root = penguin_data
    config = penguins.with_sections(
        config, train={"train_steps": 400, "steps_per_epoch": 50, "checkpoint_every_steps": 10}
    )
    inputs = penguins.inputs_for(data, root, "killed", config)
    from tfx.components.trainer.fn_args_utils import FnArgs

    # Where the Trainer's run_fn keeps the backup: keyed by its inputs, so a
    # re-executed Trainer (new model_run_dir) with the same inputs finds it.
    again = training.TrainingInputs.from_fn_args(
        FnArgs(**inputs, custom_config={CONFIG_KEY: config.to_json()}), config
    )
    backup = again.backup_dir
    assert not backup.startswith(inputs["model_run_dir"])
    job = {"kind": "run_fn", "config": config.to_json(), "inputs": inputs}
    with open(os.path.join(root, "killed.log"), "w") as log:
        victim, _ = start_worker([job], root, "killed", log=log)
        try:
            deadline = time.monotonic() + PROCESS_TIMEOUT_S
            while tf.train.latest_checkpoint(os.path.join(backup, "chief")) is None:
                assert victim.poll() is None, "the trainer ended before its first backup"
                assert time.monotonic() < deadline, "no backup within the time bound"
                time.sleep(0.05)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
        finally:
            kill_all([victim])
    assert victim.returncode == -signal.SIGKILL
    assert not os.path.exists(inputs["serving_model_dir"])

    probe = StepProbe()
    # A new execution: a fresh model_run_dir, the same inputs.
    again = dataclasses.replace(again, model_run_dir=again.model_run_dir + "-rerun")
    model, _ = run_fn.run(as_task(config), again, callbacks=[probe])
    assert probe.start_step >= 10, "the re-run started from step 0 instead of the backup"
    assert probe.start_step < 400
    assert probe.steps_run == 400 - probe.start_step
    assert int(model.optimizer.iterations.numpy()) == 400
    assert_serves(inputs["serving_model_dir"])
    assert not os.path.exists(backup), "the backup must be removed after a successful export"


def test_run_fn_reads_tf_config_from_the_environment_and_evaluator_does_nothing(
    penguin_data, monkeypatch, tmp_path, caplog
):
    from tfx.components.trainer.fn_args_utils import FnArgs

    config, data, root = penguin_data
    inputs = penguins.inputs_for(data, str(tmp_path), "evaluator", config)
    cluster = {"worker": ["localhost:2001", "localhost:2002"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 0}})
    )
    auto = penguins.with_sections(config, strategy={"kind": "auto"})
    with caplog.at_level(logging.INFO, logger="absl"):
        run_fn.run_fn(FnArgs(**inputs, custom_config={CONFIG_KEY: auto.to_json()}))
    # The task resolved as the evaluator: a return for any other reason fails here.
    assert "Trainer: evaluator task" in caplog.text
    assert not os.path.exists(inputs["serving_model_dir"]) and not os.path.exists(
        inputs["model_run_dir"]
    )


def test_cosine_schedule_warms_up_then_decays_to_zero_at_the_last_step(digits_config):
    steps, warmup, peak = 100, 10, 0.004
    train = dataclasses.replace(
        digits_config.train, learning_rate=peak, lr_schedule="cosine", warmup_steps=warmup
    )
    schedule = training.learning_rate(dataclasses.replace(digits_config, train=train), steps)
    rate = {
        step: float(schedule(step))
        for step in (0, warmup // 2, warmup, (steps + warmup) // 2, steps)
    }
    assert rate[0] == pytest.approx(0.0, abs=1e-9)
    assert rate[warmup // 2] == pytest.approx(peak / 2, rel=1e-5)
    assert rate[warmup] == pytest.approx(peak, rel=1e-5)
    # Half-way through the decay the cosine is at half its height.
    assert rate[(steps + warmup) // 2] == pytest.approx(peak / 2, rel=1e-5)
    assert rate[steps] == pytest.approx(0.0, abs=1e-9)
    assert training.learning_rate(digits_config, steps) == digits_config.train.learning_rate


def test_warmup_without_cosine_or_as_long_as_training_is_refused(digits_config):
    with pytest.raises(
        ConfigError, match=r"train\.warmup_steps: warm-up belongs to the 'cosine' schedule"
    ):
        dataclasses.replace(digits_config.train, warmup_steps=5)
    with pytest.raises(
        ConfigError, match=r"train\.warmup_steps: expected fewer warm-up steps than train_steps"
    ):
        dataclasses.replace(
            digits_config.train, lr_schedule="cosine", warmup_steps=digits_config.train.train_steps
        )
