"""Noisy Student's labeling pass: a round's teacher labels the unlabeled examples once.

`pseudo_label` reads the stored training split once, clean (no augmentation, no shuffle),
runs the round's teachers in inference mode on the examples without a label, and keeps
what `components.data.pseudo_labels.select` keeps; the student then trains on those and
the labeled examples (`components.distiller.run_fn.train_noisy_student`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
from absl import logging

from components.config import AugmentationConfig, PipelineConfig
from components.data import labels as labels_lib
from components.data import pseudo_labels
from components.distillation import losses
from components.distillation import teachers as teachers_lib
from components.training.inputs import TrainingInputs, make_datasets


def teacher_probabilities(
    config: PipelineConfig,
    inputs: TrainingInputs,
    teachers: Sequence[teachers_lib.TeacherInfo],
) -> tuple[np.ndarray, np.ndarray]:
    """`(fingerprints, class probabilities)` of every distinct unlabeled training example.

    An example is unlabeled when `data.labeled_fraction` withholds its label
    or its stored label is negative. The teachers see the stored example
    (never an augmented view) in inference mode; several are averaged with
    `distillation.teacher_weights` at T = 1.
    """
    fraction = config.data.labeled_fraction if config.data is not None else 1.0
    clean = dataclasses.replace(
        config,
        ingestion=dataclasses.replace(config.ingestion, cache="none"),
        train=dataclasses.replace(config.train, augmentation=AugmentationConfig()),
    )
    # The eval pipeline reads its files once, in order, unaugmented: give it the train split.
    _, transfer = make_datasets(
        clean,
        dataclasses.replace(inputs, eval_files=inputs.train_files),
        tft.TFTransformOutput(inputs.transform_output),
    )
    exported = [teachers_lib.ExportedTeacher(t.export_dir, t) for t in teachers]
    weights = config.distillation.teacher_weights or None
    keys, probs = [], []
    for features, label in transfer:
        fingerprints = labels_lib.feature_fingerprints(features)
        known = labels_lib.labeled_by_fingerprint(fingerprints, fraction) & (
            tf.reshape(label, [-1]) >= 0
        )
        if bool(tf.reduce_all(known)):
            continue
        unknown = {k: tf.boolean_mask(v, ~known) for k, v in features.items()}
        probs.append(losses.soft_targets([t(unknown) for t in exported], 1.0, weights).numpy())
        keys.append(tf.boolean_mask(fingerprints, ~known).numpy())
    if not keys:
        raise ValueError(
            "data.labeled_fraction: no training example is unlabeled, so Noisy Student has nothing to "
            "pseudo-label; set data.labeled_fraction below 1 or give unlabeled examples a negative label"
        )
    keys, probs = np.concatenate(keys), np.concatenate(probs)
    # A duplicated stored example is one example: its first prediction stands.
    keys, first = np.unique(keys, return_index=True)
    return keys, probs[first]


def pseudo_label(
    config: PipelineConfig,
    inputs: TrainingInputs,
    teachers: Sequence[teachers_lib.TeacherInfo],
    round_name: str = "",
) -> tuple[pseudo_labels.PseudoLabels, dict]:
    """The round's pseudo-labels (`distillation.noisy_student` settings) and what was kept.

    Returns:
      The `PseudoLabels` and a summary: unlabeled examples, those at the
      confidence threshold, those kept, and the examples per class in one
      pass (repeats included).
    """
    settings = config.distillation.noisy_student
    keys, probs = teacher_probabilities(config, inputs, teachers)
    chosen = pseudo_labels.select(
        keys, probs, settings.confidence, settings.balance, settings.pseudo_labels == "hard"
    )
    summary = {
        "unlabeled": int(len(keys)),
        "confident": int(np.sum(probs.max(axis=1) >= settings.confidence)),
        "kept": int(len(chosen.keys)),
        "per_class": chosen.class_counts().tolist(),
        "confidence": settings.confidence,
        "pseudo_labels": settings.pseudo_labels,
        "balance": settings.balance,
    }
    logging.info(
        "Distiller: Noisy Student%s: the teacher labeled %d unlabeled examples, %d at confidence >= %s; "
        "training uses %s per class (%s pseudo-labels)",
        f" {round_name}" if round_name else "",
        summary["unlabeled"],
        summary["confident"],
        settings.confidence,
        summary["per_class"],
        settings.pseudo_labels,
    )
    return chosen, summary
