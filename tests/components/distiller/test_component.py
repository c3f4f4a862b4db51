"""The Distiller component: construction, teacher checks before training, and
its output on a real tiny pipeline run (`digits_distillation_run`)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
from tfx.proto import trainer_pb2
from tfx.types import standard_artifacts

from components.config import MAX_TEACHERS, ConfigError, PipelineConfig
from components.config.payload import CONFIG_KEY
from components.distillation import model as distillation
from components.distillation import teachers as teachers_lib
from components.distiller.component import Distiller, teacher_key
from components.distiller.executor import teacher_model_dirs
from components.distiller.run_fn import train_student
from components.training import fit as training
from components.training import models
from components.training import task as task_lib
from components.training.export import TRANSFORMED_LOGITS_SIGNATURE
from tests.components.distiller.user_runs import channels as _channels
from tests.components.distiller.user_runs import raw_digits_examples

# --------------------------------------------------------------------------- #
# Construction
# --------------------------------------------------------------------------- #


def test_component_has_one_model_input_per_teacher(digits_config):
    examples, graph, teachers = _channels(3)
    component = Distiller(
        config=digits_config, examples=examples, transform_graph=graph, teacher_models=teachers
    )
    assert {k for k in component.inputs if k.startswith("teacher_model_")} == {
        teacher_key(i) for i in range(3)
    }
    for i, teacher in enumerate(teachers):
        assert component.inputs[teacher_key(i)] is teacher
    assert set(component.outputs) == {"model", "model_run"}
    assert CONFIG_KEY in component.exec_properties["custom_config"]
    assert component.exec_properties["run_fn"] == "components.distiller.run_fn.run_fn"


def test_student_trains_for_its_own_step_count(digits_config):
    """A patient student: `distillation.student_train_steps` become the Distiller's train_args."""
    examples, graph, teachers = _channels(1)
    steps = {}
    for student_steps in (0, 3 * digits_config.train.train_steps):
        config = dataclasses.replace(
            digits_config,
            distillation=dataclasses.replace(
                digits_config.distillation, student_train_steps=student_steps
            ),
        )
        component = Distiller(
            config=config, examples=examples, transform_graph=graph, teacher_models=teachers
        )
        train_args = json.loads(component.exec_properties["train_args"])
        steps[student_steps] = train_args["num_steps"]
    assert steps == {
        0: digits_config.train.train_steps,
        3 * digits_config.train.train_steps: 3 * digits_config.train.train_steps,
    }


def test_component_without_teacher_fails_at_build_time(digits_config):
    examples, graph, _ = _channels(0)
    with pytest.raises(ValueError, match=r"distillation: no teacher model was given"):
        Distiller(config=digits_config, examples=examples, transform_graph=graph, teacher_models=[])


def test_component_with_too_many_teachers_fails_at_build_time(digits_config):
    examples, graph, teachers = _channels(MAX_TEACHERS + 1)
    with pytest.raises(
        ValueError, match=rf"distillation\.num_teachers: at most {MAX_TEACHERS} teachers"
    ):
        Distiller(
            config=digits_config, examples=examples, transform_graph=graph, teacher_models=teachers
        )


# A logit student: the Distiller builds it once at construction.
STUDENT_MODULE = (
    "import tensorflow as tf\n\n\ndef student_fn(fn_args):\n"
    "    inputs = tf.keras.Input((2,), name='x_xf')\n"
    "    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(inputs))\n"
)


def test_a_student_fn_module_needs_no_config_and_travels_as_a_module_file(tmp_path):
    module = tmp_path / "student.py"
    module.write_text(STUDENT_MODULE)
    examples, graph, teachers = _channels(2)
    component = Distiller(
        examples=examples,
        transform_graph=graph,
        teacher_models=teachers,
        module_file=str(module),
        train_args=trainer_pb2.TrainArgs(num_steps=7),
    )
    props = component.exec_properties
    assert props["module_file"] == str(module)
    assert props["run_fn"] == "components.distiller.run_fn.run_fn"
    assert json.loads(props["train_args"])["num_steps"] == 7
    assert json.loads(props["custom_config"])[CONFIG_KEY]
    # Packaged as TFX packages a Trainer's module file.
    assert component._pip_dependencies


@pytest.mark.parametrize(
    "source, config, match",
    [
        (
            "def run_fn(fn_args):\n    pass\n",
            None,
            r"module_file: module_file .* defines no top-level 'student_fn'",
        ),
        (
            STUDENT_MODULE,
            {"train": {"augmentation": {"translate": 2}}},
            r"train\.augmentation: a student_fn student",
        ),
        (
            STUDENT_MODULE,
            {"distillation": {"teacher_output": "scores"}},
            r"config\.distillation\.teacher_output",
        ),
        (
            STUDENT_MODULE,
            3,
            r"config: expected a PipelineConfig, a mapping of its sections or None, got int",
        ),
    ],
)
def test_a_student_fn_distiller_refuses_bad_arguments_at_construction(
    tmp_path, source, config, match
):
    module = tmp_path / "student.py"
    module.write_text(source)
    examples, graph, teachers = _channels(1)
    with pytest.raises(ConfigError, match=match):
        Distiller(
            config=config,
            examples=examples,
            transform_graph=graph,
            teacher_models=teachers,
            module_file=str(module),
        )


def _penguin_pipeline(root: str):
    """TFX's penguin example as its pipeline file builds it, under `root` (nothing run)."""
    from testkit import tfx_examples

    example = tfx_examples.PENGUIN
    module = tfx_examples.load_pipeline(example, os.path.join(root, "code"), swapped=False)
    data_root = tfx_examples.penguin_data_root(root)
    return tfx_examples.create_pipeline(example, module, root, data_root, beam_pipeline_args=())


def test_a_softmax_student_fn_is_refused_when_the_pipeline_is_built(tmp_path):
    from testkit import tfx_examples

    # The example's own small student with a final softmax, as a user may write it.
    with open(tfx_examples.PENGUIN.student_module) as f:
        source = f.read()
    old = "tf.keras.layers.Dense(3)(hidden)"
    assert source.count(old) == 1
    module = tmp_path / "penguin_student.py"
    module.write_text(source.replace(old, "tf.keras.layers.Dense(3, activation='softmax')(hidden)"))
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "def student_fn" in text)
    example = dataclasses.replace(tfx_examples.PENGUIN, student_module=str(module))
    pipeline = _penguin_pipeline(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        tfx_examples.add_distillation(example, pipeline, str(tmp_path), train_steps=5)
    assert str(e.value).startswith(
        f"module_file: student_fn of '{module}:{line}' returns probabilities, not logits: its "
        "output comes from a final softmax / sigmoid activation."
    )
    assert "drop the final activation" in str(e.value)
    assert "apache_beam" not in str(e.value) and ".whl" not in str(e.value)
    # Refused while the pipeline was built: no component ran, none wrote anything.
    assert not (tmp_path / "pipeline_root").exists() and not (tmp_path / "metadata.db").exists()


def test_a_student_fn_that_raises_is_refused_at_construction_naming_its_line(tmp_path):
    from components.compat.user_code import UserCodeError

    module = tmp_path / "student.py"
    module.write_text("def student_fn(fn_args):\n    return fn_args.custom_config['width']\n")
    examples, graph, teachers = _channels(1)
    with pytest.raises(UserCodeError) as e:
        Distiller(
            examples=examples,
            transform_graph=graph,
            teacher_models=teachers,
            module_file=str(module),
        )
    assert str(e.value).startswith(
        f"{module}:1: student_fn of module_file '{module}' raised KeyError: 'width' "
        f"(at {module}:2), built at pipeline build"
    )
    assert isinstance(e.value.__cause__, KeyError)


def test_a_student_fn_reading_transform_output_is_left_to_the_distiller_run(tmp_path):
    module = tmp_path / "student.py"
    module.write_text(
        "import tensorflow_transform as tft\n\n\ndef student_fn(fn_args):\n"
        "    return tft.TFTransformOutput(fn_args.transform_output).transformed_feature_spec()\n"
    )
    examples, graph, teachers = _channels(1)
    # Built where the Distiller runs, on Transform's output: build, check_student and
    # check_logits refuse it there (test_student_fn).
    Distiller(
        examples=examples, transform_graph=graph, teacher_models=teachers, module_file=str(module)
    )


def test_without_module_file_a_config_with_data_is_needed():
    examples, graph, teachers = _channels(1)
    with pytest.raises(
        ConfigError,
        match=r"config: without module_file the Distiller trains the configured student",
    ):
        Distiller(examples=examples, transform_graph=graph, teacher_models=teachers)


def test_executor_passes_teacher_dirs_in_input_order():
    def model(uri):
        artifact = standard_artifacts.Model()
        artifact.uri = uri
        return artifact

    input_dict = {
        "examples": [standard_artifacts.Examples()],
        teacher_key(10): [model("/m/ten")],
        teacher_key(2): [model("/m/two")],
        teacher_key(0): [model("/m/zero")],
        teacher_key(3): [],
    }
    assert teacher_model_dirs(input_dict) == [
        "/m/zero/Format-Serving",
        "/m/two/Format-Serving",
        "/m/ten/Format-Serving",
    ]


# --------------------------------------------------------------------------- #
# Teacher checks, before any training (real SavedModels, no pipeline)
# --------------------------------------------------------------------------- #

PIXELS = 64


def _save_teacher(
    path,
    num_classes=10,
    hidden=64,
    output_keys=("probabilities", "logits", "classes"),
    width=PIXELS,
    logits_signature=True,
):
    """A SavedModel with the tfxkit serving signatures over the digits features."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((width,), name="pixels_xf")
    logits = keras.layers.Dense(num_classes)(keras.layers.Dense(hidden, activation="relu")(inp))
    model = keras.Model({"pixels_xf": inp}, logits)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        parsed = tf.io.parse_example(
            examples, {"pixels": tf.io.FixedLenFeature([width], tf.float32)}
        )
        z = model({"pixels_xf": parsed["pixels"]})
        outputs = {"probabilities": tf.nn.softmax(z), "logits": z, "classes": tf.argmax(z, axis=-1)}
        return {k: outputs.get(k, z) for k in output_keys}

    @tf.function(
        input_signature=[{"pixels_xf": tf.TensorSpec([None, width], tf.float32, name="pixels_xf")}]
    )
    def transformed_logits(features):
        return {"logits": model(features)}

    signatures = {"serving_default": serve.get_concrete_function()}
    if logits_signature:
        signatures[TRANSFORMED_LOGITS_SIGNATURE] = transformed_logits.get_concrete_function()
    model.save(path, save_format="tf", signatures=signatures)
    return str(path), model


def _inputs(tmp_path) -> training.TrainingInputs:
    """Paths where nothing exists: training would fail reading them, so an
    error about the teachers proves the check ran first."""
    return training.TrainingInputs(
        train_files=(str(tmp_path / "no_data" / "train*"),),
        eval_files=(str(tmp_path / "no_data" / "eval*"),),
        transform_output=str(tmp_path / "no_transform_graph"),
        serving_model_dir=str(tmp_path / "serving"),
        model_run_dir=str(tmp_path / "run"),
        train_steps=5,
        eval_steps=1,
    )


def _distilling(config: PipelineConfig, **changes) -> PipelineConfig:
    return dataclasses.replace(
        config, distillation=dataclasses.replace(config.distillation, enabled=True, **changes)
    )


def _fails_before_training(config, tmp_path, teacher_dirs, match):
    with pytest.raises(ValueError, match=match):
        train_student(task_lib.start_for(config, "Distiller"), _inputs(tmp_path), teacher_dirs)
    assert not (tmp_path / "run").exists() and not (tmp_path / "serving").exists()


def test_no_teacher_fails_before_training(tmp_path, digits_config):
    _fails_before_training(
        _distilling(digits_config), tmp_path, [], r"distillation: no teacher model was given"
    )


def test_teacher_with_other_number_of_classes_fails_before_training(tmp_path, digits_config):
    path, _ = _save_teacher(tmp_path / "t", num_classes=3)
    _fails_before_training(
        _distilling(digits_config),
        tmp_path,
        [path],
        r"data\.label\.num_classes: teacher 0 .* predicts 3 classes but the student's task has 10",
    )


def test_teacher_with_other_output_keys_fails_before_training(tmp_path, digits_config):
    path, _ = _save_teacher(tmp_path / "t", output_keys=("scores",))
    _fails_before_training(
        _distilling(digits_config),
        tmp_path,
        [path],
        r"teacher 0 .* serves outputs \['scores'\] but the student serves",
    )


def test_teacher_on_other_features_fails_before_training(tmp_path, digits_config):
    path, _ = _save_teacher(tmp_path / "t", width=32)
    _fails_before_training(
        _distilling(digits_config),
        tmp_path,
        [path],
        r"data\.features: teacher 0 .* reads transformed features \{pixels_xf: \[32\]",
    )


def test_student_larger_than_teacher_fails_before_training(tmp_path, digits_config):
    path, _ = _save_teacher(tmp_path / "t", hidden=2)
    _fails_before_training(
        _distilling(digits_config),
        tmp_path,
        [path],
        r"student: the student has \d+ parameters, not fewer than the 160 of teacher 0 .*require_compression",
    )


def test_student_larger_than_teacher_is_allowed_without_compression(tmp_path, digits_config):
    path, _ = _save_teacher(tmp_path / "t", hidden=2)
    # Past the teacher checks, training stops at the (missing) Transform output instead.
    with pytest.raises(
        (OSError, ValueError), match=r"does not exist|no transformed example files"
    ) as raised:
        train_student(
            task_lib.start_for(_distilling(digits_config, require_compression=False), "Distiller"),
            _inputs(tmp_path),
            [path],
        )
    assert "require_compression" not in str(raised.value)


def test_teacher_of_another_trainer_needs_a_student_fn(tmp_path, digits_config):
    """A Keras teacher without tfxkit's export: the configured student cannot serve like it."""
    path, _ = _save_teacher(tmp_path / "t", logits_signature=False)
    _fails_before_training(
        _distilling(digits_config),
        tmp_path,
        [path],
        r"teacher 0 .* was not exported by the tfxkit Trainer.*module_file with student_fn",
    )


def test_missing_teacher_dir_fails_before_training(tmp_path, digits_config):
    _fails_before_training(
        _distilling(digits_config),
        tmp_path,
        [str(tmp_path / "nope")],
        r"teacher model directory .*nope' does not exist",
    )


def test_teacher_weights_must_match_teacher_count(tmp_path, digits_config):
    path, _ = _save_teacher(tmp_path / "t")
    config = _distilling(digits_config, num_teachers=2, teacher_weights=(1.0, 1.0))
    _fails_before_training(
        config, tmp_path, [path], r"distillation\.teacher_weights: 2 weights for 1 teacher models"
    )


def test_exported_teacher_returns_the_models_logits(tmp_path):
    path, model = _save_teacher(tmp_path / "t")
    teacher = teachers_lib.ExportedTeacher(path)
    x = {"pixels_xf": np.random.default_rng(0).normal(size=(5, PIXELS)).astype(np.float32)}
    np.testing.assert_allclose(teacher(x).numpy(), model(x).numpy(), rtol=1e-6)
    info = teachers_lib.describe_teacher(path)
    assert info.num_classes == 10 and info.num_params == distillation.count_params(
        model.trainable_weights
    )
    assert not teacher.trainable_weights


# --------------------------------------------------------------------------- #
# On a real tiny pipeline run
# --------------------------------------------------------------------------- #


def _model_dirs(output):
    """Serving dirs of the run's models, by producing node."""
    from pipelines.report import find_models

    found, _ = find_models(os.path.join(output, "metadata.sqlite"), "digits")
    return {node: d for _, node, d in found}


@pytest.mark.e2e
def test_student_artifact_serves_like_its_teachers(digits_distillation_run):
    output, config, _ = digits_distillation_run
    dirs = _model_dirs(output)
    assert set(dirs) == {"Trainer", "Trainer_1", "Distiller"}
    assert tf.io.gfile.exists(os.path.join(dirs["Distiller"], "saved_model.pb"))
    student = tf.saved_model.load(dirs["Distiller"])
    for node in ("Trainer", "Trainer_1"):
        teacher = tf.saved_model.load(dirs[node])
        assert set(student.signatures) == set(teacher.signatures)
        for name, fn in teacher.signatures.items():
            assert (
                student.signatures[name].structured_input_signature == fn.structured_input_signature
            ), name
            assert student.signatures[name].structured_outputs == fn.structured_outputs, name
    # Raw serialized tf.Examples in (no label), as serving sends them.
    examples = raw_digits_examples(output, config.data.label.name, 8)
    outputs = student.signatures["serving_default"](examples=examples)
    assert outputs["probabilities"].shape == (8, 10)
    np.testing.assert_allclose(outputs["probabilities"].numpy().sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.e2e
def test_student_has_the_configured_student_shape(digits_distillation_run):
    output, config, _ = digits_distillation_run
    dirs = _model_dirs(output)
    expected = models.build_classifier(config.data, config.student, {}, "student")
    got = distillation.count_params(tf.saved_model.load(dirs["Distiller"]).trainable_variables)
    assert got == distillation.count_params(expected.trainable_weights)
    teacher_params = distillation.count_params(
        tf.saved_model.load(dirs["Trainer"]).trainable_variables
    )
    assert got * 10 <= teacher_params
