"""The one rendering of a `Placement`: Kubernetes dicts, KFP protos, and the
compiled pipeline and the TFJob agreeing on the same placement.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from google.protobuf import json_format

from components.config import Placement, Toleration
from components.kubernetes import placement as kube

GPU = Placement(
    cpu_request="4",
    cpu_limit="8",
    memory_request="16Gi",
    memory_limit="24Gi",
    accelerator_type="nvidia-l4",
    accelerator_count=2,
    node_selector={"cloud.google.com/gke-nodepool": "gpu-l4"},
    tolerations=(Toleration(key="nvidia.com/gpu"),),
)
TPU = Placement(
    accelerator_type="tpu-v5-lite-podslice",
    accelerator_count=8,
    tpu_topology="2x4",
    tolerations=(
        Toleration(key="google.com/tpu"),
        Toleration(key="dedicated", operator="Equal", value="ml", effect="NoExecute"),
    ),
)
CPU_POOL = Placement(
    cpu_request="500m",
    memory_request="512Mi",
    node_selector={"cloud.google.com/gke-nodepool": "cpu-pool"},
)


# --------------------------------------------------------------------------- #
# Kubernetes forms
# --------------------------------------------------------------------------- #


def test_gpu_node_selector_adds_the_accelerator_label_to_the_configured_pool():
    assert kube.node_selector(GPU) == {
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        "cloud.google.com/gke-nodepool": "gpu-l4",
    }


def test_tpu_node_selector_has_accelerator_and_topology():
    assert kube.node_selector(TPU) == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
        "cloud.google.com/gke-tpu-topology": "2x4",
    }


def test_no_accelerator_keeps_the_configured_selector_only():
    assert kube.node_selector(CPU_POOL) == {"cloud.google.com/gke-nodepool": "cpu-pool"}
    assert kube.node_selector(Placement()) == {}


def test_tolerations_leave_out_empty_fields():
    assert kube.tolerations(TPU) == [
        {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute"},
    ]
    assert kube.tolerations(
        Placement(
            node_selector={"pool": "tainted"}, tolerations=(Toleration(key="any", effect=""),)
        )
    ) == [{"key": "any", "operator": "Exists"}]
    assert kube.tolerations(CPU_POOL) == []


def test_resources_request_accelerators_through_limits():
    assert kube.resources(GPU) == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"cpu": "8", "memory": "24Gi", "nvidia.com/gpu": "2"},
    }
    assert kube.resources(TPU) == {"limits": {"google.com/tpu": "8"}}
    assert kube.resources(CPU_POOL) == {"requests": {"cpu": "500m", "memory": "512Mi"}}
    assert kube.resources(Placement()) == {}


def test_container_and_pod_spec():
    c = kube.container(
        GPU, name="main", image="img:1", command=("python", "-m", "x"), env={"B": "2", "A": "1"}
    )
    assert c == {
        "name": "main",
        "image": "img:1",
        "command": ["python", "-m", "x"],
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": kube.resources(GPU),
    }
    spec = kube.pod_spec(GPU, [c], service_account="trainer")
    assert spec == {
        "containers": [c],
        "nodeSelector": kube.node_selector(GPU),
        "tolerations": kube.tolerations(GPU),
        "serviceAccountName": "trainer",
    }
    bare = kube.container(
        Placement(),
        name="main",
        image="img:1",
        command=["true"],
        env={},
        ports=[{"containerPort": 1}],
    )
    assert bare["ports"] == [{"containerPort": 1}] and "resources" not in bare
    assert kube.pod_spec(Placement(), [bare]) == {"containers": [bare]}


# --------------------------------------------------------------------------- #
# KFP forms
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "quantity, cpus",
    [("4", 4.0), ("500m", 0.5), ("0.25", 0.25)],
)
def test_cpu_quantity(quantity, cpus):
    assert kube.cpu_quantity(quantity) == cpus


@pytest.mark.parametrize(
    "quantity, gigabytes",
    [("16Gi", 16 * 2**30 / 1e9), ("512Mi", 512 * 2**20 / 1e9), ("2G", 2.0), ("1000", 1e-6)],
)
def test_memory_quantity_is_in_decimal_gigabytes(quantity, gigabytes):
    assert kube.memory_quantity(quantity) == pytest.approx(gigabytes)


def test_resource_spec_is_the_resources_in_kfp_units():
    assert json_format.MessageToDict(kube.resource_spec(GPU)) == {
        "cpuRequest": 4.0,
        "cpuLimit": 8.0,
        "memoryRequest": pytest.approx(16 * 2**30 / 1e9),
        "memoryLimit": pytest.approx(24 * 2**30 / 1e9),
        "accelerator": {"type": "nvidia.com/gpu", "count": "2"},
    }
    assert json_format.MessageToDict(kube.resource_spec(TPU)) == {
        "accelerator": {"type": "google.com/tpu", "count": "8"}
    }
    assert kube.resource_spec(Placement()).ByteSize() == 0


def test_kubernetes_executor_config_has_the_node_selector_and_tolerations():
    msg = kube.kubernetes_executor_config(TPU)
    assert dict(msg.node_selector.labels) == kube.node_selector(TPU)
    assert json_format.MessageToDict(msg)["tolerations"] == kube.tolerations(TPU)
    assert kube.kubernetes_executor_config(Placement()).ByteSize() == 0


@pytest.mark.multiprocess
def test_the_module_is_pure():
    """No config section (pydantic), TFX, kfp, kubernetes or TF at import time: only the
    accelerator facts, which the config's Kubeflow section validates against too."""
    heavy = [
        "pydantic",
        "components.config.pipeline",
        "components.config.kubeflow",
        "tfx",
        "kfp",
        "kubernetes",
        "tensorflow",
        "components.kubernetes.tfjob",
        "components.kubernetes.trainjob",
        "components.kubernetes.jobs",
    ]
    code = f"import json, sys, components.kubernetes.placement; print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == []


# --------------------------------------------------------------------------- #
# One rendering: a step pod of the compiled pipeline and a TFJob replica
# --------------------------------------------------------------------------- #


def test_compiled_pipeline_tfjob_and_trainjob_place_the_same_placement_alike(taxi_config, tmp_path):
    """The compiler's platform spec / container resources and the TFJob's pod
    spec agree on node selector, tolerations and resources, GPU and TPU alike.
    """
    from components.kubernetes import tfjob, trainjob
    from pipelines import kubeflow_runner

    placements = {**taxi_config.kubeflow.placements, "Trainer": TPU, "Evaluator": GPU}
    config = dataclasses.replace(
        taxi_config, kubeflow=dataclasses.replace(taxi_config.kubeflow, placements=placements)
    )
    compiled = kubeflow_runner.compile_pipeline(config, str(tmp_path / "p.yaml"))
    pipeline = json_format.MessageToDict(compiled.pipeline_spec)
    platform = json_format.MessageToDict(compiled.platform_spec)["platforms"]["kubernetes"][
        "deploymentSpec"
    ]["executors"]
    # The same placements, now on the replicas of a multi-worker job.
    multi_worker = dataclasses.replace(
        config,
        strategy=dataclasses.replace(config.strategy, kind="multi_worker_mirrored", workers=2),
    )
    for component_id, placement in (("Trainer", TPU), ("Evaluator", GPU)):
        label = pipeline["components"][component_id]["executorLabel"]
        step_resources = pipeline["deploymentSpec"]["executors"][label]["container"]["resources"]
        manifest = tfjob.build_manifest(
            multi_worker,
            name="t-1",
            namespace="ns",
            component_id=component_id,
            invocation_uri="gs://b/i.json",
        )
        replica = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
        assert (
            platform[label]["nodeSelector"]["labels"]
            == replica["nodeSelector"]
            == kube.node_selector(placement)
        )
        assert (
            platform[label]["tolerations"] == replica["tolerations"] == kube.tolerations(placement)
        )
        replica_resources = replica["containers"][0]["resources"]
        # Replicas also request what the placement leaves unset (never BestEffort).
        assert replica_resources == kube.resources(placement, kube.REPLICA_DEFAULT_REQUESTS)
        # The TrainJob's workers get the very same rendering.
        trainjob_manifest = trainjob.build_manifest(
            multi_worker,
            name="t-1",
            namespace="ns",
            component_id=component_id,
            invocation_uri="gs://b/i.json",
        )
        node = trainjob_manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"][
            "spec"
        ]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert node["nodeSelector"] == replica["nodeSelector"]
        assert node["tolerations"] == replica["tolerations"]
        assert trainjob_manifest["spec"]["trainer"]["resourcesPerNode"] == replica_resources
        in_kfp_units = {}
        for (kind, name), value in (
            ((k, n), v) for k, q in kube.resources(placement).items() for n, v in q.items()
        ):
            if name == "cpu":
                in_kfp_units[f"cpu{kind[:-1].capitalize()}"] = kube.cpu_quantity(value)
            elif name == "memory":
                in_kfp_units[f"memory{kind[:-1].capitalize()}"] = kube.memory_quantity(value)
            else:
                in_kfp_units["accelerator"] = {"type": name, "count": value}
        assert step_resources == in_kfp_units
