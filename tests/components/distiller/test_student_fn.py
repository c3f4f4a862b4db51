"""The Distiller's run_fn on a user's `student_fn`, in this process with tiny step counts:
students that output probabilities are refused before training, a raising student_fn is
named, the teacher-target cache reports itself, and a run with a scratch baseline
records its verdict beside the model."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
from absl import logging as absl_logging
from tfx.components.trainer.fn_args_utils import FnArgs

from components.compat.user_code import UserCodeError
from components.config import ConfigError, module_config_from_dict, payload
from components.distillation.verdict import VERDICT_FILE
from components.distiller import run_fn as distiller_run_fn
from tests.components.distiller.test_student_strategies import STUDENT_MODULE, _save_teacher
from tests.components.training import penguins

# The logit student of `test_student_strategies`, with its last layer swapped in by the case.
LOGITS_LAYER = "tf.keras.layers.Dense(3)(hidden)"
TRAIN_STEPS = 6


@pytest.fixture(scope="module")
def setup(tmp_path_factory, penguin_inputs):
    """Penguin Transform output, a Keras teacher on its float features, and the features."""
    root, data = str(tmp_path_factory.mktemp("student_fn")), penguin_inputs
    tft_output = tft.TFTransformOutput(data.transform_output)
    features = sorted(
        k for k, s in tft_output.transformed_feature_spec().items() if s.dtype == tf.float32
    )
    teacher = os.path.join(root, "teacher")
    _save_teacher(teacher, tft_output, features)
    return data, teacher, features


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def absl_info():
    """The messages logged through absl at INFO and above while the test runs.

    INFO is set as absl's verbosity flag, as the product's console does
    (`pipelines.progress`): writing a SavedModel resets absl's logger to the
    flag's level.
    """
    logger, seen = logging.getLogger("absl"), _Lines()
    previous = absl_logging.get_verbosity()
    logger.addHandler(seen)
    absl_logging.set_verbosity(absl_logging.INFO)
    try:
        yield seen.lines
    finally:
        logger.removeHandler(seen)
        absl_logging.set_verbosity(previous)


def _distil(setup, tmp_path, last_layer=LOGITS_LAYER, module_source=None, **distillation):
    """Runs the Distiller's run_fn on a student module; returns its serving directory."""
    data, teacher, features = setup
    source = module_source or STUDENT_MODULE.format(features=features).replace(
        LOGITS_LAYER, last_layer
    )
    module = tmp_path / "student_module.py"
    module.write_text(source)
    config = module_config_from_dict(
        {
            "strategy": {"kind": "one_device"},
            "ingestion": {"batch_size": 32, "eval_batch_size": 32, "shuffle_buffer": 0},
            "train": {"train_steps": TRAIN_STEPS, "eval_steps": 2},
            "distillation": {"label_key": penguins.LABEL, **distillation},
        }
    )
    custom_config = payload.encode(None, config=config)
    custom_config[payload.TEACHER_DIRS_KEY] = [teacher]
    custom_config[payload.STUDENT_MODULE_KEY] = {"module_file": str(module)}
    inputs = penguins.inputs_for(data, str(tmp_path), "run", config)
    distiller_run_fn.run_fn(FnArgs(**inputs, custom_config=custom_config))
    return inputs["serving_model_dir"]


@pytest.mark.parametrize(
    "last_layer, found",
    [
        ('tf.keras.layers.Dense(3, activation="softmax")(hidden)', "final softmax / sigmoid"),
        ('tf.keras.layers.Dense(3, activation="sigmoid")(hidden)', "final softmax / sigmoid"),
        (
            "tf.keras.layers.Softmax()(tf.keras.layers.Dense(3)(hidden))",
            "final softmax / sigmoid",
        ),
    ],
)
def test_a_student_that_outputs_probabilities_is_refused_before_training(
    setup, tmp_path, last_layer, found
):
    with pytest.raises(ValueError, match=r"^module_file: student_fn of .*student_module\.py") as e:
        _distil(setup, tmp_path, last_layer)
    assert found in str(e.value)
    assert "drop the final activation" in str(e.value)
    assert not os.path.exists(tmp_path / "run" / "serving_model_dir")


def test_a_student_whose_rows_sum_to_one_is_refused_by_its_values(setup, tmp_path):
    # Normalised by hand, with no softmax op for the graph reading to find.
    last = "tf.keras.layers.Lambda(lambda z: z / tf.reduce_sum(z, -1, keepdims=True))(tf.keras.layers.Dense(3, activation='relu', bias_initializer='ones')(hidden))"
    with pytest.raises(ValueError, match=r"every row of its output lies in \[0, 1\] and sums to 1"):
        _distil(setup, tmp_path, last)
    assert not os.path.exists(tmp_path / "run" / "serving_model_dir")


def test_an_exception_from_student_fn_names_the_function_and_module_and_keeps_the_cause(
    setup, tmp_path
):
    source = "def student_fn(fn_args):\n    raise KeyError('no such feature: beak')\n"
    with pytest.raises(UserCodeError) as e:
        _distil(setup, tmp_path, module_source=source)
    assert str(e.value).startswith("student_fn of module_file '")
    assert "student_module.py' raised KeyError: 'no such feature: beak'" in str(e.value)
    assert isinstance(e.value.__cause__, KeyError)


def test_the_teacher_target_cache_says_it_was_built_and_what_it_holds(setup, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    _distil(setup, tmp_path, cache_teacher_logits=True)
    lines = [
        r.getMessage() for r in caplog.records if "teacher-target cache built" in r.getMessage()
    ]
    assert len(lines) == 1
    # 6 training steps of 32 of the 270 training rows (192 distinct examples) and
    # 2 evaluation batches of 32 of the 64 eval rows: 256 targets.
    assert "it holds 256 targets" in lines[0]


def test_a_student_fn_run_with_a_scratch_baseline_records_its_verdict(setup, tmp_path, absl_info):
    serving_dir = _distil(setup, tmp_path, scratch_baseline=True)
    assert tf.io.gfile.exists(serving_dir)
    with open(os.path.join(os.path.dirname(serving_dir), VERDICT_FILE)) as f:
        verdict = json.load(f)
    assert set(verdict) >= {"teacher_acc", "student_acc", "scratch_acc", "improved", "message"}
    for key in ("teacher_acc", "student_acc", "scratch_acc"):
        assert 0.0 <= verdict[key] <= 1.0
    assert verdict["improved"] == (verdict["student_acc"] > verdict["scratch_acc"])
    assert f"{verdict['student_acc']:.4f}" in verdict["message"]
    assert f"Distiller: {verdict['message']}" in absl_info
    # The backup of the run alone is gone with the distilled run's.
    left = [str(p) for p in (tmp_path / "run").rglob("*") if "backup" in p.name]
    assert left == []


def test_without_a_scratch_baseline_no_verdict_file_is_written(setup, tmp_path):
    serving_dir = _distil(setup, tmp_path)
    assert tf.io.gfile.exists(serving_dir)
    assert not os.path.exists(os.path.join(os.path.dirname(serving_dir), VERDICT_FILE))


def test_the_executor_copies_the_verdict_into_the_model_artifacts_properties(tmp_path):
    from tfx.types import standard_artifacts

    from components.distiller.executor import record_verdict

    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    os.makedirs(model.uri)
    verdict = {
        "teacher_acc": 0.9,
        "student_acc": 0.85,
        "scratch_acc": 0.8,
        "improved": True,
        "message": "The distilled student beat the same student trained alone by +0.0500",
    }
    with open(os.path.join(model.uri, VERDICT_FILE), "w") as f:
        json.dump(verdict, f)
    untouched = standard_artifacts.Model()
    untouched.uri = str(tmp_path / "other")
    os.makedirs(untouched.uri)
    record_verdict({"model": [model, untouched]})
    assert model.get_string_custom_property("distillation_verdict") == verdict["message"]
    assert model.get_float_custom_property("student_acc") == 0.85
    assert model.get_float_custom_property("scratch_acc") == 0.8
    assert model.get_float_custom_property("teacher_acc") == 0.9
    assert not untouched.has_custom_property("distillation_verdict")


KERAS3_MODULE = """
import json
import keras
import tensorflow as tf

FEATURES = {features!r}


def student_fn(fn_args):
    with open({record!r}, "w") as f:
        json.dump({{"keras": keras.Model.__module__, "tf.keras": tf.keras.Model.__module__}}, f)
    keras.utils.set_random_seed(0)
    inputs = {{f: keras.Input(shape=(1,), name=f) for f in FEATURES}}
    hidden = keras.layers.Dense(4, activation="relu")(keras.layers.Concatenate()(list(inputs.values())))
    hidden = keras.layers.BatchNormalization()(hidden)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))
"""


def test_a_keras3_student_fn_trains_and_serves_and_its_module_keeps_the_process_keras(
    setup, tmp_path
):
    """Written as TFX 1.21's modules are (`import keras`): trained, exported, and its
    `tf.keras` is what the process gives (the Distiller changes no module's Keras)."""
    from components.compat import legacy_keras

    _, teacher, features = setup
    record = tmp_path / "keras_seen.json"
    serving_dir = _distil(
        setup,
        tmp_path,
        module_source=KERAS3_MODULE.format(features=features, record=str(record)),
        scratch_baseline=True,
    )
    seen = json.loads(record.read_text())
    assert seen["keras"].startswith("keras.")
    assert seen["tf.keras"].split(".")[0] == legacy_keras.tf_keras_module().__name__
    served = tf.saved_model.load(serving_dir).signatures["serving_default"]
    stock = tf.saved_model.load(teacher).signatures["serving_default"]
    assert set(served.structured_outputs) == set(stock.structured_outputs)
    examples = tf.constant(penguins.raw_examples(penguins.read_rows()[:16]))
    logits = served(examples=examples)["outputs"].numpy()
    assert logits.shape == (16, 3) and np.all(np.isfinite(logits))
    # Trained and judged against the same Keras 3 network trained alone.
    with open(os.path.join(os.path.dirname(serving_dir), VERDICT_FILE)) as f:
        verdict = json.load(f)
    assert 0.0 <= verdict["student_acc"] <= 1.0 and 0.0 <= verdict["scratch_acc"] <= 1.0


def test_a_student_module_mixing_both_kerases_is_refused_naming_both(setup, tmp_path):
    source = (
        "import keras\nimport tf_keras\n\n"
        "def student_fn(fn_args):\n    return tf_keras.Sequential([keras.layers.Dense(3)])\n"
    )
    with pytest.raises(
        ConfigError, match=r"mixes two Kerases: tf_keras is tf_keras .* keras is Keras 3"
    ):
        _distil(setup, tmp_path, module_source=source)
    assert not os.path.exists(tmp_path / "run" / "serving_model_dir")
