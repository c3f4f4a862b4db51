"""Multi-worker training on Kubeflow through the Training Operator's TFJob.

No TFX types. The Trainer step (see `components.trainer.executor`) hands this
module a JSON-serialisable invocation; `launch` writes it next to the model
run artifact (shared by URI), builds a TFJob whose chief / worker / ps
replicas run the same image and the Trainer executor's entry point on it,
submits the job through the `kubernetes` client, waits with a bounded
timeout, and deletes it on success or timeout. The operator gives every
replica its `TF_CONFIG`. Pods are placed by `components.kubeflow.placement`
and the variables replicas read are declared in `components.kubeflow.env`.

Replica layout per strategy (`strategy.kind`):
  multi_worker_mirrored: `Worker` x workers (worker 0 is the chief).
  parameter_server: `Chief` x 1 (the coordinator), `Worker` x workers,
    `PS` x parameter_servers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from components.config import ConfigError, PipelineConfig, Placement, StrategyConfig
from components.kubeflow import env as tfxkit_env
from components.kubeflow.placement import container, pod_spec

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

# Replicas find the step's invocation (artifacts and exec properties) in
# this file, whose URI they get in `env.TFJOB_INVOCATION`.
INVOCATION_FILE = "tfjob_invocation.json"
REPLICA_COMMAND = ("python", "-m", "components.trainer.executor")

MULTI_WORKER_KINDS = ("multi_worker_mirrored", "parameter_server")
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class TFJobError(RuntimeError):
    """The TFJob could not be submitted or watched."""


class TFJobFailed(TFJobError):
    """The TFJob ran and failed; the message carries replica status and reasons."""


class TFJobTimeout(TFJobError):
    """The TFJob did not finish within the configured bound (and was deleted)."""


# --------------------------------------------------------------------------- #
# Shape
# --------------------------------------------------------------------------- #


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


def uses_tfjob(strategy: StrategyConfig) -> bool:
    """Whether the Trainer trains across pods (a TFJob) when it runs on Kubeflow."""
    return sum(replica_counts(strategy).values()) > 1


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
    if strategy.kind == "parameter_server" and strategy.parameter_servers < 1:
        raise ConfigError(
            f"{path}.parameter_servers: kind 'parameter_server' on Kubeflow needs >= 1 parameter server "
            f"(got {strategy.parameter_servers}) beside its {strategy.workers} worker(s)"
        )


def job_name(pipeline_name: str, component_id: str, suffix: str | None = None) -> str:
    """A DNS-1123 TFJob name, short enough for the operator's per-replica services."""
    base = (
        re.sub(r"[^a-z0-9-]+", "-", f"{pipeline_name}-{component_id}".lower())
        .strip("-")[:36]
        .strip("-")
    )
    return f"{base or 'tfxkit'}-{suffix or uuid.uuid4().hex[:8]}"


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
) -> dict[str, Any]:
    """The TFJob for the Trainer `component_id` of `config`.

    Chief and workers use the component's placement (image, resources,
    accelerator, node selector, tolerations); parameter servers use
    `kubeflow.tfjob_ps_placement`, or the same image on the default pool.

    Args:
      config: The validated pipeline config (its strategy must use a TFJob).
      name: TFJob name.
      namespace: TFJob namespace.
      component_id: The pipeline component that trains (placement key).
      invocation_uri: Where replicas read the step's invocation.

    Raises:
      ConfigError: if the strategy cannot form a multi-worker cluster.
    """
    check_strategy(config.strategy)
    counts = replica_counts(config.strategy)
    if not counts:
        raise ConfigError(
            f"strategy.kind: {config.strategy.kind!r} trains in one pod; a TFJob needs one of {list(MULTI_WORKER_KINDS)}"
        )
    kf = config.kubeflow
    placement = kf.placements.get(component_id, Placement())
    image = placement.image or kf.image
    ps_placement = kf.tfjob_ps_placement or Placement()
    labels = {
        "app.kubernetes.io/name": "tfxkit",
        "tfxkit/pipeline": config.name[:63],
        "tfxkit/component": component_id[:63],
    }
    env = tfxkit_env.replica_env(invocation_uri)
    replica_specs = {}
    for replica_type, replicas in counts.items():
        pool = ps_placement if replica_type == "PS" else placement
        replica_specs[replica_type] = {
            "replicas": replicas,
            # ExitCode: restart on retryable exit codes (preemption, OOM-kill
            # signals) and fail at once on program errors.
            "restartPolicy": "ExitCode",
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
                "backoffLimit": kf.tfjob_backoff_limit,
                "activeDeadlineSeconds": kf.tfjob_timeout_seconds,
            },
            "tfReplicaSpecs": replica_specs,
        },
    }


# --------------------------------------------------------------------------- #
# Status
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """What the operator reports about a TFJob.

    Attributes:
      phase: The latest true condition (`Created`, `Running`, `Restarting`,
        `Succeeded`, `Failed`, ...), '' before the operator has seen the job.
      reason: That condition's reason.
      message: That condition's message.
      replicas: Replica type -> {"active", "succeeded", "failed"} counts.
    """

    phase: str = ""
    reason: str = ""
    message: str = ""
    replicas: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> JobStatus:
        status = obj.get("status") or {}
        true = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
        last = true[-1] if true else {}
        replicas = {
            rtype: {k: int(rs.get(k) or 0) for k in ("active", "succeeded", "failed")}
            for rtype, rs in sorted((status.get("replicaStatuses") or {}).items())
        }
        return cls(last.get("type", ""), last.get("reason", ""), last.get("message", ""), replicas)

    @property
    def done(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def summary(self) -> str:
        parts = [
            f"{rtype}: {c['active']} active, {c['succeeded']} succeeded, {c['failed']} failed"
            for rtype, c in self.replicas.items()
        ]
        head = self.phase or "Pending (not yet seen by the training operator)"
        if self.message:
            head += f" ({self.message})"
        return head + ("; " + "; ".join(parts) if parts else "")


def pod_reasons(core_api, namespace: str, name: str) -> list[str]:
    """Why the job's pods are failing or waiting, one line per pod ([] if unreadable)."""
    from kubernetes.client.rest import ApiException

    try:
        pods = core_api.list_namespaced_pod(namespace, label_selector=f"{JOB_NAME_LABEL}={name}")
    except ApiException:
        # Reading pods is a diagnostic nicety; the job's own status still decides.
        return []
    lines = []
    for pod in sorted(pods.items, key=lambda p: p.metadata.name):
        found = []
        for cs in pod.status.container_statuses or []:
            if cs.state and cs.state.terminated and cs.state.terminated.exit_code:
                t = cs.state.terminated
                found.append(
                    f"{cs.name} terminated: {t.reason or 'Error'} (exit code {t.exit_code}){': ' + t.message.strip() if t.message else ''}"
                )
            elif (
                cs.state
                and cs.state.waiting
                and cs.state.waiting.reason not in (None, "ContainerCreating")
            ):
                w = cs.state.waiting
                found.append(
                    f"{cs.name} waiting: {w.reason}{': ' + w.message if w.message else ''}"
                )
        for cond in pod.status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                found.append(f"unschedulable: {cond.message or cond.reason}")
        if found:
            lines.append(f"pod {pod.metadata.name} ({pod.status.phase}): " + "; ".join(found))
    return lines


# --------------------------------------------------------------------------- #
# Submit, wait, delete
# --------------------------------------------------------------------------- #


def run(
    manifest: Mapping[str, Any],
    api_client,
    *,
    timeout_seconds: float,
    poll_seconds: float = 10.0,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobStatus:
    """Submits a TFJob, waits for it, and deletes it on success or timeout.

    A failed job is kept so that its pods' logs stay readable.

    Args:
      manifest: The TFJob (see `build_manifest`).
      api_client: A `kubernetes.client.ApiClient`.
      timeout_seconds: Bound on the wait, from submission.
      poll_seconds: Interval between status reads.
      log: Receives one line per status change.
      clock, sleep: Time sources (monotonic seconds).

    Returns:
      The final status (phase `Succeeded`).

    Raises:
      TFJobFailed: the job failed; the message has replica status and reasons.
      TFJobTimeout: the job did not finish in time; it was deleted.
      TFJobError: the API refused the submission or the job vanished.
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    name = manifest["metadata"]["name"]
    namespace = manifest["metadata"]["namespace"]
    where = f"TFJob {namespace}/{name}"
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, dict(manifest))
    except ApiException as e:
        hint = ""
        if e.status == 404:
            hint = "; is the Kubeflow Training Operator (TFJob CRD) installed?"
        elif e.status == 403:
            hint = "; the step's service account needs create/get/delete on tfjobs.kubeflow.org (kubeflow/tfjob-rbac.yaml)"
        raise TFJobError(
            f"{where}: submission refused: {e.status} {e.reason}: {_api_message(e)}{hint}"
        ) from e
    log(f"{where}: submitted ({_shape(manifest)})")
    deadline = clock() + timeout_seconds
    last = None
    status = JobStatus()
    while True:
        try:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            status = JobStatus.from_object(obj)
        except ApiException as e:
            if e.status == 404:
                raise TFJobError(
                    f"{where}: the job disappeared while it was being watched (deleted by someone else?)"
                ) from e
            if e.status < 500:
                raise TFJobError(
                    f"{where}: cannot read its status: {e.status} {e.reason}: {_api_message(e)}"
                ) from e
            # A busy API server is transient: keep watching until the deadline.
            log(f"{where}: status read failed ({e.status} {e.reason}); retrying")
        if status.summary() != last:
            last = status.summary()
            log(f"{where}: {last}")
        if status.phase == "Succeeded":
            _delete(custom, namespace, name, log, where)
            return status
        if status.phase == "Failed":
            reasons = pod_reasons(core, namespace, name)
            raise TFJobFailed(
                f"{where} failed: {status.summary()}"
                + "".join(f"\n  {r}" for r in reasons)
                + f"\n  (kept for inspection: kubectl -n {namespace} describe tfjob {name})"
            )
        remaining = deadline - clock()
        if remaining <= 0:
            reasons = pod_reasons(core, namespace, name)
            _delete(custom, namespace, name, log, where)
            raise TFJobTimeout(
                f"{where} did not finish within kubeflow.tfjob_timeout_seconds={timeout_seconds:g}: "
                f"{status.summary()}"
                + "".join(f"\n  {r}" for r in reasons)
                + "\n  (the job was deleted)"
            )
        sleep(min(poll_seconds, remaining))


def _delete(custom, namespace: str, name: str, log, where: str) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        custom.delete_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            body=client.V1DeleteOptions(propagation_policy="Background"),
        )
        log(f"{where}: deleted")
    except ApiException as e:
        if e.status != 404:
            log(
                f"{where}: delete failed ({e.status} {e.reason}); remove it with kubectl -n {namespace} delete tfjob {name}"
            )


def _api_message(e) -> str:
    try:
        return json.loads(e.body).get("message", e.body)
    except (TypeError, ValueError, AttributeError):
        return str(e.body or "")


def _shape(manifest: Mapping[str, Any]) -> str:
    specs = manifest["spec"]["tfReplicaSpecs"]
    return ", ".join(f"{rtype} x{spec['replicas']}" for rtype, spec in specs.items())


# --------------------------------------------------------------------------- #
# The Trainer step's side
# --------------------------------------------------------------------------- #


def should_launch(config: PipelineConfig, environ: Mapping[str, str]) -> bool:
    """Whether this Trainer step runs on Kubeflow and must train through a TFJob."""
    return tfxkit_env.on_kubeflow(environ) and uses_tfjob(config.strategy)


def write_invocation(invocation: Mapping[str, Any], directory: str) -> str:
    """Writes the step's invocation where every replica can read it; returns its URI."""
    tf.io.gfile.makedirs(directory)
    uri = f"{directory.rstrip('/')}/{INVOCATION_FILE}"
    with tf.io.gfile.GFile(uri, "w") as f:
        f.write(json.dumps(invocation, sort_keys=True))
    return uri


def read_invocation(uri: str) -> dict[str, Any]:
    with tf.io.gfile.GFile(uri, "r") as f:
        return json.loads(f.read())


def current_namespace(config: PipelineConfig) -> str:
    """`kubeflow.namespace`, or the namespace of the pod this runs in."""
    if config.kubeflow.namespace:
        return config.kubeflow.namespace
    if os.path.exists(SERVICE_ACCOUNT_NAMESPACE_FILE):
        with open(SERVICE_ACCOUNT_NAMESPACE_FILE) as f:
            return f.read().strip()
    raise ConfigError(
        "kubeflow.namespace: empty and this pod has no service-account namespace; set the TFJob namespace"
    )


def kubernetes_api_client():
    """An API client from the pod's service account, or from ~/.kube/config outside a cluster."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        # Read KUBECONFIG now: the client's default was fixed when it was imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.ApiClient()


def launch(
    config: PipelineConfig,
    invocation: Mapping[str, Any],
    shared_dir: str,
    environ: Mapping[str, str],
    api_client=None,
    *,
    poll_seconds: float = 10.0,
    log: Callable[[str], None] = print,
) -> JobStatus:
    """Runs the Trainer's training as a TFJob and waits for it.

    Args:
      config: The validated pipeline config.
      invocation: JSON-serialisable inputs, outputs and exec properties of
        the step; replicas run the Trainer executor on them.
      shared_dir: A URI every replica can read (the model run artifact).
      environ: The step's environment (component id).
      api_client: A `kubernetes.client.ApiClient` (default: in-cluster).
      poll_seconds: Interval between status reads.
      log: Receives progress lines.

    Returns:
      The final job status.
    """
    component_id = tfxkit_env.component_id(environ)
    uri = write_invocation(invocation, shared_dir)
    manifest = build_manifest(
        config,
        name=job_name(config.name, component_id),
        namespace=current_namespace(config),
        component_id=component_id,
        invocation_uri=uri,
    )
    return run(
        manifest,
        api_client if api_client is not None else kubernetes_api_client(),
        timeout_seconds=config.kubeflow.tfjob_timeout_seconds,
        poll_seconds=poll_seconds,
        log=log,
    )
