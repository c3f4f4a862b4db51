"""The distiller's `run_fn`: train the student on its teachers and export it.

`run_fn` makes the student (`_Student`: the configured one, or a user's `student_fn`),
checks the teachers against it before any training, and hands it to its method's trainer
(`TRAINERS`, one per `distillation.method`): `kd` distils one student and serves it,
`noisy_student` trains one Noisy Student round, `m_on_m` one student per teacher served as
their ensemble (`members_m_on_m`). Training is the Trainer's `training.fit` and export its
serving export; only the chief writes the model. A `student_fn` with a scratch baseline also
records the verdict against the same student trained alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.config import payload
from components.config.distillation import KD, M_ON_M, NOISY_STUDENT
from components.distillation import keras3, losses, self_training
from components.distillation import model as distillation
from components.distillation import students as student_lib
from components.distillation import teachers as teachers_lib
from components.distillation import verdict as verdict_lib
from components.distiller.executor import MEMBERS_DIR, ROUND_FILE
from components.training import fit as training
from components.training import models
from components.training import task as task_lib
from components.training.inputs import MASK_UNLABELED, make_datasets


def _itself(model: keras.Model) -> keras.Model:
    return model


@dataclasses.dataclass
class _Student:
    """The student a Distiller trains, made once for whichever method trains it.

    Attributes:
      inputs: Transform output and step counts it trains on.
      tft_output: The Transform output of `inputs`.
      teachers: The teachers, described and checked against the student.
      build: Returns a new student (called in the strategy scope): the
        configured classifier, or the `student_fn` model (logits out).
      classifier: Returns a new student to train on (pseudo-)labels as a
        `models.Classifier` (Noisy Student).
      served: The model to serve, from a trained `classifier()`.
      save_like: The teacher whose signatures the served model copies (a
        `student_fn` student serves as its teachers do); None: tfxkit's.
      judge: Whether to train the student alone after it is served and
        record the verdict (a `student_fn` with `scratch_baseline`).
      probe: A student as `build` makes it, for the first-batch checks of a
        `student_fn` (`check_first_batch`); None for the configured student,
        which `check_teachers` checked when it was made.
      module: The module file holding `student_fn` (named in errors).
    """

    inputs: training.TrainingInputs
    tft_output: tft.TFTransformOutput
    teachers: Sequence[teachers_lib.TeacherInfo]
    build: Callable[[], keras.Model]
    classifier: Callable[[], keras.Model]
    served: Callable[[keras.Model], keras.Model] = _itself
    save_like: teachers_lib.TeacherInfo | None = None
    judge: bool = False
    probe: keras.Model | None = None
    module: str = "?"

    def check_first_batch(
        self, task: task_lib.Task, groups: Sequence[Sequence[teachers_lib.TeacherInfo]]
    ) -> None:
        """Checks each group of teachers one student will train on, on the first training batch.

        The probe is dropped afterwards: no model but the ones training
        should hold memory while they train.
        """
        if self.probe is None:
            return
        for teachers in groups:
            train_student_fn_check(
                task, self.inputs, teachers, probe=self.probe, module=self.module
            )
        self.probe = None


def _configured_student(
    config, inputs: training.TrainingInputs, teacher_dirs: Sequence[str]
) -> _Student:
    """The configured student, its teachers described and checked against it before any
    training."""
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
    # `build_model` makes a Classifier: Noisy Student trains and serves it as it is.
    return _Student(inputs, tft_output, described, build=build_student, classifier=build_student)


def _user_student(task: task_lib.Task, fn_args) -> _Student:
    """The `student_fn` student of the Distiller's module file, its teachers (of any Trainer)
    described and checked against it before any training."""
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
    width = described[0].width

    def build_student() -> keras.Model:
        return student_lib.build(student_fn, fn_args, module)

    def classifier() -> keras.Model:
        # A Classifier over the student's layers: it trains on soft pseudo-labels too.
        logits = student_lib.class_logits_model(build_student(), width)
        model = models.Classifier(logits.inputs, logits.outputs, name="noisy_student")
        model.student = logits
        return model

    probe = build_student()
    student_lib.check_student(config, probe, described, [k for k in transformed if k != label])
    logging.info(
        "Distiller: student_fn model (%s) %d parameters, teachers %s (%s, width %d); label %r; "
        "alpha=%s T=%s",
        "Keras 3" if keras3.wraps_keras3(probe) else "tf_keras",
        distillation.count_params(probe.trainable_weights),
        [t.num_params for t in described],
        described[0].output,
        width,
        label,
        config.distillation.alpha,
        config.distillation.temperature,
    )
    return _Student(
        inputs,
        tft_output,
        described,
        build=build_student,
        classifier=classifier,
        served=lambda model: model.student,
        save_like=described[0],
        judge=config.distillation.scratch_baseline,
        probe=probe,
        module=module,
    )


# --------------------------------------------------------------------------- #
# The methods: one trainer each, taking the student whichever way it was made
# --------------------------------------------------------------------------- #


def _kd(
    task: task_lib.Task, student: _Student, callbacks: Sequence[keras.callbacks.Callback] = ()
) -> dict[str, float]:
    """Method kd: one student learns from the teachers' averaged soft targets; serves it.

    Returns:
      The student's evaluation results on the eval split.
    """
    student.check_first_batch(task, [student.teachers])
    model, results = _distil(task, student.inputs, student.build, student.teachers, callbacks)
    _serve(task, student, model, results)
    return results


def _noisy_student(
    task: task_lib.Task, student: _Student, callbacks: Sequence[keras.callbacks.Callback] = ()
) -> dict:
    """Method noisy_student: one round of self-training; serves its student.

    The teachers (the round's teacher: the first round's teacher Trainers or
    the previous round's student) label the unlabeled examples
    (`self_training.pseudo_label`); the student trains as a classifier on
    the labeled and kept pseudo-labeled examples under the configured noise.

    Returns:
      The labeling summary with the student's eval results (`eval`), also
      written beside the model (`ROUND_FILE`).
    """
    config, inputs = task.config, student.inputs
    student.check_first_batch(task, [student.teachers])
    pseudo, summary = self_training.pseudo_label(config, inputs, student.teachers)

    def build_and_compile() -> keras.Model:
        model = student.classifier()
        training.compile_classifier(model, config, inputs.train_steps)
        return model

    trained, results = task.fit(inputs, build_and_compile, callbacks=callbacks, unlabeled=pseudo)
    summary["eval"] = {k: float(v) for k, v in results.items()}
    _serve(task, student, student.served(trained), results, record=(ROUND_FILE, summary))
    return summary


def _m_on_m(
    task: task_lib.Task, student: _Student, callbacks: Sequence[keras.callbacks.Callback] = ()
) -> dict[str, float]:
    """Method m_on_m: one student per teacher, served as their ensemble (`members_m_on_m`).

    Returns:
      Eval accuracy of each student (`student_<i>`) and of the ensemble.
    """
    # Each student is checked against its own teacher before it trains.
    student.check_first_batch(task, [[teacher] for teacher in student.teachers])
    return members_m_on_m(
        task,
        student.inputs,
        student.teachers,
        student.build,
        save_like=student.save_like,
        callbacks=callbacks,
    )


# `distillation.method` -> its trainer: the one place the method is decided.
TRAINERS: dict[str, Callable[..., dict]] = {
    KD: _kd,
    M_ON_M: _m_on_m,
    NOISY_STUDENT: _noisy_student,
}


def _serve(
    task: task_lib.Task,
    student: _Student,
    model: keras.Model,
    results: dict[str, float],
    record: tuple[str, dict] | None = None,
) -> None:
    """Exports the one trained student, writes `record` (file name, JSON) beside it, and,
    when asked, judges it against its network trained alone (`_judge`)."""
    inputs = student.inputs
    task.export(model, inputs, save=_saver(model, student.tft_output, student.save_like))
    if record is not None:
        _write_beside(task, inputs, *record)
    if student.judge:
        _judge(task, inputs, student.teachers, student.build, results, inputs.serving_model_dir)


# --------------------------------------------------------------------------- #
# The configured student's methods, for callers with a task of their own
# --------------------------------------------------------------------------- #


def train_student(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teacher_dirs: Sequence[str],
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> tuple[keras.Model, dict[str, float]]:
    """Distils the configured student from exported teachers (method kd), without exporting it.

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
    student = _configured_student(task.config, inputs, teacher_dirs)
    return _distil(task, inputs, student.build, student.teachers, callbacks)


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
    return _m_on_m(task, _configured_student(task.config, inputs, teacher_dirs), callbacks)


def train_noisy_student(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teacher_dirs: Sequence[str],
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> dict:
    """One Noisy Student round with the configured student; exports it (`_noisy_student`).

    Returns:
      The labeling summary with the student's eval results (`eval`).
    """
    return _noisy_student(task, _configured_student(task.config, inputs, teacher_dirs), callbacks)


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


def train_student_fn_check(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    teachers: Sequence[teachers_lib.TeacherInfo],
    *,
    probe: keras.Model | None = None,
    module: str = "?",
) -> None:
    """Checks a `student_fn` student's teachers on the first training batch, before it trains.

    The labels must be classes of the teachers, and each Keras teacher's
    output must read as `describe_teacher` said (`teachers.check_outputs`).

    Args:
      task: The training task; its config gives `ingestion` and `strategy`.
      inputs: Transform output and step counts; `inputs.label_key` set.
      teachers: Descriptions of the teachers the student will train on.
      probe: A student as `student_fn` makes it, whose outputs on the first
        batch must be logits (`students.check_logits`).
      module: The module file holding `student_fn` (named in errors).
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
    if probe is not None:
        student_lib.check_logits(probe, features, module)
    del train, features, labels


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
    file when it has one, trained by its method's trainer (`TRAINERS`). The
    task starts (strategy first, see `components.training.task`) before any
    teacher is loaded.
    """
    user_module = payload.of(fn_args).student_module

    def distil(task: task_lib.Task) -> None:
        if user_module:
            student = _user_student(task, fn_args)
        else:
            inputs = training.TrainingInputs.from_fn_args(fn_args, task.config)
            student = _configured_student(task.config, inputs, task.payload.teacher_dirs)
        TRAINERS[task.config.distillation.method](task, student)

    # A student_fn module keeps the Keras the process gives it (Keras 3 on
    # TFX 1.21); `students.build` wraps a Keras 3 model for the tf_keras loop.
    task_lib.run_fn_task(fn_args, "Distiller", distil, needs_data=not user_module)
