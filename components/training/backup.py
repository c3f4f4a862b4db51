"""Crash-recovery backups of a training task: where they live, the callback, their removal.

Every location is decided here (`location`, `product_location`, `user_location`,
`run_dir_location`); `TrainingBackup` is the callback, `backup_and_restore(fn_args)` a
user's one line and `remove` the removal.
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

from components.compat import legacy_keras
from components.config import payload
from components.config.dropin import DropInSettings

BACKUPS_DIR = "backups"
# Inside the model run directory, for inputs built by hand (see `run_dir_location`).
RUN_DIR_BACKUP = "backup"


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


def product_location(fn_args, config) -> str:
    """Where the tfxkit Trainer's own run_fn keeps its backup (`TrainingInputs.from_fn_args`).

    Keyed by everything that determines training: the transformed inputs,
    the whole config and the step count the run uses (`fn_args.train_steps`,
    else `train.train_steps`), so the same inputs and config find the same
    backup.

    Args:
      fn_args: TFX's `FnArgs` of this execution.
      config: The run's `PipelineConfig`.
    """
    key = [
        list(fn_args.train_files),
        list(fn_args.eval_files),
        fn_args.transform_output,
        config.to_json(),
        fn_args.train_steps or config.train.train_steps,
    ]
    return location(fn_args.model_run_dir, key)


def user_location(fn_args) -> str:
    """Where a user's run_fn keeps its backup (`backup_and_restore`).

    Keyed by the training inputs, the step count and the string entries of
    `custom_config` (the user's own settings and the drop-in payload), apart
    from the product's backups by a `user-` prefix.

    Args:
      fn_args: The `FnArgs` the tfxkit Trainer passed to the user's `run_fn`.
    """
    key = [
        list(fn_args.train_files or []),
        list(fn_args.eval_files or []),
        fn_args.transform_output,
        fn_args.train_steps,
        {k: v for k, v in (fn_args.custom_config or {}).items() if isinstance(v, str)},
    ]
    return location(fn_args.model_run_dir, key, prefix="user-")


def run_dir_location(model_run_dir: str) -> str:
    """The backup of inputs built by hand (tests, benchmarks): inside their model run directory.

    No orchestrator re-runs them as a new execution, so nothing needs to find
    the backup from another model run directory.
    """
    return os.path.join(model_run_dir, RUN_DIR_BACKUP)


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


def backup_and_restore(fn_args, **kwargs):
    """A `BackupAndRestore` callback for a user's `run_fn`: one line to resume after a crash.

    `model.fit(..., callbacks=[backup_and_restore(fn_args)])` saves every
    `checkpoint_every_steps` steps of the Trainer's settings to
    `user_location(fn_args)` (beside the execution's model run
    directories, keyed by the inputs); a Trainer killed mid-training and
    started again with the same inputs resumes from the last backup. The
    tfxkit Trainer removes the backup after a successful export (chief only).

    Args:
      fn_args: The `FnArgs` the tfxkit Trainer passed to `run_fn`.
      **kwargs: Passed on to `BackupAndRestore` (e.g. `save_freq`).
    """
    settings = payload.of(fn_args).settings or DropInSettings()
    kwargs.setdefault("save_freq", settings.checkpoint_every_steps)
    kwargs.setdefault("delete_checkpoint", False)
    if legacy_keras.is_keras3_now():
        # The module's tf.keras is Keras 3 (as stock TFX gives it here): its model
        # takes Keras 3's callback, which keeps the same directory contract.
        return legacy_keras.tf_keras_module().callbacks.BackupAndRestore(
            user_location(fn_args), **kwargs
        )
    return TrainingBackup(user_location(fn_args), **kwargs)
