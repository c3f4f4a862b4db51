"""Trainer executor: validates the config first, then runs TFX's GenericExecutor.

On Kubeflow, a multi-worker strategy trains through a training job instead
(a TrainJob or a TFJob, see `components.kubeflow.jobs`): the step submits and
watches the job, and each replica runs this module (`python -m
components.trainer.executor`) on the step's invocation, with the `TF_CONFIG`
the training operator gives it or, on a TrainJob, the one
`components.strategies` derives from its JobSet environment.
"""

from __future__ import annotations

import json
import os
import tempfile

from absl import logging
from tfx.components.trainer import executor as tfx_trainer_executor
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils, standard_component_specs

from components.config import from_custom_config
from components.kubeflow import env as tfxkit_env
from components.kubeflow import jobs


class Executor(tfx_trainer_executor.GenericExecutor):
    """Fails fast on an invalid config, before any input is read."""

    def Do(self, input_dict, output_dict, exec_properties):
        config = from_custom_config(exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY))
        if config is not None and jobs.should_launch(config, os.environ):
            invocation = {
                "input_dict": artifact_utils.jsonify_artifact_dict(input_dict),
                "output_dict": artifact_utils.jsonify_artifact_dict(output_dict),
                "exec_properties": json.loads(json.dumps(exec_properties)),
            }
            model_run = artifact_utils.get_single_uri(
                output_dict[standard_component_specs.MODEL_RUN_KEY]
            )
            jobs.launch(config, invocation, model_run, os.environ, log=logging.info)
            return
        super().Do(input_dict, output_dict, exec_properties)


def main() -> None:
    """A training-job replica: trains on the invocation the Trainer step wrote.

    The step recorded its exec properties after its executor (a subclass such
    as the Distiller's included) had prepared them, so every replica runs this
    base executor on them and trains exactly what the step would have.
    """
    logging.set_verbosity(logging.INFO)
    invocation = jobs.read_invocation(tfxkit_env.invocation_uri(os.environ))
    context = base_executor.BaseExecutor.Context(tmp_dir=tempfile.mkdtemp(prefix="tfxkit-replica-"))
    Executor(context).Do(
        artifact_utils.parse_artifact_dict(invocation["input_dict"]),
        artifact_utils.parse_artifact_dict(invocation["output_dict"]),
        invocation["exec_properties"],
    )


if __name__ == "__main__":
    main()
