"""The `tf.distribute` strategy factory (no TFX types).

`create_strategy(config.strategy)` resolves the kind (`resolve_kind`), configures devices
and returns a `StrategyChoice`: the strategy, this task's role, whether it is the chief
and why this strategy was chosen. `formation_bound` bounds how long a cluster may take to
form; `start_server` runs a parameter-server `worker` or `ps` task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import tensorflow as tf
from absl import logging
from tensorflow.python.eager import context

from components.config import StrategyConfig, StrategyKind
from components.config.runtime import WHOLE_TASK_KINDS, whole_task_gpus_message
from components.training import cluster, peers
from components.training.cluster import TF_CONFIG_ENV, StrategyError, TFConfig, read_tf_config

KINDS = typing.get_args(StrategyKind)
# Environment variables that say a TPU is attached (Cloud TPU VMs, GKE TPU
# node pools, legacy TPU nodes); without one of them `auto` never probes.
TPU_ENV_HINTS = (
    "TPU_NAME",
    "TPU_ACCELERATOR_TYPE",
    "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",
    "TPU_WORKER_HOSTNAMES",
)

ROLE_TRAINER = "trainer"
ROLE_SERVER = "server"
ROLE_EVALUATOR = "evaluator"


def _fail(path: str, message: str) -> Any:
    raise StrategyError(f"{path}: {message}")


# --------------------------------------------------------------------------- #
# Choosing the kind
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Resolution:
    """Which strategy a task uses, and why (the pure part of the choice)."""

    kind: str
    role: str
    reason: str


def tpu_hinted(config: StrategyConfig, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a TPU may be attached: named in config or environment, or /dev/accel* exists."""
    environ = os.environ if environ is None else environ
    return (
        bool(config.tpu)
        or any(environ.get(k) for k in TPU_ENV_HINTS)
        or bool(glob.glob("/dev/accel*"))
    )


def resolve_kind(
    config: StrategyConfig,
    tf_config: TFConfig | None,
    num_gpus_visible: int,
    tpu_available: bool = False,
) -> Resolution:
    """Resolves `strategy.kind` (including `auto`) against the cluster and devices.

    Pure: no TensorFlow runtime is touched, so every rule is testable.

    Args:
      config: The `strategy` config section.
      tf_config: The parsed `TF_CONFIG`, or None.
      num_gpus_visible: GPUs this process sees.
      tpu_available: Whether a TPU was resolved (only consulted by `auto`).

    Raises:
      StrategyError: for a kind the cluster contradicts.
    """
    kind = config.kind
    if tf_config is not None and tf_config.task_type == "evaluator":
        return Resolution(
            "one_device",
            ROLE_EVALUATOR,
            "this task is the TF_CONFIG evaluator, which trains nothing",
        )
    multi = tf_config is not None and (tf_config.num_workers > 1 or tf_config.has_ps)
    local_devices = num_gpus_visible if num_gpus_visible else config.num_cpu_devices
    device_word = "GPUs" if num_gpus_visible else "logical CPU devices"

    if kind == "auto":
        if tpu_available:
            kind, why = "tpu", "a TPU is resolvable"
        elif tf_config is not None and tf_config.has_ps:
            kind, why = (
                "parameter_server",
                f"TF_CONFIG lists {tf_config.num_ps} ps and {len(tf_config.cluster.get('worker', ()))} worker task(s)",
            )
        elif multi:
            kind, why = "multi_worker_mirrored", f"TF_CONFIG lists {tf_config.num_workers} workers"
        elif local_devices > 1:
            kind, why = "mirrored", f"{local_devices} {device_word} are available"
        else:
            kind, why = (
                "one_device",
                "there is no TPU, no multi-worker TF_CONFIG and a single local device",
            )
        reason = f"strategy.kind is 'auto' and {why}"
    else:
        reason = f"strategy.kind is {kind!r}"
        if kind == "parameter_server" and (tf_config is None or not tf_config.has_ps):
            _fail(
                "strategy.kind",
                "'parameter_server' needs a cluster: set TF_CONFIG with chief, worker and ps tasks "
                "(the TFJob operator does), or use 'multi_worker_mirrored' / 'auto'",
            )
        if kind == "multi_worker_mirrored" and tf_config is not None and tf_config.has_ps:
            _fail(
                "strategy.kind",
                "'multi_worker_mirrored' takes no parameter servers, but TF_CONFIG lists ps tasks; "
                "use 'parameter_server' or drop the ps tasks",
            )
        if kind in ("one_device", "mirrored", "central_storage") and multi:
            _fail(
                "strategy.kind",
                f"{kind!r} trains on one machine, but TF_CONFIG describes a {tf_config.num_workers}-worker cluster; "
                "use 'multi_worker_mirrored' (or 'auto')",
            )
    if tf_config is not None and kind in ("multi_worker_mirrored", "parameter_server"):
        expected = (
            tf_config.num_workers
            if kind == "multi_worker_mirrored"
            else len(tf_config.cluster["worker"])
        )
        if config.kind != "auto" and expected != config.workers:
            _fail(
                "strategy.workers",
                f"TF_CONFIG lists {expected} worker(s) but strategy.workers is {config.workers}; "
                f"set strategy.workers: {expected} (it sizes shards and the TFJob)",
            )
        if (
            kind == "parameter_server"
            and config.kind != "auto"
            and tf_config.num_ps != config.parameter_servers
        ):
            _fail(
                "strategy.parameter_servers",
                f"TF_CONFIG lists {tf_config.num_ps} ps task(s) but strategy.parameter_servers is "
                f"{config.parameter_servers}; set strategy.parameter_servers: {tf_config.num_ps}",
            )
    if kind in WHOLE_TASK_KINDS and config.num_gpus:
        # Only `auto` gets here (the config refuses the explicit kinds): the
        # resolved strategy would ignore the GPU count.
        _fail(
            "strategy.num_gpus", f"{reason}, but {whole_task_gpus_message(kind, config.num_gpus)}"
        )
    role = ROLE_TRAINER
    if kind == "parameter_server" and tf_config.task_type in ("worker", "ps"):
        role = ROLE_SERVER
    return Resolution(kind, role, reason)


# --------------------------------------------------------------------------- #
# Devices and communication
# --------------------------------------------------------------------------- #


def configure_devices(config: StrategyConfig) -> None:
    """Creates `strategy.num_cpu_devices` logical CPU devices when there is no GPU.

    Raises:
      StrategyError: if TensorFlow already initialised with another device count.
    """
    n = config.num_cpu_devices
    if n <= 0 or tf.config.list_physical_devices("GPU"):
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have != n:
            _fail(
                "strategy.num_cpu_devices",
                f"asked for {n} logical CPU devices, but TensorFlow already initialised with {have}; "
                "logical devices must be configured before any TensorFlow op runs: create the strategy "
                "first thing in a fresh process (the Trainer's run_fn does), or set it to 0",
            )


def _local_devices(config: StrategyConfig, num_gpus_visible: int) -> list[str]:
    if num_gpus_visible:
        return [f"/gpu:{i}" for i in range(config.num_gpus or num_gpus_visible)]
    return [f"/cpu:{i}" for i in range(max(1, config.num_cpu_devices))]


def communication_options(
    config: StrategyConfig,
) -> tf.distribute.experimental.CommunicationOptions:
    """Collective all-reduce options of multi-worker training from config."""
    implementation = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }[config.communication]
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=config.all_reduce_pack_bytes,
        # None, not 0: no timeout thread per collective at all.
        timeout_seconds=config.collective_timeout_seconds or None,
        implementation=implementation,
    )


def _mirrored_cross_device_ops(config: StrategyConfig, num_gpus_visible: int):
    """In-machine all-reduce for `mirrored`: NCCL when asked, else TensorFlow's pick.

    TensorFlow picks NCCL on GPUs and reduction to one device on CPUs; `ring`
    is a collective (multi-worker) implementation and leaves that pick alone.
    """
    if config.communication == "nccl" and num_gpus_visible:
        return tf.distribute.NcclAllReduce()
    return None


def check_batch_sizes(batch_size: int, eval_batch_size: int, num_replicas: int, kind: str) -> None:
    """Fails unless both global batch sizes split evenly over the replicas in sync.

    Raises:
      StrategyError: naming `ingestion.batch_size` / `ingestion.eval_batch_size`.
    """
    for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
        if num_replicas > 1 and value % num_replicas:
            fixed = -(-value // num_replicas) * num_replicas
            _fail(
                f"ingestion.{name}",
                f"{value} does not split evenly over the {num_replicas} replicas in sync of strategy {kind!r}; "
                f"use a multiple of {num_replicas} (e.g. {fixed})",
            )


# --------------------------------------------------------------------------- #
# The factory
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class StrategyChoice:
    """The strategy this task trains under and its place in the cluster.

    Attributes:
      kind: The resolved kind (never `auto`).
      role: `trainer` (trains; under parameter_server: the coordinator),
        `server` (a parameter-server cluster's worker or ps: serves until
        killed) or `evaluator` (trains nothing).
      reason: Why this kind was chosen (logged once).
      strategy: The strategy (None for `server` tasks).
      tf_config: The validated `TF_CONFIG`, or None.
      coordinator: The `ClusterCoordinator` under parameter_server.
      devices: Local devices the replicas run on.
    """

    kind: str
    role: str
    reason: str
    strategy: tf.distribute.Strategy | None
    tf_config: TFConfig | None = None
    coordinator: Any = None
    devices: tuple[str, ...] = ()

    @property
    def is_chief(self) -> bool:
        """Whether this task writes the model artifact (and owns the backups)."""
        return self.tf_config is None or (self.role == ROLE_TRAINER and self.tf_config.is_chief)

    @property
    def task_type(self) -> str:
        return self.tf_config.task_type if self.tf_config else "chief"

    @property
    def task_id(self) -> int:
        return self.tf_config.task_id if self.tf_config else 0

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync if self.strategy is not None else 0

    @property
    def uses_coordinator(self) -> bool:
        return self.coordinator is not None

    @property
    def accelerated(self) -> bool:
        """Whether the replicas train on accelerators (TPUs, GPUs). A parameter-server
        job's workers are taken to have the devices this process has."""
        if self.kind == "tpu":
            return True
        if self.uses_coordinator:
            return bool(tf.config.list_physical_devices("GPU"))
        return any("gpu" in device.lower() for device in self.devices)

    def describe(self) -> str:
        task = f"{self.task_type}:{self.task_id}" if self.tf_config else "single process"
        where = (
            f"{self.num_replicas} replica(s) on {', '.join(self.devices)}"
            if self.strategy
            else "no strategy"
        )
        return (
            f"Strategy: {self.kind} ({where}); role {self.role}, task {task}, "
            f"chief {'yes' if self.is_chief else 'no'}; because {self.reason}"
        )


def create_strategy(
    config: StrategyConfig, environ: Mapping[str, str] | None = None
) -> StrategyChoice:
    """Builds the strategy for this task from the `strategy` config and `TF_CONFIG`.

    Call it before any other TensorFlow op in the process: it may create
    logical CPU devices, and multi-worker strategies configure the runtime.

    Args:
      config: The `strategy` config section.
      environ: Environment to read `TF_CONFIG` (and TPU hints) from; defaults
        to `os.environ`.

    Returns:
      The choice; its `describe()` line has been logged.

    Raises:
      StrategyError: for a malformed `TF_CONFIG`, a missing TPU,
        more GPUs asked for than visible, and similar misconfigurations.
    """
    environ = os.environ if environ is None else environ
    tf_config = read_tf_config(environ)
    configure_devices(config)
    num_gpus_visible = len(tf.config.list_physical_devices("GPU"))
    if config.num_gpus > num_gpus_visible:
        _fail(
            "strategy.num_gpus",
            f"{config.num_gpus} GPU(s) requested but {num_gpus_visible} visible; lower strategy.num_gpus "
            f"to at most {num_gpus_visible}, or set it to 0 to use every visible GPU",
        )
    if config.communication == "nccl" and not num_gpus_visible:
        _fail(
            "strategy.communication", "'nccl' needs GPUs but none are visible; use 'ring' or 'auto'"
        )
    tpu_resolver = None
    if config.kind == "tpu" or (config.kind == "auto" and tpu_hinted(config, environ)):
        tpu_resolver = _resolve_tpu(config, required=config.kind == "tpu")
    resolution = resolve_kind(
        config, tf_config, num_gpus_visible, tpu_available=tpu_resolver is not None
    )
    key = (
        resolution.kind,
        resolution.role,
        config.num_gpus,
        config.num_cpu_devices,
        config.communication,
        config.all_reduce_pack_bytes,
        config.tpu,
        environ.get(TF_CONFIG_ENV, ""),
    )
    if key in _CHOICES:
        choice = dataclasses.replace(_CHOICES[key], reason=resolution.reason)
        logging.info("%s (the process's existing strategy object)", choice.describe())
        return choice
    choice = _build(config, resolution, tf_config, num_gpus_visible, tpu_resolver)
    _CHOICES[key] = choice
    logging.info("%s", choice.describe())
    return choice


# One strategy object per setup and process: components that run one after
# another in one process (the teacher Trainer, then the distiller, under a
# local runner) share it. Two collective strategies in one process reuse
# collective instance keys and abort each other's all-reduces, and a
# multi-worker runtime can be configured only once.
_CHOICES: dict[tuple, StrategyChoice] = {}
_TPU_RESOLVERS: dict[str, Any] = {}


def _resolve_tpu(config: StrategyConfig, required: bool):
    if config.tpu in _TPU_RESOLVERS:
        return _TPU_RESOLVERS[config.tpu]
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=config.tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        # Initialising resets the TPU system, so it happens once per process.
        tf.tpu.experimental.initialize_tpu_system(resolver)
        _TPU_RESOLVERS[config.tpu] = resolver
        return resolver
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
        if required:
            detail = str(e).splitlines()[0][:200]
            _fail(
                "strategy.kind",
                f"'tpu' requested but no TPU was found (TPUClusterResolver: {detail}); set strategy.tpu to the "
                "TPU name or grpc:// address, run on a TPU VM, or use kind 'auto' or 'one_device'",
            )
        logging.info("Strategy: no TPU resolvable (%s); not using one", e)
        return None


def _build(
    config, resolution: Resolution, tf_config, num_gpus_visible: int, tpu_resolver
) -> StrategyChoice:
    kind, role = resolution.kind, resolution.role
    common = {"kind": kind, "role": role, "reason": resolution.reason, "tf_config": tf_config}
    if role == ROLE_SERVER:
        return StrategyChoice(strategy=None, **common)
    devices = _local_devices(config, num_gpus_visible)
    if kind == "one_device" or role == ROLE_EVALUATOR:
        device = devices[0]
        return StrategyChoice(
            strategy=tf.distribute.OneDeviceStrategy(device), devices=(device,), **common
        )
    if kind == "mirrored":
        strategy = tf.distribute.MirroredStrategy(
            devices=devices, cross_device_ops=_mirrored_cross_device_ops(config, num_gpus_visible)
        )
        return StrategyChoice(strategy=strategy, devices=tuple(devices), **common)
    if kind == "central_storage":
        strategy = tf.distribute.experimental.CentralStorageStrategy(
            compute_devices=devices, parameter_device="/cpu:0"
        )
        return StrategyChoice(strategy=strategy, devices=tuple(devices), **common)
    if kind == "multi_worker_mirrored":
        resolver = tf_config.cluster_resolver() if tf_config is not None else None
        with cluster_formation(tf_config, formation_bound(config), kind):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver, communication_options=communication_options(config)
            )
        local = strategy.extended.worker_devices
        return StrategyChoice(strategy=strategy, devices=tuple(local), **common)
    if kind == "parameter_server":
        # Without fail-fast, a gRPC call to a worker that restarts blocks
        # instead of letting the coordinator reschedule (TensorFlow's PS guide).
        os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
        strategy = tf.distribute.ParameterServerStrategy(tf_config.cluster_resolver())
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        workers = tuple(
            f"/job:worker/replica:0/task:{i}" for i in range(len(tf_config.cluster["worker"]))
        )
        return StrategyChoice(strategy=strategy, coordinator=coordinator, devices=workers, **common)
    if kind == "tpu":
        strategy = tf.distribute.TPUStrategy(tpu_resolver)
        return StrategyChoice(
            strategy=strategy, devices=tuple(strategy.extended.worker_devices), **common
        )
    # `StrategyConfig` admits only the kinds above (validated when it is built).
    raise AssertionError(f"unhandled strategy kind {kind!r}")


# --------------------------------------------------------------------------- #
# Forming a multi-worker cluster
# --------------------------------------------------------------------------- #


def formation_bound(config: StrategyConfig) -> tuple[float, str] | None:
    """How long a multi-worker task waits for its peers to join, and what set it; None: no bound.

    TensorFlow bounds the wait only for tasks other than the coordination
    leader (by its registration timeout, an hour unless configured); the
    leader waits for its peers without end. The bound: the registration
    timeout of this process's coordination service when the process
    configured one (`context.configure_coordination_service`, before the
    strategy), else `strategy.collective_timeout_seconds`.
    """
    service = context.context().coordination_service
    if service is not None and service.cluster_register_timeout_in_ms > 0:
        return (
            service.cluster_register_timeout_in_ms / 1000,
            "the coordination service's cluster_register_timeout_in_ms",
        )
    if config.collective_timeout_seconds:
        return float(config.collective_timeout_seconds), "strategy.collective_timeout_seconds"
    return None


@contextlib.contextmanager
def cluster_formation(
    tf_config: TFConfig | None, bound: tuple[float, str] | None, kind: str
) -> Iterator[None]:
    """Turns a cluster that does not form into an error naming the missing tasks.

    Around the construction of a multi-worker strategy (which connects to
    every peer): TensorFlow's error becomes `cluster.PeerLost` naming the
    tasks it lost; with a `bound`, a watchdog process (`peers.watch_formation`)
    ends the task naming the peers that accept no connection once
    construction has waited `bound` seconds (plus `peers.FORMATION_GRACE_S`): the
    wait is inside TensorFlow's runtime, which holds the interpreter, so no
    thread of this process could. Kubernetes then restarts the group or
    fails the job (`kubeflow.max_restarts`).
    """
    if tf_config is None or tf_config.num_workers < 2:
        yield
        return
    me = (tf_config.task_type, tf_config.task_id)
    others = {
        f"{job}:{index}": address
        for job, addresses in tf_config.training_cluster.items()
        for index, address in enumerate(addresses)
        if (job, index) != me
    }
    watch = contextlib.nullcontext()
    if bound is not None:
        seconds, source = bound
        logging.info(
            "Strategy: waiting up to %.0f s (%s) for %s to join the %s cluster",
            seconds,
            source,
            ", ".join(others),
            kind,
        )
        watch = peers.watch_formation(
            others, seconds, {"task": f"{me[0]}:{me[1]}", "kind": kind, "source": source}
        )
    with watch:
        try:
            yield
        except tf.errors.OpError as e:
            lost = cluster.lost_peers(tf_config, str(e))
            who = ", ".join(cluster.task_label(tf_config, t) for t in lost) or "a peer"
            raise cluster.PeerLost(
                f"Strategy: {who} did not join the {kind} cluster of {me[0]}:{me[1]} "
                f"({cluster.first_line(e)}); every task of the cluster must be running: the job "
                "restarts its tasks or fails (kubeflow.max_restarts)"
            ) from e


def start_server(tf_config: TFConfig, start: bool = True) -> tf.distribute.Server:
    """Starts the gRPC server of a parameter-server cluster's worker or ps task.

    Args:
      tf_config: This task's validated `TF_CONFIG` (task type `worker` or `ps`).
      start: Start serving immediately.

    Returns:
      The server; `server.join()` serves until the process is killed (the
      TFJob operator stops workers and ps once the chief completes).
    """
    if tf_config.task_type not in ("worker", "ps"):
        _fail(
            f"{TF_CONFIG_ENV}.task.type",
            f"only worker and ps tasks run a server, not {tf_config.task_type!r}",
        )
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    # A worker runs one closure per coordinator thread plus its own ops; with
    # fewer inter-op threads than workers + 1 (few cores) the cluster
    # deadlocks. TensorFlow's parameter-server guide sizes it the same way.
    # The process-wide pool is set too, and for ps tasks as well: servers
    # sharing one process (an in-process test cluster) share that pool, and
    # whichever starts first fixes its size.
    threads = max(os.cpu_count() or 1, len(tf_config.cluster["worker"]) + 1)
    server_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads)
    try:
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        if tf.config.threading.get_inter_op_parallelism_threads() not in (0, threads):
            logging.warning(
                "Strategy: TensorFlow already runs with fewer inter-op threads than %d; the cluster may stall",
                threads,
            )
    return tf.distribute.Server(
        tf_config.cluster_spec(),
        job_name=tf_config.task_type,
        task_index=tf_config.task_id,
        protocol=tf_config.rpc_layer,
        config=server_config,
        start=start,
    )
