"""The Distiller component: a Trainer whose inputs include teacher models.

Its spec is the stock TFX Trainer spec plus one `Model` input per teacher
(`teacher_model_0` ... `teacher_model_{MAX_TEACHERS - 1}`). Separate named
inputs rather than one union channel, because the Kubeflow V2 compiler
accepts only plain channels. The output is a stock `Model` artifact whose
serving signatures equal the teachers', so Evaluator and Pusher treat the
student like any model.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import trainer_pb2
from tfx.types import BaseChannel, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter
from tfx.utils import json_utils

from components import payload
from components.config import MAX_TEACHERS, PipelineConfig
from components.distiller import executor

DEFAULT_RUN_FN = "components.distiller.run_fn.run_fn"


def teacher_key(index: int) -> str:
    """Input key of the `index`-th teacher model."""
    return f"{executor.TEACHER_KEY_PREFIX}{index}"


class DistillerSpec(types.ComponentSpec):
    """Trainer spec plus the teacher model inputs."""

    PARAMETERS = dict(standard_component_specs.TrainerSpec.PARAMETERS)
    INPUTS = {
        standard_component_specs.EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        standard_component_specs.TRANSFORM_GRAPH_KEY: ChannelParameter(
            type=standard_artifacts.TransformGraph
        ),
        standard_component_specs.SCHEMA_KEY: ChannelParameter(
            type=standard_artifacts.Schema, optional=True
        ),
        **{
            teacher_key(i): ChannelParameter(type=standard_artifacts.Model, optional=i > 0)
            for i in range(MAX_TEACHERS)
        },
    }
    OUTPUTS = dict(standard_component_specs.TrainerSpec.OUTPUTS)
    TYPE_ANNOTATION = standard_component_specs.TrainerSpec.TYPE_ANNOTATION


class Distiller(base_component.BaseComponent):
    """Trains the configured student on one or more frozen teachers.

    Args:
      config: The validated pipeline config (`student`, `distillation`, and
        the `train` settings the teacher used).
      examples: Transformed examples (Transform's `transformed_examples`).
      transform_graph: Transform's `transform_graph`.
      teacher_models: The teachers' `Model` channels (tfxkit Trainer outputs).
      schema: Optional schema (unused by the default `run_fn`).
      run_fn: Dotted path of the training function (default: the tfxkit
        distillation `run_fn`).
      custom_config: Extra entries kept beside the tfxkit config.

    Raises:
      ValueError: with no teacher or more than `MAX_TEACHERS` teachers.
      ConfigError: naming `custom_config` when it is not a dict or uses a
        key reserved for tfxkit.
    """

    SPEC_CLASS = DistillerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(
        self,
        config: PipelineConfig,
        examples: BaseChannel,
        transform_graph: BaseChannel,
        teacher_models: Sequence[BaseChannel],
        schema: BaseChannel | None = None,
        run_fn: str = DEFAULT_RUN_FN,
        custom_config: dict | None = None,
    ):
        config.require_data("the Distiller")
        teacher_models = list(teacher_models)
        if not teacher_models:
            raise ValueError(
                "distillation: no teacher model was given; pass the teacher Trainers' outputs['model'] as teacher_models"
            )
        if len(teacher_models) > MAX_TEACHERS:
            raise ValueError(
                f"distillation.num_teachers: at most {MAX_TEACHERS} teachers are supported, got {len(teacher_models)}"
            )
        spec = DistillerSpec(
            examples=examples,
            transform_graph=transform_graph,
            schema=schema,
            train_args=trainer_pb2.TrainArgs(
                splits=["train"],
                num_steps=config.student_train_steps(),
            ),
            eval_args=trainer_pb2.EvalArgs(splits=["eval"], num_steps=config.train.eval_steps),
            run_fn=run_fn,
            custom_config=json_utils.dumps(payload.encode(custom_config, config=config)),
            model=types.Channel(type=standard_artifacts.Model),
            model_run=types.Channel(type=standard_artifacts.ModelRun),
            **{teacher_key(i): channel for i, channel in enumerate(teacher_models)},
        )
        super().__init__(spec=spec)
