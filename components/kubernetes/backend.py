"""What a training-job backend is, and the job shape every backend shares.

`Backend` describes a backend (how to build its job, its resource coordinates, status and
pods); `job_labels`, `replica_placement`, `JobStatus` and the rest are the shared pieces.
It imports no backend, so backends import it without reaching into the job runner.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from components.config import ConfigError, PipelineConfig, Placement, StrategyConfig
from components.config.runtime import KUBEFLOW_DISPATCHER, ServiceConfig

# What every replica runs: the Trainer executor on the step's invocation.
REPLICA_COMMAND = ("python", "-m", "components.trainer.executor")
MULTI_WORKER_KINDS = ("multi_worker_mirrored", "parameter_server")
# Job names are DNS-1035 labels (TrainJob's admission rule; TFJob's services are labels too).
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


# --------------------------------------------------------------------------- #
# Shape
# --------------------------------------------------------------------------- #


def runs_tfdata_service(service: ServiceConfig | None) -> bool:
    """Whether the training job runs the tf.data service (`ingestion.service.dispatcher: kubeflow`)."""
    return service is not None and service.dispatcher == KUBEFLOW_DISPATCHER


def uses_job(strategy: StrategyConfig, service: ServiceConfig | None = None) -> bool:
    """Whether the Trainer trains through a training job when it runs on Kubeflow.

    It does when it trains across pods, and whatever the strategy when the
    job runs its tf.data service (`service`, `ingestion.service`, with
    dispatcher `kubeflow`): one trainer pod and CPU input pods beside it.
    """
    if runs_tfdata_service(service):
        return True
    if strategy.kind == "multi_worker_mirrored":
        return strategy.workers > 1
    return strategy.kind == "parameter_server"


def check_strategy(strategy: StrategyConfig, path: str = "strategy") -> None:
    """Rejects multi-worker strategies that cannot form a cluster on Kubeflow.

    Raises:
      ConfigError: naming the field to fix.
    """
    if strategy.kind == "multi_worker_mirrored" and strategy.workers < 2:
        raise ConfigError(
            f"{path}.workers: kind 'multi_worker_mirrored' on Kubeflow needs workers >= 2 "
            f"(got {strategy.workers}); one replica is one pod: use kind 'mirrored' or 'one_device'"
        )
    if strategy.kind == "multi_worker_mirrored" and strategy.parameter_servers:
        raise ConfigError(
            f"{path}.parameter_servers: kind 'multi_worker_mirrored' runs no parameter servers "
            f"(got {strategy.parameter_servers}); set it to 0 or use kind 'parameter_server'"
        )
    if strategy.kind == "parameter_server" and strategy.parameter_servers < 1:
        raise ConfigError(
            f"{path}.parameter_servers: kind 'parameter_server' on Kubeflow needs >= 1 parameter server "
            f"(got {strategy.parameter_servers}) beside its {strategy.workers} worker(s)"
        )


def require_multi_worker(
    strategy: StrategyConfig, kind: str, service: ServiceConfig | None = None
) -> None:
    """`check_strategy`, and a strategy that trains in one pod is refused for a `kind` job.

    With the tf.data service in the job (`runs_tfdata_service(service)`) a
    strategy that trains in one pod is a job of one trainer.
    """
    check_strategy(strategy)
    if strategy.kind not in MULTI_WORKER_KINDS and not runs_tfdata_service(service):
        raise ConfigError(
            f"strategy.kind: {strategy.kind!r} trains in one pod; a {kind} needs one of {list(MULTI_WORKER_KINDS)}"
        )


def label_value(value: str) -> str:
    """`value` as a valid Kubernetes label value (63 characters, alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:63].strip("-_.")


def job_labels(config: PipelineConfig, component_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "tfxkit",
        "tfxkit/pipeline": label_value(config.name),
        "tfxkit/component": label_value(component_id),
    }


def replica_placement(
    config: PipelineConfig, component_id: str, placement_id: str = ""
) -> Placement:
    """The placement of a training step's job replicas.

    Args:
      config: The validated pipeline config.
      component_id: The pipeline component that trains.
      placement_id: The `kubeflow.placements` key the compiler chose for the
        step (`env.PLACEMENT_ID`: the step's own entry, else the teacher
        Trainer's); '' = `component_id`.

    Returns:
      That entry, or an empty `Placement` (the default pool) without one.
    """
    return config.kubeflow.placements.get(placement_id or component_id, Placement())


# --------------------------------------------------------------------------- #
# Backends and status
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """What a job's controller reports.

    Attributes:
      phase: The latest true condition (`Created`, `Running`, `Succeeded`,
        `Complete`, `Failed`, ...), '' before the controller has seen the job.
      reason: That condition's reason.
      message: That condition's message.
      replicas: Replica type (TFJob) or replicated job (TrainJob) -> counts
        (`active`, `succeeded`, `failed`, ...).
      outcome: `Succeeded`, `Failed`, or '' while the job runs.
    """

    phase: str = ""
    reason: str = ""
    message: str = ""
    replicas: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    outcome: str = ""

    @property
    def done(self) -> bool:
        return bool(self.outcome)

    def summary(self, controller: str = "the controller") -> str:
        parts = [
            f"{rtype}: " + ", ".join(f"{n} {k}" for k, n in counts.items())
            for rtype, counts in self.replicas.items()
        ]
        head = self.phase or f"Pending (not yet seen by {controller})"
        if self.message:
            head += f" ({self.message})"
        return head + ("; " + "; ".join(parts) if parts else "")


def latest_condition(obj: Mapping[str, Any]) -> dict[str, Any]:
    status = obj.get("status") or {}
    true = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    return true[-1] if true else {}


@dataclasses.dataclass(frozen=True)
class Restart:
    """What a job's controller shows of its latest restart.

    Attributes:
      marker: Changes with every restart ('' before the first one).
      detail: What restarted and why, for the log.
      count: Restarts so far, when the controller counts them (0: it does not).
    """

    marker: str = ""
    detail: str = ""
    count: int = 0


@dataclasses.dataclass(frozen=True)
class Companion:
    """An object the controller creates under the job's name whose status the wait reads too.

    Attributes:
      group, version, plural: Its resource.
    """

    group: str
    version: str
    plural: str


@dataclasses.dataclass(frozen=True)
class Backend:
    """One job kind: how to build it, where it lives in the API and how to read it.

    Attributes:
      name: Its `kubeflow.job_backend` value (`trainjob`, `tfjob`).
      build_manifest: The job for a config (keyword arguments `name`,
        `namespace`, `component_id`, `invocation_uri`, optional
        `placement_id`, see `replica_placement`).
      kind, group, version, plural: The custom resource.
      controller: Who runs it (in messages).
      pod_label: The label its controller puts on the job's pods (value: the job name).
      status: Reads a `JobStatus` from the job object.
      shape: One line naming the replicas of a manifest.
      missing_hint: Why the API may not know the resource (HTTP 404).
      rbac_file: The shipped RBAC manifest the step's service account needs.
      restart: Reads the latest restart from the job object and its
        companion's (None when the companion cannot be read).
      replica_of: Names a pod's replica from its labels (`Worker 1`, `node 0`).
      companion: An object read beside the job for `restart` (None: none).
    """

    name: str
    build_manifest: Callable[..., dict[str, Any]]
    kind: str
    group: str
    version: str
    plural: str
    controller: str
    pod_label: str
    status: Callable[[Mapping[str, Any]], JobStatus]
    shape: Callable[[Mapping[str, Any]], str]
    missing_hint: str
    rbac_file: str
    restart: Callable[[Mapping[str, Any], Mapping[str, Any] | None], Restart]
    replica_of: Callable[[Mapping[str, str]], str]
    companion: Companion | None = None
