"""Teachers of any Trainer: reading their output, calling them, checking them.

Real SavedModels, saved as a user's run_fn saves them; soft targets checked
against hand-computed ones on a tiny batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.distillation import losses
from components.distillation import teachers as teachers_lib
from tests.components.distillation.keras_teachers import features, save_teacher

T = 2.0


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """Every model call here on the CPU: on a GPU host, TF32 matmuls in one of two
    compared calls would differ from the other by more than the tolerance."""
    with tf.device("/cpu:0"):
        yield


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _targets(path, info):
    teacher = teachers_lib.ExportedTeacher(path, info)
    logits = teacher(features())
    return losses.soft_targets([logits], T).numpy()


def test_a_logits_teacher_distils_its_softened_logits(tmp_path):
    path, model = save_teacher(tmp_path / "t")
    info = teachers_lib.describe_teacher(path, transformed_features=["x_xf", "label"])
    assert (info.kind, info.output, info.width, info.num_classes) == ("keras", "logits", 3, 3)
    assert info.output_keys == ("outputs",) and info.parse_keys == ("x",)
    z = model(features()).numpy()
    np.testing.assert_allclose(_targets(path, info), _softmax(z / T), rtol=1e-5)


def test_a_feature_no_cast_turns_into_the_teachers_input_is_refused_naming_it(tmp_path):
    """A string where the teacher takes floats (a column SchemaGen typed as a string)."""
    path, _ = save_teacher(tmp_path / "t")
    teacher = teachers_lib.ExportedTeacher(path, teachers_lib.describe_teacher(path))
    strings = {"x_xf": np.full((6, 4), b"", dtype=object)}
    with pytest.raises(
        ValueError,
        match=r"^distillation: the teacher's input 'x_xf' takes float32 but the Transform output "
        r"holds it as string, which no cast",
    ):
        teacher.outputs_of(strings)
    # A string of one rank less is refused too (after the rank is conformed).
    with pytest.raises(ValueError, match=r"takes float32 but .* holds it as string"):
        teachers_lib.conform(
            {"f": np.array([b"", b""], dtype=object)}, tf.TensorSpec([None, 1], tf.float32, "f")
        )
    # Numbers where the input takes strings: no SchemaGen hint, which is about strings.
    with pytest.raises(ValueError, match=r"takes string but .* holds it as float32, .* reads$"):
        teachers_lib.conform(features(), tf.TensorSpec([None, 4], tf.string, "x_xf"))
    # A numeric dtype is cast, as Keras's fit casts it.
    as_float64 = {"x_xf": features()["x_xf"].astype(np.float64)}
    np.testing.assert_allclose(
        teacher.outputs_of(as_float64).numpy(), teacher.outputs_of(features()).numpy(), rtol=1e-6
    )


def test_a_softmax_teacher_is_read_as_probabilities(tmp_path):
    path, model = save_teacher(tmp_path / "t", activation="softmax")
    info = teachers_lib.describe_teacher(path)
    assert info.output == "probabilities"
    p = model(features()).numpy()
    # softmax(log p / T) = p^(1/T) / sum p^(1/T)
    expected = p ** (1 / T) / (p ** (1 / T)).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(_targets(path, info), expected, rtol=1e-5)


def test_a_single_logit_teacher_is_a_binary_teacher(tmp_path):
    path, model = save_teacher(tmp_path / "t", width=1)
    info = teachers_lib.describe_teacher(path)
    assert (info.output, info.width, info.num_classes) == ("logits", 1, 2)
    z = model(features()).numpy()[:, 0]
    expected = np.stack([1 - _sigmoid(z / T), _sigmoid(z / T)], axis=-1)
    np.testing.assert_allclose(_targets(path, info), expected, rtol=1e-5)


def test_a_single_sigmoid_teacher_is_a_binary_teacher_of_probabilities(tmp_path):
    path, model = save_teacher(tmp_path / "t", width=1, activation="sigmoid")
    info = teachers_lib.describe_teacher(path)
    assert (info.output, info.width, info.num_classes) == ("probabilities", 1, 2)
    p = model(features()).numpy()[:, 0]
    z = np.log(p) - np.log1p(-p)
    expected = np.stack([1 - _sigmoid(z / T), _sigmoid(z / T)], axis=-1)
    np.testing.assert_allclose(_targets(path, info), expected, rtol=1e-4)


@pytest.mark.parametrize(
    "activation, setting, match",
    [
        (
            "softmax",
            "logits",
            r"distillation\.teacher_output: teacher 0 .* read as giving logits.*sums to 1.*probabilities",
        ),
        (
            None,
            "probabilities",
            r"distillation\.teacher_output: teacher 0 .* read as giving probabilities.*set distillation\.teacher_output: logits",
        ),
    ],
)
def test_the_setting_overrides_the_reading_and_the_first_batch_checks_it(
    tmp_path, activation, setting, match
):
    path, _ = save_teacher(tmp_path / "t", activation=activation)
    info = teachers_lib.describe_teacher(path, teacher_output=setting)
    assert info.output == setting
    outputs = teachers_lib.ExportedTeacher(path, info).outputs_of(features()).numpy()
    with pytest.raises(ValueError, match=match):
        teachers_lib.check_outputs(info, outputs, 0)


def test_labels_outside_the_teachers_classes_are_refused():
    info = teachers_lib.TeacherInfo(
        export_dir="/t",
        kind="keras",
        input_specs={},
        output_keys=("outputs",),
        num_classes=3,
        width=3,
        output="logits",
        num_params=1,
    )
    teachers_lib.check_labels(info, np.array([[0], [2], [-1]]))  # -1: unlabeled
    with pytest.raises(
        ValueError,
        match=r"distillation\.label_key: the first batch has label 3, outside the 3 classes",
    ):
        teachers_lib.check_labels(info, np.array([[0], [3]]))


def test_a_teacher_without_serving_default_is_refused_naming_the_fix(tmp_path):
    import tensorflow as tf

    module = tf.Module()
    module.v = tf.Variable(1.0)
    tf.saved_model.save(module, str(tmp_path / "m"))
    with pytest.raises(ValueError, match=r"has no 'serving_default' signature"):
        teachers_lib.describe_teacher(str(tmp_path / "m"))


def test_a_signature_the_student_cannot_serve_is_recorded(tmp_path):
    """Refused on the student_fn path (see test_student); the teacher itself still teaches."""
    path, _ = save_teacher(tmp_path / "t", extra_signature=True)
    info = teachers_lib.describe_teacher(path, transformed_features=["x_xf", "label"])
    assert (
        "signature 'embed' that is neither 'serving_default' nor a transform"
        in info.serving_problem
    )
    assert not teachers_lib.describe_teacher(save_teacher(tmp_path / "u")[0]).serving_problem


def test_teachers_that_disagree_are_refused_naming_teacher_models(tmp_path):
    a = teachers_lib.describe_teacher(save_teacher(tmp_path / "a", width=3)[0])
    b = teachers_lib.describe_teacher(save_teacher(tmp_path / "b", width=5)[0])
    with pytest.raises(
        ValueError, match=r"teacher_models: teacher 0 .* and teacher 1 .* disagree on their classes"
    ):
        teachers_lib.check_agreement([a, b])
    with pytest.raises(ValueError, match=r"distillation\.teacher_weights: 3 weights for 1 teacher"):
        teachers_lib.check_agreement([a], (1.0, 1.0, 1.0))
