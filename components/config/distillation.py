"""The `distillation` section: teacher-then-student training settings."""

from __future__ import annotations

from typing import Self

from pydantic import model_validator

from components.config.validation import fail, section

# Teacher inputs of the Distiller component (one named input each).
MAX_TEACHERS = 8


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
        trained without a teacher.
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

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.student_train_steps < 0:
            fail(
                "student_train_steps",
                f"expected an integer >= 0 (0: train.train_steps), got {self.student_train_steps}",
            )
        if not 0.0 <= self.alpha <= 1.0:
            fail("alpha", f"expected a number in [0, 1], got {self.alpha}")
        if not self.temperature > 0:
            fail("temperature", f"expected a number > 0, got {self.temperature}")
        if not 1 <= self.num_teachers <= MAX_TEACHERS:
            fail(
                "num_teachers",
                f"expected an integer in [1, {MAX_TEACHERS}], got {self.num_teachers}",
            )
        if self.teacher_weights:
            if len(self.teacher_weights) != self.num_teachers:
                fail(
                    "teacher_weights",
                    f"expected {self.num_teachers} weights (one per teacher), got {len(self.teacher_weights)}",
                )
            if any(w < 0 for w in self.teacher_weights) or sum(self.teacher_weights) <= 0:
                fail("teacher_weights", "expected non-negative weights with a positive sum")
        return self
