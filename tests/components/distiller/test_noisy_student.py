"""Noisy Student (`distillation.method: noisy_student`): the refusals, the labeling pass, a
user's `student_fn` through the Distiller's run_fn, and a two-round chain on tiny digits
end to end (teacher, `Round_1`, the final `Distiller`, Evaluator, report)."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from components.config import (
    ConfigError,
    PipelineConfig,
    from_dict,
    to_dict,
)
from components.distillation import self_training
from components.distillation import teachers as teachers_lib
from components.distiller.executor import ROUND_FILE
from components.training import fit as training
from components.training import models
from testkit.tiny import tiny
from tests.components.distiller.user_runs import (
    penguin_teachers,
    raw_digits_examples,
    run_student_fn,
    student_fn_distiller,
)
from tests.components.training import penguins


def _noisy(config: PipelineConfig, fraction: float = 0.5, **settings) -> PipelineConfig:
    distillation = dataclasses.replace(
        config.distillation,
        enabled=True,
        method="noisy_student",
        cache_teacher_logits=False,
        noisy_student=dataclasses.replace(config.distillation.noisy_student, **settings),
    )
    data = dataclasses.replace(config.data, labeled_fraction=fraction)
    return dataclasses.replace(config, data=data, distillation=distillation)


# --------------------------------------------------------------------------- #
# Refusals
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"rounds": 0}, r"^distillation\.noisy_student\.rounds: expected an integer >= 1"),
        (
            {"confidence": 0.0},
            r"^distillation\.noisy_student\.confidence: expected a number in \(0, 1\)",
        ),
        ({"confidence": 1.0}, r"^distillation\.noisy_student\.confidence: "),
    ],
)
def test_bad_rounds_and_thresholds_are_refused_naming_the_field(digits_config, settings, match):
    data = to_dict(_noisy(digits_config))
    data["distillation"]["noisy_student"].update(settings)
    with pytest.raises(ConfigError, match=match):
        from_dict(data)


def test_noisy_student_without_unlabeled_examples_is_refused(digits_config):
    with pytest.raises(ConfigError, match=r"^data\.labeled_fraction: method noisy_student learns"):
        _noisy(digits_config, fraction=1.0)


def test_soft_pseudo_labels_with_mixup_are_refused(digits_config):
    data = to_dict(_noisy(digits_config, pseudo_labels="soft"))
    data["train"]["augmentation"]["mixup"] = 0.2
    with pytest.raises(ConfigError, match=r"^distillation\.noisy_student\.pseudo_labels: soft"):
        from_dict(data)


def test_a_students_augmentation_with_augment_students_off_is_refused(digits_config):
    data = to_dict(_noisy(digits_config))
    data["distillation"]["noisy_student"].update(
        augment_students=False, student_augmentation={"mixup": 0.2}
    )
    with pytest.raises(
        ConfigError,
        match=r"^distillation\.noisy_student\.student_augmentation: sets the students' "
        r"augmentation, and augment_students: false",
    ):
        from_dict(data)


@pytest.mark.parametrize(
    "settings, augmentation, match",
    [
        # Digits have no image shape here: the students' views have nothing to move.
        ({}, {"translate": 2}, r"train\.augmentation: augmentation shifts and flips images"),
        # The rule on soft pseudo-labels holds for the students' own mixup too.
        ({"pseudo_labels": "soft"}, {"mixup": 0.2}, r"noisy_student\.pseudo_labels: soft"),
    ],
)
def test_a_students_augmentation_meets_every_rule_of_the_config_it_trains_with(
    digits_config, settings, augmentation, match
):
    data = to_dict(_noisy(digits_config, **settings))
    data["distillation"]["noisy_student"]["student_augmentation"] = augmentation
    with pytest.raises(ConfigError) as refused:
        from_dict(data)
    message = str(refused.value)
    assert message.startswith("distillation.noisy_student.student_augmentation: the rounds' ")
    assert re.search(match, message), message


def test_the_teacher_target_cache_is_refused_with_noisy_student(digits_config):
    data = to_dict(_noisy(digits_config))
    data["distillation"]["cache_teacher_logits"] = True
    with pytest.raises(
        ConfigError, match=r"^distillation\.cache_teacher_logits: method noisy_student"
    ):
        from_dict(data)


def test_a_student_larger_than_its_teacher_is_allowed_for_noisy_student_only(digits_config):
    data = to_dict(_noisy(digits_config))
    data["student"]["hidden_units"] = [1024, 1024]
    assert from_dict(data).student.hidden_units == (1024, 1024)
    data["distillation"]["method"] = "kd"
    with pytest.raises(ConfigError, match=r"^student: the student has at least"):
        from_dict(data)


# --------------------------------------------------------------------------- #
# A user's student_fn, teachers from any Trainer
# --------------------------------------------------------------------------- #


def _half_unlabeled(data: penguins.Materialized, out_dir: str) -> penguins.Materialized:
    """The train split with every other example's label set to -1 (an unlabeled transfer set)."""
    os.makedirs(out_dir)
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    path = os.path.join(out_dir, "data-00000-of-00001.gz")
    with tf.io.TFRecordWriter(path, options) as writer:
        for i, record in enumerate(tf.data.TFRecordDataset(data.train_files, "GZIP")):
            example = tf.train.Example.FromString(record.numpy())
            if i % 2:
                example.features.feature[penguins.LABEL].int64_list.value[:] = [-1]
            writer.write(example.SerializeToString())
    return dataclasses.replace(data, train_files=(path,))


@pytest.mark.parametrize("pseudo_labels", ["hard", "soft"])
def test_a_student_fn_round_trains_on_the_kept_pseudo_labels_and_serves_like_its_teacher(
    tmp_path, pseudo_labels, penguin_inputs
):
    data = _half_unlabeled(penguin_inputs, str(tmp_path / "half"))
    data, (teacher,), module = penguin_teachers(str(tmp_path), 1, data)
    noisy = {
        # The untrained teacher is unsure: keep all it says, once.
        "noisy_student": {"confidence": 0.01, "pseudo_labels": pseudo_labels, "balance": False}
    }
    sections = {
        "ingestion": {"batch_size": 32, "eval_batch_size": 32, "shuffle_buffer": 0},
        "train": {"train_steps": 6, "eval_steps": 2},
        "distillation": {"label_key": penguins.LABEL, "method": "noisy_student", **noisy},
    }
    inputs = run_student_fn(data, [teacher], module, str(tmp_path), sections)

    root = os.path.dirname(inputs["serving_model_dir"].rstrip("/"))
    with open(os.path.join(root, ROUND_FILE)) as f:
        summary = json.load(f)
    train_rows = sum(1 for _ in tf.data.TFRecordDataset(data.train_files, "GZIP"))
    assert summary["unlabeled"] == train_rows // 2
    assert summary["kept"] == summary["confident"] == summary["unlabeled"]
    assert sum(summary["per_class"]) == summary["unlabeled"]
    assert summary["pseudo_labels"] == pseudo_labels
    served = tf.saved_model.load(inputs["serving_model_dir"]).signatures["serving_default"]
    own = tf.saved_model.load(teacher).signatures["serving_default"]
    assert served.structured_input_signature == own.structured_input_signature
    examples = tf.constant(penguins.raw_examples(penguins.read_rows()[:8]))
    assert served(examples=examples)["outputs"].shape == (8, 3)


def test_student_section_noise_for_a_student_fn_is_refused_naming_the_section(tmp_path):
    config = {"distillation": {"method": "noisy_student"}, "student": {"dropout": 0.3}}
    with pytest.raises(ConfigError, match=r"^student: a student_fn student is your own model"):
        student_fn_distiller(str(tmp_path), config, teachers=1)


def test_a_student_fn_round_without_unlabeled_examples_is_refused_before_training(
    tmp_path, penguin_inputs
):
    data, teachers, module = penguin_teachers(str(tmp_path), 1, penguin_inputs)
    sections = {
        "train": {"train_steps": 6, "eval_steps": 2},
        "distillation": {"label_key": penguins.LABEL, "method": "noisy_student"},
    }
    with pytest.raises(
        ValueError, match=r"^data\.labeled_fraction: no training example is unlabeled"
    ):
        run_student_fn(data, teachers, module, str(tmp_path), sections)
    assert not os.path.exists(tmp_path / "run" / "serving_model_dir")


# --------------------------------------------------------------------------- #
# The pipeline, end to end: two rounds on tiny digits
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory, digits_config):
    """Tiny digits, half the labels, two Noisy Student rounds; a student wider than the
    teacher; both with dropout (the teacher's must be off when it labels)."""
    from pipelines import local_runner

    data = to_dict(_noisy(tiny(digits_config), rounds=2, confidence=0.3))
    data["teacher"].update(hidden_units=[32], dropout=0.5)
    data["student"].update(hidden_units=[64], dropout=0.3)
    config = from_dict(data)
    output = str(tmp_path_factory.mktemp("noisy_student"))
    return output, config, local_runner.run(config, output, runner="beam")


def _uri(output, node, kind="model"):
    (path,) = glob.glob(os.path.join(output, "pipeline_root", node, kind, "*"))
    return path


@pytest.mark.e2e
def test_a_two_round_chain_reports_each_round_and_gates_the_last_against_the_teacher(noisy_run):
    from pipelines import roles

    output, config, summary = noisy_run
    assert summary["status"] == "succeeded", summary
    assert {"Trainer", "Round_1", "Distiller", "Evaluator"} <= set(summary["components"])
    rows = summary["distillation"]["models"]
    assert [(r["role"], r["node"]) for r in rows] == [
        (roles.TEACHER, "Trainer"),
        (roles.ROUND, "Round_1"),
        (roles.STUDENT, "Distiller"),
    ]
    # The students are larger than the teacher: the size check is relaxed for this method.
    assert rows[1]["params"] == rows[2]["params"] > rows[0]["params"]
    verdict = summary["distillation"]["verdict"]
    assert verdict["round_accs"] == [rows[1]["accuracy"], rows[2]["accuracy"]]
    assert verdict["message"].startswith("Noisy Student, teacher then rounds: ")
    for node in ("Round_1", "Distiller"):
        with open(os.path.join(_uri(output, node), ROUND_FILE)) as f:
            record = json.load(f)
        assert 0 < record["kept"] <= record["unlabeled"]
        assert sum(record["per_class"]) > 0


@pytest.mark.e2e
def test_the_teacher_labels_in_inference_mode_and_the_student_serves_without_noise(noisy_run):
    output, config, _ = noisy_run
    teacher = teachers_lib.describe_teacher(os.path.join(_uri(output, "Trainer"), "Format-Serving"))
    transformed = _uri(output, "Transform", "transformed_examples")
    inputs = training.TrainingInputs(
        train_files=(os.path.join(transformed, "Split-train", "*"),),
        eval_files=(os.path.join(transformed, "Split-eval", "*"),),
        transform_output=_uri(output, "Transform", "transform_graph"),
        serving_model_dir="",
        model_run_dir=str(output),
        train_steps=1,
        eval_steps=1,
    )
    # The teacher has dropout 0.5: labeling runs it in inference mode, twice the same.
    first = self_training.teacher_probabilities(config, inputs, [teacher])
    second = self_training.teacher_probabilities(config, inputs, [teacher])
    np.testing.assert_array_equal(first[0], second[0])
    # Dropout would move them by far more than a GPU kernel's rounding.
    np.testing.assert_allclose(first[1], second[1], rtol=1e-5, atol=1e-6)
    # Half the training examples are unlabeled.
    assert (
        0.3
        < len(first[0])
        / sum(1 for _ in tf.data.TFRecordDataset(tf.io.gfile.glob(inputs.train_files[0]), "GZIP"))
        < 0.7
    )

    served = tf.saved_model.load(os.path.join(_uri(output, "Distiller"), "Format-Serving"))
    batch = raw_digits_examples(output, config.data.label.name)
    once = served.signatures["serving_default"](examples=batch)["probabilities"].numpy()
    twice = served.signatures["serving_default"](examples=batch)["probabilities"].numpy()
    np.testing.assert_allclose(once, twice, rtol=1e-5, atol=1e-6)


def test_the_students_dropout_is_on_in_training_and_off_in_inference(digits_config):
    config = _noisy(
        dataclasses.replace(
            digits_config, student=dataclasses.replace(digits_config.student, dropout=0.5)
        )
    )
    model = models.build_classifier(config.data, config.student, {}, "student")
    x = {
        name: tf.ones([4, *t.shape[1:]])
        for name, t in zip(model.input_names, model.inputs, strict=True)
    }
    assert not np.array_equal(model(x, training=True).numpy(), model(x, training=True).numpy())
    np.testing.assert_array_equal(
        model(x, training=False).numpy(), model(x, training=False).numpy()
    )
