"""Multi-worker training on Kubeflow through the Training Operator's (v1) TFJob.

`build_manifest` builds the TFJob (`replica_counts`, `restart_policy`) and `BACKEND` is
its `Backend`, chosen by `kubeflow.job_backend: tfjob`; the operator gives every replica
its `TF_CONFIG`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.config import ConfigError, PipelineConfig, Placement, StrategyConfig
from components.kubernetes import env as tfxkit_env
from components.kubernetes.backend import (
    REPLICA_COMMAND,
    Backend,
    JobStatus,
    Restart,
    job_labels,
    latest_condition,
    replica_placement,
    require_multi_worker,
    runs_tfdata_service,
)
from components.kubernetes.placement import REPLICA_DEFAULT_REQUESTS, container, pod_spec

GROUP = "kubeflow.org"
VERSION = "v1"
PLURAL = "tfjobs"
KIND = "TFJob"
# The operator finds the TensorFlow container by this name and opens this port.
CONTAINER_NAME = "tensorflow"
PORT_NAME = "tfjob-port"
DEFAULT_PORT = 2222
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


def replica_counts(strategy: StrategyConfig) -> dict[str, int]:
    """TFJob replica type -> replicas for a multi-worker strategy ({} otherwise)."""
    if strategy.kind == "multi_worker_mirrored":
        return {"Worker": strategy.workers}
    if strategy.kind == "parameter_server":
        counts = {"Chief": 1, "Worker": strategy.workers}
        if strategy.parameter_servers:
            counts["PS"] = strategy.parameter_servers
        return counts
    return {}


def restart_policy(strategy: StrategyConfig, replica_type: str) -> str:
    """The TFJob `restartPolicy` of a replica type.

    The Training Operator restarts one replica at a time, never the group.
    `OnFailure` (the container restarts in place, counted against
    `runPolicy.backoffLimit`) where a fault makes a replica exit with an
    ordinary error code: every `multi_worker_mirrored` worker (survivors of a
    lost peer fail their collectives; each restarts, and together they
    re-form the group from the last backup) and the `parameter_server`
    chief (it fails when a parameter server is lost and resumes from the
    checkpoint). `ExitCode` for parameter-server workers and parameter
    servers, which only fail when killed (retryable exit codes such as 137
    recreate the pod) and so fail the job at once on a program error.
    """
    if strategy.kind == "multi_worker_mirrored" or replica_type == "Chief":
        return "OnFailure"
    return "ExitCode"


def _pod_template(
    placement: Placement,
    image: str,
    env: Mapping[str, str],
    labels: Mapping[str, str],
    service_account: str,
) -> dict[str, Any]:
    replica = container(
        placement,
        name=CONTAINER_NAME,
        image=image,
        command=REPLICA_COMMAND,
        env=env,
        ports=[{"name": PORT_NAME, "containerPort": DEFAULT_PORT}],
        default_requests=REPLICA_DEFAULT_REQUESTS,
    )
    return {
        # An Istio sidecar never exits, so a finished replica would never complete.
        "metadata": {"labels": dict(labels), "annotations": {"sidecar.istio.io/inject": "false"}},
        "spec": pod_spec(placement, [replica], service_account=service_account),
    }


def build_manifest(
    config: PipelineConfig,
    *,
    name: str,
    namespace: str,
    component_id: str,
    invocation_uri: str,
    placement_id: str = "",
) -> dict[str, Any]:
    """The TFJob for the Trainer `component_id` of `config`.

    Chief and workers use the component's placement (image, resources,
    accelerator, node selector, tolerations); parameter servers use
    `kubeflow.tfjob_ps_placement`, or the same image on the default pool.
    Every replica requests CPU and memory (`REPLICA_DEFAULT_REQUESTS` where
    its placement sets none).

    Args:
      config: The validated pipeline config (its strategy must use a TFJob).
      name: TFJob name.
      namespace: TFJob namespace.
      component_id: The pipeline component that trains (labels).
      invocation_uri: Where replicas read the step's invocation.
      placement_id: The `kubeflow.placements` key of the replicas' placement
        ('' = `component_id`; see `backend.replica_placement`).

    Raises:
      ConfigError: if the strategy cannot form a multi-worker cluster, or
        `ingestion.service.dispatcher` is `kubeflow` (only a TrainJob runs the
        tf.data service).
    """
    if runs_tfdata_service(config.ingestion.service):
        raise ConfigError(
            "kubeflow.job_backend: 'tfjob' cannot run the tf.data service of ingestion.service.dispatcher "
            "'kubeflow' (a TFJob holds only Chief, Worker, PS and Evaluator replicas); set "
            "kubeflow.job_backend: trainjob, or give ingestion.service.dispatcher the host:port of a "
            "dispatcher you run"
        )
    require_multi_worker(config.strategy, KIND)
    counts = replica_counts(config.strategy)
    kf = config.kubeflow
    placement = replica_placement(config, component_id, placement_id)
    image = placement.image or kf.image
    ps_placement = kf.tfjob_ps_placement or Placement()
    labels = job_labels(config, component_id)
    env = tfxkit_env.replica_env(invocation_uri)
    replica_specs = {}
    for replica_type, replicas in counts.items():
        pool = ps_placement if replica_type == "PS" else placement
        replica_specs[replica_type] = {
            "replicas": replicas,
            "restartPolicy": restart_policy(config.strategy, replica_type),
            "template": _pod_template(
                pool, pool.image or image, env, labels, kf.tfjob_service_account
            ),
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "runPolicy": {
                # Parameter servers never exit by themselves: remove running
                # pods once the chief decides the job's outcome.
                "cleanPodPolicy": "Running",
                "backoffLimit": kf.max_restarts,
                "activeDeadlineSeconds": kf.tfjob_timeout_seconds,
            },
            "tfReplicaSpecs": replica_specs,
        },
    }


def _status(obj: Mapping[str, Any]) -> JobStatus:
    last = latest_condition(obj)
    replicas = {
        rtype: {k: int(rs.get(k) or 0) for k in ("active", "succeeded", "failed")}
        for rtype, rs in sorted(((obj.get("status") or {}).get("replicaStatuses") or {}).items())
    }
    phase = last.get("type", "")
    return JobStatus(
        phase,
        last.get("reason", ""),
        last.get("message", ""),
        replicas,
        outcome=phase if phase in ("Succeeded", "Failed") else "",
    )


def _restart(obj: Mapping[str, Any], companion: Mapping[str, Any] | None) -> Restart:
    # The operator sets `Restarting` (reason TFJobRestarting, "... is restarting
    # because 1 Worker replica(s) failed.") each time it recreates a failed
    # replica; the condition is updated in place, so its transition time
    # marks each one. In-place restarts (`OnFailure`) show in the pods only.
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Restarting" and cond.get("status") == "True":
            marker = f"{cond.get('lastTransitionTime', '')} {cond.get('message', '')}"
            return Restart(marker, cond.get("message") or cond.get("reason", ""))
    return Restart()


def _replica_of(labels: Mapping[str, str]) -> str:
    rtype = labels.get(REPLICA_TYPE_LABEL, "")
    index = labels.get(REPLICA_INDEX_LABEL, "")
    return f"{rtype.capitalize()} {index}".strip()


def _shape(manifest: Mapping[str, Any]) -> str:
    specs = manifest["spec"]["tfReplicaSpecs"]
    return ", ".join(f"{rtype} x{spec['replicas']}" for rtype, spec in specs.items())


BACKEND = Backend(
    name="tfjob",
    build_manifest=build_manifest,
    kind=KIND,
    group=GROUP,
    version=VERSION,
    plural=PLURAL,
    controller="the training operator",
    pod_label=JOB_NAME_LABEL,
    status=_status,
    shape=_shape,
    missing_hint="is the Kubeflow Training Operator (TFJob CRD) installed? On Kubeflow Trainer v2 "
    "use kubeflow.job_backend: trainjob",
    rbac_file="kubeflow/tfjob-rbac.yaml",
    restart=_restart,
    replica_of=_replica_of,
)
