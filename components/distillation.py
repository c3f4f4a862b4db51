"""Knowledge distillation: losses and a Keras `Distiller` (no TFX types).

The student minimises

    L = (1 - alpha) * L_hard + alpha * T^2 * KL(p_teacher^T || p_student^T)

where `p^T = softmax(z / T)` are logits softened by the temperature `T`,
`L_hard` is the sparse categorical cross-entropy of the student's logits
against the labels at `T = 1` (the usual classifier loss, whatever `T` is),
and `p_teacher^T` is the (weighted) average of the teachers' softened
probabilities. Binary tasks use the same two-class softmax form: the models
emit two logits, and `softmax([z0, z1])` is the Bernoulli
`sigmoid(z1 - z0)`.

Roles cannot swap silently: the `Distiller` holds a named `student` and a
tuple of `teachers`; the teachers are frozen (`trainable = False`), run with
`training=False` outside the gradient tape behind `tf.stop_gradient`, and
gradients are taken with respect to the student's trainable variables only.

Under `tf.distribute` every replica averages its per-example losses over the
*global* batch (`tf.nn.compute_average_loss`): the optimizer sums gradients
across replicas, so the sum of per-replica means over the global batch is
the mean gradient of the whole batch, as on one device.

Optionally the teachers' soft targets are cached: they are a pure function
of the transformed features (teachers are frozen and run in inference mode),
so a table keyed by a 64-bit fingerprint of each example's features returns
them without running the teachers again once an example has been seen. With
non-augmented input every epoch after the first skips the teachers; an
augmented example simply misses and is computed, so the cache is never
stale. It holds one float per class per distinct example, in host memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tf_keras as keras

from components import augment, models
from components.config.distillation import loss_problem, teacher_weights_problem

Features = Mapping[str, tf.Tensor]
Teacher = Callable[..., tf.Tensor]


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


# The label of an example in an unlabeled transfer set.
UNLABELED = -1


def labeled_mask(features: Features, fraction: float) -> tf.Tensor:
    """Which examples keep their label when only `fraction` of them may (`[batch]` bool).

    Decided by a fingerprint of each example's features, so every input
    pipeline, run and component (teacher Trainer, Distiller, benchmark)
    agrees on the same labeled subset without an index.
    """
    buckets = 10000
    return tf.math.floormod(feature_fingerprints(features), buckets) < int(
        round(fraction * buckets)
    )


def count_params(variables: Sequence[tf.Variable]) -> int:
    """Number of scalar parameters in `variables`."""
    return int(sum(int(np.prod(v.shape)) for v in variables))


class Distiller(models.GradientAccumulationMixin, keras.Model):
    """Trains `student` on the soft targets of frozen `teachers`.

    `fit` / `evaluate` take the same `(features, labels)` batches as the
    student's own training; `call` is the student's forward pass, so after
    training `distiller.student` is the model to export. With
    `grad_accum_steps` = N > 1 (set by the Trainer's `fit`), each step gets
    N micro-batches stacked on a leading axis and makes one update.

    Args:
      student: The model being trained (logits out).
      teachers: One or more trained models or callables returning logits for
        the same features; they are frozen and never trained.
      alpha: Weight of the soft-target loss in [0, 1].
      temperature: Softmax temperature T > 0 of the soft targets.
      teacher_weights: Optional weights of the teachers' soft targets.
      cache_targets: Keep the teachers' soft targets per distinct example
        (see the module docstring) instead of recomputing them every step.

    Raises:
      ValueError: on hyperparameters out of range, no teacher, the student
        among its teachers, or a cache under `ParameterServerStrategy`
        (whose workers cannot share the coordinator's table).
    """

    def __init__(
        self,
        student: keras.Model,
        teachers: Sequence[Teacher],
        *,
        alpha: float,
        temperature: float,
        teacher_weights: Sequence[float] | None = None,
        cache_targets: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        teachers = tuple(teachers)
        check_hyperparameters(alpha, temperature, teacher_weights, len(teachers))
        if any(t is student for t in teachers):
            raise ValueError("distillation: the student cannot be one of its own teachers")
        self.student = student
        for teacher in teachers:
            if isinstance(teacher, keras.layers.Layer):
                teacher.trainable = False
        self.teachers = teachers
        self.alpha = float(alpha)
        self.temperature = float(temperature)
        self.teacher_weights = tuple(
            float(w) for w in normalized_weights(len(teachers), teacher_weights)
        )
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.hard_loss_tracker = keras.metrics.Mean(name="hard_loss")
        self.soft_loss_tracker = keras.metrics.Mean(name="soft_loss")
        self.accuracy_metric = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        self.target_cache = None
        if cache_targets:
            if isinstance(
                tf.distribute.get_strategy(), tf.distribute.experimental.ParameterServerStrategy
            ):
                raise ValueError(
                    "distillation.cache_teacher_logits: not supported with strategy.kind 'parameter_server'; "
                    "set it to false"
                )
            num_classes = int(student.output_shape[-1])
            # NaN marks a miss: soft targets are probabilities, never NaN.
            self.target_cache = tf.lookup.experimental.MutableHashTable(
                key_dtype=tf.int64,
                value_dtype=tf.float32,
                default_value=tf.fill([num_classes], float("nan")),
            )

    @property
    def metrics(self):
        # Listed here so Keras resets them at each epoch and after evaluate.
        return [
            self.loss_tracker,
            self.hard_loss_tracker,
            self.soft_loss_tracker,
            self.accuracy_metric,
        ]

    def call(self, inputs, training=None):
        return self.student(inputs, training=training)

    def teacher_targets(self, features: Features) -> tf.Tensor:
        """Soft targets of the frozen teachers (inference mode, no gradient)."""
        if self.target_cache is None:
            return self._compute_targets(features)
        keys = feature_fingerprints(features)
        cached = self.target_cache.lookup(keys)

        def compute_and_store():
            targets = self._compute_targets(features)
            with tf.control_dependencies([self.target_cache.insert(keys, targets)]):
                return tf.identity(targets)

        missing = tf.reduce_any(tf.math.is_nan(cached))
        return tf.stop_gradient(tf.cond(missing, compute_and_store, lambda: cached))

    def _compute_targets(self, features: Features) -> tf.Tensor:
        logits = [tf.stop_gradient(_call_teacher(t, features)) for t in self.teachers]
        return tf.stop_gradient(soft_targets(logits, self.temperature, self.teacher_weights))

    def compute_distillation_losses(self, labels, student_logits, targets) -> DistillationLosses:
        return distillation_losses(labels, student_logits, targets, self.alpha, self.temperature)

    def _scaled_loss(self, losses: DistillationLosses) -> tf.Tensor:
        # Mean over the global batch, not the replica's: see the module docstring.
        loss = tf.nn.compute_average_loss(losses.total)
        if self.student.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(self.student.losses))
        return loss

    def _update_metric_states(self, labels, student_logits, losses: DistillationLosses) -> None:
        # Per-example values: Mean metrics aggregate total / count across
        # replicas, which is the global mean under any strategy.
        # Unlabeled transfer-set examples have no hard loss and no accuracy;
        # the hard loss is reported per unit of label weight (1 per labeled
        # example without mixup), accuracy on the example's own label.
        label_weight = tf.add_n([w for _, w in augment.label_terms(labels)])
        labels = tf.reshape(augment.own_labels(labels), [-1])
        known = tf.cast(labels >= 0, tf.float32)
        self.loss_tracker.update_state(losses.total)
        self.hard_loss_tracker.update_state(
            tf.math.divide_no_nan(losses.hard, label_weight), sample_weight=label_weight
        )
        self.soft_loss_tracker.update_state(losses.soft)
        self.accuracy_metric.update_state(
            tf.maximum(labels, 0), student_logits, sample_weight=known
        )

    def _update_metrics(
        self, labels, student_logits, losses: DistillationLosses
    ) -> dict[str, tf.Tensor]:
        self._update_metric_states(labels, student_logits, losses)
        return {m.name: m.result() for m in self.metrics}

    # The steps use explicit TensorFlow control flow only; AutoGraph would
    # re-transpile every Keras function they reach (tens of seconds a process).
    @tf.autograph.experimental.do_not_convert
    def train_step(self, data):
        features, labels, _ = keras.utils.unpack_x_y_sample_weight(data)
        steps = self.grad_accum_steps
        # Teachers run before any tape opens: nothing they compute is recorded.
        if steps == 1:
            targets = self.teacher_targets(features)
        else:
            targets = _unflatten(self.teacher_targets(_flatten(features)), steps)
        variables = self.student.trainable_variables
        if steps == 1:
            with tf.GradientTape() as tape:
                student_logits = self.student(features, training=True)
                losses = self.compute_distillation_losses(labels, student_logits, targets)
                loss = self._scaled_loss(losses)
            # `minimize` applies loss scaling under mixed precision and sums the
            # gradients across replicas; only the student's variables change.
            self.optimizer.minimize(loss, variables, tape=tape)
            return self._update_metrics(labels, student_logits, losses)

        def micro_loss(micro):
            micro_features, micro_labels, micro_targets = micro
            student_logits = self.student(micro_features, training=True)
            losses = self.compute_distillation_losses(micro_labels, student_logits, micro_targets)
            # Update only: reading results inside the loop would synchronise replicas.
            self._update_metric_states(micro_labels, student_logits, losses)
            return self._scaled_loss(losses)

        grads = models.accumulate_gradients(
            micro_loss, (features, labels, targets), variables, steps, self.optimizer
        )
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return {m.name: m.result() for m in self.metrics}

    @tf.autograph.experimental.do_not_convert
    def test_step(self, data):
        features, labels, _ = keras.utils.unpack_x_y_sample_weight(data)
        targets = self.teacher_targets(features)
        student_logits = self.student(features, training=False)
        losses = self.compute_distillation_losses(labels, student_logits, targets)
        return self._update_metrics(labels, student_logits, losses)


def _flatten(features: Features) -> dict[str, tf.Tensor]:
    """`[steps, batch, ...]` micro-batches to one `[steps * batch, ...]` batch."""
    return {
        k: tf.reshape(v, tf.concat([[-1], tf.shape(v)[2:]], axis=0)) for k, v in features.items()
    }


def _unflatten(values: tf.Tensor, steps: int) -> tf.Tensor:
    return tf.reshape(values, tf.concat([[steps, -1], tf.shape(values)[1:]], axis=0))


def feature_fingerprints(features: Features) -> tf.Tensor:
    """A 64-bit fingerprint of each example's features (all keys, raw bytes).

    Args:
      features: Dense tensors with a leading batch dimension.

    Returns:
      int64 `[batch]`; equal feature values give equal fingerprints.
    """
    per_feature = [
        tf.fingerprint(tf.reshape(features[k], [tf.shape(features[k])[0], -1]))
        for k in sorted(features)
    ]
    combined = tf.fingerprint(tf.concat(per_feature, axis=1))
    return tf.bitcast(combined, tf.int64)


def _call_teacher(teacher: Teacher, features: Features) -> tf.Tensor:
    if isinstance(teacher, keras.layers.Layer):
        return teacher(features, training=False)
    return teacher(features)
