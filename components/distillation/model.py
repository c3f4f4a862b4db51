"""The Keras `Distiller`: frozen teachers and a trained student (no TFX types).

`Distiller` holds a named `student` and a tuple of frozen `teachers`, trains the student
on `components.distillation.losses` averaged over the global batch, and can cache the
teachers' soft targets by example fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras as keras

from components.data import augment
from components.data.labels import feature_fingerprints
from components.distillation.losses import (
    DistillationLosses,
    check_hyperparameters,
    distillation_losses,
    normalized_weights,
    soft_targets,
)
from components.training import models

Features = Mapping[str, tf.Tensor]
Teacher = Callable[..., tf.Tensor]


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


def _call_teacher(teacher: Teacher, features: Features) -> tf.Tensor:
    if isinstance(teacher, keras.layers.Layer):
        return teacher(features, training=False)
    return teacher(features)
