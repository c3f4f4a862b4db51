"""The steps `create_pipeline` calls, each built alone: the data checks and Transform's
place behind the gate (the distillation stage and the Evaluator's candidate are pinned
through the whole DAG in `test_distillation_pipeline.py`).
"""

from __future__ import annotations

import pytest

from components.data.sources import ResolvedInput
from pipelines import pipeline
from pipelines.roles import GATE_ID


@pytest.fixture
def gen(digits_config):
    return pipeline.example_gen(
        digits_config, ResolvedInput("/data/digits", "*.tfrecord", "tfrecord")
    )


def test_data_checks_gate_the_data_against_the_last_validated_schema(digits_config, gen):
    checks = pipeline.data_checks(digits_config, gen)
    statistics, schema, validator, baseline, gate = checks
    assert [c.id for c in checks] == [
        "StatisticsGen",
        "SchemaGen",
        "ExampleValidator",
        "latest_validated_schema",
        GATE_ID,
    ]
    assert statistics.inputs["examples"] is gen.outputs["examples"]
    assert gate.inputs["statistics"] is statistics.outputs["statistics"]
    assert gate.inputs["schema"] is schema.outputs["schema"]
    assert gate.inputs["anomalies"] is validator.outputs["anomalies"]
    assert gate.inputs["baseline_schema"] is baseline.outputs["schema"]


def test_transform_waits_for_the_gate_without_reading_its_outputs(digits_config, gen):
    # Reading the gate's output would make every run's Transform miss the cache,
    # since the gate checks against a newer baseline each run.
    _, schema, _, _, gate = pipeline.data_checks(digits_config, gen)
    transform = pipeline.transform_after_gate(digits_config, gen, schema, gate)
    assert [n.id for n in transform.upstream_nodes] == [GATE_ID]
    assert {k: c.producer_component_id for k, c in transform.inputs.items()} == {
        "examples": gen.id,
        "schema": "SchemaGen",
    }
