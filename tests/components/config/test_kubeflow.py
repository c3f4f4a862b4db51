"""The `kubeflow` section's tf.data service placements: `Placement.replicas` and the
`tfdata_dispatcher` / `tfdata_workers` entries; every error names the field path."""

from __future__ import annotations

import pytest
import yaml

from components.config import ConfigError, Placement, from_dict, json_schema, to_dict
from components.config.kubeflow import TFDATA_DISPATCHER_PLACEMENT, TFDATA_WORKERS_PLACEMENT
from pipelines.configs import SHIPPED_CONFIG_DIR

CPU_POOL = {"cloud.google.com/gke-nodepool": "cpu-pool"}


def _taxi(**kubeflow):
    data = yaml.safe_load((SHIPPED_CONFIG_DIR / "taxi.yaml").read_text())
    data["kubeflow"].update(kubeflow)
    return data


def test_replicas_default_to_none_set():
    assert Placement().replicas == 0
    assert TFDATA_DISPATCHER_PLACEMENT == "tfdata_dispatcher"
    assert TFDATA_WORKERS_PLACEMENT == "tfdata_workers"


def test_service_placements_load_and_round_trip():
    placements = {
        "tfdata_dispatcher": {"cpu_request": "2", "node_selector": CPU_POOL},
        "tfdata_workers": {"replicas": 8, "cpu_request": "8", "node_selector": CPU_POOL},
    }
    config = from_dict(_taxi(placements=placements))
    workers = config.kubeflow.placements["tfdata_workers"]
    assert workers.replicas == 8 and workers.cpu_request == "8"
    assert config.kubeflow.placements["tfdata_dispatcher"].replicas == 0
    assert from_dict(to_dict(config)) == config
    # A worker count alone is a placement (default pool, default requests).
    from_dict(_taxi(placements={"tfdata_workers": {"replicas": 2}}))


@pytest.mark.parametrize(
    "kubeflow, match",
    [
        (
            {"placements": {"Trainer": {"replicas": 2, "node_selector": CPU_POOL}}},
            r"^kubeflow\.placements\.Trainer\.replicas: only the tf\.data service workers' entry "
            r"\(tfdata_workers\) takes replicas; remove it",
        ),
        (
            {"placements": {"tfdata_dispatcher": {"replicas": 2}}},
            r"^kubeflow\.placements\.tfdata_dispatcher\.replicas: only the tf\.data service",
        ),
        (
            {"tfjob_ps_placement": {"replicas": 2, "node_selector": CPU_POOL}},
            r"^kubeflow\.tfjob_ps_placement\.replicas: strategy\.parameter_servers counts",
        ),
        (
            {"placements": {"tfdata_workers": {"replicas": -1}}},
            r"^kubeflow\.placements\.tfdata_workers\.replicas: expected an integer >= 0",
        ),
        (
            {
                "placements": {
                    "tfdata_dispatcher": {
                        "accelerator_type": "nvidia-l4",
                        "accelerator_count": 1,
                    }
                }
            },
            r"^kubeflow\.placements\.tfdata_dispatcher\.accelerator_type: the tf\.data service "
            r"dispatcher and workers run on CPU nodes",
        ),
        (
            {"placements": {"tfdata_workers": {"replicas": 2, "beam_args": ["--x"]}}},
            r"^kubeflow\.placements\.tfdata_workers\.beam_args: the tf\.data service runs no Beam",
        ),
    ],
    ids=[
        "replicas_on_a_component",
        "replicas_on_the_dispatcher",
        "replicas_on_parameter_servers",
        "negative",
        "accelerator",
        "beam_args",
    ],
)
def test_misplaced_service_fields_name_the_field(kubeflow, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(_taxi(**kubeflow))


def test_schema_describes_replicas():
    described = json_schema()["$defs"]["Placement"]["properties"]["replicas"]["description"]
    assert described.startswith("Pods of the tf.data service workers")


FLINK = {
    "job_server_image": "apache/beam_flink1.19_job_server:2.72.0",
    "flink_image": "flink:1.19",
    "worker_image": "us-docker.pkg.dev/tfxkit-demo/tfxkit/tfxkit:0.1.0",
}


def test_a_flink_section_loads_with_its_flink_version_read_from_the_job_server():
    config = from_dict(_taxi(flink=FLINK))
    flink = config.kubeflow.flink
    assert flink.environment_type == "EXTERNAL" and flink.flink_version == ""
    assert from_dict(to_dict(config)) == config
    assert from_dict(_taxi(flink={**FLINK, "flink_version": "v1_19"})).kubeflow.flink
    assert "flink" in json_schema()["$defs"]["KubeflowConfig"]["properties"]


@pytest.mark.parametrize(
    "flink, match",
    [
        (
            {k: v for k, v in FLINK.items() if k != "job_server_image"},
            r"kubeflow\.flink\.job_server_image: expected Beam's Flink job server image",
        ),
        (
            {k: v for k, v in FLINK.items() if k != "flink_image"},
            r"kubeflow\.flink\.flink_image: expected the Flink image",
        ),
        (
            {k: v for k, v in FLINK.items() if k != "worker_image"},
            r"kubeflow\.flink\.worker_image: EXTERNAL workers need a Beam worker-pool sidecar",
        ),
        (
            {
                **{k: v for k, v in FLINK.items() if k != "worker_image"},
                "environment_type": "DOCKER",
            },
            r"kubeflow\.flink\.worker_image: DOCKER workers need the SDK container image",
        ),
        (
            {**FLINK, "flink_version": "v1_18"},
            r"kubeflow\.flink\.flink_version: 'v1_18' contradicts job_server_image",
        ),
        (
            {**FLINK, "job_server_image": "registry/my-job-server:1"},
            r"kubeflow\.flink\.flink_version: job_server_image .* does not name its Flink version",
        ),
        ({**FLINK, "environment_type": "PROCESS"}, r"kubeflow\.flink\.environment_type"),
        ({**FLINK, "task_slots": 0}, r"kubeflow\.flink\.task_slots: expected an integer >= 1"),
        ({**FLINK, "parallelism": -1}, r"kubeflow\.flink\.parallelism: expected an integer >= 0"),
        (
            {**FLINK, "task_manager": {"memory": "4 potatoes"}},
            r"kubeflow\.flink\.task_manager\.memory: expected a Flink memory size",
        ),
        ({**FLINK, "worker_memory": "2GB"}, r"kubeflow\.flink\.worker_memory: expected a memory"),
        ({**FLINK, "name": "Taxi_Flink"}, r"kubeflow\.flink\.name: expected a Kubernetes name"),
        ({**FLINK, "worker_pool_port": 70000}, r"kubeflow\.flink\.worker_pool_port"),
    ],
)
def test_a_bad_flink_section_is_refused_naming_the_field(flink, match):
    with pytest.raises(ConfigError, match=match):
        from_dict(_taxi(flink=flink))


@pytest.mark.parametrize(
    "beam_args", [["--runner=FlinkRunner"], ["--job_endpoint", "localhost:8099"]]
)
def test_pipeline_wide_beam_args_may_not_contradict_the_flink_section(beam_args):
    with pytest.raises(
        ConfigError, match=r"kubeflow\.beam_args: \[.*\] contradict kubeflow\.flink"
    ):
        from_dict(_taxi(flink=FLINK, beam_args=beam_args))
    # A placement's own beam_args may send one component elsewhere.
    placements = {"Transform": {"cpu_request": "1", "beam_args": beam_args}}
    assert from_dict(_taxi(flink=FLINK, placements=placements)).kubeflow.flink
