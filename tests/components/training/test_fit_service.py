"""The Trainer fed by a tf.data service of real processes (TensorFlow's dispatcher and a
worker on loopback), one device in this process, mirrored over two logical CPUs in a
fresh one, and clusters of processes (`testkit/local_cluster.py`, free
loopback ports): two multi-worker-mirrored workers reading one service job, and a
parameter-server job whose workers read it through the coordinator's per-worker datasets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft

from components.data import codes, layout, service
from components.training import fit as training
from components.training import peers, strategies
from components.training.inputs import make_datasets
from testkit import local_cluster
from testkit.data_service import LocalService
from testkit.local_cluster import teacher_builder
from tests.components.training import penguins

pytestmark = pytest.mark.multiprocess
# Bound on the mirrored run's process (import + train on 2 busy cores).
CHILD_TIMEOUT_S = 600
# Bounds on a cluster's tasks (2 busy cores): a server task listening, and a
# run (runtime start, tracing, 6 steps, evaluation) ending.
SERVE_TIMEOUT_S = 120
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def setup(tmp_path_factory, penguin_inputs):
    root = str(tmp_path_factory.mktemp("penguins_service"))
    config, data = penguins.penguins_config(), penguin_inputs
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
    builder = teacher_builder(served, inputs)
    _, results = training.fit(served, inputs, builder, choice=choice)
    assert np.isfinite(results["loss"]) and results["accuracy"] > 0.5


def _with_codebooks(data: penguins.Materialized, directory: str) -> penguins.Materialized:
    """The penguins inputs with the layout record a tfxkit Transform writes for them
    (their z-scored measurements take under 256 values each: every one gets a codebook)."""
    graph = os.path.join(directory, "transform_graph")
    shutil.copytree(data.transform_output, graph)
    spec = tft.TFTransformOutput(graph).transformed_feature_spec()
    books = {
        name: np.empty(0, np.float32)
        for name, s in spec.items()
        if s.dtype == tf.float32 and isinstance(s, tf.io.FixedLenFeature)
    }
    files = []
    for split, paths in (("train", data.train_files), ("eval", data.eval_files)):
        for path in paths:
            for batch in tf.data.TFRecordDataset(path, "GZIP").batch(64):
                parsed = tf.io.parse_example(batch, spec)
                books = {k: codes.add(b, parsed[k].numpy()) for k, b in books.items()}
            files.append(layout.ShardFile(path, split, layout.scan_shard(path, "gzip")))
    record = layout.Layout(
        compression="gzip",
        num_shards=1,
        packing=None,
        parse_spec=layout.spec_to_json(spec),
        files=tuple(files),
        codebooks={k: tuple(b.tolist()) for k, b in books.items() if b is not None},
    )
    layout.write_layout(graph, record)
    return dataclasses.replace(data, transform_output=graph)


def test_features_with_codebooks_train_from_the_service_as_codes(setup, tmp_path, caplog):
    """Sent as codes, decoded in the training step: the model trains as on values."""
    config, data, root, local = setup
    data = _with_codebooks(data, str(tmp_path))
    books = layout.read_layout(data.transform_output).codebooks
    assert len(books) >= len(penguins.FLOAT_FEATURES)
    service = {"dispatcher": local.address, "compression": "none", "codes": "on"}
    served = penguins.with_sections(
        config, ingestion={"cache": "none", "deterministic": False, "service": service}
    )
    inputs = training.TrainingInputs(**penguins.inputs_for(data, str(tmp_path), "coded", served))
    tft_output = tft.TFTransformOutput(data.transform_output)
    with caplog.at_level(logging.INFO, logger="absl"):
        coded, _ = make_datasets(served, inputs, tft_output, decoding_step=True)
    # Its own job: a values reader of the run (the Distiller's check) never joins it.
    assert "-train-codes, distributed_epoch)" in caplog.text
    assert {k for k, s in coded.element_spec[0].items() if s.dtype == tf.uint8} == set(books)
    # A consumer that does not decode gets values.
    values, _ = make_datasets(served, inputs, tft_output)
    assert all(s.dtype != tf.uint8 for s in values.element_spec[0].values())
    choice = strategies.create_strategy(served.strategy, environ={})
    with caplog.at_level(logging.INFO, logger="absl"):
        _, results = training.fit(served, inputs, teacher_builder(served, inputs), choice=choice)
    assert "as one-byte codes" in caplog.text
    assert np.isfinite(results["loss"]) and results["accuracy"] > 0.5


MIRRORED_CHILD = """
import json, sys
from components.config import PipelineConfig
from testkit.local_cluster import teacher_builder
from components.training import fit as training, strategies
job = json.loads(sys.argv[1])
config = PipelineConfig.from_json(job["config"])
choice = strategies.create_strategy(config.strategy, environ={})
inputs = training.TrainingInputs(**job["inputs"])
_, results = training.fit(config, inputs, teacher_builder(config, inputs), choice=choice)
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


# --------------------------------------------------------------------------- #
# Clusters of processes: multi-worker mirrored and parameter server
# --------------------------------------------------------------------------- #

# `service.distribute`'s log line, one per dataset it sends through the service.
_ON_SERVICE = re.compile(
    r"ingestion: .* runs on the tf\.data service at (\S+) \(job (\S+), (\w+)\)"
)
# The dispatcher's lines naming a consumer (a reading input pipeline) of an
# iteration (one run of a job): TensorFlow 2.16 logs no job names, even at
# TF_CPP_MIN_LOG_LEVEL=0 (and VLOG 1); these are its AutoScaler's warnings, one
# per consumer released (and sometimes one per reported processing time).
_CONSUMER = re.compile(
    r"consumer (?:with )?ID (\d+) (?:for|to) Iteration (\d+)|Iteration (\d+) and consumer ID (\d+)"
)
# How long the dispatcher may take to log the consumers' release after the run.
DISPATCHER_LOG_TIMEOUT_S = 30
# TensorFlow 2.21's dispatcher (the current stack) logs no such lines in these
# runs, so there the shared iteration goes unwitnessed: both readers' job names
# are still checked, and training through the service still has to finish.
DISPATCHER_LOGS_CONSUMERS = tf.__version__.startswith("2.16.")
# `training.fit`'s last line: the evaluation after training.
_EVAL = re.compile(r"Trainer: eval after training: \{'loss': ([^,]+),")


@pytest.fixture(scope="module")
def launcher(setup):
    """Forks the cluster tasks; leaving it kills every one (one process group)."""
    root = setup[2]
    with local_cluster.Launcher(os.path.join(root, "tasks")) as launcher:
        yield launcher


def _job(config, inputs, cluster, task_type, index):
    """A cluster task that trains without exporting (`local_cluster.run_task`)."""
    return {
        "env": {"TF_CONFIG": local_cluster.tf_config(cluster, task_type, index)},
        "config": config.to_json(),
        "inputs": inputs,
        "export": False,
    }


def _until_done_or_failed(tasks, timeout) -> list[str]:
    """Waits (bounded) until every task exited or one failed; the names of those still running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [t.poll() for t in tasks]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            break
        time.sleep(0.2)
    return [t.name for t in tasks if t.poll() is None]


def _report(tasks, local, still_running=()) -> str:
    parts = [
        f"--- {t.name}: exit {t.poll()}{' (still running: killed)' if t.name in still_running else ''}, "
        f"result {t.result()}\n{t.tail()}"
        for t in tasks
    ]
    parts.append(f"--- dispatcher\n{local.dispatcher.tail()}")
    return "\n".join(parts)


def _log(task) -> str:
    return task.tail(10**7)


def _eval_loss(task) -> float:
    found = _EVAL.findall(_log(task))
    assert found, f"{task.name}: no evaluation after training\n{task.tail()}"
    return float(found[-1])


def _service_jobs(task) -> set[tuple[str, str, str]]:
    """(dispatcher, job, processing mode) of every dataset `task` sent through the service."""
    return set(_ON_SERVICE.findall(_log(task)))


def _iterations(log: str) -> dict[str, set[str]]:
    """Iteration -> its consumers, from dispatcher log text."""
    found: dict[str, set[str]] = {}
    for consumer, iteration, iteration2, consumer2 in _CONSUMER.findall(log):
        found.setdefault(iteration or iteration2, set()).add(consumer or consumer2)
    return found


def _shared_iterations(local, readers: int) -> dict[str, set[str]]:
    """The iterations the dispatcher logged, once one of them named `readers` consumers.

    It logs a consumer when the consumer's iterator is released, which may
    come just after the task that read it exited: waited for (bounded).
    """

    def logged():
        return _iterations(local.dispatcher.log())

    if not DISPATCHER_LOGS_CONSUMERS:
        return logged()
    with contextlib.suppress(TimeoutError):
        local_cluster.wait_for(
            lambda: any(len(c) >= readers for c in logged().values()),
            DISPATCHER_LOG_TIMEOUT_S,
            f"the dispatcher to log an iteration of {readers} consumers",
            every=0.2,
        )
    return logged()


def _assert_one_job_read_by(iterations: dict[str, set[str]], readers: int, report: str) -> None:
    """The first iteration had every reader as a consumer, and no iteration more
    (where the dispatcher logs consumers: `DISPATCHER_LOGS_CONSUMERS`).

    Input pipelines that each read a job of their own would each start an
    iteration. A job has one iteration per pass over the data where the
    pipeline repeats after the service, one for the run where the service's
    workers repeat it: later passes may end before every reader joined.
    """
    if not DISPATCHER_LOGS_CONSUMERS:
        return
    assert iterations, report
    first = iterations[min(iterations, key=int)]
    assert len(first) == readers, f"{iterations}\n{report}"
    assert all(len(c) <= readers for c in iterations.values()), f"{iterations}\n{report}"


def test_multi_worker_mirrored_workers_train_from_one_service_job(setup, launcher):
    config, data, root, _ = setup
    # A service of its own, whose dispatcher log is about this run alone; two
    # service workers, between which the job's files are handed out too.
    with LocalService(os.path.join(root, "mwms_servers"), workers=2) as local, launcher.scope():
        # Picked once the service's servers listen: each binds an OS-assigned port,
        # which could otherwise be one picked here before its task bound it.
        cluster = local_cluster.free_cluster(2)
        served = _on_service(config, local, kind="multi_worker_mirrored", workers=2)
        inputs = penguins.inputs_for(data, root, "mwms_service", served)
        workers = [
            launcher.start(f"mwms_service.worker{i}", _job(served, inputs, cluster, "worker", i))
            for i in range(2)
        ]
        still_running = _until_done_or_failed(workers, RUN_TIMEOUT_S)
        report = _report(workers, local, still_running)
        assert not still_running and all(w.poll() == 0 for w in workers), report
        # The dispatcher's log: both workers' input pipelines read one job.
        iterations = _shared_iterations(local, 2)
    for worker in workers:
        result = worker.result()
        assert "error" not in result and result["iterations"] == served.train.train_steps, report
        assert np.isfinite(_eval_loss(worker)), report
    # Both workers derived one job name from the run, and read that one job.
    expected = service.job_name(served.ingestion.service, inputs["model_run_dir"], "train")
    address = f"grpc://{local.address}"
    assert (
        _service_jobs(workers[0])
        == _service_jobs(workers[1])
        == {(address, expected, "distributed_epoch")}
    ), report
    _assert_one_job_read_by(iterations, 2, report)


def test_parameter_server_workers_train_from_the_service(setup, launcher):
    config, data, root, _ = setup
    servers = [("ps", 0), ("worker", 0), ("worker", 1)]
    with LocalService(os.path.join(root, "ps_servers"), workers=1) as local, launcher.scope():
        # After the service listens, as in the multi-worker test above.
        cluster = local_cluster.free_cluster(2, ps=1, chief=True)
        served = _on_service(config, local, kind="parameter_server", workers=2, parameter_servers=1)
        inputs = penguins.inputs_for(data, root, "ps_service", served)
        tasks = [
            launcher.start(f"ps_service.{t}{i}", _job(served, inputs, cluster, t, i))
            for t, i in servers
        ]
        try:
            for (task_type, index), task in zip(servers, tasks, strict=True):
                local_cluster.wait_for(
                    lambda a=cluster[task_type][index], t=task: (
                        peers.reachable(a, 0.5) or t.poll() is not None
                    ),
                    SERVE_TIMEOUT_S,
                    f"{task_type}:{index} to serve",
                )
        except TimeoutError as e:
            pytest.fail(f"{e}\n{_report(tasks, local)}")
        assert all(t.poll() is None for t in tasks), _report(tasks, local)
        chief = launcher.start("ps_service.chief0", _job(served, inputs, cluster, "chief", 0))
        tasks.append(chief)
        still_running = _until_done_or_failed([chief], RUN_TIMEOUT_S)
        report = _report(tasks, local, still_running)
        assert not still_running and chief.poll() == 0, report
        # The servers serve until killed (leaving the scope).
        assert all(t.poll() is None for t in tasks[:-1]), report
        # The coordinator built the dataset (checks) but read nothing: the two
        # workers' per-worker datasets are the consumers of the job.
        iterations = _shared_iterations(local, 2)
    result = chief.result()
    assert result["is_chief"] and result["iterations"] == served.train.train_steps, report
    assert np.isfinite(_eval_loss(chief)), report
    expected = service.job_name(served.ingestion.service, inputs["model_run_dir"], "train")
    assert _service_jobs(chief) == {(f"grpc://{local.address}", expected, "distributed_epoch")}, (
        report
    )
    _assert_one_job_read_by(iterations, 2, report)
