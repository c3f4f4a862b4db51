"""The distiller's `run_fn`: train the student on its teachers and export it.

Thin: unpack TFX's `FnArgs` (the executor adds the teacher model directories
to the payload, see `components.config.payload`), check the teachers against the student's task before
any training, then train with the Trainer's own `training.fit` (strategies,
gradient accumulation, mixed precision, backups) and export with the
Trainer's own serving export, so the student serves exactly like its
teacher. Like the Trainer's `run_fn`, it runs unchanged as every replica of
a multi-worker job, and only the chief writes the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.config import payload
from components.distillation import model as distillation
from components.distillation import students as student_lib
from components.distillation import teachers as teachers_lib
from components.training import fit as training
from components.training import task as task_lib
from components.training.inputs import MASK_UNLABELED, make_datasets


def train_student(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teacher_dirs: Sequence[str],
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> tuple[keras.Model, dict[str, float]]:
    """Distils the configured student from exported teachers.

    Args:
      task: The training task; its config gives the `student` shape, the
        `distillation` settings and the shared `train` settings.
      inputs: Transform output and step counts, as for the teacher.
      teacher_dirs: Serving SavedModels of the teachers.
      callbacks: Extra Keras callbacks for `fit`.

    Returns:
      The trained student and its evaluation results (`accuracy`,
      `hard_loss`, `soft_loss`, `loss`) on the eval split.

    Raises:
      ValueError: before training, if the teachers cannot teach this student.
    """
    config = task.config
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

    return _distil(
        task,
        inputs,
        lambda: training.build_model(config, tft_output, config.student, "student"),
        described,
        callbacks,
    )


def _distil(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    build_student,
    teachers: Sequence[teachers_lib.TeacherInfo],
    callbacks: Sequence[keras.callbacks.Callback],
) -> tuple[keras.Model, dict[str, float]]:
    """Trains a new student (`build_student()`, in the strategy scope) on the teachers' soft targets."""
    config = task.config
    settings = config.distillation
    built = []

    def build_and_compile() -> keras.Model:
        student = build_student()
        built.append(student)
        distiller = distillation.Distiller(
            student_lib.class_logits_model(student, teachers[0].width),
            [
                teachers_lib.ExportedTeacher(t.export_dir, t, name=f"teacher_{i}")
                for i, t in enumerate(teachers)
            ],
            alpha=settings.alpha,
            temperature=settings.temperature,
            teacher_weights=settings.teacher_weights or None,
            cache_targets=settings.cache_teacher_logits,
            name="distiller",
        )
        distiller.compile(optimizer=training.make_optimizer(config, inputs.train_steps))
        return distiller

    _, results = task.fit(inputs, build_and_compile, callbacks=callbacks, unlabeled=MASK_UNLABELED)
    return built[-1], results


def train_student_fn(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teachers: Sequence[teachers_lib.TeacherInfo],
    build_student,
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> tuple[keras.Model, dict[str, float]]:
    """Distils the user's student (`student_fn`) from teachers of any Trainer.

    Before training, on the first training batch: the labels must be
    classes of the teachers, and each Keras teacher's output must read as
    `describe_teacher` said (`teachers.check_outputs`).

    Args:
      task: The training task; its config gives `distillation`, `train`,
        `ingestion` and `strategy` (no data section needed).
      inputs: Transform output and step counts; `inputs.label_key` set.
      teachers: Descriptions of the teachers, checked against the student.
      build_student: Returns a new student (logits out); called in the
        strategy scope.
      callbacks: Extra Keras callbacks for `fit`.

    Returns:
      The trained student (as `build_student` made it) and its evaluation
      results on the eval split.
    """
    config = task.config
    tft_output = tft.TFTransformOutput(inputs.transform_output)
    # No cache: the check reads one batch, and a file cache begun must be finished.
    probe_config = dataclasses.replace(
        config, ingestion=dataclasses.replace(config.ingestion, cache="none")
    )
    train, _ = make_datasets(probe_config, inputs, tft_output, unlabeled=MASK_UNLABELED)
    features, labels = next(iter(train.take(1)))
    for i, info in enumerate(teachers):
        teachers_lib.check_labels(info, labels.numpy())
        outputs = teachers_lib.ExportedTeacher(info.export_dir, info).outputs_of(features)
        teachers_lib.check_outputs(info, np.asarray(outputs), i)
    del train, features, labels
    return _distil(task, inputs, build_student, teachers, callbacks)


def _run_student_module(task: task_lib.Task, fn_args) -> None:
    config = task.config
    tft_output = tft.TFTransformOutput(fn_args.transform_output)
    transformed = sorted(tft_output.transformed_feature_spec())
    described = [
        teachers_lib.describe_teacher(d, config.distillation.teacher_output, transformed)
        for d in task.payload.teacher_dirs
    ]
    teachers_lib.check_agreement(described, config.distillation.teacher_weights)
    label = student_lib.label_key(config, described, transformed)
    inputs = training.TrainingInputs.from_fn_args(fn_args, config, label_key=label)
    student_fn = student_lib.load_student_fn(task.payload.student_module)
    probe = student_lib.build(student_fn, fn_args)
    student_lib.check_student(config, probe, described, [k for k in transformed if k != label])
    logging.info(
        "Distiller: student_fn model %d parameters, teachers %s (%s, width %d); label %r; alpha=%s T=%s",
        distillation.count_params(probe.trainable_weights),
        [t.num_params for t in described],
        described[0].output,
        described[0].width,
        label,
        config.distillation.alpha,
        config.distillation.temperature,
    )
    del probe
    student, _ = train_student_fn(
        task, inputs, described, lambda: student_lib.build(student_fn, fn_args)
    )
    task.export(
        student,
        inputs,
        save=lambda d: student_lib.export_like_teacher(student, tft_output, described[0], d),
    )


def run_fn(fn_args) -> None:
    """Trains and exports the student (TFX `run_fn` contract).

    The configured student, or the `student_fn` of the Distiller's module
    file when it has one. The task starts (strategy first, see
    `components.training.task`) before any teacher is loaded.
    """
    if payload.of(fn_args).student_module:
        task_lib.run_fn_task(
            fn_args, "Distiller", lambda task: _run_student_module(task, fn_args), needs_data=False
        )
        return

    def distil(task: task_lib.Task) -> None:
        inputs = training.TrainingInputs.from_fn_args(fn_args, task.config)
        student, _ = train_student(task, inputs, task.payload.teacher_dirs)
        task.export(student, inputs)

    task_lib.run_fn_task(fn_args, "Distiller", distil)
