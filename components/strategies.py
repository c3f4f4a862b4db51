"""The `tf.distribute` strategy factory and `TF_CONFIG` handling (no TFX types).

`create_strategy(config.strategy)` turns the `strategy` config section into a
`StrategyChoice`: the strategy, this task's role in the cluster (trainer,
parameter-server/worker server, evaluator), whether it is the chief, and one
log line saying why this strategy was chosen.

Kinds:
  one_device: the first GPU, else the CPU.
  mirrored: synchronous replicas on this machine's GPUs, or on
    `strategy.num_cpu_devices` logical CPU devices when there is no GPU.
  multi_worker_mirrored: synchronous replicas on every worker of the
    `TF_CONFIG` cluster (collective all-reduce; ring or NCCL, packing from
    config). Without `TF_CONFIG` it runs as a one-worker cluster.
  parameter_server: asynchronous training; this task (the `chief`) is the
    coordinator, `worker` and `ps` tasks run a `tf.distribute.Server`.
  central_storage: variables on the CPU, compute replicated on local devices.
  tpu: `TPUStrategy` on the TPU `TPUClusterResolver` finds (`strategy.tpu`).
  auto: a TPU if one is resolvable; else a `TF_CONFIG` cluster with `ps` tasks
    means parameter_server, with several workers multi_worker_mirrored; else
    several local devices (GPUs, or configured logical CPUs) mean mirrored;
    else one_device.

Logical CPU devices must be configured before TensorFlow initialises its
runtime, so `create_strategy` is the first thing a trainer process should call.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import typing
from collections.abc import Mapping
from typing import Any

import tensorflow as tf
from absl import logging

from components.config import ConfigError, StrategyConfig, StrategyKind
from components.config.runtime import WHOLE_TASK_KINDS, whole_task_gpus_message

KINDS = typing.get_args(StrategyKind)
TASK_TYPES = ("chief", "worker", "ps", "evaluator")
TF_CONFIG_ENV = "TF_CONFIG"
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


class StrategyError(ConfigError):
    """The strategy cannot be built as configured; the message names the field and the fix."""


def _fail(path: str, message: str) -> Any:
    raise StrategyError(f"{path}: {message}")


# --------------------------------------------------------------------------- #
# TF_CONFIG
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class TFConfig:
    """A validated `TF_CONFIG`.

    Attributes:
      cluster: Job name (`chief`, `worker`, `ps`, `evaluator`) -> task
        addresses (`host:port`).
      task_type: This task's job name.
      task_id: This task's index in its job.
      rpc_layer: Protocol of the cluster (`grpc`).
    """

    cluster: dict[str, tuple[str, ...]]
    task_type: str
    task_id: int
    rpc_layer: str = "grpc"

    @property
    def num_workers(self) -> int:
        """Training workers: the chief and the workers (evaluators excluded)."""
        return len(self.cluster.get("chief", ())) + len(self.cluster.get("worker", ()))

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", ()))

    @property
    def has_ps(self) -> bool:
        return self.num_ps > 0

    @property
    def is_chief(self) -> bool:
        """The task that writes the model: `chief`, else worker 0 when there is no chief."""
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_id == 0 and "chief" not in self.cluster

    @property
    def training_cluster(self) -> dict[str, list[str]]:
        """The cluster without the evaluator, which trains nothing."""
        return {job: list(tasks) for job, tasks in self.cluster.items() if job != "evaluator"}

    def cluster_spec(self) -> tf.train.ClusterSpec:
        return tf.train.ClusterSpec(self.training_cluster)

    def cluster_resolver(self) -> tf.distribute.cluster_resolver.ClusterResolver:
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            self.cluster_spec(),
            task_type=self.task_type,
            task_id=self.task_id,
            rpc_layer=self.rpc_layer,
        )


_ADDRESS = re.compile(r"[^\s:/]+:[0-9]{1,5}")


def parse_tf_config(text: str | None) -> TFConfig | None:
    """Parses and validates a `TF_CONFIG` value.

    Args:
      text: The JSON text of `TF_CONFIG`; None, empty or `{}` means no cluster.

    Returns:
      The validated config, or None when there is no cluster.

    Raises:
      StrategyError: naming the offending `TF_CONFIG` field and the fix.
    """
    if text is None or not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return _fail(
            TF_CONFIG_ENV, f"is not valid JSON ({e}); set it to an object with 'cluster' and 'task'"
        )
    if not isinstance(data, dict):
        return _fail(
            TF_CONFIG_ENV,
            f"expected a JSON object with 'cluster' and 'task', got {type(data).__name__}",
        )
    if not data:
        return None
    unknown = sorted(set(data) - {"cluster", "task", "rpc_layer", "environment"})
    if unknown:
        _fail(
            f"{TF_CONFIG_ENV}.{unknown[0]}",
            "unknown key; allowed keys: cluster, task, rpc_layer, environment",
        )
    cluster = _parse_cluster(data.get("cluster"))
    task = data.get("task")
    if not isinstance(task, dict):
        return _fail(
            f"{TF_CONFIG_ENV}.task", f"expected an object with 'type' and 'index', got {task!r}"
        )
    task_type, task_id = task.get("type"), task.get("index", 0)
    if task_type not in TASK_TYPES:
        _fail(
            f"{TF_CONFIG_ENV}.task.type",
            f"unknown task type {task_type!r}; expected one of {list(TASK_TYPES)}",
        )
    if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
        _fail(f"{TF_CONFIG_ENV}.task.index", f"expected an integer >= 0, got {task_id!r}")
    if task_type == "evaluator" and "evaluator" not in cluster:
        # TensorFlow's own convention: the evaluator may be left out of the cluster.
        if task_id != 0:
            _fail(f"{TF_CONFIG_ENV}.task.index", f"there is one evaluator (index 0), got {task_id}")
    elif task_type not in cluster:
        _fail(
            f"{TF_CONFIG_ENV}.task.type",
            f"{task_type!r} has no tasks in TF_CONFIG.cluster ({sorted(cluster)}); add its addresses",
        )
    elif task_id >= len(cluster[task_type]):
        _fail(
            f"{TF_CONFIG_ENV}.task.index",
            f"{task_id} is out of range: TF_CONFIG.cluster.{task_type} lists {len(cluster[task_type])} task(s) "
            f"(valid indices 0..{len(cluster[task_type]) - 1})",
        )
    rpc_layer = data.get("rpc_layer", "grpc") or "grpc"
    if not isinstance(rpc_layer, str):
        _fail(f"{TF_CONFIG_ENV}.rpc_layer", f"expected a string such as 'grpc', got {rpc_layer!r}")
    tf_config = TFConfig(cluster=cluster, task_type=task_type, task_id=task_id, rpc_layer=rpc_layer)
    if tf_config.has_ps:
        if "chief" not in cluster:
            _fail(
                f"{TF_CONFIG_ENV}.cluster.chief",
                "the parameter-server strategy needs a 'chief' task (the coordinator that runs the Trainer); "
                "add one (a TFJob's Chief replica)",
            )
        if "worker" not in cluster:
            _fail(
                f"{TF_CONFIG_ENV}.cluster.worker",
                "the parameter-server strategy needs at least one 'worker' task",
            )
    return tf_config


def _parse_cluster(cluster: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(cluster, dict) or not cluster:
        return _fail(
            f"{TF_CONFIG_ENV}.cluster",
            f"expected a non-empty object of job -> ['host:port', ...], got {cluster!r}",
        )
    out: dict[str, tuple[str, ...]] = {}
    for job, tasks in cluster.items():
        if job not in TASK_TYPES:
            _fail(
                f"{TF_CONFIG_ENV}.cluster.{job}",
                f"unknown job {job!r}; expected one of {list(TASK_TYPES)}",
            )
        if not isinstance(tasks, list) or not tasks:
            _fail(
                f"{TF_CONFIG_ENV}.cluster.{job}",
                f"expected a non-empty list of 'host:port' addresses, got {tasks!r}",
            )
        for i, address in enumerate(tasks):
            if not isinstance(address, str) or not _ADDRESS.fullmatch(address):
                _fail(
                    f"{TF_CONFIG_ENV}.cluster.{job}[{i}]",
                    f"expected a 'host:port' address, got {address!r}",
                )
        if len(set(tasks)) != len(tasks):
            _fail(f"{TF_CONFIG_ENV}.cluster.{job}", f"duplicate addresses in {tasks}")
        out[job] = tuple(tasks)
    for job in ("chief", "evaluator"):
        if len(out.get(job, ())) > 1:
            _fail(
                f"{TF_CONFIG_ENV}.cluster.{job}",
                f"expected at most one {job} task, got {len(out[job])}",
            )
    return out


def read_tf_config(environ: Mapping[str, str] | None = None) -> TFConfig | None:
    """Parses `TF_CONFIG` from the environment, or derives it on a TrainJob replica.

    `TF_CONFIG` as TFJob and Vertex AI set it wins; without it, a pod of a
    Kubeflow Trainer v2 TrainJob (JobSet variables set) gets the cluster
    `tf_config_from_jobset` derives, logged once.
    """
    environ = os.environ if environ is None else environ
    text = environ.get(TF_CONFIG_ENV)
    if not text:
        derived = tf_config_from_jobset(environ)
        if derived is not None:
            logging.info("TF_CONFIG derived from the JobSet environment: %s", json.dumps(derived))
            text = json.dumps(derived)
    return parse_tf_config(text)


# TrainJob replicated job -> TF_CONFIG job.
JOBSET_TASK_TYPES = {"node": "worker", "chief": "chief", "ps": "ps"}
DEFAULT_TF_PORT = 2222


def tf_config_from_jobset(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """`TF_CONFIG` of a TrainJob replica, from what its JobSet pod sees.

    JobSet names pod `p` of Job `j` of replicated job `R` in JobSet `S`
    `S-R-j-p`, reachable as `S-R-j-p.S` through the JobSet's headless
    service; tfxkit runtimes run one Indexed Job per replicated job, so a
    task's index is its pod's completion index. Replicated job `node` holds
    the workers (worker 0 is the chief unless a `chief` job exists), `chief`
    the parameter-server coordinator, `ps` the parameter servers. The
    variables are declared in `components.kubeflow.env`.

    Args:
      environ: The replica's environment.

    Returns:
      `{"cluster": ..., "task": {"type", "index"}}`, or None when no JobSet
      variable is set (a local run, a TFJob replica).

    Raises:
      StrategyError: naming the variable that is missing or inconsistent.
    """
    from components.kubeflow import env as kenv

    required = (kenv.JOBSET_NAME, kenv.REPLICATED_JOB, kenv.COMPLETION_INDEX, kenv.REPLICAS)
    present = [name for name in (*required, kenv.JOB_INDEX) if environ.get(name)]
    if not present:
        return None
    missing = [name for name in required if not environ.get(name)]
    if missing:
        how = {
            kenv.COMPLETION_INDEX: f"the downward API (annotation {kenv.COMPLETION_INDEX_ANNOTATION})",
            kenv.JOBSET_NAME: f"the downward API (label {kenv.JOBSET_NAME_LABEL})",
            kenv.REPLICATED_JOB: f"the downward API (label {kenv.REPLICATED_JOB_LABEL})",
            kenv.REPLICAS: "the Trainer step (TrainJob trainer.env and runtime patches)",
        }
        _fail(
            missing[0],
            f"not set, but this pod has {present[0]}: a TrainJob replica cannot derive TF_CONFIG without it "
            f"(set by {how[missing[0]]}); is the TrainJob's runtime a tfxkit runtime "
            "(python -m components.kubeflow.trainjob)?",
        )
    jobset, job = environ[kenv.JOBSET_NAME], environ[kenv.REPLICATED_JOB]
    counts: dict[str, int] = {}
    for part in environ[kenv.REPLICAS].split(","):
        name, _, number = part.partition("=")
        if name not in JOBSET_TASK_TYPES or not number.isdigit() or int(number) < 1:
            _fail(
                kenv.REPLICAS,
                f"expected replicated job counts such as 'chief=1,node=2,ps=1' (jobs {sorted(JOBSET_TASK_TYPES)}), "
                f"got {environ[kenv.REPLICAS]!r}",
            )
        counts[name] = int(number)
    if "node" not in counts:
        _fail(kenv.REPLICAS, f"lists no 'node' (worker) job: {environ[kenv.REPLICAS]!r}")
    if job not in counts:
        _fail(
            kenv.REPLICATED_JOB,
            f"this pod's replicated job {job!r} is not among {sorted(counts)} ({kenv.REPLICAS}); "
            "the runtime has a replicated job the strategy does not use",
        )
    index_text = environ[kenv.COMPLETION_INDEX]
    if not index_text.isdigit() or int(index_text) >= counts[job]:
        _fail(
            kenv.COMPLETION_INDEX,
            f"expected an index in [0, {counts[job]}) for replicated job {job!r}, got {index_text!r}",
        )
    job_index = environ.get(kenv.JOB_INDEX) or "0"
    if job_index != "0":
        _fail(
            kenv.JOB_INDEX,
            f"tfxkit runtimes run one Job per replicated job (replicas: 1), got Job index {job_index!r}",
        )
    runtime_pods = environ.get(kenv.RUNTIME_PODS)
    if runtime_pods and runtime_pods != str(counts[job]):
        field = "strategy.parameter_servers" if job == "ps" else "the chief"
        _fail(
            kenv.RUNTIME_PODS,
            f"the runtime runs {runtime_pods} {job!r} pod(s) but the step expects {counts[job]} ({field}); "
            "regenerate the runtime for this config (python -m components.kubeflow.trainjob --config ...)",
        )
    port = environ.get(kenv.TF_PORT) or str(DEFAULT_TF_PORT)
    if not port.isdigit():
        _fail(kenv.TF_PORT, f"expected a port number, got {port!r}")
    aliases = {}
    if environ.get(kenv.HOST_ALIASES):
        try:
            aliases = json.loads(environ[kenv.HOST_ALIASES])
        except ValueError as e:
            _fail(kenv.HOST_ALIASES, f"is not valid JSON ({e})")
    cluster: dict[str, list[str]] = {}
    for name, number in counts.items():
        addresses = [f"{jobset}-{name}-0-{i}.{jobset}:{port}" for i in range(number)]
        cluster[JOBSET_TASK_TYPES[name]] = [aliases.get(a, a) for a in addresses]
    task = {"type": JOBSET_TASK_TYPES[job], "index": int(index_text)}
    return {"cluster": cluster, "task": task}


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
        bytes_per_pack=config.all_reduce_pack_bytes, implementation=implementation
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
