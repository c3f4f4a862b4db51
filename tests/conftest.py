"""Shared fixtures: shipped configs and small variants of them."""

from __future__ import annotations

import dataclasses
import os

import pytest

from components.config import PipelineConfig, load_config

SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data")


@pytest.fixture(scope="session")
def taxi_config() -> PipelineConfig:
    return load_config("taxi")


@pytest.fixture(scope="session")
def digits_config() -> PipelineConfig:
    return load_config("digits")


def tiny(config: PipelineConfig, **train_overrides) -> PipelineConfig:
    """The same pipeline with step counts small enough for tests."""
    train = dataclasses.replace(
        config.train, train_steps=20, eval_steps=2, steps_per_epoch=10, checkpoint_every_steps=10, **train_overrides
    )
    return dataclasses.replace(config, train=train, evaluation=dataclasses.replace(config.evaluation, min_accuracy=0.0))
