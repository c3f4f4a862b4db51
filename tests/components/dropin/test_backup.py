"""`backup_and_restore(fn_args)`: a re-run of a killed Trainer finds the same backup."""

from __future__ import annotations

import os

import attr
from tfx.components.trainer.fn_args_utils import FnArgs

from components.config import payload
from components.config.dropin import DropInSettings
from components.training import backup


def _fn_args(tmp_path, execution: int, **overrides) -> FnArgs:
    settings = DropInSettings(checkpoint_every_steps=3)
    args = FnArgs(
        train_files=["/data/Split-train/*"],
        eval_files=["/data/Split-eval/*"],
        transform_output="/graph",
        train_steps=5,
        model_run_dir=str(tmp_path / "Trainer" / "model_run" / str(execution)),
        custom_config={payload.DROPIN_KEY: settings.to_json(), "user": "x"},
    )
    return attr.evolve(args, **overrides)


def test_a_new_execution_with_the_same_inputs_finds_the_same_backup(tmp_path):
    first = backup.backup_and_restore(_fn_args(tmp_path, 7))
    rerun = backup.backup_and_restore(_fn_args(tmp_path, 8))
    assert first.backup_dir == rerun.backup_dir
    # Beside the executions' model run directories, never inside one.
    assert os.path.dirname(first.backup_dir) == str(tmp_path / "Trainer" / "backups")
    assert first.save_freq == 3


def test_changed_inputs_start_afresh(tmp_path):
    first = backup.backup_and_restore(_fn_args(tmp_path, 7))
    longer = backup.backup_and_restore(_fn_args(tmp_path, 8, train_steps=6))
    other_data = backup.backup_and_restore(_fn_args(tmp_path, 8, train_files=["/other/*"]))
    assert len({first.backup_dir, longer.backup_dir, other_data.backup_dir}) == 3


def test_explicit_save_freq_wins(tmp_path):
    assert backup.backup_and_restore(_fn_args(tmp_path, 7), save_freq=11).save_freq == 11
