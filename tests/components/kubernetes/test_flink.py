"""`kubeflow.flink`'s manifests against the Flink Kubernetes operator's published CRD
(`tests/data/flink/`, its Helm chart at release-1.15.0) and the Kubernetes API's own
models, and its Beam args as Beam itself parses them."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from apache_beam.options.pipeline_options import (
    PipelineOptions,
    PortableOptions,
    StandardOptions,
)
from kubernetes import client as k8s_client

from components.config import ConfigError, from_dict
from components.kubernetes import flink
from pipelines.configs import SHIPPED_CONFIG_DIR
from tests.components.kubernetes.kube_api import crd_schema, unknown_fields
from tests.conftest import data_file

CRD = ("flink", "flinkdeployments-crd-release-1.15.0.yml")
FLINK = {
    "job_server_image": "apache/beam_flink1.19_job_server:2.72.0",
    "flink_image": "flink:1.19",
    "worker_image": "us-docker.pkg.dev/tfxkit-demo/tfxkit/tfxkit:0.1.0",
}


def _config(**flink_fields):
    data = yaml.safe_load((SHIPPED_CONFIG_DIR / "taxi.yaml").read_text())
    data["kubeflow"]["flink"] = {**FLINK, **flink_fields}
    return from_dict(data)


@pytest.fixture(scope="module")
def schema():
    return crd_schema(data_file(*CRD), flink.GROUP, flink.VERSION, "flinkdeployments")


# Every object's fields the API server declares itself; the operator's generated CRD
# schema leaves them out at its top level.
OBJECT_FIELDS = ("apiVersion", "kind", "metadata")


def _valid(manifest, schema):
    jsonschema.Draft7Validator(schema).validate(manifest)
    declared = {k: v for k, v in manifest.items() if k not in OBJECT_FIELDS}
    assert unknown_fields(declared, schema) == []


def _as_kubernetes_model(manifest, kind):
    """`manifest` read into the Kubernetes client's model and written back: a field the
    API does not declare, or a value of the wrong type, does not survive the round trip."""
    api = k8s_client.ApiClient()
    model = api._ApiClient__deserialize(manifest, kind)
    return api.sanitize_for_serialization(model)


@pytest.mark.parametrize("environment_type", ["EXTERNAL", "DOCKER"])
def test_the_flink_deployment_is_valid_against_the_operators_crd(schema, environment_type):
    config = _config(environment_type=environment_type, task_managers=3, task_slots=4)
    deployment = flink.flink_deployment(config)
    _valid(deployment, schema)
    spec = deployment["spec"]
    assert spec["flinkVersion"] == "v1_19" and spec["mode"] == "native" and "job" not in spec
    assert spec["taskManager"]["replicas"] == 3
    assert spec["flinkConfiguration"] == {
        "taskmanager.numberOfTaskSlots": "4",
        "parallelism.default": "12",
    }
    template = spec["taskManager"].get("podTemplate")
    if environment_type == "DOCKER":
        assert template is None
        return
    # The pod template is the Kubernetes Pod the operator merges into each TaskManager.
    assert _as_kubernetes_model(template, "V1Pod") == template
    main, sidecar = template["spec"]["containers"]
    assert main == {"name": flink.FLINK_MAIN_CONTAINER}
    assert sidecar["image"] == FLINK["worker_image"]
    assert sidecar["command"][-1] == "apache_beam.runners.worker.worker_pool_main"
    assert sidecar["args"] == ["--service_port=50000"]


def test_the_job_server_deployment_and_service_are_kubernetes_objects(schema):
    config = _config(name="taxi-beam", namespace="beam")
    deployment, service = flink.job_server(config)
    assert _as_kubernetes_model(deployment, "V1Deployment") == deployment
    assert _as_kubernetes_model(service, "V1Service") == service
    # Its pod template against the same PodTemplateSpec schema the operator publishes.
    pod_template = schema["properties"]["spec"]["properties"]["podTemplate"]
    _valid(deployment["spec"]["template"], pod_template)
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--flink-master=taxi-beam-rest.beam.svc.cluster.local:8081" in args
    assert "--artifacts-dir=gs://tfxkit-demo/taxi/root/beam-artifacts" in args
    assert deployment["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert {p["port"] for p in service["spec"]["ports"]} == {8099, 8098, 8097}


def test_the_beam_args_reach_the_job_server_as_beam_parses_them():
    config = _config(task_managers=2, task_slots=3)
    options = PipelineOptions(flink.beam_args(config))
    assert options.view_as(StandardOptions).runner == "PortableRunner"
    portable = options.view_as(PortableOptions)
    _, service = flink.job_server(config)
    host = f"{service['metadata']['name']}.default.svc.cluster.local"
    assert portable.job_endpoint == f"{host}:{flink.JOB_PORT}"
    assert portable.artifact_endpoint == f"{host}:{flink.ARTIFACT_PORT}"
    assert portable.environment_type == "EXTERNAL"
    # The worker pool is the sidecar in the TaskManager's own pod.
    sidecar = flink.flink_deployment(config)["spec"]["taskManager"]["podTemplate"]["spec"][
        "containers"
    ][1]
    assert portable.environment_config == f"localhost:{sidecar['ports'][0]['containerPort']}"
    assert options.get_all_options()["parallelism"] == 6
    assert int(options.get_all_options()["sdk_worker_parallelism"]) == 3
    docker = PipelineOptions(flink.beam_args(_config(environment_type="DOCKER")))
    assert docker.view_as(PortableOptions).environment_config == FLINK["worker_image"]


def test_names_default_from_the_pipeline_and_the_kubeflow_namespace():
    config = _config()
    assert flink.names(config) == ("taxi-flink", "taxi-flink-job-server", "default")
    assert flink.artifacts_dir(_config(artifacts_dir="gs://b/a")) == "gs://b/a"


def test_a_job_server_of_another_beam_release_is_refused_naming_the_field():
    config = _config(job_server_image="apache/beam_flink1.19_job_server:2.60.0")
    with pytest.raises(
        ConfigError, match=r"kubeflow\.flink\.job_server_image: .* is Beam 2\.60\.0"
    ):
        flink.check_versions(config, "2.72.0")
    flink.check_versions(config, "2.60.0")
    # An untagged or custom-tagged image is the user's to match.
    flink.check_versions(_config(job_server_image="apache/beam_flink1.19_job_server"), "2.72.0")


def test_the_schema_check_catches_a_misspelt_field_and_a_wrong_type(schema):
    deployment = flink.flink_deployment(_config())
    deployment["spec"]["taskManager"]["replica"] = 2
    with pytest.raises(AssertionError):
        _valid(deployment, schema)
    deployment = flink.flink_deployment(_config())
    deployment["spec"]["flinkVersion"] = "v9_9"
    with pytest.raises(jsonschema.ValidationError):
        _valid(deployment, schema)
