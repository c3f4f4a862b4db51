"""Multi-pod training jobs on Kubeflow: what both backends share (no TFX types).

`launch` writes the step's invocation next to the model artifact, has the configured
backend build the job, submits it, waits (bounded), reports per-replica status and
deletes it unless it failed. `BACKENDS` is the one list of backends, looked up by
`kubeflow.job_backend` (`backend_named`) or by manifest kind (`backend_of`).
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

from components.config import ConfigError, PipelineConfig
from components.kubernetes import env as tfxkit_env
from components.kubernetes import tfjob, trainjob
from components.kubernetes.backend import DNS_1035, Backend, JobStatus, Restart, uses_job

# Replicas find the step's invocation (artifacts and exec properties) in
# this file, whose URI they get in `env.TFJOB_INVOCATION`.
INVOCATION_FILE = "tfjob_invocation.json"
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# Job names: a DNS-1035 label (TrainJob's admission rule; TFJob's services
# are labels too), short enough that the longest derived name (`<job>-data-worker-0-<pod>`
# for JobSet pods, up to 1000 tf.data service workers; `<job>-worker-<i>` for TFJob
# services) stays within 63.
JOB_NAME_BASE_MAX = 36


class JobError(RuntimeError):
    """The training job could not be submitted or watched."""


class JobFailed(JobError):
    """The training job ran and failed; the message carries replica status and reasons."""


class JobTimeout(JobError):
    """The training job did not finish within the configured bound (and was deleted)."""


# --------------------------------------------------------------------------- #
# Backends and names
# --------------------------------------------------------------------------- #

# `kubeflow.job_backend` -> its backend.
BACKENDS: dict[str, Backend] = {b.name: b for b in (trainjob.BACKEND, tfjob.BACKEND)}


def backend_named(name: str) -> Backend:
    """The backend `kubeflow.job_backend` names.

    Raises:
      ConfigError: naming `kubeflow.job_backend` and the known backends.
    """
    if name not in BACKENDS:
        raise ConfigError(f"kubeflow.job_backend: expected one of {list(BACKENDS)}, got {name!r}")
    return BACKENDS[name]


def backend_of(manifest: Mapping[str, Any]) -> Backend:
    """The backend of a job manifest, by its `kind`.

    Raises:
      ValueError: the manifest is no training job of a known backend.
    """
    for backend in BACKENDS.values():
        if manifest.get("kind") == backend.kind:
            return backend
    raise ValueError(f"not a training job manifest: kind {manifest.get('kind')!r}")


def job_name(pipeline_name: str, component_id: str, suffix: str | None = None) -> str:
    """A DNS-1035 job name for any pipeline name (`2024taxi` -> `tfxkit-2024taxi-trainer-<suffix>`).

    Lowercased, characters outside `[a-z0-9-]` become '-', and a name that
    would not start with a letter gets the prefix `tfxkit-`, so the name is
    deterministic apart from its random (or given) suffix.

    Raises:
      ValueError: a given `suffix` that is not lowercase letters and digits.
    """
    if suffix is not None and not re.fullmatch(r"[a-z0-9]{1,8}", suffix):
        raise ValueError(
            f"job name suffix: expected 1-8 lowercase letters or digits, got {suffix!r}"
        )
    base = re.sub(r"[^a-z0-9-]+", "-", f"{pipeline_name}-{component_id}".lower()).strip("-")
    if not base[:1].isalpha():
        base = f"tfxkit-{base}".strip("-")
    base = base[:JOB_NAME_BASE_MAX].rstrip("-")
    name = f"{base}-{suffix or uuid.uuid4().hex[:8]}"
    assert DNS_1035.fullmatch(name), name
    return name


# --------------------------------------------------------------------------- #
# Backends and status
# --------------------------------------------------------------------------- #


def _last_line(message: str | None) -> str:
    # A termination message may be a log tail (FallbackToLogsOnError): its
    # last line is the exception.
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _terminated(t) -> str:
    message = _last_line(t.message)
    return f"{t.reason or 'Error'} (exit code {t.exit_code}){': ' + message if message else ''}"


def pod_reasons(
    core_api,
    namespace: str,
    selector: str,
    replica_of: Callable[[Mapping[str, str]], str] = lambda labels: "",
) -> list[str]:
    """Why the job's pods are failing, waiting or restarting, one line per pod ([] if unreadable).

    Each line names the pod, its replica (`replica_of` its labels) and its
    phase, then per container what ended it, or its last failure and
    restart count when it was restarted in place.
    """
    from kubernetes.client.rest import ApiException

    try:
        pods = core_api.list_namespaced_pod(namespace, label_selector=selector)
    except ApiException:
        # Reading pods is a diagnostic nicety; the job's own status still decides.
        return []
    lines = []
    for pod in sorted(pods.items, key=lambda p: p.metadata.name):
        found = []
        for cs in pod.status.container_statuses or []:
            if cs.state and cs.state.terminated and cs.state.terminated.exit_code:
                found.append(f"{cs.name} terminated: {_terminated(cs.state.terminated)}")
            elif (
                cs.state
                and cs.state.waiting
                and cs.state.waiting.reason not in (None, "ContainerCreating")
            ):
                w = cs.state.waiting
                found.append(
                    f"{cs.name} waiting: {w.reason}{': ' + w.message if w.message else ''}"
                )
            last = cs.last_state.terminated if cs.last_state else None
            if cs.restart_count and last is not None:
                found.append(
                    f"{cs.name} restarted {cs.restart_count} time(s), last: {_terminated(last)}"
                )
        for cond in pod.status.conditions or []:
            if cond.type == "PodScheduled" and cond.status == "False":
                found.append(f"unschedulable: {cond.message or cond.reason}")
        if found:
            replica = replica_of(pod.metadata.labels or {})
            where = f"{replica}, {pod.status.phase}" if replica else pod.status.phase
            lines.append(f"pod {pod.metadata.name} ({where}): " + "; ".join(found))
    return lines


def read_companion(custom, backend: Backend, namespace: str, name: str) -> dict | None:
    """The backend's companion object of job `name` (None without one, or when it cannot be read)."""
    from kubernetes.client.rest import ApiException

    if backend.companion is None:
        return None
    c = backend.companion
    try:
        return custom.get_namespaced_custom_object(c.group, c.version, namespace, c.plural, name)
    except ApiException:
        # Restarts are reported from it; the job's own status still decides.
        return None


# --------------------------------------------------------------------------- #
# Submit, wait, delete
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class _Watched:
    """The job `run` watches: its backend and where it lives.

    Attributes:
      backend: The job's backend.
      namespace, name: The job object.
    """

    backend: Backend
    namespace: str
    name: str

    @property
    def where(self) -> str:
        """The job in messages: `<kind> <namespace>/<name>`."""
        return f"{self.backend.kind} {self.namespace}/{self.name}"

    @property
    def selector(self) -> str:
        """The label selector of the job's pods."""
        return f"{self.backend.pod_label}={self.name}"


@dataclasses.dataclass
class _Progress:
    """What the watch has seen so far (updated at every poll).

    Attributes:
      status: The last status read (kept when a read fails transiently).
      restart: The last restart the controller showed.
      restarts_seen: Restarts counted so far.
    """

    status: JobStatus
    restart: Restart
    restarts_seen: int = 0


def restarts_after(previous: Restart, latest: Restart, seen: int) -> int | None:
    """The restart count once `latest` is read, or None when it shows no new restart.

    A TrainJob's JobSet counts its restarts (`latest.count`); for a TFJob
    they are the `Restarting` transitions seen between polls, so a new
    marker without a count adds one to `seen`. (In-place restarts of
    `OnFailure` replicas show in the pods' restart counts only.)
    """
    if latest.marker and latest.marker != previous.marker:
        return latest.count or seen + 1
    return None


def run(
    manifest: Mapping[str, Any],
    api_client,
    *,
    timeout_seconds: float,
    poll_seconds: float = 10.0,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    max_restarts: int | None = None,
) -> JobStatus:
    """Submits a training job (TrainJob or TFJob), waits for it, deletes it on success or timeout.

    Restarts are logged as the controller reports them (a TrainJob's JobSet
    `status.restarts`, a TFJob's `Restarting` condition). A failed job is
    kept so that its pods' logs stay readable; the failure names each
    failing pod's replica and its last reason.

    Args:
      manifest: The job (see the backends' `build_manifest`).
      api_client: A `kubernetes.client.ApiClient`.
      timeout_seconds: Bound on the wait, from submission.
      poll_seconds: Interval between status reads.
      log: Receives one line per status change.
      clock, sleep: Time sources (monotonic seconds).
      max_restarts: `kubeflow.max_restarts`, for the messages (None: unknown).

    Returns:
      The final status (outcome `Succeeded`).

    Raises:
      JobFailed: the job failed; the message has replica status and reasons.
      JobTimeout: the job did not finish in time; it was deleted.
      JobError: the API refused the submission or the job vanished.
    """
    from kubernetes import client

    backend = backend_of(manifest)
    name = manifest["metadata"]["name"]
    job = _Watched(backend, namespace=manifest["metadata"]["namespace"], name=name)
    custom = client.CustomObjectsApi(api_client)
    core = client.CoreV1Api(api_client)
    _submit(custom, job, manifest)
    log(f"{job.where}: submitted ({backend.shape(manifest)})")
    deadline = clock() + timeout_seconds
    budget = f" (kubeflow.max_restarts: {max_restarts})" if max_restarts is not None else ""
    progress = _Progress(JobStatus(), backend.restart({}, None))
    last = None
    while True:
        _poll(custom, job, progress, budget, log)
        summary = progress.status.summary(backend.controller)
        if summary != last:
            last = summary
            log(f"{job.where}: {last}")
        if progress.status.outcome == "Succeeded":
            _delete(custom, backend, job.namespace, job.name, log, job.where)
            return progress.status
        if progress.status.outcome == "Failed":
            reasons = pod_reasons(core, job.namespace, job.selector, backend.replica_of)
            raise JobFailed(_failure_message(job, summary, reasons, progress.restarts_seen, budget))
        remaining = deadline - clock()
        if remaining <= 0:
            reasons = pod_reasons(core, job.namespace, job.selector, backend.replica_of)
            _delete(custom, backend, job.namespace, job.name, log, job.where)
            raise JobTimeout(_timeout_message(job, summary, reasons, timeout_seconds))
        sleep(min(poll_seconds, remaining))


def submission_hint(backend: Backend, http_status: int) -> str:
    """What a refused submission's message adds for HTTP `http_status` ('' when nothing helps)."""
    if http_status == 404:
        return f"; {backend.missing_hint}"
    if http_status == 403:
        return (
            f"; the step's service account needs create/get/delete on "
            f"{backend.plural}.{backend.group} ({backend.rbac_file})"
        )
    return ""


def _submit(custom, job: _Watched, manifest: Mapping[str, Any]) -> None:
    """Creates the job object.

    Raises:
      JobError: the API refused it; the message says why and, for 403 or
        404, what to install or grant.
    """
    from kubernetes.client.rest import ApiException

    b = job.backend
    try:
        custom.create_namespaced_custom_object(
            b.group, b.version, job.namespace, b.plural, dict(manifest)
        )
    except ApiException as e:
        raise JobError(
            f"{job.where}: submission refused: {e.status} {e.reason}: {_api_message(e)}"
            f"{submission_hint(b, e.status)}"
        ) from e


def _poll(custom, job: _Watched, progress: _Progress, budget: str, log) -> None:
    """Reads the job's status and restarts into `progress`, logging a new restart.

    Raises:
      JobError: the job is gone, or its status cannot be read (a client error).
    """
    from kubernetes.client.rest import ApiException

    b = job.backend
    try:
        obj = custom.get_namespaced_custom_object(
            b.group, b.version, job.namespace, b.plural, job.name
        )
        progress.status = b.status(obj)
        latest = b.restart(obj, read_companion(custom, b, job.namespace, job.name))
        seen = restarts_after(progress.restart, latest, progress.restarts_seen)
        if seen is not None:
            progress.restarts_seen = seen
            log(f"{job.where}: restart {seen}{budget}: {latest.detail}")
        progress.restart = latest
    except ApiException as e:
        if e.status == 404:
            raise JobError(
                f"{job.where}: the job disappeared while it was being watched (deleted by someone else?)"
            ) from e
        if e.status < 500:
            raise JobError(
                f"{job.where}: cannot read its status: {e.status} {e.reason}: {_api_message(e)}"
            ) from e
        # A busy API server is transient: keep watching until the deadline.
        log(f"{job.where}: status read failed ({e.status} {e.reason}); retrying")


def _failure_message(
    job: _Watched, summary: str, reasons: list[str], restarts_seen: int, budget: str
) -> str:
    after = f" after {restarts_seen} restart(s){budget}" if restarts_seen else ""
    kind = job.backend.kind.lower()
    return (
        f"{job.where} failed{after}: {summary}"
        + "".join(f"\n  {r}" for r in reasons)
        + f"\n  (kept for inspection: kubectl -n {job.namespace} describe {kind} {job.name})"
    )


def _timeout_message(
    job: _Watched, summary: str, reasons: list[str], timeout_seconds: float
) -> str:
    return (
        f"{job.where} did not finish within kubeflow.tfjob_timeout_seconds={timeout_seconds:g}: "
        f"{summary}" + "".join(f"\n  {r}" for r in reasons) + "\n  (the job was deleted)"
    )


def _delete(custom, backend: Backend, namespace: str, name: str, log, where: str) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        custom.delete_namespaced_custom_object(
            backend.group,
            backend.version,
            namespace,
            backend.plural,
            name,
            body=client.V1DeleteOptions(propagation_policy="Background"),
        )
        log(f"{where}: deleted")
    except ApiException as e:
        if e.status != 404:
            log(
                f"{where}: delete failed ({e.status} {e.reason}); remove it with "
                f"kubectl -n {namespace} delete {backend.kind.lower()} {name}"
            )


def _api_message(e) -> str:
    try:
        return json.loads(e.body).get("message", e.body)
    except (TypeError, ValueError, AttributeError):
        return str(e.body or "")


# --------------------------------------------------------------------------- #
# The Trainer step's side
# --------------------------------------------------------------------------- #


def should_launch(config: PipelineConfig, environ: Mapping[str, str]) -> bool:
    """Whether this Trainer step runs on Kubeflow and must train through a job.

    It must when it trains across pods or when its job runs the tf.data
    service (`ingestion.service.dispatcher: kubeflow`), see `backend.uses_job`.
    """
    return tfxkit_env.on_kubeflow(environ) and uses_job(config.strategy, config.ingestion.service)


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


def current_namespace(config: PipelineConfig, namespace_file: str = "") -> str:
    """`kubeflow.namespace`, or the namespace of the pod this runs in (its service account's)."""
    if config.kubeflow.namespace:
        return config.kubeflow.namespace
    path = namespace_file or SERVICE_ACCOUNT_NAMESPACE_FILE
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    raise ConfigError(
        "kubeflow.namespace: empty and this pod has no service-account namespace "
        f"({path}); set the training job's namespace"
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


def build_manifest(config: PipelineConfig, **kwargs) -> dict[str, Any]:
    """The job of `kubeflow.job_backend` (arguments as the backends' `build_manifest`)."""
    return backend_named(config.kubeflow.job_backend).build_manifest(config, **kwargs)


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
    """Runs the Trainer's training as a job of `kubeflow.job_backend` and waits for it.

    Args:
      config: The validated pipeline config.
      invocation: JSON-serialisable inputs, outputs and exec properties of
        the step; replicas run the Trainer executor on them.
      shared_dir: A URI every replica can read (the model run artifact).
      environ: The step's environment (component id, placement key).
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
        placement_id=tfxkit_env.placement_id(environ),
    )
    return run(
        manifest,
        api_client if api_client is not None else kubernetes_api_client(),
        timeout_seconds=config.kubeflow.tfjob_timeout_seconds,
        poll_seconds=poll_seconds,
        log=log,
        max_restarts=config.kubeflow.max_restarts,
    )
