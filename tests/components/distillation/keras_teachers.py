"""Keras teachers saved as a TFX user's run_fn saves them (tests' helper).

`model.save(dir, signatures={"serving_default": serve})` where `serve`
parses raw tf.Examples (`x`: 4 floats) and feeds the model's transformed
input `x_xf` (here the raw value itself), as TFX's examples do.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import tf_keras as keras

RAW_SPEC = {"x": tf.io.FixedLenFeature([4], tf.float32)}


def save_teacher(path, width: int = 3, activation: str | None = None, extra_signature=False):
    """Saves a Dense teacher on `x_xf` with `width` outputs; returns `(dir, model)`."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((4,), name="x_xf")
    hidden = keras.layers.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, keras.layers.Dense(width, activation=activation)(hidden))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        parsed = tf.io.parse_example(examples, RAW_SPEC)
        return {"outputs": model(parsed["x"])}

    signatures = {"serving_default": serve.get_concrete_function()}
    if extra_signature:

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def embed(x):
            return {"hidden": x * 2.0}

        signatures["embed"] = embed.get_concrete_function()
    model.save(str(path), save_format="tf", signatures=signatures)
    return str(path), model


def features(n: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x_xf": np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)}


def serialized(values: np.ndarray) -> list[bytes]:
    """Raw tf.Examples of `x` rows."""
    return [
        tf.train.Example(
            features=tf.train.Features(
                feature={"x": tf.train.Feature(float_list=tf.train.FloatList(value=row))}
            )
        ).SerializeToString()
        for row in values
    ]
