"""M-on-M (`distillation.method: m_on_m`): one student per teacher, served as their mean of
logits. The ensemble model, the refusals, a user's `student_fn` through the Distiller's
run_fn, and a tiny digits pipeline end to end (teachers, `EnsembleStudent`, the M-on-M
Distiller, Evaluator, Pusher, report)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from components.config import ConfigError, PipelineConfig
from components.config.distillation import BaselineConfig
from components.config.payload import CONFIG_KEY
from components.config.training import ModelConfig
from components.distillation.model import count_params
from components.distiller import run_fn as distiller_run_fn
from components.distiller.component import Distiller, EnsembleStudent
from components.distiller.executor import MEMBERS_DIR
from testkit.tiny import tiny
from tests.components.distiller.user_runs import (
    channels,
    penguin_teachers,
    raw_digits_examples,
    run_student_fn,
    student_fn_distiller,
)
from tests.components.training import penguins


def _m_on_m(config: PipelineConfig, **changes) -> PipelineConfig:
    settings = {"enabled": True, "method": "m_on_m", "num_teachers": 2, **changes}
    return dataclasses.replace(
        config, distillation=dataclasses.replace(config.distillation, **settings)
    )


# --------------------------------------------------------------------------- #
# The ensemble model
# --------------------------------------------------------------------------- #


def _member(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inputs = {"a": keras.Input((3,), name="a"), "b": keras.Input((2,), name="b")}
    hidden = keras.layers.Dense(4, activation="relu")(keras.layers.concatenate([*inputs.values()]))
    # One name for all, as the Distiller builds its students.
    return keras.Model(inputs, keras.layers.Dense(5)(hidden), name="student")


def test_the_ensemble_outputs_the_mean_of_its_students_logits_and_keeps_their_weights():
    members = [_member(seed) for seed in (1, 2, 3)]
    ensemble = distiller_run_fn.ensemble_model(members)
    rng = np.random.default_rng(0)
    batch = {"a": rng.normal(size=(7, 3)), "b": rng.normal(size=(7, 2))}
    expected = np.mean([m(batch).numpy() for m in members], axis=0)
    np.testing.assert_allclose(ensemble(batch).numpy(), expected, rtol=1e-6, atol=1e-6)
    assert sorted(ensemble.input_names) == ["a", "b"]
    assert count_params(ensemble.trainable_weights) == sum(
        count_params(m.trainable_weights) for m in members
    )


# --------------------------------------------------------------------------- #
# Refusals
# --------------------------------------------------------------------------- #


def test_m_on_m_with_one_teacher_is_refused_naming_num_teachers(digits_config):
    with pytest.raises(ConfigError, match=r"^distillation\.num_teachers: .*at least 2 teachers"):
        _m_on_m(digits_config, num_teachers=1)


def test_m_on_m_with_teacher_weights_is_refused(digits_config):
    with pytest.raises(
        ConfigError, match=r"^distillation\.teacher_weights: .*remove teacher_weights"
    ):
        _m_on_m(digits_config, teacher_weights=(1.0, 2.0))


def test_m_on_m_students_that_together_outweigh_a_teacher_are_refused(digits_config):
    wide = dataclasses.replace(digits_config.teacher, hidden_units=(64,))
    student = dataclasses.replace(digits_config.student, hidden_units=(40,))
    config = dataclasses.replace(digits_config, teacher=wide, student=student)
    # One such student is smaller than the teacher; two are not.
    _m_on_m(config, num_teachers=1, method="kd")
    with pytest.raises(ConfigError, match=r"^student: the 2 students of method m_on_m"):
        _m_on_m(config)


def test_a_distiller_built_in_code_counts_its_teacher_models(digits_config):
    config = _m_on_m(digits_config)
    examples, graph, models = channels(1)
    with pytest.raises(ConfigError, match=r"^distillation\.num_teachers \(teacher_models\): "):
        Distiller(config=config, examples=examples, transform_graph=graph, teacher_models=models)


def test_a_student_fn_m_on_m_with_a_scratch_baseline_is_refused(tmp_path):
    config = {"distillation": {"method": "m_on_m", "scratch_baseline": True}}
    with pytest.raises(ConfigError, match=r"^distillation\.scratch_baseline: with method m_on_m"):
        student_fn_distiller(str(tmp_path), config, teachers=2)


def test_the_ensemble_student_is_a_kd_distiller_of_its_own_type(digits_config):
    examples, graph, models = channels(2)
    one = EnsembleStudent(
        config=_m_on_m(digits_config),
        examples=examples,
        transform_graph=graph,
        teacher_models=models,
    )
    assert one.type != Distiller.get_class_type()
    carried = json.loads(json.loads(one.exec_properties["custom_config"])[CONFIG_KEY])
    assert carried["distillation"]["method"] == "kd"


# --------------------------------------------------------------------------- #
# A user's student_fn and teachers from any Trainer
# --------------------------------------------------------------------------- #


def test_a_student_fn_m_on_m_serves_the_mean_of_its_students_with_the_teachers_signature(
    tmp_path, penguin_inputs
):
    data, teachers, module = penguin_teachers(str(tmp_path), 2, penguin_inputs)
    sections = {
        "ingestion": {"batch_size": 32, "eval_batch_size": 32, "shuffle_buffer": 0},
        "train": {"train_steps": 6, "eval_steps": 2},
        "distillation": {"label_key": penguins.LABEL, "method": "m_on_m"},
    }
    inputs = run_student_fn(data, teachers, module, str(tmp_path), sections)

    serving = inputs["serving_model_dir"]
    root = os.path.join(os.path.dirname(serving.rstrip("/")), MEMBERS_DIR)
    assert sorted(os.listdir(root)) == ["0", "1"]
    examples = tf.constant(penguins.raw_examples(penguins.read_rows()[:16]))
    ensemble = tf.saved_model.load(serving).signatures["serving_default"]
    teacher = tf.saved_model.load(teachers[0]).signatures["serving_default"]
    assert ensemble.structured_input_signature == teacher.structured_input_signature
    assert ensemble.structured_outputs.keys() == teacher.structured_outputs.keys()
    members = [
        tf.saved_model.load(os.path.join(root, i))
        .signatures["serving_default"](examples=examples)["outputs"]
        .numpy()
        for i in ("0", "1")
    ]
    np.testing.assert_allclose(
        ensemble(examples=examples)["outputs"].numpy(),
        np.mean(members, axis=0),
        rtol=1e-5,
        atol=1e-5,
    )
    # Each student's backup is gone once the ensemble is exported.
    left = [d for d, _, _ in os.walk(tmp_path) if d.endswith(("-student0", "-student1"))]
    assert not left


# --------------------------------------------------------------------------- #
# The pipeline, end to end
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def m_on_m_run(tmp_path_factory, digits_config):
    """Tiny digits with two teachers, method m_on_m and one network trained alone at the
    two students' cost (their [32] hidden units each; [64] alone): the pipeline's output
    directory, config and summary."""
    from pipelines import local_runner

    wide = BaselineConfig(name="wide", model=ModelConfig(hidden_units=(64,)))
    config = _m_on_m(tiny(digits_config), baselines=(wide,))
    output = str(tmp_path_factory.mktemp("m_on_m"))
    return output, config, local_runner.run(config, output, runner="beam")


@pytest.mark.e2e
def test_the_m_on_m_pipeline_serves_the_students_mean_and_reports_every_model(m_on_m_run):
    from pipelines import roles

    output, config, summary = m_on_m_run
    assert summary["status"] == "succeeded", summary
    assert set(summary["components"]) >= {"Trainer", "Trainer_1", "EnsembleStudent", "Distiller"}
    rows = summary["distillation"]["models"]
    by_role = {}
    for row in rows:
        by_role.setdefault(row["role"], []).append(row)
    assert [len(by_role[r]) for r in (roles.TEACHER, roles.TEACHER_ENSEMBLE)] == [2, 1]
    assert [
        len(by_role[r])
        for r in (roles.BASELINE, roles.ENSEMBLE_STUDENT, roles.MEMBER, roles.STUDENT)
    ] == [1, 1, 2, 1]
    (ensemble_row,) = by_role[roles.STUDENT]
    members = by_role[roles.MEMBER]
    assert ensemble_row["params"] == sum(m["params"] for m in members)
    assert by_role[roles.TEACHER_ENSEMBLE][0]["params"] == sum(
        t["params"] for t in by_role[roles.TEACHER]
    )
    verdict = summary["distillation"]["verdict"]
    assert verdict["member_accs"] == [m["accuracy"] for m in members]
    assert verdict["one_student_acc"] == by_role[roles.ENSEMBLE_STUDENT][0]["accuracy"]
    assert verdict["message"].startswith("The ensemble of 2 students scored")
    # The network alone at the ensemble's cost is the verdict's yardstick.
    (wide,) = by_role[roles.BASELINE]
    assert wide["node"] == "Baseline_wide" and wide["params"] <= ensemble_row["params"]
    assert verdict["same_cost_alone"] == "Baseline_wide"
    assert verdict["same_cost_alone_acc"] == wide["accuracy"]
    assert verdict["ensemble_params"] == ensemble_row["params"]
    assert verdict["beat_same_cost_alone"] == (ensemble_row["accuracy"] > wide["accuracy"])
    assert "At the same serving cost" in verdict["message"]
    # Each teacher beat the student it taught (by far, in this short run).
    assert verdict["teacher_accs"] == [t["accuracy"] for t in by_role[roles.TEACHER]]
    assert verdict["teachers_beat_students"] is True

    examples = raw_digits_examples(output, config.data.label.name)
    served = tf.saved_model.load(ensemble_row["serving_dir"])
    teacher = tf.saved_model.load(by_role[roles.TEACHER][0]["serving_dir"])
    assert set(served.signatures) == set(teacher.signatures)
    for name, fn in teacher.signatures.items():
        assert served.signatures[name].structured_input_signature == fn.structured_input_signature
        assert served.signatures[name].structured_outputs == fn.structured_outputs
    got = served.signatures["serving_default"](examples=examples)
    logits = [
        tf.saved_model.load(m["serving_dir"])
        .signatures["serving_default"](examples=examples)["logits"]
        .numpy()
        for m in members
    ]
    np.testing.assert_allclose(got["logits"].numpy(), np.mean(logits, axis=0), atol=1e-5)
    # Served twice, the same answer: no noise at serving time.
    again = served.signatures["serving_default"](examples=examples)
    np.testing.assert_allclose(
        got["probabilities"].numpy(), again["probabilities"].numpy(), rtol=1e-5, atol=1e-6
    )
