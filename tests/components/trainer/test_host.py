"""`components.trainer.host` and `launcher`: what the thin Trainer executor delegates to."""

from __future__ import annotations

import dataclasses
import os

import pytest
from tfx.components.trainer.fn_args_utils import FnArgs

from components.kubeflow import env
from components.trainer import host, launcher


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
