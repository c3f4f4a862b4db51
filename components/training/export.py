"""Serving export: raw serialized tf.Examples in, class probabilities out.

`export_serving_model` writes a SavedModel carrying the TFT graph, with `serving_default`
(`probabilities`, `logits`, `classes`), `transform_features` and `transformed_logits`;
`export_from_task` exports on the chief only (others to `scratch_export_dir`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras

SERVING_OUTPUT_KEYS = ("probabilities", "logits", "classes")
TRANSFORMED_LOGITS_SIGNATURE = "transformed_logits"


def export_serving_model(
    model: keras.Model, tft_output: tft.TFTransformOutput, label_key: str, export_dir: str
) -> None:
    """Saves `model` with serving signatures that apply the transform graph."""
    model.tft_layer = tft_output.transform_features_layer()
    raw_spec = tft_output.raw_feature_spec()
    raw_spec.pop(label_key, None)
    input_keys = list(model.input_names)

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False
    )
    def serve(examples):
        parsed = tf.io.parse_example(examples, raw_spec)
        transformed = model.tft_layer(parsed)
        logits = tf.cast(model({k: transformed[k] for k in input_keys}, training=False), tf.float32)
        return {
            "probabilities": tf.nn.softmax(logits),
            "logits": logits,
            "classes": tf.argmax(logits, axis=-1),
        }

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.string, name="examples")], autograph=False
    )
    def transform_features(examples):
        parsed = tf.io.parse_example(examples, raw_spec)
        return model.tft_layer(parsed)

    transformed_specs = {
        k: tf.TensorSpec(t.shape, t.dtype, name=k)
        for k, t in zip(input_keys, model.inputs, strict=True)
    }

    @tf.function(input_signature=[transformed_specs], autograph=False)
    def transformed_logits(features):
        return {"logits": tf.cast(model(features, training=False), tf.float32)}

    signatures = {
        "serving_default": serve.get_concrete_function(),
        "transform_features": transform_features.get_concrete_function(),
        TRANSFORMED_LOGITS_SIGNATURE: transformed_logits.get_concrete_function(),
    }
    # Optimizer state is training-only; leaving it out keeps the serving model
    # small and makes SavedModel sizes of differently trained models comparable.
    model.save(export_dir, save_format="tf", signatures=signatures, include_optimizer=False)


def scratch_export_dir(scratch_dir: str, task_type: str, task_id: int) -> str:
    """Where a non-chief task saves its throwaway copy of the model (under `scratch_dir`).

    One directory per task, inside the model run directory and never the
    model artifact; `discard_scratch_export` removes it.
    """
    return os.path.join(scratch_dir, f"workertemp_{task_type}_{task_id}", "serving_model")


def discard_scratch_export(export_dir: str) -> None:
    """Deletes a `scratch_export_dir` with its task directory."""
    task_dir = os.path.dirname(export_dir)
    if tf.io.gfile.exists(task_dir):
        tf.io.gfile.rmtree(task_dir)


def export_from_task(
    model: keras.Model,
    tft_output: tft.TFTransformOutput,
    label_key: str,
    export_dir: str,
    *,
    is_chief: bool,
    task_type: str,
    task_id: int,
    scratch_dir: str,
    save: Callable[[str], None] | None = None,
) -> str:
    """Exports from one task of a (possibly multi-worker) training job.

    Every worker of a synchronous multi-worker job must save: reading
    variables aggregated across replicas (metrics, sync-on-read state) is a
    collective operation all workers join. Only the chief writes into the
    model artifact; the others save to a task-specific directory under
    `scratch_dir` (`scratch_export_dir`: the model run directory, never the
    artifact) and delete it. A user's run_fn saves there itself
    (`components.trainer.host`).

    Args:
      model, tft_output, label_key: As for `export_serving_model`.
      export_dir: The serving model directory (the chief's destination).
      is_chief: Whether this task writes the model.
      task_type, task_id: This task in `TF_CONFIG` (names the temp directory).
      scratch_dir: Where non-chief tasks write their throwaway copy.
      save: Writes the serving model into the directory it is given (default:
        `export_serving_model` of `model`); the Distiller of a `student_fn`
        exports with its teacher's signatures.

    Returns:
      The directory this task wrote (already deleted for a non-chief task).
    """
    if save is None:

        def save(directory: str) -> None:
            export_serving_model(model, tft_output, label_key, directory)

    if is_chief:
        save(export_dir)
        return export_dir
    temp_dir = scratch_export_dir(scratch_dir, task_type, task_id)
    save(temp_dir)
    discard_scratch_export(temp_dir)
    return temp_dir
