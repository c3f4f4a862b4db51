"""Serving export: raw serialized tf.Examples in, class probabilities out.

The exported SavedModel carries the TFT transform graph, so a pushed model
serves raw examples. Signatures (the standard TFX ones):

- `serving_default(examples)`: `probabilities`, `logits`, `classes`;
- `transform_features(examples)`: the transformed features (what TFMA and
  distillation use to feed the model the Trainer saw).
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras


def export_serving_model(
    model: keras.Model, tft_output: tft.TFTransformOutput, label_key: str, export_dir: str
) -> None:
    """Saves `model` with serving signatures that apply the transform graph."""
    model.tft_layer = tft_output.transform_features_layer()
    raw_spec = tft_output.raw_feature_spec()
    raw_spec.pop(label_key, None)
    input_keys = list(model.input_names)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        parsed = tf.io.parse_example(examples, raw_spec)
        transformed = model.tft_layer(parsed)
        logits = tf.cast(model({k: transformed[k] for k in input_keys}, training=False), tf.float32)
        return {
            "probabilities": tf.nn.softmax(logits),
            "logits": logits,
            "classes": tf.argmax(logits, axis=-1),
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def transform_features(examples):
        parsed = tf.io.parse_example(examples, raw_spec)
        return model.tft_layer(parsed)

    signatures = {
        "serving_default": serve.get_concrete_function(),
        "transform_features": transform_features.get_concrete_function(),
    }
    model.save(export_dir, save_format="tf", signatures=signatures)
