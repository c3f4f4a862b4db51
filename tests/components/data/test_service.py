"""The input pipeline on a tf.data service of real processes: TensorFlow's dispatcher and
workers started as `python -m components.data.service` on loopback (free ports, bounded
starts, stopped on every path)."""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import logging
import os
import platform
import signal
import threading
import time

import numpy as np
import portpicker
import pytest
import tensorflow as tf

from components.config import IngestionConfig, ServiceConfig
from components.config.runtime import DISPATCHER_ENV
from components.data import codes, service
from components.data.layout import IngestionError
from pipelines.local_service import ServiceProcess, ServiceStartError
from testkit.data_service import LocalService
from tests.components.data.test_ingestion import BATCH, CONFIG, _rows, take_examples, write

pytestmark = pytest.mark.multiprocess

N = 301


def _config(address: str, **service_fields) -> IngestionConfig:
    return dataclasses.replace(
        CONFIG,
        deterministic=False,
        cache="none",
        service=ServiceConfig(dispatcher=address, compression="none", **service_fields),
    )


def _next_within(stream, seconds: float = 60):
    """`next(stream)` (its error raised here), or TimeoutError when the service does not
    answer in `seconds`."""
    out: list = []
    failed: list[BaseException] = []

    def read():
        try:
            out.append(next(stream))
        except Exception as e:  # re-raised in the caller's thread
            failed.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(seconds)
    if failed:
        raise failed[0]
    if not out:
        raise TimeoutError(f"no batch from the service within {seconds} s")
    return out[0]


def _uids(examples) -> collections.Counter:
    return collections.Counter(uid for (uid, *_) in examples)


# Epochs' worth of a two-worker training stream within which every example comes: each
# worker moves on to its next epoch by itself, so one may run ahead of the other.
EPOCHS_TO_SEE_ALL = 6


def examples_until_all_seen(ds: tf.data.Dataset, limit: int) -> int:
    """Examples read from `ds` until every uid of the N examples came, or `limit` + 1 when
    some had not by then."""
    seen, read = set(), 0
    for features, _ in ds:
        uids = features["uid"].numpy().reshape(-1).astype(int).tolist()
        seen.update(uids)
        read += len(uids)
        if len(seen) == N:
            return read
        if read > limit:
            return limit + 1
    return limit + 1


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    with LocalService(str(tmp_path_factory.mktemp("service")), workers=2) as local:
        yield local


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write(tmp_path_factory.mktemp("data"), pack=True, compression="none", n=N)


@pytest.mark.parametrize("remote", ["read", "parse"])
def test_one_epoch_from_two_workers_holds_every_example_once(two_workers, data, remote):
    config = _config(two_workers.address, remote=remote)
    one_pass = take_examples(data.make(config, training=False, service_job=f"once-{remote}"))
    local = take_examples(data.make(CONFIG, training=False))
    assert sorted(one_pass) == sorted(local)
    # The training stream repeats on the workers, one job: each epoch hands out
    # every file once, but each worker moves on to its next epoch by itself, so
    # with two workers epochs overlap (one worker may be epochs ahead; every
    # example came within 2.7 epochs' worth here).
    train = data.make(config, training=True, service_job=f"train-{remote}")
    assert examples_until_all_seen(train, EPOCHS_TO_SEE_ALL * N) <= EPOCHS_TO_SEE_ALL * N


def test_parallel_epochs_from_two_workers_train_on_shuffled_copies(two_workers, data):
    """Under `parallel_epochs` each worker reads every file: the training stream holds
    every example, a copy from each worker, and no batch twice. (Batched on the workers
    with one seed, their batches could be the same batches; only thread timing would
    tell them apart. The copies are shuffled together and batched here, which
    `test_the_workers_batch_unless_this_process_caches` asserts of the plan.)"""
    config = _config(two_workers.address, remote="parse", processing_mode="parallel_epochs")
    stream = iter(data.make(config, training=True, service_job="parallel"))
    batches = [
        tuple(_next_within(stream)[0]["uid"].numpy().reshape(-1).astype(int).tolist())
        for _ in range(4 * N // BATCH)
    ]
    assert len(set(batches)) == len(batches)
    assert {uid for batch in batches for uid in batch} == set(range(N))


def test_one_worker_streams_whole_epochs_one_after_another(tmp_path, data):
    """One worker that shuffles and batches: the training stream is epoch after epoch,
    each holding every example exactly once (shuffled within the epoch, batches running
    across its end), as reading here gives. (With `remote: read` the shuffle here runs
    over the workers' repeated stream, so it mixes across an epoch's end.)"""
    with LocalService(str(tmp_path), workers=1) as one:
        config = _config(one.address, remote="parse")
        train = take_examples(data.make(config, training=True, service_job="one"), 3 * N)
    for epoch in range(3):
        assert _uids(train[epoch * N : (epoch + 1) * N]) == collections.Counter(range(N))


# What shuffling and batching leave in a dataset's graph.
BATCHING_OPS = frozenset(
    {
        "ShuffleDatasetV3",
        "RebatchDatasetV2",
        "RebatchDataset",
        "BatchDatasetV2",
        "MapDataset",
        "ParallelMapDatasetV2",
        "UnbatchDataset",
    }
)


def _consumer_ops(ds: tf.data.Dataset) -> list[str]:
    """The dataset ops this process runs on what the service hands it: `ds`'s chain from
    its output back to the service's op (the graph also holds the part the workers run,
    as the input of the op that registers it)."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())  # noqa: SLF001 (TF's only graph view)
    nodes = {node.name: node for node in graph.node}
    (node,) = [n for n in graph.node if n.op == "_Retval"]
    node = nodes[node.input[0]]
    chain = []
    while not node.op.startswith("DataServiceDataset"):
        chain.append(node.op)
        node = nodes[node.input[0].split(":")[0]]
    return chain


@pytest.mark.parametrize("remote", ["parse", "augment"])
def test_the_workers_hand_over_whole_shuffled_batches(two_workers, data, remote):
    """Streaming training data, the workers shuffle and batch: this process receives
    batches of exactly the batch size and runs no shuffle, map or re-batch of its own."""
    config = _config(two_workers.address, remote=remote)
    remote_map = (lambda features, label: (features, label)) if remote == "augment" else None
    ds = data.make(config, training=True, service_job=f"batched-{remote}", remote_map=remote_map)
    assert not set(_consumer_ops(ds)) & BATCHING_OPS, _consumer_ops(ds)
    stream = iter(ds)
    batches = [_next_within(stream) for _ in range(2 * N // BATCH)]
    assert {int(label.shape[0]) for _, label in batches} == {BATCH}
    uids = [int(u) for features, _ in batches for u in features["uid"].numpy().reshape(-1)]
    # Examples of the files, not in file order (shuffled on the workers); which
    # epoch each came from is the two workers' race (one worker streams whole
    # epochs: test_one_worker_streams_whole_epochs_one_after_another).
    assert set(uids) <= set(range(N))
    assert uids[:BATCH] != sorted(uids[:BATCH])


def _decoded_rows(features, label, books) -> list[tuple]:
    decoded = {
        k: codes.decode(v, tf.constant(books[k])) if v.dtype == tf.uint8 else v
        for k, v in features.items()
    }
    return _rows(decoded, label)


def test_a_feature_with_a_codebook_travels_as_codes_that_decode_to_its_values(
    two_workers, data, caplog
):
    """The writer recorded `vec`'s 64 values (`uid` has 301): the workers send it as one
    byte a value, and decoded, every example is one of the files' examples, exactly."""
    books = {k: np.asarray(v, np.float32) for k, v in data.layout.codebooks.items()}
    assert set(books) == {"vec"} and books["vec"].size == 64
    config = _config(two_workers.address)
    ds = data.make(config, training=True, service_job="coded", codebooks=data.layout.codebooks)
    assert ds.element_spec[0]["vec"].dtype == tf.uint8
    assert ds.element_spec[0]["uid"].dtype == tf.float32
    stream = iter(ds)
    served = []
    for _ in range(2 * N // BATCH):
        served.extend(_decoded_rows(*_next_within(stream), books))
    local = set(take_examples(data.make(CONFIG, training=False)))
    assert set(served) <= local and len({row[0] for row in served}) > N // 2
    # What this process caches and re-batches stays values; `codes: on` says so.
    on = dataclasses.replace(config.service, codes="on")
    with caplog.at_level(logging.WARNING, logger="absl"):
        cached = data.make(
            dataclasses.replace(config, cache="memory", service=on),
            training=True,
            service_job="coded-cached",
            codebooks=data.layout.codebooks,
        )
    assert cached.element_spec[0]["vec"].dtype == tf.float32
    assert "workers do not batch this read" in caplog.text


@pytest.mark.parametrize("view", ["keeps", "moves"])
def test_codes_after_a_view_are_checked_and_a_new_value_fails_naming_the_feature(
    two_workers, data, view
):
    """A view on the workers (`remote: augment`) may make values the files do not hold:
    those codes are checked, and a new value fails the read, never rounds it. (Values
    read from the recorded files are in the codebook by construction: not checked.)"""
    config = _config(two_workers.address, remote="augment")
    shift = 0.0 if view == "keeps" else 1e-3

    def remote_map(features, label):
        return {**features, "vec": features["vec"] + shift}, label

    stream = iter(
        data.make(
            config,
            training=True,
            service_job=f"view-{view}",
            remote_map=remote_map,
            codebooks=data.layout.codebooks,
        )
    )
    if view == "keeps":
        features, _ = _next_within(stream)
        assert features["vec"].dtype == tf.uint8
        return
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature `vec` holds a value outside"):
        for _ in range(N // BATCH + 1):
            _next_within(stream)


def test_with_a_cache_here_this_process_shuffles_and_batches(two_workers, data):
    """A cache here replays what it holds: the workers make one pass, and the shuffle
    and batches come after the cache, in this process."""
    config = dataclasses.replace(_config(two_workers.address), cache="memory")
    ds = data.make(config, training=True, service_job="cached")
    assert {"CacheDatasetV2", "ShuffleDatasetV3", "RebatchDatasetV2"} <= set(_consumer_ops(ds))
    assert sorted(take_examples(ds, N)) == sorted(take_examples(data.make(CONFIG, training=False)))


def test_two_replicas_sharing_a_job_see_each_example_once(two_workers, data):
    config = _config(two_workers.address)
    name = service.job_name(config.service, "/runs/model_run", "train")
    # Every replica of a run derives the one job from the run.
    assert name == service.job_name(config.service, "/runs/model_run", "train")
    assert name != service.job_name(config.service, "/runs/other_run", "train")
    replicas = [
        data.make(
            config,
            training=False,
            service_job=name,
            input_context=tf.distribute.InputContext(2, i, 2),
            batch_size=2 * BATCH,
        )
        for i in range(2)
    ]
    shares: list[list] = [[], []]

    def read(i):
        shares[i] = take_examples(replicas[i])

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a replica's epoch did not end"
    assert _uids(shares[0] + shares[1]) == collections.Counter(range(N))


def test_a_worker_killed_mid_epoch_leaves_training_running(tmp_path, data):
    # Documented behaviour: TensorFlow's client drops a lost worker and reads
    # on from the others; the files the lost worker held are lost for that
    # epoch (at most once), and training does not stop.
    with LocalService(str(tmp_path), workers=2) as local:
        config = _config(local.address)
        stream = iter(data.make(config, training=True, service_job="kill"))
        for _ in range(5):
            _next_within(stream)
        local.workers[1].kill()
        seen = []
        deadline = time.monotonic() + 120
        while len(seen) < 3 * N and time.monotonic() < deadline:
            features, _ = _next_within(stream)
            seen.extend(features["uid"].numpy().reshape(-1).tolist())
        assert len(seen) >= 3 * N
        # Later epochs come whole from the worker left.
        assert set(seen) == set(range(N))


def test_a_dispatcher_restarted_from_its_journal_resumes_the_job(tmp_path, data):
    journal = str(tmp_path / "journal")
    with LocalService(str(tmp_path), workers=1, journal_dir=journal) as local:
        config = _config(local.address)
        stream = iter(data.make(config, training=True, service_job="restart"))
        before = [_next_within(stream) for _ in range(3)]
        local.restart_dispatcher()
        after = []
        for _ in range(2 * N // BATCH):
            after.append(_next_within(stream))
        assert before and len(after) == 2 * N // BATCH


@pytest.mark.parametrize("where", ["closed port", "name that resolves to no host"])
def test_an_unreachable_dispatcher_fails_in_bounded_time_naming_it(data, where):
    address = (
        f"127.0.0.1:{portpicker.pick_unused_port()}"
        if where == "closed port"
        else "no-such-dispatcher.invalid:5050"
    )
    config = _config(address, connect_timeout_seconds=2)
    start = time.monotonic()
    with pytest.raises(
        IngestionError, match=f"no tf.data service dispatcher answered at grpc://{address}"
    ):
        data.make(config, training=True, service_job="nobody")
    assert time.monotonic() - start < 30


def test_a_worker_whose_dispatcher_does_not_answer_exits_naming_it(tmp_path):
    address = f"127.0.0.1:{portpicker.pick_unused_port()}"
    worker = ServiceProcess(
        "worker",
        ["--dispatcher", address, "--dispatcher_wait_seconds", "2"],
        str(tmp_path / "worker.log"),
    )
    with pytest.raises(ServiceStartError, match=r"exited at start \(code 3\)") as raised:
        worker.wait_listening(120)
    assert f"no dispatcher answered at {address} within 2 s (--dispatcher_wait_seconds)" in str(
        raised.value
    )


def test_a_dispatcher_without_workers_fails_in_bounded_time_naming_it(tmp_path, data):
    with LocalService(str(tmp_path), workers=0) as local:
        config = _config(local.address, worker_wait_seconds=3)
        start = time.monotonic()
        with pytest.raises(IngestionError) as raised:
            data.make(config, training=True, service_job="no-workers")
        assert time.monotonic() - start < 60
    assert str(raised.value) == (
        f"ingestion.service.worker_wait_seconds: the tf.data service dispatcher at "
        f"grpc://{local.address} has no worker that answers after 3 s: 0 registered. Start one "
        f"(python -m components.data.service worker --dispatcher {local.address}), or check that "
        "the workers point at this dispatcher and can start (on Kubeflow: their pods)"
    )


def test_a_dispatcher_whose_workers_are_all_gone_fails_naming_them(tmp_path, data):
    with LocalService(str(tmp_path), workers=1) as local:
        gone = local.workers[0]
        gone.kill()
        config = _config(local.address, worker_wait_seconds=3)
        with pytest.raises(IngestionError) as raised:
            data.make(config, training=True, service_job="all-gone")
    assert f"after 3 s: 1 registered ({gone.address}), none answering. Start one" in str(
        raised.value
    )


def test_a_worker_that_starts_during_the_wait_is_used(tmp_path, data):
    with LocalService(str(tmp_path), workers=0) as local:
        late = threading.Timer(1.0, local.add_worker)
        late.start()
        try:
            config = _config(local.address, worker_wait_seconds=300)
            stream = iter(data.make(config, training=True, service_job="late"))
            features, _ = _next_within(stream, 120)
        finally:
            late.join(timeout=180)
        assert features["uid"].shape[0] == BATCH


def test_python_in_the_remote_part_is_refused_naming_the_fix():
    ds = tf.data.Dataset.range(4).map(lambda x: tf.py_function(lambda v: v, [x], tf.int64))
    with pytest.raises(IngestionError, match=r"calls Python \(EagerPyFunc.*TensorFlow ops"):
        service.distribute(ds, ServiceConfig(dispatcher="127.0.0.1:1"), "job")
    gen = tf.data.Dataset.from_generator(
        lambda: iter([1, 2]), output_signature=tf.TensorSpec([], tf.int32)
    )
    assert service.python_ops(gen)
    assert not service.python_ops(tf.data.Dataset.range(3).map(lambda x: x + 1))


def test_kubeflow_dispatcher_outside_its_job_is_refused(monkeypatch):
    monkeypatch.delenv(DISPATCHER_ENV, raising=False)
    with pytest.raises(IngestionError, match=DISPATCHER_ENV):
        service.resolve_address(ServiceConfig(dispatcher="kubeflow"))
    monkeypatch.setenv(DISPATCHER_ENV, "tj-dispatcher-0-0.tj:5050")
    assert (
        service.resolve_address(ServiceConfig(dispatcher="kubeflow"))
        == "grpc://tj-dispatcher-0-0.tj:5050"
    )


# tgkill(2)'s syscall number, by machine.
TGKILL = {"x86_64": 234, "aarch64": 131}


def _threads_taking(pid: int, sig: int) -> list[int]:
    """The threads of `pid` other than its main one that do not block `sig`."""
    taking = []
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                blocked = next(line for line in f if line.startswith("SigBlk:"))
        except (OSError, StopIteration):
            continue  # the thread ended meanwhile
        if tid != pid and not int(blocked.split()[1], 16) & (1 << (sig - 1)):
            taking.append(tid)
    return taking


def test_a_stop_signal_taken_by_any_thread_of_a_server_stops_it(tmp_path):
    # The kernel may hand a process's SIGTERM to any thread; TensorFlow's server runs
    # several. Sent to one that is not the main thread (tgkill), it must still stop it.
    tgkill = TGKILL.get(platform.machine())
    if tgkill is None:
        pytest.skip(f"tgkill's syscall number on {platform.machine()} is not listed here")
    libc = ctypes.CDLL(None, use_errno=True)
    server = ServiceProcess("dispatcher", ["--port", "0"], str(tmp_path / "dispatcher.log"))
    try:
        server.wait_listening(120)
        pid = server.process.pid
        # A thread may end between the listing and the signal: try the next one.
        for tid in _threads_taking(pid, signal.SIGTERM):
            if libc.syscall(tgkill, pid, tid, signal.SIGTERM) == 0:
                break
        else:
            pytest.fail("no thread besides the main one took SIGTERM")
        # The grace for the server's own stop, and then some.
        assert server.process.wait(timeout=service.SERVER_STOP_GRACE_SECONDS + 20) == 0
    finally:
        server.stop()
