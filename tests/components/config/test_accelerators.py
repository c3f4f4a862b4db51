"""GKE accelerator facts: resource names, node labels, TPU topologies."""

from __future__ import annotations

import pytest

from components.config import accelerators


@pytest.mark.parametrize(
    "accelerator_type, topology, resource, labels",
    [
        ("nvidia-l4", "", "nvidia.com/gpu", {"cloud.google.com/gke-accelerator": "nvidia-l4"}),
        (
            "tpu-v4-podslice",
            "2x2x4",
            "google.com/tpu",
            {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v4-podslice",
                "cloud.google.com/gke-tpu-topology": "2x2x4",
            },
        ),
        ("", "", "", {}),
    ],
    ids=["gpu", "tpu", "none"],
)
def test_accelerator_resource_and_node_labels(accelerator_type, topology, resource, labels):
    assert accelerators.accelerator_resource(accelerator_type) == resource
    assert accelerators.accelerator_node_labels(accelerator_type, topology) == labels
    assert accelerators.is_tpu(accelerator_type) == (resource == accelerators.TPU_RESOURCE)


def test_every_known_tpu_is_a_tpu():
    assert all(accelerators.is_tpu(name) for name in accelerators.TPU_TOPOLOGY_DIMS)
    assert set(accelerators.TPU_TOPOLOGY_DIMS.values()) == {2, 3}
