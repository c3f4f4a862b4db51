"""Exported teachers: loading them and checking them against the student's task.

A teacher is a serving SavedModel written by `components.export` (the tfxkit
Trainer's export). Its `transformed_logits` signature gives logits on the
transformed features the student trains on, so the distiller reads Transform
output once and feeds both roles the same batch. No TFX types here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf
import tf_keras as keras

from components.config import PipelineConfig
from components.distillation import count_params
from components.export import SERVING_OUTPUT_KEYS, TRANSFORMED_LOGITS_SIGNATURE


@dataclasses.dataclass(frozen=True)
class TeacherInfo:
    """What the distiller needs to know about one exported teacher.

    Attributes:
      export_dir: The serving SavedModel directory.
      input_specs: Transformed feature name -> spec of `transformed_logits`.
      output_keys: Output keys of its `serving_default` signature.
      num_classes: Width of its logits.
      num_params: Trainable parameters of the model.
    """

    export_dir: str
    input_specs: dict[str, tf.TensorSpec]
    output_keys: tuple[str, ...]
    num_classes: int
    num_params: int


def describe_teacher(export_dir: str) -> TeacherInfo:
    """Reads a teacher's signatures and size without running it.

    Raises:
      ValueError: if the directory holds no SavedModel or the model was not
        exported with the signatures distillation needs.
    """
    if not tf.io.gfile.exists(export_dir):
        raise ValueError(f"distillation: teacher model directory {export_dir!r} does not exist")
    try:
        loaded = tf.saved_model.load(export_dir)
    except (OSError, ValueError, tf.errors.OpError) as e:
        raise ValueError(
            f"distillation: teacher model {export_dir!r} is not a readable SavedModel: {e}"
        ) from e
    signatures = loaded.signatures
    missing = [s for s in ("serving_default", TRANSFORMED_LOGITS_SIGNATURE) if s not in signatures]
    if missing:
        raise ValueError(
            f"distillation: teacher model {export_dir!r} has no {missing} signature(s) (it has {sorted(signatures)}); "
            "train teachers with the tfxkit Trainer, whose export (components.export) adds them"
        )
    logits_fn = signatures[TRANSFORMED_LOGITS_SIGNATURE]
    logits_spec = logits_fn.structured_outputs["logits"]
    return TeacherInfo(
        export_dir=export_dir,
        input_specs=dict(logits_fn.structured_input_signature[1]),
        output_keys=tuple(sorted(signatures["serving_default"].structured_outputs)),
        num_classes=int(logits_spec.shape[-1]),
        num_params=count_params(getattr(loaded, "trainable_variables", ())),
    )


def check_teachers(
    config: PipelineConfig, teachers: Sequence[TeacherInfo], student: keras.Model
) -> None:
    """Fails before training when the teachers cannot teach this student.

    Args:
      config: The validated pipeline config (the student's task).
      teachers: Descriptions of the teacher models.
      student: An (untrained) student of the configured shape.

    Raises:
      ValueError: naming the config field to fix.
    """
    if not teachers:
        raise ValueError(
            "distillation: no teacher model was given; pass one or more trained teacher Model artifacts "
            "(the teacher Trainers' outputs['model'])"
        )
    weights = config.distillation.teacher_weights
    if weights and len(weights) != len(teachers):
        raise ValueError(
            f"distillation.teacher_weights: {len(weights)} weights for {len(teachers)} teacher models; give one weight per teacher"
        )
    num_classes = config.data.label.num_classes
    student_inputs = {
        k: (tuple(t.shape.as_list()[1:]), t.dtype)
        for k, t in zip(student.input_names, student.inputs, strict=True)
    }
    student_params = count_params(student.trainable_weights)
    for i, teacher in enumerate(teachers):
        where = f"teacher {i} ({teacher.export_dir})"
        if teacher.num_classes != num_classes:
            raise ValueError(
                f"data.label.num_classes: {where} predicts {teacher.num_classes} classes but the student's task has "
                f"{num_classes}; distil from teachers trained on this label"
            )
        if set(teacher.output_keys) != set(SERVING_OUTPUT_KEYS):
            raise ValueError(
                f"distillation: {where} serves outputs {sorted(teacher.output_keys)} but the student serves "
                f"{sorted(SERVING_OUTPUT_KEYS)}; Evaluator and Pusher compare them as one model, so export the "
                "teacher with the tfxkit Trainer"
            )
        teacher_inputs = {
            k: (tuple(s.shape.as_list()[1:]), s.dtype) for k, s in teacher.input_specs.items()
        }
        if teacher_inputs != student_inputs:
            raise ValueError(
                f"data.features: {where} reads transformed features {_describe(teacher_inputs)} but the student reads "
                f"{_describe(student_inputs)}; distil from teachers trained on this feature config"
            )
        if config.distillation.require_compression and student_params >= teacher.num_params:
            raise ValueError(
                f"student: the student has {student_params} parameters, not fewer than the {teacher.num_params} of {where}, "
                "and distillation.require_compression is true; shrink student.hidden_units / student.embedding_dim "
                "or set distillation.require_compression: false"
            )


def _describe(inputs: dict[str, tuple]) -> str:
    return (
        "{"
        + ", ".join(
            f"{k}: {list(shape)} {dtype.name}" for k, (shape, dtype) in sorted(inputs.items())
        )
        + "}"
    )


class ExportedTeacher(keras.layers.Layer):
    """A frozen exported teacher called on transformed features.

    Load it inside the strategy scope the student trains in, so its variables
    are placed like the student's.

    Args:
      export_dir: A serving SavedModel with a `transformed_logits` signature.
    """

    def __init__(self, export_dir: str, **kwargs):
        super().__init__(trainable=False, **kwargs)
        self.export_dir = export_dir
        self._loaded = tf.saved_model.load(export_dir)
        self._logits_fn = self._loaded.signatures[TRANSFORMED_LOGITS_SIGNATURE]
        self.input_keys = tuple(sorted(self._logits_fn.structured_input_signature[1]))

    def call(self, features, training=None):
        # A signature is a frozen inference graph: `training` has no effect.
        del training
        return self._logits_fn(**{k: features[k] for k in self.input_keys})["logits"]
