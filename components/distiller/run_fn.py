"""The distiller's `run_fn`: train the student on its teachers and export it.

Thin: unpack TFX's `FnArgs` (the executor adds the teacher model directories
to the payload, see `components.payload`), check the teachers against the student's task before
any training, then train with the Trainer's own `training.fit` (strategies,
gradient accumulation, mixed precision, backups) and export with the
Trainer's own serving export, so the student serves exactly like its
teacher. Like the Trainer's `run_fn`, it runs unchanged as every replica of
a multi-worker job, and only the chief writes the model.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components import distillation, strategies
from components.config import PipelineConfig
from components.distiller import teachers as teachers_lib
from components.trainer import task as task_lib
from components.trainer import training
from components.trainer.inputs import MASK_UNLABELED


def train_student(
    config: PipelineConfig,
    inputs: training.TrainingInputs,
    teacher_dirs: Sequence[str],
    choice: strategies.StrategyChoice | None = None,
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> tuple[keras.Model, dict[str, float]]:
    """Distils the configured student from exported teachers.

    Args:
      config: The validated pipeline config (`student` shape, `distillation`
        settings, shared `train` settings).
      inputs: Transform output and step counts, as for the teacher.
      teacher_dirs: Serving SavedModels of the teachers.
      choice: The strategy, when the caller created it already (it must be
        created before anything else touches TensorFlow).
      callbacks: Extra Keras callbacks for `fit`.

    Returns:
      The trained student and its evaluation results (`accuracy`,
      `hard_loss`, `soft_loss`, `loss`) on the eval split.

    Raises:
      ValueError: before training, if the teachers cannot teach this student.
    """
    choice = choice if choice is not None else strategies.create_strategy(config.strategy)
    settings = config.distillation
    tft_output = tft.TFTransformOutput(inputs.transform_output)
    described = [teachers_lib.describe_teacher(d) for d in teacher_dirs]
    probe = training.build_model(config, tft_output, config.student, "student")
    teachers_lib.check_teachers(config, described, probe)
    logging.info(
        "Distiller: student %d parameters, teachers %s; alpha=%s T=%s",
        distillation.count_params(probe.trainable_weights),
        [t.num_params for t in described],
        settings.alpha,
        settings.temperature,
    )
    del probe

    def build_and_compile() -> keras.Model:
        student = training.build_model(config, tft_output, config.student, "student")
        teachers = [
            teachers_lib.ExportedTeacher(d, name=f"teacher_{i}") for i, d in enumerate(teacher_dirs)
        ]
        distiller = distillation.Distiller(
            student,
            teachers,
            alpha=settings.alpha,
            temperature=settings.temperature,
            teacher_weights=settings.teacher_weights or None,
            cache_targets=settings.cache_teacher_logits,
            name="distiller",
        )
        distiller.compile(optimizer=training.make_optimizer(config, inputs.train_steps))
        return distiller

    distiller, results = training.fit(
        config,
        inputs,
        build_and_compile,
        choice=choice,
        callbacks=callbacks,
        unlabeled=MASK_UNLABELED,
    )
    return distiller.student, results


def run_fn(fn_args) -> None:
    """Trains and exports the student (TFX `run_fn` contract)."""
    # Before loading the teachers: the strategy comes first (see components.trainer.task).
    task = task_lib.from_fn_args(fn_args, "Distiller")
    if task is None:
        return
    inputs = training.TrainingInputs.from_fn_args(fn_args, task.config)
    student, _ = train_student(task.config, inputs, task.payload.teacher_dirs, task.choice)
    task_lib.export(student, task.config, inputs, task.choice)
