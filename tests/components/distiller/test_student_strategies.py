"""A student_fn student under a strategy: mirrored over two logical CPUs trains
the same weights as one device (each in a fresh process)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras

from components.config import module_config_from_dict
from tests.components.training import penguins
from tests.components.training.test_fit import kill_all, start_worker, wait_all

STUDENT_MODULE = """
import tensorflow as tf

FEATURES = {features!r}


def student_fn(fn_args):
    tf.keras.utils.set_random_seed(0)
    inputs = {{f: tf.keras.layers.Input(shape=(1,), name=f) for f in FEATURES}}
    hidden = tf.keras.layers.Dense(4, activation="relu")(tf.keras.layers.concatenate(list(inputs.values())))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(hidden))
"""


def _save_teacher(path: str, tft_output, features) -> None:
    """A Keras teacher on the float features, saved as a user's run_fn saves it."""
    keras.utils.set_random_seed(0)
    inputs = {f: keras.Input((1,), name=f) for f in features}
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.concatenate(list(inputs.values()))
    )
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.tft_layer = tft_output.transform_features_layer()
    raw = tft_output.raw_feature_spec()
    raw.pop(penguins.LABEL)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        transformed = model.tft_layer(tf.io.parse_example(examples, raw))
        return {"outputs": model({f: transformed[f] for f in features})}

    model.save(path, save_format="tf", signatures={"serving_default": serve})


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, penguin_inputs):
    """The same student_fn distilled on one device and mirrored over two logical CPUs."""
    root = str(tmp_path_factory.mktemp("student_strategies"))
    data = penguin_inputs
    tft_output = tft.TFTransformOutput(data.transform_output)
    features = sorted(
        k for k, s in tft_output.transformed_feature_spec().items() if s.dtype == tf.float32
    )
    teacher = os.path.join(root, "teacher")
    _save_teacher(teacher, tft_output, features)
    module = os.path.join(root, "student_module.py")
    with open(module, "w") as f:
        f.write(STUDENT_MODULE.format(features=features))
    runs, processes = {}, []
    try:
        for name, strategy in (
            ("one", {"kind": "one_device"}),
            ("mirrored", {"kind": "mirrored", "num_cpu_devices": 2}),
        ):
            config = module_config_from_dict(
                {
                    "strategy": strategy,
                    # Reproducible element order: both see the same global batches.
                    "ingestion": {
                        "batch_size": 32,
                        "eval_batch_size": 32,
                        "shuffle_buffer": 0,
                        "deterministic": True,
                    },
                    "train": {"train_steps": 6, "eval_steps": 1},
                    # The teacher leaves body_mass_g_xf unread too: the label is named.
                    "distillation": {"label_key": penguins.LABEL},
                }
            )
            inputs = penguins.inputs_for(data, root, name, config)
            job = {
                "kind": "distil",
                "config": config.to_json(),
                "inputs": inputs,
                "teacher_dirs": [teacher],
                "module_file": module,
            }
            log = open(os.path.join(root, f"{name}.log"), "w")  # noqa: SIM115
            process, _ = start_worker([job], root, name, log=log)
            processes.append(process)
            runs[name] = (process, inputs["serving_model_dir"], log)
        wait_all(processes)
    finally:
        kill_all(processes)
    out = {}
    for name, (process, serving_dir, log) in runs.items():
        log.close()
        with open(log.name) as f:
            assert process.returncode == 0, f.read()[-4000:]
        out[name] = serving_dir
    return out, teacher


@pytest.mark.multiprocess
def test_mirrored_over_two_logical_cpus_distils_the_same_student_as_one_device(distilled):
    dirs, teacher = distilled
    weights = {}
    for name, serving_dir in dirs.items():
        loaded = tf.saved_model.load(serving_dir)
        weights[name] = {v.name: v.numpy() for v in loaded.trainable_variables}
        # The student serves as its teacher does.
        assert set(loaded.signatures) == set(tf.saved_model.load(teacher).signatures)
    assert sorted(weights["one"]) == sorted(weights["mirrored"])
    for key, value in weights["one"].items():
        np.testing.assert_allclose(weights["mirrored"][key], value, atol=1e-5, err_msg=key)
