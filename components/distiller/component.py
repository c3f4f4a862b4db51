"""The Distiller component: a Trainer whose inputs include teacher models.

`DistillerSpec` is the stock Trainer spec plus one named `Model` input per teacher
(`teacher_key`: `teacher_model_0` ...); `Distiller`'s output is a stock `Model` whose
serving signatures equal the teachers', so Evaluator and Pusher treat it like any model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tfx import types
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import trainer_pb2
from tfx.types import BaseChannel, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter
from tfx.utils import json_utils

from components.config import (
    M_ON_M,
    MAX_TEACHERS,
    ConfigError,
    PipelineConfig,
    module_config_from_dict,
    payload,
    stock_args,
)
from components.config.distillation import KD, NOISY_STUDENT, method_problem
from components.distillation import students
from components.distillation.students import STUDENT_FN
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
        standard_component_specs.HYPERPARAMETERS_KEY: ChannelParameter(
            type=standard_artifacts.HyperParameters, optional=True
        ),
        **{
            teacher_key(i): ChannelParameter(type=standard_artifacts.Model, optional=i > 0)
            for i in range(MAX_TEACHERS)
        },
    }
    OUTPUTS = dict(standard_component_specs.TrainerSpec.OUTPUTS)
    TYPE_ANNOTATION = standard_component_specs.TrainerSpec.TYPE_ANNOTATION


class Distiller(base_component.BaseComponent):
    """Trains a student on one or more frozen teachers.

    Two kinds of student:

    - the configured one (`config.student`, a full config with its data
      section), from teachers the tfxkit Trainer exported;
    - your own: `module_file` defines `student_fn(fn_args) -> tf.keras.Model`
      (built on the transformed features, logits out), as a TFX module file
      defines `run_fn`. Its teachers come from any TFX Trainer (stock
      `tfx.components.Trainer` or tfxkit's) whose run_fn saved a Keras
      model, and it is exported with the first teacher's serving signatures,
      so Evaluator (student as candidate, teacher as baseline) and Pusher
      treat it as the teacher. `config` is then optional: the
      `distillation`, `train`, `ingestion` and `strategy` sections.

    Args:
      config: The validated pipeline config, a mapping of its sections, or
        (with `module_file`) None for every default.
      examples: Transformed examples (Transform's `transformed_examples`).
      transform_graph: Transform's `transform_graph`.
      teacher_models: The teachers' `Model` channels.
      schema: Optional schema (unused by the default `run_fn`).
      run_fn: Dotted path of the training function (default: the tfxkit
        distillation `run_fn`).
      custom_config: Extra entries kept beside the tfxkit config.
      module_file: A module file defining `student_fn` (TFX packages it as
        it packages a Trainer's module file).
      train_args: Student training steps (default: the config's
        `distillation.student_train_steps`, else `train.train_steps`).
      eval_args: Evaluation steps (default: `train.eval_steps`).
      hyperparameters: Optional `HyperParameters` channel, passed to
        `student_fn` as `fn_args.hyperparameters` as a Trainer passes it.

    Raises:
      ValueError: with no teacher or more than `MAX_TEACHERS` teachers.
      ConfigError: naming the argument: a module file that is missing or
        defines no `student_fn`, zero training steps, augmentation asked
        for a `student_fn` student, or `custom_config` that is not a dict or
        uses a key reserved for tfxkit; a local module file's `student_fn`
        that returns no Keras model or returns probabilities, built once here
        (`students.check_at_build`), naming the file and line.
      UserCodeError: that `student_fn` raised when built here.
    """

    SPEC_CLASS = DistillerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(
        self,
        config: PipelineConfig | Mapping[str, Any] | None = None,
        examples: BaseChannel | None = None,
        transform_graph: BaseChannel | None = None,
        teacher_models: Sequence[BaseChannel] = (),
        schema: BaseChannel | None = None,
        run_fn: str = DEFAULT_RUN_FN,
        custom_config: dict | None = None,
        *,
        module_file: Any = None,
        train_args: trainer_pb2.TrainArgs | None = None,
        eval_args: trainer_pb2.EvalArgs | None = None,
        hyperparameters: BaseChannel | None = None,
    ):
        if examples is None or transform_graph is None:
            raise ConfigError(
                "examples / transform_graph: the Distiller needs Transform's transformed_examples and "
                "transform_graph"
            )
        config = _resolve_config(config, module_file)
        teacher_models = list(teacher_models)
        if not teacher_models:
            raise ValueError(
                "distillation: no teacher model was given; pass the teacher Trainers' outputs['model'] as teacher_models"
            )
        if len(teacher_models) > MAX_TEACHERS:
            raise ValueError(
                f"distillation.num_teachers: at most {MAX_TEACHERS} teachers are supported, got {len(teacher_models)}"
            )
        _check_method(config, len(teacher_models), module_file is not None)
        stock_args.check_steps(train_args, eval_args, None)
        train_args = train_args or trainer_pb2.TrainArgs(
            splits=["train"], num_steps=config.student_train_steps()
        )
        eval_args = eval_args or trainer_pb2.EvalArgs(
            splits=["eval"], num_steps=config.train.eval_steps
        )
        custom_config = json_utils.dumps(payload.encode(custom_config, config=config))
        if isinstance(module_file, str) and "://" not in module_file:
            _check_student_fn(
                module_file, train_args, eval_args, custom_config, hyperparameters is not None
            )
        spec = DistillerSpec(
            examples=examples,
            transform_graph=transform_graph,
            schema=schema,
            hyperparameters=hyperparameters,
            train_args=train_args,
            eval_args=eval_args,
            module_file=module_file,
            run_fn=run_fn,
            custom_config=custom_config,
            model=types.Channel(type=standard_artifacts.Model),
            model_run=types.Channel(type=standard_artifacts.ModelRun),
            **{teacher_key(i): channel for i, channel in enumerate(teacher_models)},
        )
        super().__init__(spec=spec)
        if module_file is not None:
            # As tfx.components.Trainer: the module travels as a wheel to where the step runs.
            udf_utils.add_user_module_dependency(self, "module_file", "module_path")


def _check_student_fn(
    module_file: str,
    train_args: trainer_pb2.TrainArgs,
    eval_args: trainer_pb2.EvalArgs,
    custom_config: str,
    tuned: bool,
) -> None:
    """Builds the module's `student_fn` now, on the `FnArgs` the executor will pass as far as
    they are known, and checks it returns logits (`students.check_at_build`).

    Args:
      custom_config: The component's `custom_config` execution property (JSON).
      tuned: The Distiller has a `hyperparameters` input (known when it runs).

    Raises:
      ConfigError, UserCodeError: as `students.check_at_build`.
    """
    unknown = students.RUN_TIME_FIELDS | ({"hyperparameters"} if tuned else set())
    fn_args = students.BuildFnArgs(
        unknown=frozenset(unknown),
        train_steps=train_args.num_steps,
        eval_steps=eval_args.num_steps,
        custom_config=json_utils.loads(custom_config),
    )
    students.check_at_build(module_file, fn_args)


def _check_method(config: PipelineConfig, num_teachers: int, student_fn: bool) -> None:
    """Refuses an M-on-M Distiller it cannot serve, naming the field.

    Raises:
      ConfigError: fewer than two teacher models; or a `student_fn` with
        `distillation.scratch_baseline` (its verdict compares one student
        with one student trained alone, not an ensemble).
    """
    settings = config.distillation
    problem = method_problem(settings.method, num_teachers, bool(settings.teacher_weights))
    if problem:
        field, message = problem
        raise ConfigError(f"distillation.{field} (teacher_models): {message}")
    if settings.method == M_ON_M and student_fn and settings.scratch_baseline:
        raise ConfigError(
            "distillation.scratch_baseline: with method m_on_m the Distiller serves an ensemble of "
            f"{STUDENT_FN} students, and the verdict compares one student with the same student trained "
            "alone; set scratch_baseline: false (the run's log reports each student and the ensemble)"
        )


def _resolve_config(config: Any, module_file: Any) -> PipelineConfig:
    """The config a Distiller runs with, checked for its kind of student.

    Raises:
      ConfigError: naming `config` or the field that cannot work.
    """
    if module_file is None:
        if not isinstance(config, PipelineConfig):
            raise ConfigError(
                "config: without module_file the Distiller trains the configured student and needs a "
                f"PipelineConfig with a data section, got {type(config).__name__}; give module_file with "
                f"{STUDENT_FN} to distil your own student"
            )
        config.require_data("without module_file, the Distiller's configured student")
        return config
    stock_args.check_module_file(module_file, {STUDENT_FN: "module_file"})
    if config is None:
        config = PipelineConfig()
    elif isinstance(config, Mapping):
        config = module_config_from_dict(config, "config")
    elif not isinstance(config, PipelineConfig):
        raise ConfigError(
            f"config: expected a PipelineConfig, a mapping of its sections or None, got {type(config).__name__}"
        )
    student = config.student
    noise = student.dropout or student.stochastic_depth or (student.conv and student.conv.dropout)
    if config.distillation.method == NOISY_STUDENT and noise:
        raise ConfigError(
            f"student: a {STUDENT_FN} student is your own model, and the student section's noise "
            "(dropout, stochastic_depth) applies to the configured student only; put the dropout or "
            f"stochastic depth in the model {STUDENT_FN} returns and leave the student section out"
        )
    if config.train.augmentation.enabled:
        raise ConfigError(
            f"train.augmentation: a {STUDENT_FN} student trains on the stored transformed examples, and the "
            "augmentation needs the data section's feature shapes; disable it (the teacher-target cache wants "
            "clean examples anyway)"
        )
    return config


def ensemble_student_config(config: PipelineConfig) -> PipelineConfig:
    """The config of `EnsembleStudent`: the same student and settings, method `kd`."""
    return dataclasses.replace(
        config,
        distillation=dataclasses.replace(config.distillation, method=KD, scratch_baseline=False),
    )


class EnsembleStudent(Distiller):
    """One configured student distilled from all the teachers' averaged soft targets.

    With `distillation.method: m_on_m` the pipeline trains it beside the
    M-on-M Distiller: what a user would serve instead of the students'
    ensemble, at one student's cost. A component type of its own, so the
    report tells it from the candidate (`pipelines.roles`).
    """

    def __init__(
        self,
        config: PipelineConfig,
        examples: BaseChannel,
        transform_graph: BaseChannel,
        teacher_models: Sequence[BaseChannel],
        schema: BaseChannel | None = None,
    ):
        super().__init__(
            config=ensemble_student_config(config),
            examples=examples,
            transform_graph=transform_graph,
            teacher_models=teacher_models,
            schema=schema,
        )


def round_id(index: int) -> str:
    """Node id of Noisy Student round `index` (1-based) before the last (the `Distiller`)."""
    return f"Round_{index}"


class StudentRound(Distiller):
    """A Noisy Student round before the last: its student is the next round's teacher.

    The same Distiller (`distillation.method: noisy_student`); a component
    type of its own, so the report lists it as a round, not as the
    candidate (`pipelines.roles`).
    """
