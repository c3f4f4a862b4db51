"""The `distillation` section, and the rules of the distillation loss's hyperparameters
(which `components.distillation.model` applies to a `Distiller` built in code too)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import field
from typing import Literal, Self

from pydantic import model_validator

from components.config.training import AugmentationConfig, ModelConfig
from components.config.validation import fail, section

# The rules of the loss's hyperparameters, in one place: the `distillation`
# section applies them when a config is built, and `components.distillation.model`
# when a `Distiller` is (possibly without a config, from user code). Each
# returns the first broken rule as (field under `distillation`, message), or
# None; the caller raises its own error type.


def loss_problem(alpha: float, temperature: float) -> tuple[str, str] | None:
    """Checks the soft-target weight `alpha` and the softmax `temperature`.

    Returns:
      (field, message) of the first value outside the range the loss is
      defined for, or None.
    """
    if not 0.0 <= alpha <= 1.0:
        return "alpha", f"expected a number in [0, 1], got {alpha}"
    if not temperature > 0:
        return "temperature", f"expected a number > 0, got {temperature}"
    return None


def teacher_weights_problem(
    teacher_weights: Sequence[float] | None, num_teachers: int
) -> tuple[str, str] | None:
    """Checks optional teacher weights against the number of teachers.

    Returns:
      (field, message) when there is not one weight per teacher or the
      weights cannot be normalised, else None (also for no weights: uniform).
    """
    if not teacher_weights:
        return None
    if len(teacher_weights) != num_teachers:
        return (
            "teacher_weights",
            f"expected {num_teachers} weights (one per teacher), got {len(teacher_weights)}",
        )
    if any(w < 0 for w in teacher_weights) or sum(teacher_weights) <= 0:
        return "teacher_weights", "expected non-negative weights with a positive sum"
    return None


# Teacher inputs of the Distiller component (one named input each).
MAX_TEACHERS = 8

# `distillation.method`: one student from every teacher's averaged soft
# targets, or one student per teacher served as their mean of logits.
KD, M_ON_M, NOISY_STUDENT = "kd", "m_on_m", "noisy_student"


def method_problem(method: str, num_teachers: int, weighted: bool) -> tuple[str, str] | None:
    """Checks `method` against the teachers it is given.

    Returns:
      (field, message) when M-on-M has fewer than two teachers or teacher
      weights (its students are averaged equally), else None.
    """
    if method != M_ON_M:
        return None
    if num_teachers < 2:
        return (
            "num_teachers",
            f"method m_on_m trains one student per teacher and serves their ensemble: it needs at least 2 "
            f"teachers, got {num_teachers}; set num_teachers: 2 or more, or method: kd",
        )
    if weighted:
        return (
            "teacher_weights",
            "method m_on_m averages its students' logits equally and each student has one teacher, so "
            "teacher weights have nothing to weigh; remove teacher_weights",
        )
    return None


@section()
class NoisyStudentConfig:
    """Noisy Student self-training (`distillation.method: noisy_student`; Xie et al. 2020).

    Round k's teacher (round 1: the teacher Trainers; later: round k - 1's
    student) labels every unlabeled training example once, in inference
    mode on the stored (clean) example; the round's student (the `student`
    shape, which may be as large as the teacher or larger) trains on the
    labeled examples plus the kept pseudo-labeled ones, noised by the
    training settings: `student.dropout`, `student.conv.dropout` /
    `stochastic_depth`, `train.augmentation` (views, mixup, `input_noise`).

    Attributes:
      rounds: Students trained one after another (each round's is the next
        round's teacher); the last is the pipeline's candidate.
      pseudo_labels: "hard": the teacher's most likely class; "soft": its
        class probabilities (T = 1) as the target distribution.
      confidence: Keep a pseudo-labeled example only when the teacher's
        largest class probability is at least this.
      balance: Give every class the same number of pseudo-labeled examples,
        the mean kept per class: a class with more keeps its most confident,
        a class with fewer repeats its examples (the most confident once
        more when the count does not divide).
      augment_students: Train the rounds' students with `train.augmentation`
        (the paper's noise); false trains them without it while the teacher
        Trainers keep it (with `student.dropout: 0`, self-training without
        the student's noise: what paid on Fashion-MNIST at 1% of the labels,
        see docs/distillation.md).
      student_augmentation: The rounds' students' own augmentation, in place
        of `train.augmentation`, which the teacher Trainers keep (e.g. mixup
        alone for students whose teacher trained with views and mixup: what
        the validation split chose on Fashion-MNIST, see
        docs/distillation.md). Default: `train.augmentation`, as
        `augment_students` says. Every rule of the config applies to the
        config the students train with (`PipelineConfig.students_config`).
    """

    rounds: int = 2
    pseudo_labels: Literal["hard", "soft"] = "hard"
    confidence: float = 0.7
    balance: bool = True
    augment_students: bool = True
    student_augmentation: AugmentationConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.rounds < 1:
            fail(
                "rounds", f"expected an integer >= 1 (students trained in turn), got {self.rounds}"
            )
        if not 0.0 < self.confidence < 1.0:
            fail(
                "confidence",
                f"expected a number in (0, 1): the teacher's class probability a pseudo-label needs, "
                f"got {self.confidence}",
            )
        if self.student_augmentation is not None and not self.augment_students:
            fail(
                "student_augmentation",
                "sets the students' augmentation, and augment_students: false trains them without "
                "any; drop one of the two",
            )
        return self


@section()
class BaselineConfig:
    """A model a user would train alone instead of distilling: a yardstick of the verdict.

    Trained like the scratch baseline (hard labels, the student's steps and
    schedule) by a `ModelBaseline` Trainer of its own (node
    `Baseline_<name>`), so the report can say whether the distilled
    student (with method m_on_m, the students' ensemble) beat the best small
    model trained without a teacher, not only the same network trained
    without one. Every rule of the config applies
    to the config it trains with (`PipelineConfig.alone_config`).

    Attributes:
      name: Names it in the pipeline and the report: 1 to 16 lowercase
        letters, digits and '_'.
      model: Its whole network (the fields of `student`; a field not given
        takes its default, not the student's value); default: the
        student's network.
      augmentation: Its training augmentation; default: `train.augmentation`
        (the student's own).
    """

    name: str
    model: ModelConfig | None = None
    augmentation: AugmentationConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if not re.fullmatch(r"[a-z0-9_]{1,16}", self.name):
            fail(
                "name",
                f"expected 1 to 16 lowercase letters, digits and '_' (the node is Baseline_<name>), "
                f"got {self.name!r}",
            )
        if self.model is None and self.augmentation is None:
            fail(
                "model",
                f"baseline {self.name!r} sets neither model nor augmentation, so it is the scratch "
                "baseline again; set one of them, or use distillation.scratch_baseline: true",
            )
        return self


@section("distillation")
class DistillationConfig:
    """Teacher-then-student distillation (see `components.distillation`).

    Attributes:
      enabled: Add the distillation stage after the teacher Trainer: the
        Distiller trains the `student` shape on the teachers' soft targets,
        and the Evaluator gates it against the first teacher.
      student_train_steps: Optimizer steps of the student (0: `train.train_steps`).
        A student learning to match its teachers keeps improving long
        after a model on hard labels would have converged (Beyer et al.
        2022), so a patient schedule gives it more steps than the teacher.
      alpha: Weight of the soft-target loss; `1 - alpha` weighs the hard loss
        (cross-entropy at T = 1).
      temperature: Softmax temperature T of the soft targets (the soft loss
        is scaled by T^2).
      num_teachers: Teacher Trainers (seeds `train.seed + i`) whose soft
        targets are averaged; at most `MAX_TEACHERS`.
      teacher_weights: Optional weights of the teachers (normalised).
      cache_teacher_logits: Keep each distinct example's teacher soft
        targets in memory instead of running the teachers at every step
        (exact: teachers are frozen; not with the parameter-server strategy).
      require_compression: Reject, before training, a student with as many
        parameters as a teacher or more.
      scratch_baseline: Also train the `student` shape alone, on hard labels
        only, with the student's steps, schedule and augmentation (the
        `StudentBaseline` Trainer), so that the run's report shows whether
        distillation paid: the distilled student against the same student
        trained without a teacher. With a `student_fn`, the Distiller itself
        trains that model alone after the distilled one and records both
        accuracies and the verdict (log, `distillation_verdict.json` at the
        model artifact's root, the artifact's custom properties).
      teacher_output: What a Keras teacher's model output means when the
        Distiller trains a `student_fn` (a teacher from your own run_fn):
        "auto" reads it from the model (a final softmax / sigmoid gives
        probabilities, anything else logits) and checks the reading on the
        first batch; "logits" or "probabilities" say it.
      label_key: The transformed label feature when the Distiller trains a
        `student_fn` ("": the one transformed feature the teachers do not
        read). Examples with a negative label are an unlabeled transfer set.
      method: "kd": one student learns from the teachers' averaged soft
        targets. "m_on_m" (many-on-many): one student per teacher (student
        i learns from teacher i alone, seed `train.seed + i`), served as one
        SavedModel that returns the mean of the students' logits; the
        pipeline also trains one student from all teachers
        (`EnsembleStudent`), what a user would pick instead, so the report
        compares them. "noisy_student": self-training on the unlabeled
        examples (`noisy_student`); `alpha` and `temperature` are unused,
        and the student may be as large as its teacher or larger
        (`require_compression` does not apply).
      noisy_student: The rounds and pseudo-labels of method noisy_student.
      baselines: Other models a user would train alone instead (methods kd
        and m_on_m): each trains beside the Distiller, and the report's
        verdict compares the distilled student with the best of them and the
        scratch baseline, naming its size (`BaselineConfig`); with m_on_m,
        the students' ensemble with the best of them at its serving cost (at
        most its parameters, within 5%).
    """

    enabled: bool = False
    student_train_steps: int = 0
    alpha: float = 0.9
    temperature: float = 4.0
    num_teachers: int = 1
    teacher_weights: tuple[float, ...] = ()
    cache_teacher_logits: bool = False
    require_compression: bool = True
    scratch_baseline: bool = False
    teacher_output: Literal["auto", "logits", "probabilities"] = "auto"
    label_key: str = ""
    method: Literal["kd", "m_on_m", "noisy_student"] = KD
    noisy_student: NoisyStudentConfig = field(default_factory=NoisyStudentConfig)
    baselines: tuple[BaselineConfig, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.student_train_steps < 0:
            fail(
                "student_train_steps",
                f"expected an integer >= 0 (0: train.train_steps), got {self.student_train_steps}",
            )
        problem = loss_problem(self.alpha, self.temperature)
        if problem:
            fail(*problem)
        if not 1 <= self.num_teachers <= MAX_TEACHERS:
            fail(
                "num_teachers",
                f"expected an integer in [1, {MAX_TEACHERS}], got {self.num_teachers}",
            )
        problem = teacher_weights_problem(
            self.teacher_weights, self.num_teachers
        ) or method_problem(
            self.method,
            # A Distiller built in code counts the teacher models it is given.
            self.num_teachers if self.enabled else 2,
            bool(self.teacher_weights),
        )
        if problem:
            fail(*problem)
        names = [b.name for b in self.baselines]
        if len(set(names)) < len(names):
            fail("baselines", f"expected distinct names, got {names}")
        if self.baselines and self.method == NOISY_STUDENT:
            fail(
                "baselines",
                "method noisy_student judges its last round against the network trained alone on "
                "the labels (the report's verdict), not against baselines; remove baselines or use "
                "method: kd or m_on_m",
            )
        if self.method == NOISY_STUDENT and self.cache_teacher_logits:
            fail(
                "cache_teacher_logits",
                "method noisy_student labels the unlabeled examples once per round, before the student "
                "trains, so there is nothing to cache; set cache_teacher_logits: false",
            )
        return self
