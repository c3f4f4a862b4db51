"""GKE accelerator facts: resource names, node labels, TPU slice topologies.

Both the config (`components.config`, which validates a `Placement`'s
accelerator fields) and the Kubernetes rendering
(`components.kubernetes.placement`, which requests and selects them) read these
facts, so they live here, apart from both: pure data and string functions,
no TFX, Kubernetes or config imports.
"""

from __future__ import annotations

# Kubernetes extended resources of accelerators; KFP's driver requests the
# same names verbatim.
GPU_RESOURCE = "nvidia.com/gpu"
TPU_RESOURCE = "google.com/tpu"
# GKE node labels that select an accelerator's node pool.
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GKE_TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
# GKE TPU accelerator label -> dimensions of its slice topology (v4 and v5p
# slices are 3-D tori such as 2x2x4; v3, v5e and v6e are 2-D such as 2x4).
TPU_TOPOLOGY_DIMS = {
    "tpu-v3-slice": 2,
    "tpu-v3-device": 2,
    "tpu-v4-podslice": 3,
    "tpu-v5-lite-podslice": 2,
    "tpu-v5-lite-device": 2,
    "tpu-v5p-slice": 3,
    "tpu-v6e-slice": 2,
}
TPU_PREFIX = "tpu-"


def is_tpu(accelerator_type: str) -> bool:
    """Whether a GKE accelerator name (`tpu-v5-lite-podslice`, `nvidia-l4`) is a TPU."""
    return accelerator_type.startswith(TPU_PREFIX)


def accelerator_resource(accelerator_type: str) -> str:
    """The extended resource an accelerator is requested as ('' for none).

    Args:
      accelerator_type: A GKE accelerator name, or '' for none.

    Returns:
      `google.com/tpu` for TPUs, `nvidia.com/gpu` for GPUs, '' for none.
    """
    if not accelerator_type:
        return ""
    return TPU_RESOURCE if is_tpu(accelerator_type) else GPU_RESOURCE


def accelerator_node_labels(accelerator_type: str, tpu_topology: str = "") -> dict[str, str]:
    """The GKE node labels that pick an accelerator's node pool.

    Config validation reads these to reject a `node_selector` that
    contradicts the accelerator fields.

    Args:
      accelerator_type: A GKE accelerator name, or '' for none.
      tpu_topology: The TPU slice topology (`2x4`); TPUs only.

    Returns:
      Label -> value: the accelerator label for a GPU, the TPU accelerator
      and topology labels for a TPU, {} for none.
    """
    if is_tpu(accelerator_type):
        return {GKE_TPU_ACCELERATOR_LABEL: accelerator_type, GKE_TPU_TOPOLOGY_LABEL: tpu_topology}
    if accelerator_type:
        return {GKE_ACCELERATOR_LABEL: accelerator_type}
    return {}
