"""A student from the user's module file: checks before training, and its export
with the teacher's serving signatures (real SavedModels, a real transform graph)."""

from __future__ import annotations

import dataclasses

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
import tf_keras as keras
from apache_beam.options.pipeline_options import PipelineOptions
from tensorflow_transform.tf_metadata import schema_utils

from components.config import ConfigError, PipelineConfig
from components.distillation import students as student_lib
from components.distillation import teachers as teachers_lib
from testkit.tfx_examples import signatures
from tests.components.distillation.keras_teachers import RAW_SPEC, save_teacher, serialized


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """Every model call here on the CPU: on a GPU host, TF32 matmuls in one of two
    compared calls would differ from the other by more than the tolerance."""
    with tf.device("/cpu:0"):
        yield


@pytest.fixture(scope="module")
def tft_output(tmp_path_factory):
    """A transform graph over raw `x` (4 floats) and `label`: `x_xf = x`, `label` kept."""
    out = str(tmp_path_factory.mktemp("transform"))

    def preprocessing_fn(inputs):
        return {"x_xf": tf.identity(inputs["x"]), "label": inputs["label"]}

    spec = {**RAW_SPEC, "label": tf.io.FixedLenFeature([], tf.int64)}
    metadata = tft.DatasetMetadata(schema_utils.schema_from_feature_spec(spec))
    rows = [{"x": [float(i)] * 4, "label": i % 3} for i in range(6)]
    with beam.Pipeline(options=PipelineOptions([])) as pipeline:
        with tft_beam.Context(temp_dir=out + "/tmp"):
            data = pipeline | beam.Create(rows)
            transform_fn = (data, metadata) | tft_beam.AnalyzeDataset(preprocessing_fn)
            _ = transform_fn | tft_beam.WriteTransformFn(out)
            # The raw metadata, as TFX's Transform writes it beside the graph.
            _ = metadata | "raw" >> tft_beam.WriteMetadata(out + "/metadata", pipeline)
    return tft.TFTransformOutput(out)


def _student(width=3, hidden=2, name="x_xf"):
    keras.utils.set_random_seed(1)
    inp = keras.Input((4,), name=name)
    return keras.Model(inp, keras.layers.Dense(width)(keras.layers.Dense(hidden)(inp)))


@pytest.mark.parametrize("activation", [None, "softmax"])
def test_the_student_serves_with_the_teachers_signatures_and_meaning(
    tmp_path, tft_output, activation
):
    teacher_dir, teacher = save_teacher(tmp_path / "t", activation=activation)
    info = teachers_lib.describe_teacher(teacher_dir, transformed_features=["x_xf", "label"])
    student = _student()
    student_lib.export_like_teacher(student, tft_output, info, str(tmp_path / "s"))
    assert signatures(str(tmp_path / "s")) == signatures(teacher_dir)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    examples = tf.constant(serialized(x))  # raw, no label: as serving sends them
    served = tf.saved_model.load(str(tmp_path / "s")).signatures["serving_default"](
        examples=examples
    )
    expected = student(x).numpy()
    if activation == "softmax":
        expected = tf.nn.softmax(expected).numpy()
        np.testing.assert_allclose(served["outputs"].numpy().sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(served["outputs"].numpy(), expected, rtol=1e-5)
    by_teacher = tf.saved_model.load(teacher_dir).signatures["serving_default"](examples=examples)
    assert by_teacher["outputs"].shape == served["outputs"].shape


def test_a_binary_student_trains_as_two_class_logits_and_exports_one_unit(tmp_path, tft_output):
    teacher_dir, _ = save_teacher(tmp_path / "t", width=1, activation="sigmoid")
    info = teachers_lib.describe_teacher(teacher_dir)
    student = _student(width=1)
    two = student_lib.class_logits_model(student, info.width)
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    z = student(x).numpy()
    np.testing.assert_allclose(two(x).numpy(), np.concatenate([np.zeros_like(z), z], -1), rtol=1e-6)
    assert two.trainable_weights == student.trainable_weights
    student_lib.export_like_teacher(student, tft_output, info, str(tmp_path / "s"))
    served = tf.saved_model.load(str(tmp_path / "s")).signatures["serving_default"](
        examples=tf.constant(serialized(x))
    )
    np.testing.assert_allclose(served["outputs"].numpy(), 1 / (1 + np.exp(-z)), rtol=1e-5)


def _config(**distillation) -> PipelineConfig:
    config = PipelineConfig()
    return dataclasses.replace(
        config, distillation=dataclasses.replace(config.distillation, **distillation)
    )


def test_a_student_of_another_width_is_refused_naming_module_file(tmp_path):
    info = teachers_lib.describe_teacher(save_teacher(tmp_path / "t")[0])
    with pytest.raises(
        ValueError,
        match=r"module_file: student_fn's model outputs 2 logits per example but teacher 0 .* outputs 3 \(3 classes\)",
    ):
        student_lib.check_student(_config(), _student(width=2), [info], ["x_xf"])


def test_a_teacher_the_student_cannot_serve_like_is_refused_naming_it(tmp_path):
    info = teachers_lib.describe_teacher(
        save_teacher(tmp_path / "t", extra_signature=True)[0],
        transformed_features=["x_xf", "label"],
    )
    with pytest.raises(
        ValueError,
        match=r"teacher_models: teacher 0 .* cannot be served by a student: it has a signature 'embed'",
    ):
        student_lib.check_student(_config(), _student(), [info], ["x_xf"])


def test_a_student_reading_unknown_features_is_refused(tmp_path):
    info = teachers_lib.describe_teacher(save_teacher(tmp_path / "t")[0])
    with pytest.raises(
        ValueError,
        match=r"module_file: student_fn's model reads \['pixels'\], which Transform does not write",
    ):
        student_lib.check_student(_config(), _student(name="pixels"), [info], ["x_xf"])


def test_a_student_not_smaller_than_its_teacher_is_refused_unless_allowed(tmp_path):
    info = teachers_lib.describe_teacher(save_teacher(tmp_path / "t")[0])
    big = _student(hidden=64)
    with pytest.raises(
        ValueError,
        match=r"student: the student has \d+ parameters, not fewer than the \d+ of teacher 0 .*require_compression: false",
    ):
        student_lib.check_student(_config(), big, [info], ["x_xf"])
    student_lib.check_student(_config(require_compression=False), big, [info], ["x_xf"])


def test_the_label_is_the_one_feature_the_teachers_do_not_read(tmp_path):
    info = teachers_lib.describe_teacher(save_teacher(tmp_path / "t")[0])
    assert student_lib.label_key(_config(), [info], ["x_xf", "label"]) == "label"
    with pytest.raises(
        ValueError, match=r"distillation\.label_key: cannot tell the label .*\['id', 'label'\]"
    ):
        student_lib.label_key(_config(), [info], ["x_xf", "label", "id"])
    assert student_lib.label_key(_config(label_key="id"), [info], ["x_xf", "label", "id"]) == "id"
    with pytest.raises(
        ValueError, match=r"distillation\.label_key: 'tips' is not a transformed feature"
    ):
        student_lib.label_key(_config(label_key="tips"), [info], ["x_xf", "label"])


def test_a_module_without_student_fn_or_returning_no_model_is_named(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def run_fn(fn_args):\n    pass\n\ndef student_fn(fn_args):\n    return 3\n")
    with pytest.raises(
        ConfigError, match=r"module_file: student_fn returned int, not a Keras model"
    ):
        student_lib.build(student_lib.load_student_fn({"module_file": str(module)}), None)
    module = tmp_path / "without.py"
    module.write_text("def run_fn(fn_args):\n    pass\n")
    with pytest.raises(ConfigError, match=r"module_file: cannot load student_fn from"):
        student_lib.load_student_fn({"module_file": str(module)})


STUDENT_AT_BUILD = """import tensorflow as tf


def student_fn(fn_args):
    inputs = {
        "x_xf": tf.keras.Input((fn_args.custom_config["width"],), name="x_xf"),
        "city_xf": tf.keras.Input((1,), name="city_xf", dtype=tf.string),
    }
    hidden = tf.keras.layers.Dense(4)(inputs["x_xf"])
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(hidden))
"""


def _build_args(**known):
    return student_lib.BuildFnArgs(train_steps=5, eval_steps=1, custom_config={"width": 2}, **known)


def test_a_logit_student_is_built_and_checked_from_what_the_build_knows(tmp_path):
    module = tmp_path / "student.py"
    module.write_text(STUDENT_AT_BUILD)
    fn_args = _build_args()
    assert student_lib.check_at_build(str(module), fn_args) is True
    assert fn_args.read_unknown == set()


def test_a_student_fn_returning_no_model_is_named_with_its_line_at_build(tmp_path):
    module = tmp_path / "student.py"
    module.write_text("\n\ndef student_fn(fn_args):\n    return 3\n")
    with pytest.raises(ConfigError) as e:
        student_lib.check_at_build(str(module), _build_args())
    assert str(e.value).startswith(
        f"{module}:3: module_file: student_fn returned int, not a Keras model"
    )


def test_a_student_fn_reading_the_run_is_not_judged_at_build(tmp_path):
    module = tmp_path / "student.py"
    module.write_text("def student_fn(fn_args):\n    return open(fn_args.schema_path).read()\n")
    fn_args = _build_args()
    assert student_lib.check_at_build(str(module), fn_args) is False
    assert fn_args.read_unknown == {"schema_path"}


def test_a_student_fn_importing_a_package_not_installed_here_is_left_to_the_run(tmp_path):
    """A package in the cluster's image only: the pipeline still compiles here."""
    module = tmp_path / "student.py"
    module.write_text("import tfxkit_only_on_the_cluster\n\ndef student_fn(fn_args):\n    pass\n")
    assert student_lib.check_at_build(str(module), _build_args()) is False


def test_a_student_module_that_does_not_import_is_refused_at_build(tmp_path):
    module = tmp_path / "student.py"
    module.write_text("def student_fn(fn_args):\n    return (\n")
    with pytest.raises(ConfigError, match=r"module_file: cannot load student_fn from"):
        student_lib.check_at_build(str(module), _build_args())


def test_a_student_module_finding_a_helper_beside_it_by_its_file_is_built(tmp_path):
    """`__file__` is set at build as where the Distiller runs (a module importing its neighbour)."""
    (tmp_path / "helper_beside.py").write_text(STUDENT_AT_BUILD)
    module = tmp_path / "student.py"
    module.write_text(
        "import os\nimport sys\n\nsys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))\n"
        "from helper_beside import student_fn  # noqa: E402\n"
    )
    assert student_lib.check_at_build(str(module), _build_args()) is True
