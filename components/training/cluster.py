"""The training cluster: `TF_CONFIG` and the cluster a TrainJob replica derives.

`parse_tf_config` validates a `TF_CONFIG` into a `TFConfig`, `tf_config_from_jobset`
derives one from a TrainJob replica's JobSet variables and `read_tf_config` reads either;
`lost_peers` names the tasks a failure lost, and `PeerLost` is the error naming them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from components.config import ConfigError
from components.kubernetes import env as kenv
from components.training import peers

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
TF_CONFIG_ENV = "TF_CONFIG"


class StrategyError(ConfigError):
    """The strategy cannot be built as configured; the message names the field and the fix.

    Raised for a malformed or inconsistent cluster (`TF_CONFIG`, JobSet
    variables) as well as by `components.training.strategies`, since either stops the
    strategy from being built.
    """


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


# --------------------------------------------------------------------------- #
# TF_CONFIG derived from a TrainJob's JobSet environment
# --------------------------------------------------------------------------- #


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
    variables are declared in `components.kubernetes.env`.

    Args:
      environ: The replica's environment.

    Returns:
      `{"cluster": ..., "task": {"type", "index"}}`, or None when no JobSet
      variable is set (a local run, a TFJob replica).

    Raises:
      StrategyError: naming the variable that is missing or inconsistent.
    """
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
            "(python -m components.kubernetes.trainjob)?",
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
            "regenerate the runtime for this config (python -m components.kubernetes.trainjob --config ...)",
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
# Lost peers
# --------------------------------------------------------------------------- #


class PeerLost(RuntimeError):
    """A task of the training cluster is gone or never joined; the message names it.

    Raised in place of TensorFlow's error (kept as `__cause__`), whose text
    names tasks as `/job:worker/replica:0/task:1`, or none at all (a
    collective that timed out).
    """


Task = tuple[str, int]
# How TensorFlow's errors name a task: `/job:worker/replica:0/task:1`.
_TASK_IN_TEXT = re.compile(r"/job:(chief|worker|ps)/replica:\d+/task:(\d+)")


def task_label(tf_config: TFConfig, task: Task) -> str:
    """`worker:1 (host:port)`: a task as `TF_CONFIG` lists it."""
    job, index = task
    return f"{job}:{index} ({tf_config.cluster[job][index]})"


def mentioned_tasks(text: str, tf_config: TFConfig) -> list[Task]:
    """The other training tasks of the cluster that `text` names, in order of mention."""
    found: list[Task] = []
    for job, index_text in _TASK_IN_TEXT.findall(text):
        task = (job, int(index_text))
        if (
            task != (tf_config.task_type, tf_config.task_id)
            and task[1] < len(tf_config.cluster.get(job, ()))
            and task not in found
        ):
            found.append(task)
    return found


def unreachable_tasks(tf_config: TFConfig, tasks: Sequence[Task] | None = None) -> list[Task]:
    """Which of `tasks` (default: every other training task) accept no connection, probed at once."""
    if tasks is None:
        tasks = [
            (job, index)
            for job, addresses in tf_config.training_cluster.items()
            for index in range(len(addresses))
            if (job, index) != (tf_config.task_type, tf_config.task_id)
        ]
    addresses = {f"{job}:{index}": tf_config.cluster[job][index] for job, index in tasks}
    down = set(peers.unreachable(addresses))
    return [task for task in tasks if f"{task[0]}:{task[1]}" in down]


def lost_peers(tf_config: TFConfig, text: str) -> list[Task]:
    """The tasks to blame for an error with this text.

    The tasks TensorFlow's message names, narrowed to those that accept no
    connection when some do not (a message may name a healthy task too);
    when it names none, every other task that accepts no connection. Empty
    when every peer answers: one is alive but stuck.
    """
    named = mentioned_tasks(text, tf_config)
    if named:
        return unreachable_tasks(tf_config, named) or named
    return unreachable_tasks(tf_config)


def first_line(error: BaseException, limit: int = 300) -> str:
    """`Type: the cause in TensorFlow's message`, shortened (its messages run to pages).

    A graph execution error starts with the op's Python traceback; the cause
    is the first line after it.
    """
    skip = (
        "Graph execution error",
        "Detected at node",
        "File ",
        "[[",
        "The error could be from a previous operation",
    )
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    body = [line for line in lines if not line.startswith(skip)]
    head = (body or lines or [""])[0]
    head = head if len(head) <= limit else head[: limit - 3] + "..."
    return f"{type(error).__name__}: {head}"
