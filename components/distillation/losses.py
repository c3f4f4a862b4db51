"""Knowledge-distillation losses and soft targets (no TFX types).

    L = (1 - alpha) * L_hard + alpha * T^2 * KL(p_teacher^T || p_student^T),  p^T = softmax(z / T)

`distillation_losses` computes both terms and `soft_targets` the (weighted) average of the
teachers' softened probabilities; binary tasks use the two-class softmax form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from components.config.distillation import loss_problem, teacher_weights_problem
from components.data import augment


class DistillationLosses(NamedTuple):
    """Per-example loss parts, each of shape `[batch]`.

    Attributes:
      total: `(1 - alpha) * hard + alpha * soft`.
      hard: Cross-entropy of the student's logits (T = 1) against the labels
        (0 for an unlabeled example; under mixup the `lam`-weighted sum over
        the example's own and its partner's label).
      soft: `T^2 * KL(teacher targets || student softened probabilities)`.
    """

    total: tf.Tensor
    hard: tf.Tensor
    soft: tf.Tensor


def check_hyperparameters(
    alpha: float,
    temperature: float,
    teacher_weights: Sequence[float] | None = None,
    num_teachers: int = 1,
) -> None:
    """Rejects values outside the range the loss is defined for.

    The rules are the config's (`components.config.distillation`), so a
    `Distiller` built in code refuses what a config file would.

    Raises:
      ValueError: naming the `distillation.*` config field and the fix.
    """
    problem = loss_problem(alpha, temperature)
    if problem:
        raise ValueError(f"distillation.{problem[0]}: {problem[1]}")
    if num_teachers < 1:
        raise ValueError(
            "distillation: no teacher given; distillation needs at least one trained teacher model"
        )
    problem = teacher_weights_problem(teacher_weights, num_teachers)
    if problem:
        raise ValueError(f"distillation.{problem[0]}: {problem[1]}")


def normalized_weights(
    num_teachers: int, teacher_weights: Sequence[float] | None = None
) -> np.ndarray:
    """Teacher weights summing to 1 (uniform when none are given)."""
    if not teacher_weights:
        return np.full(num_teachers, 1.0 / num_teachers, dtype=np.float32)
    w = np.asarray(teacher_weights, dtype=np.float64)
    return (w / w.sum()).astype(np.float32)


def soft_targets(
    teacher_logits: Sequence[tf.Tensor],
    temperature: float,
    teacher_weights: Sequence[float] | None = None,
) -> tf.Tensor:
    """The (weighted) average of the teachers' softened class probabilities.

    Args:
      teacher_logits: One `[batch, classes]` logits tensor per teacher.
      temperature: Softmax temperature T.
      teacher_weights: Optional non-negative weights, normalised to sum to 1.

    Returns:
      `sum_i w_i * softmax(z_i / T)`, float32 `[batch, classes]`.
    """
    weights = normalized_weights(len(teacher_logits), teacher_weights)
    probs = [tf.nn.softmax(tf.cast(z, tf.float32) / temperature, axis=-1) for z in teacher_logits]
    return tf.add_n([float(w) * p for w, p in zip(weights, probs, strict=True)])


def distillation_losses(
    labels: tf.Tensor,
    student_logits: tf.Tensor,
    targets: tf.Tensor,
    alpha: float,
    temperature: float,
) -> DistillationLosses:
    """Per-example distillation loss and its two parts.

    An example whose label is negative (`UNLABELED`: part of an unlabeled
    transfer set) has no hard term: it contributes `alpha * soft` only.
    A mixup batch (`augment.MixedLabels`) has the hard term
    `lam * CE(y) + (1 - lam) * CE(y[perm])`, each part 0 where its label is
    `UNLABELED` (see `augment.label_terms`), and the soft term of the
    teachers' targets on the mixed inputs, unchanged.

    Args:
      labels: Integer class ids, `[batch]` or `[batch, 1]`; `UNLABELED` for
        examples without a label. Or `augment.MixedLabels` of a mixup batch.
      student_logits: `[batch, classes]`.
      targets: Teacher soft targets from `soft_targets` (already softened by
        the same `temperature`).
      alpha: Weight of the soft-target loss in [0, 1].
      temperature: Softmax temperature T > 0.

    Returns:
      `DistillationLosses` of `[batch]` tensors (not yet averaged).
    """
    logits = tf.cast(student_logits, tf.float32)
    hard = tf.add_n(
        [
            tf.where(
                weight > 0,
                weight * tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits),
                0.0,
            )
            for ids, weight in augment.label_terms(labels)
        ]
    )
    log_student = tf.nn.log_softmax(logits / temperature, axis=-1)
    # xlogy(p, p) is 0 where p is 0, so a teacher that is certain gives no NaN.
    kl = tf.reduce_sum(tf.math.xlogy(targets, targets) - targets * log_student, axis=-1)
    # Hinton, Vinyals & Dean (2015), "Distilling the Knowledge in a Neural
    # Network", sec. 2: the gradients of the soft term scale as 1/T^2, so it is
    # multiplied by T^2 to keep its contribution comparable to the hard term
    # when T changes.
    soft = (temperature**2) * kl
    total = (1.0 - alpha) * hard + alpha * soft
    return DistillationLosses(total=total, hard=hard, soft=soft)
