"""DataGate: stops the pipeline before Transform on anomalies, drift or bad labels.

TFX's ExampleValidator records anomalies but lets the pipeline go on; the gate
turns them (plus drift against the last validated schema and the config's
promises) into a failed execution, so Transform, Trainer and Pusher never run
on bad data. Its output, the validated schema, is the drift baseline of the
next run.
"""

from __future__ import annotations

import json

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from components.config import PipelineConfig, payload
from components.validation import executor


class DataGateSpec(ComponentSpec):
    PARAMETERS = {"custom_config": ExecutionParameter(type=str)}
    INPUTS = {
        "statistics": ChannelParameter(type=standard_artifacts.ExampleStatistics),
        "schema": ChannelParameter(type=standard_artifacts.Schema),
        "anomalies": ChannelParameter(type=standard_artifacts.ExampleAnomalies),
        "baseline_schema": ChannelParameter(type=standard_artifacts.Schema, optional=True),
    }
    OUTPUTS = {"validated_schema": ChannelParameter(type=standard_artifacts.Schema)}


class DataGate(base_component.BaseComponent):
    SPEC_CLASS = DataGateSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(
        self,
        config: PipelineConfig,
        statistics: types.BaseChannel,
        schema: types.BaseChannel,
        anomalies: types.BaseChannel,
        baseline_schema: types.BaseChannel | None = None,
    ):
        config.require_data("DataGate")
        super().__init__(
            spec=DataGateSpec(
                custom_config=json.dumps(payload.encode(config=config)),
                statistics=statistics,
                schema=schema,
                anomalies=anomalies,
                baseline_schema=baseline_schema,
                validated_schema=types.Channel(type=standard_artifacts.Schema),
            )
        )
