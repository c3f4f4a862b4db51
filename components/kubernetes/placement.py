"""The one rendering of a config `Placement` to Kubernetes and KFP forms.

Kubernetes forms (plain dicts): `node_selector`, `tolerations`, `resources`, `container`,
`pod_spec`; KFP forms (protos, derived from them): `resource_spec` and
`kubernetes_executor_config`. Pure: config is imported for annotations only, and kfp
inside the two functions that build its protos.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from components.config.accelerators import accelerator_node_labels, accelerator_resource

if TYPE_CHECKING:
    from components.config import Placement

# What a training-job replica requests for CPU / memory its placement leaves
# unset: without requests a pod is BestEffort, the first evicted under
# pressure, which for one replica of a synchronous job stalls every other.
REPLICA_DEFAULT_REQUESTS = {"cpu": "1", "memory": "2Gi"}

# Memory quantity suffix -> bytes (Kubernetes quantities).
_MEMORY_UNITS = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


# --------------------------------------------------------------------------- #
# Kubernetes forms
# --------------------------------------------------------------------------- #


def node_selector(placement: Placement) -> dict[str, str]:
    """The pod's node selector: the accelerator's GKE labels, then `placement.node_selector`."""
    return {
        **accelerator_node_labels(placement.accelerator_type, placement.tpu_topology),
        **placement.node_selector,
    }


def tolerations(placement: Placement) -> list[dict[str, str]]:
    """The pod's tolerations as Kubernetes dicts (empty fields left out)."""
    return [
        {
            k: v
            for k, v in (
                ("key", t.key),
                ("operator", t.operator),
                ("value", t.value),
                ("effect", t.effect),
            )
            if v
        }
        for t in placement.tolerations
    ]


def resources(
    placement: Placement, default_requests: Mapping[str, str] | None = None
) -> dict[str, dict[str, str]]:
    """The container's `resources`: CPU / memory requests and limits, and the accelerator.

    Args:
      placement: Supplies requests, limits and the accelerator.
      default_requests: Requests for resources (`cpu`, `memory`) the
        placement neither requests nor limits (a limit alone already makes
        Kubernetes request that much). Training-job replicas pass
        `REPLICA_DEFAULT_REQUESTS`, so none of them runs BestEffort.

    Returns:
      `{"requests": {...}, "limits": {...}}`, each present only when
      non-empty; {} for a placement without resources.
    """
    requests = {
        k: v for k, v in (("cpu", placement.cpu_request), ("memory", placement.memory_request)) if v
    }
    limits = {
        k: v for k, v in (("cpu", placement.cpu_limit), ("memory", placement.memory_limit)) if v
    }
    for key, value in (default_requests or {}).items():
        if key not in requests and key not in limits:
            requests[key] = value
    resource = accelerator_resource(placement.accelerator_type)
    if resource:
        # Extended resources are requested through limits (requests default to them).
        limits[resource] = str(placement.accelerator_count)
    out = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def container(
    placement: Placement,
    *,
    name: str,
    image: str,
    command: Sequence[str],
    env: Mapping[str, str],
    ports: Sequence[Mapping[str, Any]] = (),
    default_requests: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A container with the placement's resources.

    Args:
      placement: Supplies the resources (its image is the caller's choice:
        jobs fall back to a default image).
      name: Container name (a job operator may look its container up by it).
      image: Container image.
      command: Entry point and arguments.
      env: Environment variables, rendered sorted by name.
      ports: Container ports, as Kubernetes dicts.
      default_requests: See `resources`.
    """
    out: dict[str, Any] = {
        "name": name,
        "image": image,
        "command": list(command),
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        # A replica that fails without a termination message gets the tail
        # of its log as one (the traceback): the wait step reports it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if ports:
        out["ports"] = [dict(p) for p in ports]
    placed = resources(placement, default_requests)
    if placed:
        out["resources"] = placed
    return out


def scheduling(placement: Placement) -> dict[str, Any]:
    """The pod-spec fields that put a pod on the placement's nodes.

    `nodeSelector` and `tolerations`, each only when the placement sets it.
    """
    out: dict[str, Any] = {}
    selector = node_selector(placement)
    if selector:
        out["nodeSelector"] = selector
    tolerated = tolerations(placement)
    if tolerated:
        out["tolerations"] = tolerated
    return out


def pod_spec(
    placement: Placement, containers: Sequence[Mapping[str, Any]], *, service_account: str = ""
) -> dict[str, Any]:
    """A pod spec on the placement's nodes: node selector and tolerations.

    Args:
      placement: Supplies the node selector and tolerations.
      containers: The pod's containers (see `container`).
      service_account: The pod's service account ('' = the namespace default).
    """
    spec: dict[str, Any] = {"containers": [dict(c) for c in containers], **scheduling(placement)}
    if service_account:
        spec["serviceAccountName"] = service_account
    return spec


# --------------------------------------------------------------------------- #
# KFP forms
# --------------------------------------------------------------------------- #


def cpu_quantity(value: str) -> float:
    """CPUs of a Kubernetes CPU quantity ('500m' -> 0.5), as KFP stores them."""
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def memory_quantity(value: str) -> float:
    """Decimal gigabytes of a Kubernetes memory quantity ('16Gi' -> 17.18), as KFP stores them."""
    number = value.rstrip("KMGTPEi")
    return int(number) * _MEMORY_UNITS[value[len(number) :]] / 10**9


def resource_spec(placement: Placement):
    """The pipeline spec's `ResourceSpec`: `resources` in KFP units (CPUs, GB).

    Returns:
      A `PipelineDeploymentConfig.PipelineContainerSpec.ResourceSpec`.
    """
    from kfp.pipeline_spec import pipeline_spec_pb2

    spec = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec.ResourceSpec()
    placed = resources(placement)
    requests, limits = placed.get("requests", {}), placed.get("limits", {})
    if "cpu" in requests:
        spec.cpu_request = cpu_quantity(requests["cpu"])
    if "cpu" in limits:
        spec.cpu_limit = cpu_quantity(limits["cpu"])
    if "memory" in requests:
        spec.memory_request = memory_quantity(requests["memory"])
    if "memory" in limits:
        spec.memory_limit = memory_quantity(limits["memory"])
    resource = accelerator_resource(placement.accelerator_type)
    if resource:
        # KFP's driver requests the accelerator type verbatim as a Kubernetes
        # resource name; the GPU / TPU model is picked by the node selector.
        spec.accelerator.type = resource
        spec.accelerator.count = int(limits[resource])
    return spec


def kubernetes_executor_config(placement: Placement):
    """The kfp-kubernetes platform spec of a step: `node_selector` and `tolerations`.

    Returns:
      A `kfp.kubernetes` `KubernetesExecutorConfig`.
    """
    from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s

    msg = k8s.KubernetesExecutorConfig()
    msg.node_selector.labels.update(node_selector(placement))
    for toleration in tolerations(placement):
        msg.tolerations.append(k8s.Toleration(**toleration))
    return msg
