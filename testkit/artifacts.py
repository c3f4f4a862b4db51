"""TFX artifacts on local directories, for tests that call an executor directly."""

from __future__ import annotations

import os

from tfx.types import artifact_utils, standard_artifacts


def local_artifact(cls, root, name: str, **properties):
    """An artifact of type `cls` whose URI is the (created) directory `root/name`."""
    artifact = cls()
    artifact.uri = os.path.join(str(root), name)
    os.makedirs(artifact.uri, exist_ok=True)
    for key, value in properties.items():
        setattr(artifact, key, value)
    return artifact


def trainer_artifacts(root) -> tuple[dict, dict]:
    """The Trainer executor's `input_dict` (train / eval examples) and `output_dict`
    (model, model run) on directories under `root`."""
    examples = local_artifact(
        standard_artifacts.Examples,
        root,
        "examples",
        split_names=artifact_utils.encode_split_names(["train", "eval"]),
    )
    outputs = {
        "model": [local_artifact(standard_artifacts.Model, root, "model")],
        "model_run": [local_artifact(standard_artifacts.ModelRun, root, "model_run")],
    }
    return {"examples": [examples]}, outputs
