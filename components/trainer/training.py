"""The training workflow shared by the teacher Trainer and the distiller.

No TFX types: `TrainingInputs` carries plain paths (built from TFX's `FnArgs`
in `run_fn`), so the workflow is testable on temp directories.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components import ingestion, models
from components.config import ModelConfig, PipelineConfig
from components.transform.preprocessing import num_ids


@dataclasses.dataclass(frozen=True)
class TrainingInputs:
    """Paths and step counts of one training run.

    Attributes:
      train_files: File patterns of the transformed train split.
      eval_files: File patterns of the transformed eval split.
      transform_output: Transform graph directory (TFTransformOutput).
      serving_model_dir: Where the serving SavedModel is exported.
      model_run_dir: Scratch space: logs, caches, backups.
      train_steps: Optimizer steps.
      eval_steps: Evaluation batches.
    """

    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    transform_output: str
    serving_model_dir: str
    model_run_dir: str
    train_steps: int
    eval_steps: int

    @classmethod
    def from_fn_args(cls, fn_args, config: PipelineConfig) -> TrainingInputs:
        return cls(
            train_files=tuple(fn_args.train_files),
            eval_files=tuple(fn_args.eval_files),
            transform_output=fn_args.transform_output,
            serving_model_dir=fn_args.serving_model_dir,
            model_run_dir=fn_args.model_run_dir,
            train_steps=fn_args.train_steps or config.train.train_steps,
            eval_steps=fn_args.eval_steps or config.train.eval_steps,
        )


def list_files(patterns: tuple[str, ...] | list[str]) -> list[str]:
    """Expands TFX split file patterns to a sorted file list."""
    files = sorted(f for p in patterns for f in tf.io.gfile.glob(p))
    if not files:
        raise ValueError(f"Trainer: no transformed example files match {list(patterns)}")
    return files


def make_datasets(
    config: PipelineConfig, inputs: TrainingInputs, tft_output: tft.TFTransformOutput
) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """Train (repeated, shuffled) and eval datasets of `(features, label)`."""
    feature_spec = tft_output.transformed_feature_spec()

    def dataset(patterns, training, batch_size):
        return ingestion.make_dataset(
            list_files(patterns),
            feature_spec,
            config.data.label.name,
            config.ingestion,
            batch_size=batch_size,
            compression=config.transform.compression,
            training=training,
            seed=config.train.seed,
        )

    return (
        dataset(inputs.train_files, True, config.ingestion.batch_size),
        dataset(inputs.eval_files, False, config.ingestion.eval_batch_size),
    )


def build_model(config: PipelineConfig, tft_output: tft.TFTransformOutput, shape: ModelConfig, name: str) -> keras.Model:
    """A classifier of the given shape over this run's transformed features."""
    cards = {f.name: num_ids(f, tft_output) for f in config.data.features if f.is_categorical}
    return models.build_classifier(config.data, shape, cards, name)


def compile_classifier(model: keras.Model, config: PipelineConfig) -> None:
    model.compile(
        optimizer=keras.optimizers.Adam(config.train.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )


def fit(
    config: PipelineConfig,
    inputs: TrainingInputs,
    build_and_compile: Callable[[], keras.Model],
) -> tuple[keras.Model, dict[str, float]]:
    """Builds, trains and evaluates a model.

    Args:
      config: The validated pipeline config.
      inputs: Paths and step counts.
      build_and_compile: Returns a compiled Keras model (called once).

    Returns:
      The trained model and its evaluation results on the eval split.
    """
    keras.utils.set_random_seed(config.train.seed)
    tft_output = tft.TFTransformOutput(inputs.transform_output)
    train_ds, eval_ds = make_datasets(config, inputs, tft_output)
    model = build_and_compile()
    steps_per_epoch = min(config.train.steps_per_epoch, inputs.train_steps)
    model.fit(
        train_ds,
        steps_per_epoch=steps_per_epoch,
        epochs=math.ceil(inputs.train_steps / steps_per_epoch),
        verbose=2,
    )
    results = model.evaluate(eval_ds.take(inputs.eval_steps), return_dict=True, verbose=0)
    logging.info("Trainer: eval after training: %s", results)
    return model, results
