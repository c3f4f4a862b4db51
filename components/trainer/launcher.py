"""The Trainer step on Kubeflow: a multi-worker strategy trains as a training job.

`should_launch` says whether this step submits a job instead of training in its pod;
`launch` submits it on the step's invocation (`components.kubernetes.jobs`), waits for it
and returns with its result.
"""

from __future__ import annotations

import json
import os

from absl import logging
from tfx.types import artifact_utils, standard_component_specs

from components.config import PipelineConfig
from components.kubernetes import jobs


def should_launch(config: PipelineConfig | None) -> bool:
    """Whether this step submits a training job instead of training (never without a config)."""
    return config is not None and jobs.should_launch(config, os.environ)


def launch(config: PipelineConfig, input_dict, output_dict, exec_properties) -> None:
    """Submits the training job on this step's invocation and waits for it.

    Args:
      config: The pipeline config (strategy, Kubeflow placement).
      input_dict, output_dict: The step's artifacts.
      exec_properties: The step's execution properties as the executor
        prepared them (a subclass's additions included): every replica
        trains on exactly these.
    """
    invocation = {
        "input_dict": artifact_utils.jsonify_artifact_dict(input_dict),
        "output_dict": artifact_utils.jsonify_artifact_dict(output_dict),
        "exec_properties": json.loads(json.dumps(exec_properties)),
    }
    model_run = artifact_utils.get_single_uri(output_dict[standard_component_specs.MODEL_RUN_KEY])
    jobs.launch(config, invocation, model_run, os.environ, log=logging.info)
