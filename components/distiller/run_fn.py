"""The distiller's `run_fn`: train the student on its teachers and export it.

`run_fn` checks the teachers against the student before any training, trains with the
Trainer's `training.fit` and exports with its serving export (`train_student`, and
`train_student_fn` for a user's `student_fn`, which with a scratch baseline also records
the verdict against the same student trained alone); only the chief writes the model.
With `distillation.method: m_on_m`, one student per teacher and their ensemble
(`members_m_on_m`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.compat import legacy_keras
from components.config import M_ON_M, NOISY_STUDENT, payload
from components.distillation import losses, self_training
from components.distillation import model as distillation
from components.distillation import students as student_lib
from components.distillation import teachers as teachers_lib
from components.distillation import verdict as verdict_lib
from components.distiller.executor import MEMBERS_DIR, ROUND_FILE
from components.training import fit as training
from components.training import models
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
    described, build_student = _configured_student(task.config, inputs, teacher_dirs)
    return _distil(task, inputs, build_student, described, callbacks)


def train_m_on_m(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teacher_dirs: Sequence[str],
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> dict[str, float]:
    """M-on-M with the configured student: one per teacher, served as their ensemble.

    Returns:
      Eval accuracies (`members_m_on_m`).
    """
    described, build_student = _configured_student(task.config, inputs, teacher_dirs)
    return members_m_on_m(
        task, inputs, described, build_student, save_like=None, callbacks=callbacks
    )


def _configured_student(config, inputs: training.TrainingInputs, teacher_dirs: Sequence[str]):
    """The teachers, described and checked against the configured student (before any
    training), and the function that builds that student."""
    tft_output = tft.TFTransformOutput(inputs.transform_output)
    described = [teachers_lib.describe_teacher(d) for d in teacher_dirs]

    def build_student() -> keras.Model:
        return training.build_model(config, tft_output, config.student, "student")

    probe = build_student()
    teachers_lib.check_teachers(config, described, probe)
    settings = config.distillation
    logging.info(
        "Distiller (%s): student %d parameters, teachers %s; alpha=%s T=%s",
        settings.method,
        distillation.count_params(probe.trainable_weights),
        [t.num_params for t in described],
        settings.alpha,
        settings.temperature,
    )
    return described, build_student


def train_noisy_student(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teacher_dirs: Sequence[str],
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> dict:
    """One Noisy Student round with the configured student; exports it.

    The teachers (the round's teacher: the first round's teacher Trainers or
    the previous round's student) label the unlabeled examples
    (`self_training.pseudo_label`); the student trains as a classifier on
    the labeled and kept pseudo-labeled examples under the configured noise.

    Returns:
      The labeling summary with the student's eval results (`eval`).
    """
    config = task.config
    described, build_student = _configured_student(config, inputs, teacher_dirs)
    pseudo, summary = self_training.pseudo_label(config, inputs, described)

    def build_and_compile() -> keras.Model:
        model = build_student()
        training.compile_classifier(model, config, inputs.train_steps)
        return model

    student, results = task.fit(inputs, build_and_compile, callbacks=callbacks, unlabeled=pseudo)
    summary["eval"] = {k: float(v) for k, v in results.items()}
    task.export(student, inputs)
    _write_beside(task, inputs, ROUND_FILE, summary)
    return summary


def _write_beside(task: task_lib.Task, inputs: training.TrainingInputs, name: str, record) -> None:
    """Writes `record` as JSON at the model artifact's root (chief only), beside its serving model."""
    if task.is_chief:
        path = os.path.join(os.path.dirname(inputs.serving_model_dir.rstrip("/")), name)
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(json.dumps(record, indent=2) + "\n")


def member_inputs(inputs: training.TrainingInputs, index: int) -> training.TrainingInputs:
    """Student `index` of M-on-M: its own backup, and its serving model beside the ensemble's
    (`<model artifact>/MEMBERS_DIR/<index>`, not inside the directory a Pusher copies)."""
    root = os.path.dirname(inputs.serving_model_dir.rstrip("/"))
    return dataclasses.replace(
        inputs,
        serving_model_dir=os.path.join(root, MEMBERS_DIR, str(index)),
        backup_dir=f"{inputs.backup_dir}-student{index}",
    )


def members_m_on_m(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teachers: Sequence[teachers_lib.TeacherInfo],
    build_student,
    *,
    save_like: teachers_lib.TeacherInfo | None,
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> dict[str, float]:
    """Trains student i on teacher i alone (seed `train.seed + i`), exports each, then the ensemble.

    The ensemble (`ensemble_model`: the mean of the students' logits) is the
    Distiller's model, with tfxkit's signatures or, with `save_like`, that
    teacher's. Every student's backup is kept until the ensemble is
    exported, so a task restarted midway skips the students already trained.

    Returns:
      Eval accuracy of each student (`student_<i>`) and of the ensemble.
    """
    config = task.config
    tft_output = tft.TFTransformOutput(inputs.transform_output)
    width = teachers[0].width
    members, accuracies = [], {}
    for i, teacher in enumerate(teachers):
        seeded = dataclasses.replace(
            config, train=dataclasses.replace(config.train, seed=config.train.seed + i)
        )
        member_task = dataclasses.replace(
            task, payload=dataclasses.replace(task.payload, config=seeded)
        )
        own = member_inputs(inputs, i)
        student, results = _distil(member_task, own, build_student, [teacher], callbacks)
        accuracies[f"student_{i}"] = float(results["accuracy"])
        logging.info(
            "Distiller: M-on-M student %d of %d (teacher %s): eval accuracy %.4f",
            i + 1,
            len(teachers),
            teacher.export_dir,
            results["accuracy"],
        )
        task.export(student, own, save=_saver(student, tft_output, save_like), release=False)
        members.append(student)
    with task.scope():
        ensemble = ensemble_model(members)
    scored = student_lib.class_logits_model(ensemble, width)
    accuracies["ensemble"] = _eval_accuracy(config, inputs, lambda f: scored(f, training=False))
    logging.info(
        "Distiller: M-on-M ensemble of %d students: eval accuracy %.4f (students %s)",
        len(members),
        accuracies["ensemble"],
        ", ".join(f"{accuracies[f'student_{i}']:.4f}" for i in range(len(members))),
    )
    task.export(ensemble, inputs, save=_saver(ensemble, tft_output, save_like))
    for i in range(len(members)):
        task.release(member_inputs(inputs, i).backup_dir)
    return accuracies


def _saver(model, tft_output, teacher: teachers_lib.TeacherInfo | None):
    if teacher is None:
        return None
    return lambda d: student_lib.export_like_teacher(model, tft_output, teacher, d)


def ensemble_model(members: Sequence[keras.Model], name: str = "m_on_m") -> keras.Model:
    """One Keras model whose output is the mean of `members`' logits (float32).

    The members must read the same inputs (the first member's names and
    specs); they keep their own weights, so the ensemble serves and saves as
    one model. Members that share a name are renamed `<name>_<i>`.
    """
    if len({m.name for m in members}) < len(members):
        # Layer names must be unique within a model; the members become its layers.
        for i, m in enumerate(members):
            m._name = f"{m.name}_{i}"
    first = members[0]
    inputs = {
        key: keras.Input(type_spec=tensor.type_spec, name=key)
        for key, tensor in zip(first.input_names, first.inputs, strict=True)
    }
    logits = [
        keras.layers.Activation("linear", dtype="float32", name=f"student_{i}_logits")(m(inputs))
        for i, m in enumerate(members)
    ]
    return keras.Model(inputs, keras.layers.Average(name="mean_logits")(logits), name=name)


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
    distillers = []

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
        distillers.append(distiller)
        return distiller

    _, results = task.fit(inputs, build_and_compile, callbacks=callbacks, unlabeled=MASK_UNLABELED)
    cache = distillers[-1].target_cache
    if cache is not None:
        logging.info(
            "Distiller: teacher-target cache built: it holds %d targets (one per distinct "
            "example seen in training and evaluation); later epochs read them instead of running "
            "the teachers",
            int(cache.size()),
        )
    return built[-1], results


def train_student_fn(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teachers: Sequence[teachers_lib.TeacherInfo],
    build_student,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    probe: keras.Model | None = None,
    module: str = "?",
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
      probe: A student as `build_student` makes it, whose outputs on the first
        batch must be logits (`students.check_logits`).
      module: The module file holding `student_fn` (named in errors).

    Returns:
      The trained student (as `build_student` made it) and its evaluation
      results on the eval split.
    """
    train_student_fn_check(task, inputs, teachers, probe=probe, module=module)
    return _distil(task, inputs, build_student, teachers, callbacks)


def train_student_fn_check(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teachers: Sequence[teachers_lib.TeacherInfo],
    *,
    probe: keras.Model | None = None,
    module: str = "?",
) -> None:
    """The checks `train_student_fn` makes on the first training batch, before training."""
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
    if probe is not None:
        student_lib.check_logits(probe, features, module)
    del train, features, labels


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
    module = student_lib.module_of(task.payload.student_module)
    student_fn = student_lib.load_student_fn(task.payload.student_module)

    def build_student() -> keras.Model:
        return student_lib.build(student_fn, fn_args, module)

    probe = build_student()
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
    if config.distillation.method == NOISY_STUDENT:
        train_student_fn_check(task, inputs, described, probe=probe, module=module)
        del probe
        pseudo, summary = self_training.pseudo_label(config, inputs, described)
        width = described[0].width

        def build_and_compile() -> keras.Model:
            # A Classifier over the student's layers: it trains on soft pseudo-labels too.
            logits = student_lib.class_logits_model(build_student(), width)
            model = models.Classifier(logits.inputs, logits.outputs, name="noisy_student")
            model.student = logits
            training.compile_classifier(model, config, inputs.train_steps)
            return model

        classifier, results = task.fit(inputs, build_and_compile, unlabeled=pseudo)
        student = classifier.student
        summary["eval"] = {k: float(v) for k, v in results.items()}
        task.export(
            student,
            inputs,
            save=lambda d: student_lib.export_like_teacher(student, tft_output, described[0], d),
        )
        _write_beside(task, inputs, ROUND_FILE, summary)
        if config.distillation.scratch_baseline:
            _judge(task, inputs, described, build_student, results, fn_args.serving_model_dir)
        return
    if config.distillation.method == M_ON_M:
        # Each student is checked against its teacher before it trains.
        for teacher in described:
            train_student_fn_check(task, inputs, [teacher], probe=probe, module=module)
        del probe
        members_m_on_m(task, inputs, described, build_student, save_like=described[0])
        return
    student, results = train_student_fn(
        task, inputs, described, build_student, probe=probe, module=module
    )
    del probe
    task.export(
        student,
        inputs,
        save=lambda d: student_lib.export_like_teacher(student, tft_output, described[0], d),
    )
    if config.distillation.scratch_baseline:
        _judge(task, inputs, described, build_student, results, fn_args.serving_model_dir)


def _judge(task, inputs, teachers, build_student, distilled: dict, serving_model_dir: str) -> None:
    """Trains the same `student_fn` model alone and records the verdict beside the model.

    The student alone gets the distilled student's steps, seed, schedule,
    augmentation and input pipeline, on hard labels only (the labeled
    examples alone, as a user training it would). Both accuracies and the
    teachers' are on the eval split; the verdict goes to the log and, from
    the chief, to `verdict.VERDICT_FILE` at the root of the model artifact.
    """
    config = task.config
    width = teachers[0].width
    alone_inputs = dataclasses.replace(inputs, backup_dir=inputs.backup_dir + "-alone")

    def build_and_compile() -> keras.Model:
        model = student_lib.class_logits_model(build_student(), width)
        training.compile_classifier(model, config, inputs.train_steps)
        return model

    _, alone = task.fit(alone_inputs, build_and_compile)
    task.release(alone_inputs.backup_dir)
    result = verdict_lib.verdict(
        _teacher_accuracy(config, inputs, teachers), distilled["accuracy"], alone["accuracy"]
    )
    logging.info("Distiller: %s", result["message"])
    if task.is_chief:
        path = os.path.join(
            os.path.dirname(serving_model_dir.rstrip("/")), verdict_lib.VERDICT_FILE
        )
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")


def _teacher_accuracy(config, inputs, teachers) -> float:
    """Accuracy of the teachers' weighted soft targets on the eval split (what the student learns)."""
    exported = [teachers_lib.ExportedTeacher(t.export_dir, t) for t in teachers]
    weights = config.distillation.teacher_weights or None
    return _eval_accuracy(
        config,
        inputs,
        lambda features: losses.soft_targets([t(features) for t in exported], 1.0, weights),
    )


def _eval_accuracy(config, inputs, scores) -> float:
    """Accuracy of `scores(features)` (`[batch, classes]`, argmax = class) on the eval split's
    labeled examples, read as training evaluates (`inputs.eval_steps` batches)."""
    tft_output = tft.TFTransformOutput(inputs.transform_output)
    uncached = dataclasses.replace(
        config, ingestion=dataclasses.replace(config.ingestion, cache="none")
    )
    _, eval_data = make_datasets(uncached, inputs, tft_output, unlabeled=MASK_UNLABELED)
    hits = seen = 0
    for features, labels in eval_data.take(inputs.eval_steps):
        predicted = np.argmax(np.asarray(scores(features)), axis=-1)
        labels = np.reshape(labels.numpy(), [-1])
        known = labels >= 0
        hits += int(np.sum(predicted[known] == labels[known]))
        seen += int(np.sum(known))
    return hits / seen if seen else float("nan")


def run_fn(fn_args) -> None:
    """Trains and exports the student (TFX `run_fn` contract).

    The configured student, or the `student_fn` of the Distiller's module
    file when it has one. The task starts (strategy first, see
    `components.training.task`) before any teacher is loaded.
    """
    if payload.of(fn_args).student_module:
        # The student trains inside a tf_keras model: its module's tf.keras must
        # be tf_keras while it is loaded, built and trained.
        with legacy_keras.tf_keras_scope():
            task_lib.run_fn_task(
                fn_args,
                "Distiller",
                lambda task: _run_student_module(task, fn_args),
                needs_data=False,
            )
        return

    def distil(task: task_lib.Task) -> None:
        inputs = training.TrainingInputs.from_fn_args(fn_args, task.config)
        if task.config.distillation.method == M_ON_M:
            train_m_on_m(task, inputs, task.payload.teacher_dirs)
            return
        if task.config.distillation.method == NOISY_STUDENT:
            train_noisy_student(task, inputs, task.payload.teacher_dirs)
            return
        student, _ = train_student(task, inputs, task.payload.teacher_dirs)
        task.export(student, inputs)

    task_lib.run_fn_task(fn_args, "Distiller", distil)
