"""The Transform component's execution properties carry only what Transform reads."""

from __future__ import annotations

import dataclasses
import json

import pytest
from tfx import v1 as tfx

from components.config import payload
from components.config.payload import CONFIG_KEY
from components.transform.component import Transform

CUSTOM_CONFIG = "custom_config"


def _exec_config(config) -> str:
    transform = Transform(
        config=config,
        examples=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Examples),
        schema=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Schema),
    )
    return transform.exec_properties[CUSTOM_CONFIG]


def _edits(config):
    train = dataclasses.replace(config.train, train_steps=config.train.train_steps + 1)
    teacher = dataclasses.replace(config.teacher, dropout=0.11)
    ingestion = dataclasses.replace(config.ingestion, batch_size=config.ingestion.batch_size * 2)
    evaluation = dataclasses.replace(config.evaluation, min_accuracy=0.123)
    return {
        "train.train_steps": dataclasses.replace(config, train=train),
        "teacher.dropout": dataclasses.replace(config, teacher=teacher),
        "ingestion.batch_size": dataclasses.replace(config, ingestion=ingestion),
        "evaluation.min_accuracy": dataclasses.replace(config, evaluation=evaluation),
    }


@pytest.mark.parametrize(
    "field",
    ["train.train_steps", "teacher.dropout", "ingestion.batch_size", "evaluation.min_accuracy"],
)
def test_settings_transform_does_not_read_leave_its_execution_unchanged(taxi_config, field):
    # Equal execution properties are what lets the orchestrator reuse the cached Transform.
    assert _exec_config(_edits(taxi_config)[field]) == _exec_config(taxi_config)


def test_settings_transform_reads_change_its_execution(taxi_config):
    shards = dataclasses.replace(
        taxi_config.transform, num_shards=taxi_config.transform.num_shards + 1
    )
    dropped = dataclasses.replace(taxi_config.data, features=taxi_config.data.features[:-1])
    for changed in (
        dataclasses.replace(taxi_config, transform=shards),
        dataclasses.replace(taxi_config, data=dropped),
    ):
        assert _exec_config(changed) != _exec_config(taxi_config)


def test_the_executor_reads_back_the_sections_it_uses(taxi_config):
    config = payload.decode(_exec_config(taxi_config)).config
    assert (config.data, config.transform, config.strategy) == (
        taxi_config.data,
        taxi_config.transform,
        taxi_config.strategy,
    )
    assert CONFIG_KEY in json.loads(_exec_config(taxi_config))
