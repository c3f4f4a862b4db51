"""The distillation stage in the pipeline: teacher Trainers -> Distiller ->
Evaluator (student = candidate, teacher = baseline) -> Pusher.

The e2e tests share `digits_distillation_run` (two teachers, a gate the
student cannot pass); one re-runs a copy of it with reachable thresholds (the
config travels into every component, so the whole DAG runs again), after
which the Pusher must push the student.
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import shutil

import pytest
import tensorflow as tf
import tensorflow_model_analysis as tfma
from ml_metadata.proto import metadata_store_pb2

from components.config import from_dict, to_dict
from components.distillation.model import count_params
from components.distiller.component import teacher_key
from components.trainer.component import Trainer
from pipelines import local_runner
from pipelines.pipeline import PipelinePaths, create_pipeline, distillation_eval_config, eval_config
from pipelines.report import CHART_FILE
from pipelines.summary import latest_run_executions, open_store


def _build(config, tmp_path):
    from components.data.sources import ResolvedInput

    data = ResolvedInput(str(tmp_path), "*.tfrecord", "tfrecord")
    paths = PipelinePaths(
        str(tmp_path / "root"), str(tmp_path / "serving"), str(tmp_path / "m.sqlite")
    )
    return {c.id: c for c in create_pipeline(config, data, paths).components}


def _distilling(config, num_teachers=1):
    return dataclasses.replace(
        config,
        distillation=dataclasses.replace(
            config.distillation, enabled=True, num_teachers=num_teachers
        ),
    )


def test_distillation_pipeline_wiring(tmp_path, digits_config):
    components = _build(_distilling(digits_config, num_teachers=3), tmp_path)
    teachers = [components[n] for n in ("Trainer", "Trainer_1", "Trainer_2")]
    assert all(isinstance(t, Trainer) for t in teachers)
    seeds = [
        json.loads(json.loads(t.exec_properties["custom_config"])["tfxkit_config"])["train"]["seed"]
        for t in teachers
    ]
    assert seeds == [digits_config.train.seed + i for i in range(3)]
    distiller, evaluator, pusher = (
        components["Distiller"],
        components["Evaluator"],
        components["Pusher"],
    )
    for i, teacher in enumerate(teachers):
        assert distiller.inputs[teacher_key(i)] is teacher.outputs["model"]
    assert evaluator.inputs["model"] is distiller.outputs["model"]
    assert evaluator.inputs["baseline_model"] is components["Trainer"].outputs["model"]
    assert pusher.inputs["model"] is distiller.outputs["model"]
    assert pusher.inputs["model_blessing"] is evaluator.outputs["blessing"]


def test_noisy_student_chains_its_rounds_and_gates_the_last_against_the_first_teacher(
    tmp_path, digits_config
):
    config = dataclasses.replace(
        digits_config,
        data=dataclasses.replace(digits_config.data, labeled_fraction=0.1),
        distillation=dataclasses.replace(
            digits_config.distillation,
            enabled=True,
            method="noisy_student",
            cache_teacher_logits=False,
            scratch_baseline=False,
            noisy_student=dataclasses.replace(digits_config.distillation.noisy_student, rounds=3),
        ),
    )
    components = _build(config, tmp_path)
    chain = [components[n] for n in ("Trainer", "Round_1", "Round_2", "Distiller")]
    for teacher, student in zip(chain, chain[1:], strict=False):
        assert student.inputs[teacher_key(0)] is teacher.outputs["model"]
        assert teacher_key(1) not in student.inputs
    seeds = [
        json.loads(json.loads(c.exec_properties["custom_config"])["tfxkit_config"])["train"]["seed"]
        for c in chain[1:]
    ]
    assert seeds == [digits_config.train.seed + k for k in (1, 2, 3)]
    evaluator = components["Evaluator"]
    assert evaluator.inputs["model"] is components["Distiller"].outputs["model"]
    assert evaluator.inputs["baseline_model"] is components["Trainer"].outputs["model"]


@pytest.mark.parametrize("augment_students", [True, False])
def test_noisy_students_train_with_or_without_the_augmentation_the_teacher_keeps(
    tmp_path, digits_config, augment_students
):
    data = to_dict(digits_config)
    data["data"]["labeled_fraction"] = 0.1
    data["train"]["augmentation"] = {"mixup": 0.2}
    data["distillation"].update(
        method="noisy_student",
        cache_teacher_logits=False,
        scratch_baseline=False,
        noisy_student={"augment_students": augment_students},
    )
    components = _build(from_dict(data), tmp_path)

    def mixup(node):
        carried = json.loads(
            json.loads(components[node].exec_properties["custom_config"])["tfxkit_config"]
        )
        return carried["train"]["augmentation"]["mixup"]

    assert mixup("Trainer") == 0.2
    assert [mixup(n) for n in ("Round_1", "Distiller")] == [0.2 if augment_students else 0.0] * 2


def test_noisy_students_train_with_their_own_augmentation_beside_the_teachers(
    tmp_path, digits_config
):
    data = to_dict(digits_config)
    data["data"]["labeled_fraction"] = 0.1
    data["train"]["augmentation"] = {"mixup": 0.4, "input_noise": 0.1}
    data["distillation"].update(
        method="noisy_student",
        cache_teacher_logits=False,
        scratch_baseline=True,
        noisy_student={"student_augmentation": {"mixup": 0.2}},
    )
    components = _build(from_dict(data), tmp_path)

    def carried(node):
        return json.loads(
            json.loads(components[node].exec_properties["custom_config"])["tfxkit_config"]
        )

    teacher = {"translate": 0, "flip": False, "mixup": 0.4, "input_noise": 0.1}
    # The teacher and the network trained alone keep train.augmentation.
    assert carried("Trainer")["train"]["augmentation"] == teacher
    assert carried("StudentBaseline")["train"]["augmentation"] == teacher
    for node in ("Round_1", "Distiller"):
        config = carried(node)
        assert config["train"]["augmentation"] == {**teacher, "mixup": 0.2, "input_noise": 0.0}
        assert config["distillation"]["noisy_student"]["student_augmentation"] is None


def test_pipeline_without_distillation_is_unchanged(tmp_path, digits_config):
    plain = dataclasses.replace(
        digits_config, distillation=dataclasses.replace(digits_config.distillation, enabled=False)
    )
    components = _build(plain, tmp_path)
    assert "Distiller" not in components and "Trainer_1" not in components
    assert "ServedEvaluator" not in components
    assert components["Evaluator"].inputs["model"] is components["Trainer"].outputs["model"]
    # The one baseline is the served model (evaluation.against_served).
    served = components["latest_served_model"].outputs["model"]
    assert components["Evaluator"].inputs["baseline_model"] is served
    assert components["Pusher"].inputs["model"] is components["Trainer"].outputs["model"]


def test_eval_config_compares_student_with_teacher(digits_config):
    config = dataclasses.replace(
        digits_config,
        evaluation=dataclasses.replace(
            digits_config.evaluation, min_accuracy=0.8, max_accuracy_drop=0.03
        ),
    )
    result = distillation_eval_config(config)
    specs = {s.name: s for s in result.model_specs}
    assert set(specs) == {"candidate", "baseline"}
    assert specs["baseline"].is_baseline and not specs["candidate"].is_baseline
    assert specs["candidate"].signature_name == eval_config(config).model_specs[0].signature_name
    (accuracy,) = [
        m
        for s in result.metrics_specs
        for m in s.metrics
        if m.class_name == "SparseCategoricalAccuracy"
    ]
    assert accuracy.threshold.value_threshold.lower_bound.value == pytest.approx(0.8)
    assert accuracy.threshold.change_threshold.absolute.value == pytest.approx(-0.03)
    assert accuracy.threshold.change_threshold.direction == tfma.MetricDirection.HIGHER_IS_BETTER


def _store(output):
    return open_store(os.path.join(output, "metadata.sqlite"))


def _artifacts(store, execution, type_name, event_type=metadata_store_pb2.Event.OUTPUT):
    ids = [
        e.artifact_id
        for e in store.get_events_by_execution_ids([execution.id])
        if e.type == event_type
    ]
    found = store.get_artifacts_by_id(ids) if ids else []
    return [a for a in found if store.get_artifact_types_by_id([a.type_id])[0].name == type_name]


def _gate_artifacts(output, name):
    """(student model, teacher model, blessing, Pusher's input models, pushed model) of the newest run."""
    store = _store(output)
    executions = latest_run_executions(store, name)
    (student,) = _artifacts(store, executions["Distiller"], "Model")
    (teacher,) = _artifacts(store, executions["Trainer"], "Model")
    (blessing,) = _artifacts(store, executions["Evaluator"], "ModelBlessing")
    pusher_inputs = _artifacts(store, executions["Pusher"], "Model", metadata_store_pb2.Event.INPUT)
    (pushed,) = _artifacts(store, executions["Pusher"], "PushedModel")
    return student, teacher, blessing, pusher_inputs, pushed


@pytest.mark.e2e
def test_unreachable_gate_blesses_nothing_and_pushes_nothing(digits_distillation_run):
    output, config, summary = digits_distillation_run
    assert summary["status"] == "succeeded"
    assert summary["blessed"] is False
    assert summary["pushed_model"] is None
    serving = os.path.join(output, "serving", config.name)
    assert not tf.io.gfile.exists(serving) or not tf.io.gfile.listdir(serving)
    student, teacher, blessing, _, pushed = _gate_artifacts(output, config.name)
    props = blessing.custom_properties
    assert props["blessed"].int_value == 0
    # TFMA compared the student (candidate) against the teacher (baseline).
    assert props["current_model_id"].int_value == student.id
    assert props["baseline_model_id"].int_value == teacher.id
    assert pushed.custom_properties["pushed"].int_value == 0
    # The accuracy change against the teacher was computed.
    assert "accuracy_diff" in summary["metrics"]


@pytest.mark.e2e
def test_reachable_gate_pushes_the_student_not_the_teacher(digits_distillation_run, tmp_path):
    # A copy: the shared run stays as the other tests (other workers too) read it.
    output = str(tmp_path / "out")
    shutil.copytree(digits_distillation_run[0], output)
    config = digits_distillation_run[1]
    reachable = dataclasses.replace(
        config,
        evaluation=dataclasses.replace(config.evaluation, min_accuracy=0.0, max_accuracy_drop=1.0),
    )
    summary = local_runner.run(reachable, output, runner="beam")
    assert summary["blessed"] is True and summary["pushed_model"]
    student, teacher, blessing, pusher_inputs, pushed = _gate_artifacts(output, config.name)
    assert blessing.custom_properties["blessed"].int_value == 1
    assert student.id in {a.id for a in pusher_inputs} and teacher.id not in {
        a.id for a in pusher_inputs
    }
    assert pushed.custom_properties["pushed"].int_value == 1
    # The pushed files are the student's SavedModel.
    pushed_dir = summary["pushed_model"]
    student_dir = os.path.join(student.uri, "Format-Serving")
    assert filecmp.cmp(
        os.path.join(pushed_dir, "saved_model.pb"),
        os.path.join(student_dir, "saved_model.pb"),
        shallow=False,
    )
    pushed_params = count_params(tf.saved_model.load(pushed_dir).trainable_variables)
    teacher_params = count_params(
        tf.saved_model.load(os.path.join(teacher.uri, "Format-Serving")).trainable_variables
    )
    assert pushed_params == count_params(tf.saved_model.load(student_dir).trainable_variables)
    assert pushed_params * 10 <= teacher_params


@pytest.mark.e2e
def test_run_report_compares_teachers_and_student(digits_distillation_run):
    output, _, summary = digits_distillation_run
    report = summary["distillation"]
    assert [(r["role"], r["node"]) for r in report["models"]] == [
        ("teacher", "Trainer"),
        ("teacher", "Trainer_1"),
        ("student", "Distiller"),
    ]
    for row in report["models"]:
        assert 0.0 <= row["accuracy"] <= 1.0 and row["params"] > 0 and row["saved_model_bytes"] > 0
        assert row["latency_ms_b1"] > 0 and row["latency_ms_b256"] > 0
    teacher, student = report["models"][0], report["models"][2]
    assert report["student_vs_teacher"]["params"] == pytest.approx(
        student["params"] / teacher["params"]
    )
    # The Evaluator scored the same student on the same eval split.
    assert student["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)
    assert report["chart"] == os.path.join(output, CHART_FILE)
    with open(report["chart"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    on_disk = json.load(open(os.path.join(output, "summary.json")))
    assert on_disk["distillation"]["models"][2]["node"] == "Distiller"


# Ids a team might give its nodes; none of them is the product's default.
RENAMED = {
    "Trainer": "TeacherA",
    "Trainer_1": "TeacherB",
    "Distiller": "Student",
    "Evaluator": "Judge",
    "Pusher": "Publish",
}


@pytest.mark.e2e
def test_renamed_nodes_keep_summary_and_report_correct(tmp_path, monkeypatch, digits_config):
    from testkit.tiny import tiny

    def renamed_pipeline(*args, **kwargs):
        pipeline = create_pipeline(*args, **kwargs)
        for component in pipeline.components:
            if component.id in RENAMED:
                component.with_id(RENAMED[component.id])
        return pipeline

    monkeypatch.setattr(local_runner, "create_pipeline", renamed_pipeline)
    config = _distilling(tiny(digits_config), num_teachers=2)
    summary = local_runner.run(config, str(tmp_path), runner="beam")

    assert set(RENAMED.values()) <= set(summary["components"])
    assert not set(RENAMED) & set(summary["components"])
    # Metrics, blessing and push are read by artifact type, whatever the ids.
    assert summary["blessed"] is True and summary["pushed_model"]
    assert summary["metrics"]["example_count"] > 0
    report = summary["distillation"]
    assert [(r["role"], r["node"]) for r in report["models"]] == [
        ("teacher", "TeacherA"),
        ("teacher", "TeacherB"),
        ("student", "Student"),
    ]
    # The first teacher is the Evaluator's baseline, and the student is the
    # model the Evaluator scored on the same eval split.
    assert report["models"][2]["accuracy"] == pytest.approx(
        summary["metrics"]["accuracy"], abs=1e-6
    )
    assert report["models"][0]["accuracy"] == pytest.approx(
        summary["metrics"]["accuracy"] - summary["metrics"]["accuracy_diff"], abs=1e-6
    )


def test_the_shipped_m_on_m_config_trains_its_same_cost_baseline_beside_the_ensemble(tmp_path):
    from pipelines.configs import load_config

    components = _build(load_config("fashion_mnist_m_on_m"), tmp_path)
    assert {"Trainer_2", "EnsembleStudent", "Baseline_wide", "Distiller"} <= set(components)
    wide = json.loads(
        json.loads(components["Baseline_wide"].exec_properties["custom_config"])["tfxkit_config"]
    )
    assert wide["teacher"]["conv"]["filters"] == [16, 32, 64]
    assert wide["distillation"]["enabled"] is False


def test_each_baseline_trains_its_own_model_beside_the_scratch_baseline(tmp_path, digits_config):
    data = to_dict(digits_config)
    data["distillation"].update(
        enabled=True,
        scratch_baseline=True,
        baselines=[
            {"name": "wide", "model": {"hidden_units": [64]}},
            {"name": "noisy", "augmentation": {"input_noise": 0.1}},
        ],
    )
    config = from_dict(data)
    components = _build(config, tmp_path)

    def carried(node):
        return json.loads(
            json.loads(components[node].exec_properties["custom_config"])["tfxkit_config"]
        )

    scratch, wide, noisy = (
        carried(n) for n in ("StudentBaseline", "Baseline_wide", "Baseline_noisy")
    )
    assert scratch["teacher"]["hidden_units"] == list(config.student.hidden_units)
    assert wide["teacher"]["hidden_units"] == [64]
    assert noisy["teacher"]["hidden_units"] == list(config.student.hidden_units)
    assert [c["train"]["augmentation"]["input_noise"] for c in (scratch, wide, noisy)] == [
        0,
        0,
        0.1,
    ]
    # The student's steps; one model each, no distillation stage of their own.
    for c in (scratch, wide, noisy):
        assert c["train"]["train_steps"] == config.student_train_steps()
        assert c["distillation"]["enabled"] is False and c["distillation"]["baselines"] == []
    # Yardsticks only: nothing downstream reads them.
    for node in ("Baseline_wide", "Baseline_noisy"):
        model = components[node].outputs["model"]
        assert not any(
            model is channel for c in components.values() for channel in c.inputs.values()
        )
