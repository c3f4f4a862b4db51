"""The steps `create_pipeline` calls, each built alone: the data checks, Transform's
place behind the gate, and the gates before the Pusher (`evaluate_and_push`: the
served model's Resolver and the Evaluators; the distillation stage and the
Evaluator's candidate are pinned through the whole DAG in `test_distillation_pipeline.py`).
"""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow_model_analysis as tfma
from tfx.dsl.compiler import compiler
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import (
    LatestBlessedModelStrategy,
)
from tfx.utils import proto_utils

from components.data.sources import ResolvedInput
from components.pusher.component import SERVED_BLESSING_KEY
from components.trainer.component import Trainer
from pipelines import pipeline
from pipelines.roles import GATE_ID, SERVED_GATE_ID, SERVED_RESOLVER_ID


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


def _served(config, against_served=True, distilled=False):
    return dataclasses.replace(
        config,
        distillation=dataclasses.replace(config.distillation, enabled=distilled),
        evaluation=dataclasses.replace(
            config.evaluation, against_served=against_served, change_threshold=0.02
        ),
    )


def _evaluate_and_push(config, gen):
    """`evaluate_and_push` after the steps before it, as `create_pipeline` calls it."""
    _, schema, _, _, gate = pipeline.data_checks(config, gen)
    transform = pipeline.transform_after_gate(config, gen, schema, gate)
    trainer = Trainer(
        config=config,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema.outputs["schema"],
    )
    distill = (
        pipeline.distillation_stage(config, transform, schema, trainer)
        if config.distillation.enabled
        else []
    )
    return trainer, distill, pipeline.evaluate_and_push(config, gen, trainer, distill, "/serving")


def _accuracy_threshold(evaluator):
    config = proto_utils.json_to_proto(evaluator.exec_properties["eval_config"], tfma.EvalConfig())
    (spec,) = config.metrics_specs
    (accuracy,) = [m for m in spec.metrics if m.class_name == "SparseCategoricalAccuracy"]
    return accuracy.threshold


def _assert_resolves_blessings_of(resolver, config, gate_id):
    """`resolver` is TFX's latest-blessed-model Resolver, and the pipeline TFX compiles
    reads its blessings from `gate_id`'s `blessing` output alone (any Model)."""
    assert resolver.id == SERVED_RESOLVER_ID
    assert resolver.exec_properties["resolver_class"] is LatestBlessedModelStrategy
    built = pipeline.create_pipeline(
        config,
        ResolvedInput("/data/digits", "*.tfrecord", "tfrecord"),
        pipeline.PipelinePaths("/root", "/serving", "/m.sqlite"),
    )
    (node,) = [
        n.pipeline_node
        for n in compiler.Compiler().compile(built).nodes
        if n.pipeline_node.node_info.id == SERVED_RESOLVER_ID
    ]
    channels = {
        (c.artifact_query.type.name, c.output_key): sorted(
            q.name.field_value.string_value for q in c.context_queries
        )
        for spec in node.inputs.inputs.values()
        for c in spec.channels
    }
    # No other Evaluator's blessing counts as served.
    assert channels == {
        ("Model", ""): [config.name],
        ("ModelBlessing", "blessing"): [config.name, f"{config.name}.{gate_id}"],
    }


def test_the_evaluator_compares_the_candidate_with_the_served_model(digits_config, gen):
    config = _served(digits_config)
    trainer, _, (resolver, evaluator, pusher) = _evaluate_and_push(config, gen)
    _assert_resolves_blessings_of(resolver, config, "Evaluator")
    assert evaluator.id == "Evaluator"
    assert evaluator.inputs["model"] is trainer.outputs["model"]
    assert evaluator.inputs["baseline_model"] is resolver.outputs["model"]
    threshold = _accuracy_threshold(evaluator)
    assert threshold.value_threshold.lower_bound.value == config.evaluation.min_accuracy
    assert threshold.change_threshold.direction == tfma.MetricDirection.HIGHER_IS_BETTER
    assert threshold.change_threshold.absolute.value == -0.02
    assert pusher.inputs["model_blessing"] is evaluator.outputs["blessing"]
    assert SERVED_BLESSING_KEY not in pusher.inputs


def test_a_distilled_student_faces_the_teacher_and_the_served_model(digits_config, gen):
    config = _served(digits_config, distilled=True)
    trainer, distill, components = _evaluate_and_push(config, gen)
    resolver, teacher_gate, served_gate, pusher = components
    student = distill[-1].outputs["model"]
    _assert_resolves_blessings_of(resolver, config, SERVED_GATE_ID)
    assert (teacher_gate.id, served_gate.id) == ("Evaluator", SERVED_GATE_ID)
    assert teacher_gate.inputs["model"] is student
    assert teacher_gate.inputs["baseline_model"] is trainer.outputs["model"]
    assert _accuracy_threshold(teacher_gate).change_threshold.absolute.value == -(
        config.evaluation.max_accuracy_drop
    )
    assert served_gate.inputs["model"] is student
    assert served_gate.inputs["baseline_model"] is resolver.outputs["model"]
    assert _accuracy_threshold(served_gate).change_threshold.absolute.value == -0.02
    assert pusher.inputs["model"] is student
    assert pusher.inputs["model_blessing"] is teacher_gate.outputs["blessing"]
    assert pusher.inputs[SERVED_BLESSING_KEY] is served_gate.outputs["blessing"]


@pytest.mark.parametrize("distilled", [False, True], ids=["alone", "distilled"])
def test_without_against_served_there_is_no_served_gate(digits_config, gen, distilled):
    config = _served(digits_config, against_served=False, distilled=distilled)
    trainer, distill, (evaluator, pusher) = _evaluate_and_push(config, gen)
    assert evaluator.id == "Evaluator"
    expected_baseline = trainer.outputs["model"] if distilled else None
    assert evaluator.inputs.get("baseline_model") is expected_baseline
    if not distilled:
        assert not _accuracy_threshold(evaluator).HasField("change_threshold")
    assert SERVED_BLESSING_KEY not in pusher.inputs


def test_create_pipeline_runs_the_served_resolver_before_the_served_gate(digits_config):
    config = _served(digits_config, distilled=True)
    built = pipeline.create_pipeline(
        config,
        ResolvedInput("/data/digits", "*.tfrecord", "tfrecord"),
        pipeline.PipelinePaths("/root", "/serving", "/m.sqlite"),
    )
    ids = [c.id for c in built.components]
    assert ids.index(SERVED_RESOLVER_ID) < ids.index(SERVED_GATE_ID) < ids.index("Pusher")
