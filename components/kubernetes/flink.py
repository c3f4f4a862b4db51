"""The manifests and Beam args that put a compiled pipeline's Beam stages on Flink (`kubeflow.flink`).

A session cluster of the Flink Kubernetes operator (a `FlinkDeployment` with no job: Beam
submits one per Beam stage), each TaskManager with a Beam Python worker-pool sidecar when
the workers are `EXTERNAL`; Beam's Flink job server as a Deployment and Service in front of
it; and the Beam args every Beam stage of the pipeline gets. Nothing here talks to a
cluster: `tfxkit compile` writes these beside the pipeline, and the user applies them.
"""

from __future__ import annotations

from typing import Any

from components.config import ConfigError, PipelineConfig
from components.config.kubeflow import (
    FlinkConfig,
    job_server_beam_version,
    job_server_flink_version,
)

# The operator's API of `FlinkDeployment` (its Helm chart's CRD at release-1.15.0).
GROUP, VERSION, KIND = "flink.apache.org", "v1beta1", "FlinkDeployment"
# Beam's Flink job server: job service, artifact staging, expansion service.
JOB_PORT, ARTIFACT_PORT, EXPANSION_PORT = 8099, 8098, 8097
# The operator's JobManager REST service is `<name>-rest` on this port.
REST_PORT = 8081
# The container the operator runs Flink in; a pod template names it to add to it.
FLINK_MAIN_CONTAINER = "flink-main-container"
WORKER_POOL_CONTAINER = "beam-worker-pool"


def _flink(config: PipelineConfig) -> FlinkConfig:
    flink = config.kubeflow.flink
    if flink is None:
        raise ValueError("kubeflow.flink is not set")
    return flink


def names(config: PipelineConfig) -> tuple[str, str, str]:
    """(FlinkDeployment name, job server name, namespace)."""
    flink = _flink(config)
    name = flink.name or f"{config.name}-flink"[:45].rstrip("-")
    namespace = flink.namespace or config.kubeflow.namespace or "default"
    return name, f"{name}-job-server", namespace


def parallelism(flink: FlinkConfig) -> int:
    return flink.parallelism or flink.task_managers * flink.task_slots


def artifacts_dir(config: PipelineConfig) -> str:
    flink = _flink(config)
    return flink.artifacts_dir or f"{config.kubeflow.pipeline_root.rstrip('/')}/beam-artifacts"


def beam_args(config: PipelineConfig) -> list[str]:
    """The Beam args of every Beam stage: submit to the job server, run SDK workers as configured."""
    flink = _flink(config)
    _, job_server, namespace = names(config)
    host = f"{job_server}.{namespace}.svc.cluster.local"
    environment = (
        f"localhost:{flink.worker_pool_port}"
        if flink.environment_type == "EXTERNAL"
        else flink.worker_image
    )
    return [
        "--runner=PortableRunner",
        f"--job_endpoint={host}:{JOB_PORT}",
        f"--artifact_endpoint={host}:{ARTIFACT_PORT}",
        f"--environment_type={flink.environment_type}",
        f"--environment_config={environment}",
        f"--parallelism={parallelism(flink)}",
        f"--sdk_worker_parallelism={flink.task_slots}",
    ]


def check_versions(config: PipelineConfig, beam_version: str) -> None:
    """Refuses a job server of another Beam release than the pipeline's.

    Beam's portable runners need the job server and the SDK workers on one release.

    Raises:
      ConfigError: naming `kubeflow.flink.job_server_image`.
    """
    image = _flink(config).job_server_image
    tagged = job_server_beam_version(image)
    if tagged and tagged != beam_version:
        raise ConfigError(
            f"kubeflow.flink.job_server_image: {image!r} is Beam {tagged}, but the pipeline is "
            f"compiled with Beam {beam_version} (the release kubeflow.image must hold); Beam's job "
            f"server and its SDK workers must be one release: use ...:{beam_version}"
        )


def _worker_pool_sidecar(flink: FlinkConfig) -> dict[str, Any]:
    """Beam's Python worker pool: it starts an SDK worker process per request of the runner."""
    return {
        "name": WORKER_POOL_CONTAINER,
        "image": flink.worker_image,
        "command": ["python", "-m", "apache_beam.runners.worker.worker_pool_main"],
        "args": [f"--service_port={flink.worker_pool_port}"],
        "ports": [{"containerPort": flink.worker_pool_port, "name": "worker-pool"}],
        "resources": {"requests": {"cpu": flink.worker_cpu, "memory": flink.worker_memory}},
    }


def flink_deployment(config: PipelineConfig) -> dict[str, Any]:
    """The session cluster: a `FlinkDeployment` without a job."""
    flink = _flink(config)
    name, _, namespace = names(config)
    task_manager: dict[str, Any] = {
        "replicas": flink.task_managers,
        "resource": {"cpu": flink.task_manager.cpu, "memory": flink.task_manager.memory},
    }
    if flink.environment_type == "EXTERNAL":
        task_manager["podTemplate"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "spec": {"containers": [{"name": FLINK_MAIN_CONTAINER}, _worker_pool_sidecar(flink)]},
        }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(config)},
        "spec": {
            "image": flink.flink_image,
            "flinkVersion": flink.flink_version or job_server_flink_version(flink.job_server_image),
            "mode": "native",
            "serviceAccount": flink.service_account,
            "flinkConfiguration": {
                "taskmanager.numberOfTaskSlots": str(flink.task_slots),
                "parallelism.default": str(parallelism(flink)),
            },
            "jobManager": {
                "replicas": 1,
                "resource": {"cpu": flink.job_manager.cpu, "memory": flink.job_manager.memory},
            },
            "taskManager": task_manager,
        },
    }


def _labels(config: PipelineConfig) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "tfxkit", "tfxkit/pipeline": config.name}


def job_server(config: PipelineConfig) -> list[dict[str, Any]]:
    """Beam's Flink job server (a Deployment) and its Service, pointed at the session cluster."""
    flink = _flink(config)
    name, server, namespace = names(config)
    selector = {"app.kubernetes.io/name": server}
    ports = {"job": JOB_PORT, "artifact": ARTIFACT_PORT, "expansion": EXPANSION_PORT}
    container = {
        "name": "job-server",
        "image": flink.job_server_image,
        "args": [
            f"--flink-master={name}-rest.{namespace}.svc.cluster.local:{REST_PORT}",
            "--job-host=0.0.0.0",
            f"--job-port={JOB_PORT}",
            f"--artifact-port={ARTIFACT_PORT}",
            f"--expansion-port={EXPANSION_PORT}",
            f"--artifacts-dir={artifacts_dir(config)}",
        ],
        "ports": [{"containerPort": port, "name": key} for key, port in ports.items()],
        "readinessProbe": {"tcpSocket": {"port": JOB_PORT}, "periodSeconds": 5},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": server, "namespace": namespace, "labels": _labels(config)},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {"serviceAccountName": flink.service_account, "containers": [container]},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": server, "namespace": namespace, "labels": _labels(config)},
        "spec": {
            "selector": selector,
            "ports": [
                {"name": key, "port": port, "targetPort": port} for key, port in ports.items()
            ],
        },
    }
    return [deployment, service]


def manifests(config: PipelineConfig) -> list[dict[str, Any]]:
    """Everything to apply before the pipeline runs: the session cluster, then its job server."""
    return [flink_deployment(config), *job_server(config)]
