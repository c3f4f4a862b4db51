"""How the pipeline runs: the `transform` output, the `ingestion` input
pipeline and the `strategy` (tf.distribute) sections."""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import field
from typing import Literal, Self

from pydantic import model_validator

from components.config.validation import fail, section


@section("transform")
class TransformConfig:
    """How Transform writes its output (recorded for the Trainer in `tfxkit_layout.json`).

    Attributes:
      num_shards: Output files per split; 0 picks a default sized for parallel
        reads and per-worker file sharding: at least 8 and at least
        2 x `strategy.workers`, a multiple of the workers.
      compression: `gzip` (TFX's default, `.gz` files) or `none`
        (`.tfrecord` files: faster to read, larger on disk).
      pack_features: Write every dense numeric transformed feature (label
        included) as one fixed-length float32 vector per example, so parsing
        costs one feature. Integer ids must stay below 2^24 (exact in float32;
        the Transform fails naming the feature otherwise). Stock TFX readers
        (`data_accessor`) cannot unpack it: keep it off for user `run_fn`s.
    """

    num_shards: int = 0
    compression: Literal["gzip", "none"] = "gzip"
    pack_features: bool = False

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.num_shards < 0:
            fail("num_shards", f"expected an integer >= 0 (0 = automatic), got {self.num_shards}")
        return self


# `ingestion.service.dispatcher` naming the dispatcher the compiled Kubeflow
# training job starts beside its trainers (its address reaches them in this
# environment variable).
KUBEFLOW_DISPATCHER = "kubeflow"
DISPATCHER_ENV = "TFXKIT_TFDATA_DISPATCHER"
_ADDRESS = re.compile(r"(grpc://)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})")
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# How much of the input pipeline the service workers run, in pipeline order.
REMOTE_PARTS = ("read", "parse", "augment")


class ConfigWarning(UserWarning):
    """A config value that is allowed but likely a mistake; the message names the field."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_dispatcher_address(value: str) -> str | None:
    """None when `value` is a `[grpc://]host:port` address, else what is wrong with it."""
    match = _ADDRESS.fullmatch(value)
    if match is None:
        return f"expected 'host:port' or 'grpc://host:port' (e.g. 'grpc://data-dispatcher:5050'), got {value!r}"
    if not 0 < int(match["port"]) < 65536:
        return f"expected a port in [1, 65535], got {match['port']} in {value!r}"
    return None


def local_workers_outside_run(local_workers: int) -> str:
    """Why `ingestion.service.local_workers` cannot reach a component (only a tfxkit run starts them)."""
    return (
        f"ingestion.service.local_workers: {local_workers} asks a tfxkit local run (tfxkit run, make run, "
        "pipelines.local_runner.run) to start a tf.data service, and this is not one; in a pipeline of "
        "your own start the servers yourself (python -m components.data.service dispatcher --port 5050, "
        "and for each worker python -m components.data.service worker --dispatcher localhost:5050), then "
        "set ingestion.service.dispatcher: localhost:5050 and local_workers: 0"
    )


@section("ingestion.service")
class ServiceConfig:
    """Input processing on tf.data service workers instead of the training host.

    Attributes:
      dispatcher: The tf.data service dispatcher, `host:port` or
        `grpc://host:port`; `kubeflow` for the dispatcher the compiled
        Kubeflow training job starts beside its trainers; '' (default) keeps
        all input processing on the training host, unless `local_workers`
        starts a service for a local run.
      processing_mode: `distributed_epoch` (the dispatcher hands out files:
        each example at most once per epoch across all workers and trainers;
        TensorFlow documents exactly once when no worker fails, but a pass
        that came short with none lost has been seen here) or
        `parallel_epochs` (every worker produces a whole epoch: each example
        once per worker per epoch).
      job_name: The service job every trainer of a run reads ('' = one derived
        from the run's model directory, the same on every replica), so the
        replicas of a multi-worker run share one job and its examples.
      compression: `none` (default) or `auto` (TensorFlow's default: the
        workers compress what they send, the trainer decompresses it). On
        dense float batches `auto` cost the trainer 2.1 times the CPU per
        example and the workers 1.5 times, and moved a third fewer examples
        a second (`benchmarks/results/tfdata_service.json`); it pays only
        where the link carries less than one trainer core receives
        uncompressed (about 300,000 examples of 3 KB a second, 8 Gbit/s).
      remote: What the service workers run: `read` (files to serialized
        records; parsing stays here), `parse` (and parsing, the default) or
        `augment` (and `train.augmentation`'s image views; mixup stays here).
        With `parse` or `augment`, fixed-length features and no `cache`, the
        workers also shuffle and batch: the training host receives whole
        batches, its cheapest way in. `partially_labeled`, caching (and then
        shuffling and batching) and prefetch stay on the training host.
      codes: `on`: where the workers shuffle and batch for the product's own
        training (Trainer, Distiller) and nothing on the training host touches
        the features afterwards (every label kept, no mixup or input noise,
        views on the workers or none), every float feature the Transform
        recorded a codebook for (at most 256 distinct values, as z-scored 8-bit
        pixels) is sent as one-byte codes (checked on the workers after a view
        there) and decoded in the training step (`components.data.codes`).
        Receiving costs the training host a third to a half of the CPU, and
        the workers less without views (`benchmarks/results/service_codes.json`);
        the decode (a gather) is cheap on an accelerator but costs a CPU more
        than receiving saves. `on` that cannot apply logs why. `auto`
        (default): `on` where the replicas are GPUs or TPUs (`strategy`; a
        parameter-server job: this process's devices) and the workers make no
        views (`remote: augment` checks each code, not measured), else `off`.
        `off`: float32 values.
      work_dir: The dispatcher's journal directory on storage every pod
        reaches (fault-tolerant mode: a restarted dispatcher resumes its jobs).
        Read by the dispatcher the Kubeflow job starts ('' there: under the
        pipeline root) and by `python -m components.data.service dispatcher`.
      connect_timeout_seconds: How long the Trainer waits for the dispatcher
        to answer before failing with its address.
      worker_wait_seconds: How long the Trainer waits, once the dispatcher
        answers, for a registered worker that answers too (workers still
        starting, pods not yet scheduled), logging what it waits for every
        few seconds; then it fails naming the dispatcher and the workers it
        saw. Without this bound a run with no worker waits forever. Also
        the bound on a training whose workers are all lost: with none
        answering and no step made for this long, the Trainer or Distiller
        fails and its process ends.
      local_workers: A tfxkit local run (`tfxkit run`, `make run`,
        `pipelines.local_runner.run`) starts a dispatcher and this many
        workers on this machine for the run, on free ports, logs them under
        `<output>/tfdata_service/` and stops them when the run ends; 0
        (default) starts none. Not with `dispatcher` (the run sets it), not
        for Kubeflow (use `dispatcher: kubeflow`) and not in a pipeline of
        your own (start the servers yourself and give `dispatcher`).
    """

    dispatcher: str = ""
    processing_mode: Literal["distributed_epoch", "parallel_epochs"] = "distributed_epoch"
    job_name: str = ""
    compression: Literal["auto", "none"] = "none"
    remote: Literal["read", "parse", "augment"] = "parse"
    codes: Literal["auto", "on", "off"] = "auto"
    work_dir: str = ""
    connect_timeout_seconds: int = 60
    worker_wait_seconds: int = 300
    local_workers: int = 0

    @property
    def enabled(self) -> bool:
        """Whether input runs on the service: a dispatcher named, or one the local run starts."""
        return bool(self.dispatcher) or self.local_workers > 0

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.local_workers < 0:
            fail("local_workers", f"expected an integer >= 0 (0 = none), got {self.local_workers}")
        if self.local_workers and self.dispatcher:
            fail(
                "local_workers",
                f"{self.local_workers} starts a dispatcher for the run, and ingestion.service.dispatcher "
                f"names one ({self.dispatcher!r}); set dispatcher: '' to start a local service, or "
                "local_workers: 0 to use that dispatcher",
            )
        cores = available_cores()
        if self.local_workers > cores:
            # Allowed (a worker may wait on I/O), but workers beyond the cores
            # compete with the trainer for them.
            warnings.warn(
                f"ingestion.service.local_workers: {self.local_workers} workers on {cores} available "
                "cores compete with the trainer and each other for them; fewer workers than cores "
                "is the useful range",
                ConfigWarning,
                stacklevel=2,
            )
        if self.dispatcher and self.dispatcher != KUBEFLOW_DISPATCHER:
            problem = check_dispatcher_address(self.dispatcher)
            if problem:
                fail(
                    "dispatcher",
                    f"{problem}; or {KUBEFLOW_DISPATCHER!r} for the dispatcher of the Kubeflow job, or '' for no service",
                )
        if self.job_name and not _JOB_NAME.fullmatch(self.job_name):
            fail("job_name", f"expected letters, digits, '_', '.' or '-', got {self.job_name!r}")
        for name in ("connect_timeout_seconds", "worker_wait_seconds"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        return self


@section("ingestion")
class IngestionConfig:
    """The Trainer's tf.data input pipeline.

    Attributes:
      batch_size: Global batch size (split across replicas).
      eval_batch_size: Global batch size for evaluation.
      shuffle_buffer: Examples mixed together when training (0 disables
        shuffling): files are reshuffled every epoch and 8 of them read at
        once, round robin, in batches of an eighth of this (at least a
        batch, at most 4096); the parsed batches are shuffled in a buffer of
        about this many examples and examples are permuted within windows of
        this many.
      cache: `auto`, `none`, `memory`, or `file` (under the model run
        directory): keep the parsed training data after the first epoch, so
        later epochs skip reading and parsing. `memory` / `file` need the
        (packed) data to fit in memory / on disk; `auto` caches in memory when
        the writer's recorded shard stats put the parsed data (each input
        pipeline's share) at most a fifth of the memory the process can still
        allocate (its cgroup limit included), and does not cache otherwise
        (no recorded stats, such as stock TFX Transform output, or a
        parameter-server worker's dataset).
      num_parallel_reads: Files read concurrently (0 = autotune).
      num_parallel_calls: Parallel parse calls (0 = autotune).
      prefetch: Batches prefetched (0 = autotune; for batches the tf.data
        service's workers hand over, 0 buffers about 64 MB of them).
      deterministic: Keep element order reproducible across runs (slower);
        without shuffling, every epoch then has the same order.
      service: Run reading, parsing and optionally augmentation on tf.data
        service workers (`ServiceConfig`); off by default.
    """

    batch_size: int = 256
    eval_batch_size: int = 256
    shuffle_buffer: int = 10000
    cache: Literal["auto", "none", "memory", "file"] = "auto"
    num_parallel_reads: int = 0
    num_parallel_calls: int = 0
    prefetch: int = 0
    deterministic: bool = False
    service: ServiceConfig = field(default_factory=ServiceConfig)

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in ("batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        for name in ("shuffle_buffer", "num_parallel_reads", "num_parallel_calls", "prefetch"):
            if getattr(self, name) < 0:
                fail(name, f"expected an integer >= 0, got {getattr(self, name)}")
        if self.service.enabled:
            if self.deterministic:
                fail(
                    "deterministic",
                    "with ingestion.service the order of examples depends on which worker serves which "
                    "file first, so it cannot be reproduced; set deterministic: false or turn the service off",
                )
            if self.service.remote == "augment" and self.cache in ("memory", "file"):
                fail(
                    "cache",
                    f"cache {self.cache!r} with service.remote 'augment' would keep the first epoch's "
                    "augmented views and replay them, leaving the service idle after one epoch; set cache: "
                    "none (or auto, which caches nothing then), or service.remote: parse to cache parsed "
                    "examples on this host",
                )
        return self


StrategyKind = Literal[
    "auto",
    "one_device",
    "mirrored",
    "multi_worker_mirrored",
    "parameter_server",
    "central_storage",
    "tpu",
]


# Strategies that use every accelerator their task sees: `num_gpus` cannot select among them.
WHOLE_TASK_KINDS = ("multi_worker_mirrored", "parameter_server", "tpu")
# Shortest non-zero `strategy.collective_timeout_seconds`: well above what
# TensorFlow needs to call a lost peer down (its coordination service, which
# MultiWorkerMirroredStrategy starts, after 10 s without a heartbeat; the
# strategy's older ping health check, 30 s x 3 tries, is off when that
# service runs), so that a lost peer is reported as lost, and a collective
# waiting for a peer that is writing its backup or compiling its first step
# is not cut short.
MIN_COLLECTIVE_TIMEOUT_SECONDS = 120


def whole_task_gpus_message(kind: str, num_gpus: int) -> str:
    return (
        f"kind {kind!r} uses every accelerator its task sees, so num_gpus {num_gpus} would be ignored; "
        "set num_gpus: 0 and size each replica with the Kubeflow placement's accelerator_count "
        "(or CUDA_VISIBLE_DEVICES)"
    )


@section("strategy")
class StrategyConfig:
    """Which tf.distribute strategy the Trainer uses.

    Attributes:
      kind: One of `auto`, `one_device`, `mirrored`, `multi_worker_mirrored`,
        `parameter_server`, `central_storage`, `tpu` (see
        `components.strategies` for what `auto` picks).
      num_gpus: GPUs to use on this machine under `mirrored` and
        `central_storage` (0: every visible GPU; `one_device` takes at most 1);
        more than are visible fails before training. Multi-worker,
        parameter-server and TPU strategies use every accelerator their task
        sees (size them with the Kubeflow placement's `accelerator_count`), so
        they refuse a non-zero value, also when `auto` resolves to them.
      num_cpu_devices: Logical CPU devices to create when there is no GPU
        (lets `mirrored` run on CPU; 0 keeps TensorFlow's default of one).
      communication: Collective implementation, `auto`, `ring` or `nccl`
        (multi-worker all-reduce; `nccl` also selects NCCL for `mirrored`).
      all_reduce_pack_bytes: Pack small gradients into chunks of this size
        for the multi-worker all-reduce (0: TensorFlow's default).
      collective_timeout_seconds: Under `multi_worker_mirrored`, fail a
        collective (all-reduce) that waits longer than this for its peers
        with `DeadlineExceededError`, instead of hanging (0 = no timeout;
        otherwise at least 120). It guards against a peer that is alive but
        stuck: a peer that is gone is already turned into an error within
        seconds by TensorFlow's coordination service (10 s without a
        heartbeat). It costs one thread per pending collective (TensorFlow
        calls it a debugging aid), hence off by default. Set it above the
        longest step, backup write (`train.checkpoint_every_steps`) and
        first-step compilation. It also bounds how long a worker waits at
        start for every peer to join: past it the worker ends naming the
        peers that do not answer (with 0, worker 0 waits as long as
        TensorFlow does, without end, and the others an hour).
      tpu: TPU name or address for `TPUClusterResolver` ('' = local / env).
      workers: Expected worker replicas (used to size shards and TFJobs).
      parameter_servers: Expected parameter-server replicas.
      steps_per_execution: Steps per `tf.function` call (fewer round trips;
        matters most for parameter server and TPU). Backups are counted in
        steps regardless.
    """

    kind: StrategyKind = "auto"
    num_gpus: int = 0
    num_cpu_devices: int = 0
    communication: Literal["auto", "ring", "nccl"] = "auto"
    all_reduce_pack_bytes: int = 0
    collective_timeout_seconds: int = 0
    tpu: str = ""
    workers: int = 1
    parameter_servers: int = 0
    steps_per_execution: int = 1

    @model_validator(mode="after")
    def _check(self) -> Self:
        for name in ("num_gpus", "num_cpu_devices", "all_reduce_pack_bytes", "parameter_servers"):
            if getattr(self, name) < 0:
                fail(name, f"expected an integer >= 0, got {getattr(self, name)}")
        for name in ("workers", "steps_per_execution"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        if self.kind == "parameter_server" and self.parameter_servers < 1 and self.workers > 1:
            fail("parameter_servers", "expected >= 1 parameter server for kind 'parameter_server'")
        if self.kind == "one_device" and self.num_gpus > 1:
            fail(
                "num_gpus",
                f"kind 'one_device' uses one device, got num_gpus {self.num_gpus}; use kind 'mirrored' for several GPUs",
            )
        if self.kind in WHOLE_TASK_KINDS and self.num_gpus:
            fail("num_gpus", whole_task_gpus_message(self.kind, self.num_gpus))
        timeout = self.collective_timeout_seconds
        if timeout < 0 or 0 < timeout < MIN_COLLECTIVE_TIMEOUT_SECONDS:
            fail(
                "collective_timeout_seconds",
                f"expected 0 (no timeout) or at least {MIN_COLLECTIVE_TIMEOUT_SECONDS} seconds, "
                f"got {timeout}; a shorter one would cut off collectives that wait for a peer's "
                f"backup or first-step compilation (TensorFlow already reports a lost peer within seconds)",
            )
        if timeout and self.kind not in ("auto", "multi_worker_mirrored"):
            fail(
                "collective_timeout_seconds",
                f"only 'multi_worker_mirrored' runs collectives with a timeout, got kind {self.kind!r}; "
                "set it to 0",
            )
        if self.kind == "tpu" and self.communication == "nccl":
            fail(
                "communication", "'nccl' is for GPUs; TPUs have their own interconnect (use 'auto')"
            )
        return self


def check_service(
    ingestion: IngestionConfig, strategy: StrategyConfig, image_views: bool | None
) -> None:
    """The rules `ingestion.service` sets on the sections beside it (run by the configs holding them).

    Args:
      image_views: Whether `train.augmentation` has image views to run
        remotely; None for a user's module, whose augmentation is its own code.
    """
    service = ingestion.service
    if not service.enabled:
        return
    if strategy.kind == "tpu":
        fail(
            "ingestion.service",
            "the product has not run a TPU strategy's input through the tf.data service, so it does not "
            "offer it; turn the service off (dispatcher: '') or use a GPU or CPU strategy",
        )
    if service.remote == "augment" and not image_views:
        where = (
            "train.augmentation has no image views (translate / flip) on"
            if image_views is not None
            else "a user module's augmentation is its own code, which the product does not move"
        )
        fail(
            "ingestion.service.remote",
            f"'augment' runs train.augmentation's image views on the service workers, but {where}; "
            "set remote: parse",
        )
