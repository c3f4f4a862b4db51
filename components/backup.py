"""Crash-recovery backups of a training task: where they live, the callback, their removal.

A low module (TensorFlow and tf_keras only) shared by the product's training
(`components.trainer.training`), a user's `run_fn`
(`components.dropin.backup_and_restore`) and the task lifecycle
(`components.trainer.task`), so none of them imports another for it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tf_keras as keras
from absl import logging

BACKUPS_DIR = "backups"


def location(model_run_dir: str, key_parts: Sequence[Any], prefix: str = "") -> str:
    """Where a training task keeps its backup: beside the executions, keyed by its inputs.

    An orchestrator that re-runs a killed Trainer creates a new execution
    with a new model run directory (`<root>/<node>/model_run/<id>`), so the
    backup lives beside those (`<root>/<node>/backups/`), keyed by everything
    that determines training: the same inputs find the same backup and
    resume; anything changed starts afresh.

    Args:
      model_run_dir: This execution's model run directory.
      key_parts: JSON-serialisable values that determine the training.
      prefix: Prepended to the key (keeps kinds of backups apart).
    """
    key = hashlib.sha256(
        json.dumps(list(key_parts), sort_keys=True, default=str).encode()
    ).hexdigest()[:16]
    node_dir = os.path.dirname(os.path.dirname(model_run_dir.rstrip("/")))
    return os.path.join(node_dir, BACKUPS_DIR, f"{prefix}{key}")


def remove(path: str, *, is_chief: bool) -> None:
    """Deletes the backup once the model is safely exported (chief only).

    Until then a re-run resumes from the last backup instead of retraining;
    other workers' backup copies live in temporary directories Keras removes.
    """
    if is_chief and tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)
        logging.info("Trainer: removed the training backup %s after export", path)


class TrainingBackup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` that also covers the one-device and central-storage strategies.

    tf_keras keeps an allow-list of strategies; its backup is a
    `tf.train.Checkpoint` of the model, its optimizer and two counters, which
    these two strategies save and restore like any other checkpoint (the
    fault-tolerance test resumes a one-device run from it).
    """

    def __init__(self, backup_dir: str, **kwargs):
        super().__init__(backup_dir, **kwargs)
        self._supported_strategies = (
            *self._supported_strategies,
            tf.distribute.OneDeviceStrategy,
            tf.distribute.experimental.CentralStorageStrategy,
        )
