"""The Trainer step on Kubeflow: a multi-worker strategy trains as a training job.

On Kubeflow, a strategy that needs several workers does not train in the
step's pod: the step submits a training job (a TrainJob or a TFJob, see
`components.kubernetes.jobs`) carrying its invocation, watches it and returns
with the job's result. Each replica runs the Trainer executor (`python -m
components.trainer.executor`) on that invocation, with the `TF_CONFIG` the
training operator gives it or, on a TrainJob, the one `components.training.cluster`
derives from its JobSet environment.
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
