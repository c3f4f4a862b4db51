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
