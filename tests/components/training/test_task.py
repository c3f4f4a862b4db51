"""`components.training.task` and `components.training.backup`: one lifecycle for every training entry."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from tfx.components.trainer.fn_args_utils import FnArgs

from components.config import payload
from components.trainer import fn_args as fn_args_lib
from components.training import backup, export, strategies, task
from components.training import fit as training
from tests.components.training import penguins


def _fn_args(tmp_path, config, execution: int = 1) -> FnArgs:
    return FnArgs(
        train_files=["/data/Split-train/*"],
        eval_files=["/data/Split-eval/*"],
        transform_output="/graph",
        serving_model_dir=str(tmp_path / "Trainer" / "model" / str(execution) / "Format-Serving"),
        model_run_dir=str(tmp_path / "Trainer" / "model_run" / str(execution)),
        train_steps=5,
        custom_config=payload.encode(config=config),
    )


def test_a_training_task_gets_the_executors_payload_and_a_trainer_role(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    config = penguins.penguins_config()
    decoded = payload.decode(payload.encode({"mine": 1}, config=config))
    # custom_config says something else: the task must use the attached payload, not re-parse.
    other = dataclasses.replace(config, name="not-parsed-again")
    fn_args = fn_args_lib.with_payload(_fn_args(tmp_path, other), decoded)
    assert fn_args.tfxkit_payload is decoded and fn_args.train_steps == 5
    started = task.run_fn_task(fn_args, "Trainer", lambda trainer: trainer)
    assert started.payload is decoded and started.config.name == config.name
    assert started.choice.role == strategies.ROLE_TRAINER and started.choice.is_chief


def test_an_evaluator_task_has_nothing_to_do(tmp_path, monkeypatch):
    cluster = {"worker": ["localhost:2001", "localhost:2002"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 0}})
    )
    auto = penguins.with_sections(penguins.penguins_config(), strategy={"kind": "auto"})
    ran = []
    assert task.run_fn_task(_fn_args(tmp_path, auto), "Distiller", ran.append) is None
    assert ran == []


def test_a_run_fn_without_a_tfxkit_config_is_named(tmp_path):
    fn_args = FnArgs(custom_config={"mine": 1}, model_run_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"^Distiller: custom_config carries no tfxkit config"):
        task.run_fn_task(fn_args, "Distiller", lambda trainer: trainer)


def test_both_backups_live_beside_the_executions_keyed_by_their_inputs(tmp_path):
    config = penguins.penguins_config()
    product = training.TrainingInputs.from_fn_args(_fn_args(tmp_path, config, 7), config)
    rerun = training.TrainingInputs.from_fn_args(_fn_args(tmp_path, config, 8), config)
    user = backup.user_location(_fn_args(tmp_path, config, 7))
    backups = str(tmp_path / "Trainer" / backup.BACKUPS_DIR)
    assert product.backup_dir == rerun.backup_dir
    assert {os.path.dirname(product.backup_dir), os.path.dirname(user)} == {backups}
    assert os.path.basename(user).startswith("user-") and user != product.backup_dir
    longer = dataclasses.replace(config, train=dataclasses.replace(config.train, train_steps=9))
    assert (
        training.TrainingInputs.from_fn_args(_fn_args(tmp_path, longer, 8), longer).backup_dir
        != product.backup_dir
    )


def test_inputs_built_by_hand_keep_their_backup_in_their_model_run_dir(tmp_path):
    run_dir = str(tmp_path / "run")
    inputs = training.TrainingInputs(("/t",), ("/e",), "/graph", "/serving", run_dir, 5, 1)
    assert inputs.backup_dir == backup.run_dir_location(run_dir) == os.path.join(run_dir, "backup")
    explicit = dataclasses.replace(inputs, backup_dir=str(tmp_path / "elsewhere"))
    assert explicit.backup_dir == str(tmp_path / "elsewhere")


@pytest.mark.parametrize("is_chief", [True, False])
def test_only_the_chief_removes_the_backup(tmp_path, is_chief):
    path = str(tmp_path / "backups" / "key")
    os.makedirs(os.path.join(path, "chief"))
    backup.remove(path, is_chief=is_chief)
    assert os.path.exists(path) is not is_chief


def test_a_non_chief_scratch_export_stays_in_the_model_run_dir_and_goes(tmp_path):
    run_dir = str(tmp_path / "model_run" / "3")
    scratch = export.scratch_export_dir(run_dir, "worker", 1)
    assert scratch.startswith(run_dir + os.sep)
    assert scratch != export.scratch_export_dir(run_dir, "worker", 2)
    os.makedirs(scratch)
    export.discard_scratch_export(scratch)
    assert not os.path.exists(os.path.dirname(scratch)) and os.path.exists(run_dir)
