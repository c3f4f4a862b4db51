"""Keras 3 teachers saved with `tf.saved_model.save`: which transformed feature each input reads.

Real Keras 3 models saved as TFX's examples save them under Keras 3 (a
serving signature that parses raw examples, applies a transform and calls the
model on the dict it returns); the Distiller's reading is checked against the
teacher's own serving signature.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from components.distillation import teachers as teachers_lib

RAW = {name: tf.io.FixedLenFeature([1], tf.float32) for name in ("a", "b", "c")}
TRANSFORMED = ["a_xf", "b_xf", "c_xf", "label_xf"]
# The model reads its inputs in an order that is neither sorted nor the transform's.
MODEL_INPUTS = ["c_xf", "a_xf", "b_xf"]


def _transform(raw):
    """What the Transform writes (and the teacher's transform layer computes) from raw features."""
    return {
        "a_xf": raw["a"] * 2.0,
        "b_xf": raw["b"] - 1.0,
        "c_xf": raw["c"] * raw["c"],
        "label_xf": tf.zeros_like(raw["a"], dtype=tf.int64),
    }


def _raw(n: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=(n, 1)).astype(np.float32) for name in RAW}


def _serialized(raw: dict[str, np.ndarray]) -> tf.Tensor:
    rows = []
    for i in range(len(raw["a"])):
        feature = {
            k: tf.train.Feature(float_list=tf.train.FloatList(value=v[i])) for k, v in raw.items()
        }
        rows.append(tf.train.Example(features=tf.train.Features(feature=feature)))
    return tf.constant([r.SerializeToString() for r in rows])


def _save(path, through_transform: bool = True, dict_inputs: bool = False):
    """A Keras 3 model on three same-spec inputs (a list, or a dict by name), saved with
    `tf.saved_model.save`; returns `(dir, model)`."""
    keras.utils.set_random_seed(0)
    inputs = [keras.Input(shape=(1,), name=name) for name in MODEL_INPUTS]
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.concatenate(inputs))
    outputs = keras.layers.Dense(3)(hidden)
    if dict_inputs:
        model = keras.Model(dict(zip(MODEL_INPUTS, inputs, strict=True)), outputs)
    else:
        model = keras.Model(inputs, outputs)
    transform = tf.function(_transform)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        raw = tf.io.parse_example(examples, RAW)
        if through_transform:
            return {"outputs": model(transform(raw))}
        # The model called on parsed raw features: nothing says which input reads what.
        return {"outputs": model([raw["a"], raw["b"], raw["c"]])}

    tf.saved_model.save(model, str(path), signatures={"serving_default": serve})
    return str(path), model


def test_a_keras3_teachers_inputs_are_named_by_the_transformed_feature_each_reads(tmp_path):
    path, model = _save(tmp_path / "t")
    info = teachers_lib.describe_teacher(path, transformed_features=TRANSFORMED)
    assert info.kind == teachers_lib.KERAS
    assert info.positional == tuple(MODEL_INPUTS)
    assert sorted(info.input_specs) == sorted(MODEL_INPUTS)
    assert (info.output, info.width, info.num_classes) == ("logits", 3, 3)
    assert info.num_params == model.count_params()


@pytest.mark.parametrize("dict_inputs", [False, True], ids=["list_inputs", "dict_inputs"])
def test_a_keras3_teachers_logits_equal_its_own_serving_outputs(tmp_path, dict_inputs):
    """Called on the Transform's output as the Distiller calls it, the teacher gives what it
    serves on the raw examples; a reading in another order would not."""
    path, _ = _save(tmp_path / "t", dict_inputs=dict_inputs)
    info = teachers_lib.describe_teacher(path, transformed_features=TRANSFORMED)
    assert info.positional == tuple(sorted(MODEL_INPUTS) if dict_inputs else MODEL_INPUTS)
    raw = _raw()
    served = tf.saved_model.load(path).signatures["serving_default"](examples=_serialized(raw))
    served = served["outputs"].numpy()
    transformed = {
        k: v.numpy() for k, v in _transform({k: tf.constant(v) for k, v in raw.items()}).items()
    }
    read = teachers_lib.ExportedTeacher(path, info).outputs_of(transformed).numpy()
    np.testing.assert_allclose(read, served, rtol=1e-6, atol=1e-6)
    misread = teachers_lib.ExportedTeacher(
        path, dataclasses.replace(info, positional=tuple(reversed(info.positional)))
    )
    assert not np.allclose(misread.outputs_of(transformed).numpy(), served, atol=1e-3)


def test_a_keras3_teacher_whose_inputs_cannot_be_named_is_refused_naming_the_fix(tmp_path):
    path, _ = _save(tmp_path / "t", through_transform=False)
    with pytest.raises(
        ValueError,
        match=r"was saved from Keras 3 with tf\.saved_model\.save, which keeps its inputs by "
        r"position only, and its input 0 \(inputs_0: .*\) reads no transformed feature seen; call "
        r"the model on the dict of transformed features inside serving_default",
    ):
        teachers_lib.describe_teacher(path, transformed_features=TRANSFORMED)
