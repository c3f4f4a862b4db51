"""`components.trainer.host` and `launcher`: what the thin Trainer executor delegates to."""

from __future__ import annotations

import dataclasses
import json
import os
import types

import pytest
from tfx.components.trainer.fn_args_utils import FnArgs

from components.compat.legacy_keras import KerasMismatchError, check_one_keras
from components.compat.user_code import UserCodeError
from components.config import StrategyConfig, payload
from components.config.dropin import DropInSettings
from components.kubernetes import env
from components.trainer import executor, host, launcher
from testkit.artifacts import trainer_artifacts


def _fn_args(tmp_path) -> FnArgs:
    return FnArgs(
        serving_model_dir=str(tmp_path / "model" / "Format-Serving"),
        model_run_dir=str(tmp_path / "model_run"),
    )


def test_a_product_run_fn_that_writes_no_model_fails_as_under_stock_tfx(tmp_path):
    ran = []
    with pytest.raises(RuntimeError, match=r"^run_fn failed to generate model\.$"):
        host.run_product_fn(ran.append, _fn_args(tmp_path))
    assert len(ran) == 1


def test_a_product_run_fn_that_writes_its_model_passes(tmp_path):
    host.run_product_fn(lambda fn_args: os.makedirs(fn_args.serving_model_dir), _fn_args(tmp_path))
    assert os.path.isdir(tmp_path / "model" / "Format-Serving")


def test_the_step_launches_a_job_only_on_kubeflow_for_a_multi_worker_strategy(
    taxi_config, monkeypatch
):
    workers = dataclasses.replace(
        taxi_config,
        strategy=dataclasses.replace(taxi_config.strategy, kind="multi_worker_mirrored", workers=2),
    )
    monkeypatch.delenv(env.ORCHESTRATOR, raising=False)
    assert not launcher.should_launch(workers)
    monkeypatch.setenv(env.ORCHESTRATOR, env.KUBEFLOW)
    assert launcher.should_launch(workers)
    assert not launcher.should_launch(taxi_config)
    # A user module without a full config has no Kubeflow settings: it trains in the step.
    assert not launcher.should_launch(None)


# What `recording_run_fn` saw, for the executor test below.
SEEN: list = []


def recording_run_fn(fn_args) -> None:
    """A run_fn that records what the executor handed it and writes a model."""
    attached = payload.of(fn_args)
    # The same object twice only if the executor attached it: decoding makes a new one each time.
    SEEN.append((fn_args.custom_config, attached, attached is payload.of(fn_args)))
    os.makedirs(fn_args.serving_model_dir)


def test_the_executor_decodes_once_and_the_run_fn_gets_that_payload(taxi_config, tmp_path):
    inputs, outputs = trainer_artifacts(tmp_path)
    custom_config = payload.encode({"mine": 1}, config=taxi_config)
    SEEN.clear()
    executor.Executor().Do(
        inputs,
        outputs,
        {
            "custom_config": json.dumps(custom_config),
            "train_args": '{"num_steps": 2, "splits": ["train"]}',
            "eval_args": '{"num_steps": 1, "splits": ["eval"]}',
            "run_fn": f"{__name__}.recording_run_fn",
        },
    )
    ((seen_custom_config, attached, not_parsed_again),) = SEEN
    # The user-visible dict is TFX's; the payload beside it is the executor's own decode.
    assert seen_custom_config == custom_config
    assert attached.config == taxi_config and dict(attached.user) == {"mine": 1}
    assert not_parsed_again


def raising_run_fn(fn_args) -> None:
    """A user's run_fn that fails the way user code does."""
    raise KeyError("no such column: tips")


def test_an_exception_from_a_user_run_fn_names_it_and_keeps_the_cause(tmp_path):
    inputs, outputs = trainer_artifacts(tmp_path)
    settings = DropInSettings(strategy=StrategyConfig(kind="one_device"))
    with pytest.raises(UserCodeError) as e:
        executor.Executor().Do(
            inputs,
            outputs,
            {
                "custom_config": json.dumps(payload.encode({}, settings=settings)),
                "train_args": '{"num_steps": 2, "splits": ["train"]}',
                "eval_args": '{"num_steps": 1, "splits": ["eval"]}',
                "run_fn": f"{__name__}.raising_run_fn",
            },
        )
    assert str(e.value) == (
        f"the user run_fn '{__name__}.raising_run_fn' raised KeyError: 'no such column: tips'"
    )
    assert isinstance(e.value.__cause__, KeyError)
    assert not os.listdir(tmp_path / "model")


def test_a_user_module_holding_both_kerases_is_refused_naming_both():
    import keras
    import tf_keras

    module = types.ModuleType("user_module")
    module.keras, module.legacy = keras, tf_keras
    with pytest.raises(
        KerasMismatchError,
        match=r"^module_file 'user_module\.py': mixes two Kerases: legacy is tf_keras \(Keras 2\) "
        r"and keras is Keras 3",
    ):
        check_one_keras(module, "module_file 'user_module.py'")
    only_one = types.ModuleType("user_module")
    only_one.keras = tf_keras
    check_one_keras(only_one, "module_file 'user_module.py'")
