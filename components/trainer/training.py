"""The training workflow shared by the teacher Trainer and the distiller.

No TFX types: `TrainingInputs` carries plain paths (built from TFX's `FnArgs`
in `run_fn`), so the workflow is testable on temp directories.

`fit` trains any compiled Keras model under the configured `tf.distribute`
strategy (see `components.strategies`), with mixed precision, gradient
accumulation and a crash-recovery backup beside the execution's model run
directory (`backup_dir`); the task lifecycle (`components.trainer.task`)
resolves the role before and exports (only the chief writes the model) and
removes the backup after.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence

import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components import augment as augment_lib
from components import backup, distillation, ingestion, layout, models, strategies
from components.config import ConfigError, ModelConfig, PipelineConfig
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
      backup_dir: Crash-recovery backup location ('' = `<model_run_dir>/backup`).
    """

    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    transform_output: str
    serving_model_dir: str
    model_run_dir: str
    train_steps: int
    eval_steps: int
    backup_dir: str = ""

    @classmethod
    def from_fn_args(cls, fn_args, config: PipelineConfig) -> TrainingInputs:
        inputs = cls(
            train_files=tuple(fn_args.train_files),
            eval_files=tuple(fn_args.eval_files),
            transform_output=fn_args.transform_output,
            serving_model_dir=fn_args.serving_model_dir,
            model_run_dir=fn_args.model_run_dir,
            train_steps=fn_args.train_steps or config.train.train_steps,
            eval_steps=fn_args.eval_steps or config.train.eval_steps,
        )
        # Keyed by everything that determines training: the same inputs and
        # config find the same backup (see `backup.location`).
        key = [
            inputs.train_files,
            inputs.eval_files,
            inputs.transform_output,
            config.to_json(),
            inputs.train_steps,
        ]
        return dataclasses.replace(inputs, backup_dir=backup.location(fn_args.model_run_dir, key))


def list_files(patterns: tuple[str, ...] | list[str]) -> list[str]:
    """Expands TFX split file patterns to a sorted file list."""
    files = sorted(f for p in patterns for f in tf.io.gfile.glob(p))
    if not files:
        raise ValueError(f"Trainer: no transformed example files match {list(patterns)}")
    return files


# What the training input does with examples whose label `data.labeled_fraction` withholds.
DROP_UNLABELED = "drop"
MASK_UNLABELED = "mask"


def make_datasets(
    config: PipelineConfig,
    inputs: TrainingInputs,
    tft_output: tft.TFTransformOutput,
    input_context: tf.distribute.InputContext | None = None,
    unlabeled: str = DROP_UNLABELED,
) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """Train (repeated, shuffled) and eval datasets of `(features, label)`.

    Only the train dataset is augmented (`train.augmentation`, see
    `augmented`); under mixup its label is an `augment.MixedLabels`.

    The record format comes from the layout record the tfxkit Transform wrote
    into the transform graph (compression, packing, parse spec, every shard
    with its sizes); without one the input is stock TFX Transform output
    (GZIP tf.Examples in the transform graph's feature spec).

    Args:
      config: The validated pipeline config.
      inputs: Paths of the run.
      tft_output: The transform graph of the transformed examples.
      input_context: This input pipeline's place among all of them (from
        `distribute_datasets_from_function`); None reads everything.

    Raises:
      ValueError: (`LayoutError` / `IngestionError`) naming the file when the
        transformed examples disagree with the layout record.
    """
    record = layout.read_layout(inputs.transform_output)
    graph_spec = tft_output.transformed_feature_spec()
    if record is None:
        logging.info(
            "Trainer: no tfxkit layout record in %s; reading stock TFX Transform output",
            inputs.transform_output,
        )
        feature_spec, packing, compression, shard_stats = graph_spec, None, "gzip", None
    else:
        feature_spec = record.feature_spec(graph_spec)
        packing, compression, shard_stats = record.packing, record.compression, record.shard_stats()

    def dataset(patterns, training, batch_size):
        files = list_files(patterns)
        if record is not None:
            record.check_listed(files)
        cache_path = ""
        if training and config.ingestion.cache == "file":
            cache_dir = f"{inputs.model_run_dir}/ingestion_cache"
            tf.io.gfile.makedirs(cache_dir)
            cache_path = f"{cache_dir}/train"
        return ingestion.make_dataset(
            files,
            feature_spec,
            config.data.label.name,
            config.ingestion,
            batch_size=batch_size,
            compression=compression,
            training=training,
            packing=packing,
            shard_stats=shard_stats,
            input_context=input_context,
            cache_path=cache_path,
            seed=config.train.seed,
        )

    train = dataset(inputs.train_files, True, config.ingestion.batch_size)
    if config.data.labeled_fraction < 1.0:
        # Before augmentation: the labeled subset is decided on the stored example.
        batch_size = config.ingestion.batch_size
        if input_context is not None:
            # As `ingestion.make_dataset` batches for a distributed input pipeline.
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        train = partially_labeled(train, config.data.labeled_fraction, unlabeled, batch_size)
    if config.train.augmentation.enabled:
        train = augmented(train, config, input_context)
    return train, dataset(inputs.eval_files, False, config.ingestion.eval_batch_size)


def partially_labeled(
    dataset: tf.data.Dataset, fraction: float, unlabeled: str, batch_size: int
) -> tf.data.Dataset:
    """Applies `data.labeled_fraction` to repeated training batches of `(features, label)`.

    Args:
      dataset: Batches from `make_dataset` (repeated, so re-batching never ends short).
      fraction: Fraction of examples that keep their label (`distillation.labeled_mask`).
      unlabeled: `DROP_UNLABELED`: train on the labeled examples only (a
        teacher, or a student from scratch); `MASK_UNLABELED`: keep every
        example and give the others the label `UNLABELED`, so the Distiller
        learns soft targets on them and hard labels on the rest.
      batch_size: Examples per batch of this input pipeline.
    """
    if unlabeled == MASK_UNLABELED:

        def mask(features, label):
            known = distillation.labeled_mask(features, fraction)
            shape = tf.shape(label)
            flat = tf.where(
                known, tf.reshape(label, [-1]), tf.cast(distillation.UNLABELED, label.dtype)
            )
            return features, tf.reshape(flat, shape)

        return dataset.map(mask, num_parallel_calls=tf.data.AUTOTUNE)
    if unlabeled != DROP_UNLABELED:
        raise ValueError(
            f"unlabeled: expected {DROP_UNLABELED!r} or {MASK_UNLABELED!r}, got {unlabeled!r}"
        )

    def labeled_only(features, label):
        # One vectorised fingerprint per batch, not one per example.
        known = distillation.labeled_mask(features, fraction)
        return tf.nest.map_structure(lambda t: tf.boolean_mask(t, known), (features, label))

    kept = dataset.map(labeled_only, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    return kept.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


# Stateless-seed stream of mixup, apart from the image views' streams (one per image feature).
MIXUP_STREAM = 0x6D6978


def augmented(
    dataset: tf.data.Dataset,
    config: PipelineConfig,
    input_context: tf.distribute.InputContext | None = None,
) -> tf.data.Dataset:
    """Training batches with `train.augmentation` applied: image views, then mixup.

    Augmenting here, before the model, is what makes distillation consistent:
    the Distiller's teachers and student are called on the same (augmented,
    mixed) batch. Each batch gets its own stateless seed from `train.seed`,
    the batch's index and this input pipeline's id: runs are reproducible and
    parallel input pipelines see different views. (A run resumed from a
    backup restarts the sequence of views, as it restarts the input.)

    With `mixup` the float features are mixed within the batch (within each
    replica's batch under a strategy; see `augment.mixup`) and the label
    becomes `augment.MixedLabels`, which the Trainer's `Classifier` and the
    `Distiller` read.
    """
    settings = config.train.augmentation
    shapes = {f.transformed_name: f.shape for f in config.data.features if f.shape}
    dense = sorted(f.transformed_name for f in config.data.features if not f.is_categorical)
    pipeline_id = input_context.input_pipeline_id if input_context is not None else 0
    pipelines = input_context.num_input_pipelines if input_context is not None else 1

    def augment(index, batch):
        features, label = batch
        seed = tf.stack([tf.constant(config.train.seed, tf.int64), index * pipelines + pipeline_id])
        if settings.image_views:
            features = augment_lib.augment_images(
                features, shapes, translate=settings.translate, flip=settings.flip, seed=seed
            )
        if settings.mixup:
            features, label = augment_lib.mixup(
                features,
                label,
                dense,
                settings.mixup,
                tf.random.experimental.stateless_fold_in(seed, MIXUP_STREAM),
            )
        return features, label

    return (
        dataset.enumerate()
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def build_model(
    config: PipelineConfig, tft_output: tft.TFTransformOutput, shape: ModelConfig, name: str
) -> keras.Model:
    """A classifier of the given shape over this run's transformed features."""
    cards = {f.name: num_ids(f, tft_output) for f in config.data.features if f.is_categorical}
    return models.build_classifier(
        config.data, shape, cards, name, recompute=config.train.gradient_checkpointing
    )


def learning_rate(
    config: PipelineConfig, total_steps: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """`train.learning_rate` under `train.lr_schedule` for a training of `total_steps` updates.

    The `cosine` schedule warms up linearly from 0 over `train.warmup_steps`
    and then decays to 0 at `total_steps`. The optimizer's step counter is
    restored with a `BackupAndRestore` backup, so a resumed run continues
    the schedule where it stopped.
    """
    train = config.train
    if train.lr_schedule == "constant":
        return train.learning_rate
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if train.warmup_steps else train.learning_rate,
        decay_steps=max(1, total_steps - train.warmup_steps),
        warmup_target=train.learning_rate if train.warmup_steps else None,
        warmup_steps=train.warmup_steps,
    )


def make_optimizer(config: PipelineConfig, total_steps: int) -> keras.optimizers.Optimizer:
    """Adam at `learning_rate(config, total_steps)`."""
    return keras.optimizers.Adam(learning_rate(config, total_steps))


def compile_classifier(
    model: keras.Model, config: PipelineConfig, total_steps: int | None = None
) -> None:
    """Compiles a classifier: Adam under the configured schedule, sparse cross-entropy, accuracy."""
    model.compile(
        optimizer=make_optimizer(config, total_steps or config.train.train_steps),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )


def fit(
    config: PipelineConfig,
    inputs: TrainingInputs,
    build_and_compile: Callable[[], keras.Model],
    *,
    choice: strategies.StrategyChoice | None = None,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    unlabeled: str = DROP_UNLABELED,
) -> tuple[keras.Model, dict[str, float]]:
    """Builds, trains and evaluates a model under the configured strategy.

    Works for any compiled Keras model: the teacher (Keras's own train step)
    and models with a custom `train_step` such as the distiller. In order:

    1. the strategy (created here unless `choice` is given) and the settings
       are checked before any data is read: batch sizes must split over the
       replicas, accumulation needs a model that supports it;
    2. `build_and_compile` runs inside `strategy.scope()` and the
       `train.mixed_precision` policy, so variables are distributed and
       layers compute in the configured precision;
    3. datasets come from `make_datasets` per input pipeline (each worker
       reads its shard at its per-replica batch size) through
       `strategy.distribute_datasets_from_function`, or through a
       `DatasetCreator` scheduled on every worker by the `ClusterCoordinator`
       under the parameter-server strategy;
    4. training backs up to `backup_dir(inputs)` (beside the execution's
       model run directory when the inputs come from `from_fn_args`) every
       `train.checkpoint_every_steps` steps and resumes from there when the
       process is started again with the same inputs (the task removes it
       after the export, see `components.trainer.task.export`).

    Loss scaling across replicas: Keras's compiled losses average per-example
    losses over the local batch and divide by the replicas in sync, so the
    all-reduced (summed) gradient is that of the mean over the *global*
    batch; custom steps should use `tf.nn.compute_average_loss` for the same
    reason. Metric variables are aggregated across replicas when read.

    Gradient accumulation (`train.grad_accum_steps` = N > 1): each step
    receives N micro-batches of `ingestion.batch_size` stacked on a leading
    axis and makes one optimizer update (see `models.accumulate_gradients`),
    so `train_steps` still counts updates and each update sees N x
    `ingestion.batch_size` examples.

    Args:
      config: The validated pipeline config.
      inputs: Paths and step counts.
      build_and_compile: Returns a compiled Keras model (called once, inside
        the strategy scope).
      choice: The strategy, when the caller created it already (it must be
        created before anything else touches TensorFlow).
      callbacks: Extra Keras callbacks, run after the backup callback.

    Returns:
      The trained model and its evaluation results on the eval split.

    Raises:
      ConfigError: naming the field, for settings that cannot work (before
        any data is read).
    """
    choice = choice if choice is not None else strategies.create_strategy(config.strategy)
    if choice.role != strategies.ROLE_TRAINER:
        raise ValueError(
            f"Trainer: this task ({choice.task_type}:{choice.task_id}) is a {choice.role}, not a trainer"
        )
    _check_settings(config, choice)
    keras.utils.set_random_seed(config.train.seed)
    tft_output = tft.TFTransformOutput(inputs.transform_output)
    with models.precision_policy(config.train.mixed_precision):
        with choice.strategy.scope():
            model = build_and_compile()
        _configure_model(model, config)
        train_data, eval_data = _distributed_datasets(config, inputs, tft_output, choice, unlabeled)
        steps_per_epoch = min(config.train.steps_per_epoch, inputs.train_steps)
        save_freq: int | str = max(
            1, config.train.checkpoint_every_steps // config.strategy.steps_per_execution
        )
        if choice.uses_coordinator:
            # Keras backs up a parameter-server run at epoch ends only, so
            # epochs are no longer than the backup interval.
            steps_per_epoch = min(steps_per_epoch, config.train.checkpoint_every_steps)
            save_freq = "epoch"
        backups = backup.TrainingBackup(
            backup_dir(inputs), save_freq=save_freq, delete_checkpoint=False
        )
        model.fit(
            train_data,
            steps_per_epoch=steps_per_epoch,
            epochs=math.ceil(inputs.train_steps / steps_per_epoch),
            callbacks=[backups, _ResumeLog(backups.backup_dir), *callbacks],
            verbose=2,
        )
        results = model.evaluate(eval_data, steps=inputs.eval_steps, return_dict=True, verbose=0)
    logging.info("Trainer: eval after training: %s", results)
    return model, results


def _check_settings(config: PipelineConfig, choice: strategies.StrategyChoice) -> None:
    # Only what depends on the strategy resolved at run time: the config's
    # own ranges were validated when it was built.
    train = config.train
    strategies.check_batch_sizes(
        config.ingestion.batch_size,
        config.ingestion.eval_batch_size,
        choice.num_replicas,
        choice.kind,
    )
    if train.mixed_precision == "mixed_float16":
        if choice.kind == "tpu":
            raise ConfigError(
                "train.mixed_precision: TPUs compute in bfloat16; use 'mixed_bfloat16'"
            )
        if not tf.config.list_physical_devices("GPU"):
            logging.warning(
                "Trainer: train.mixed_precision 'mixed_float16' without a GPU runs, but slowly; use 'mixed_bfloat16' on CPU"
            )


def _configure_model(model: keras.Model, config: PipelineConfig) -> None:
    """Applies accumulation and steps-per-execution settings to the compiled model."""
    steps = config.train.grad_accum_steps
    if steps > 1:
        if not getattr(model, "supports_gradient_accumulation", False):
            raise ConfigError(
                f"train.grad_accum_steps: model {model.name!r} ({type(model).__name__}) cannot accumulate gradients; "
                "mix components.models.GradientAccumulationMixin into its class (a custom train_step then calls "
                "models.accumulate_gradients), or set train.grad_accum_steps: 1"
            )
        model.grad_accum_steps = steps
    if config.strategy.steps_per_execution > 1:
        model.steps_per_execution = config.strategy.steps_per_execution


def _distributed_datasets(
    config: PipelineConfig,
    inputs: TrainingInputs,
    tft_output: tft.TFTransformOutput,
    choice: strategies.StrategyChoice,
    unlabeled: str = DROP_UNLABELED,
):
    """Per-input-pipeline train and eval datasets, distributed by the strategy."""
    accum = config.train.grad_accum_steps

    def train_fn(input_context):
        train, _ = make_datasets(
            config, inputs, tft_output, input_context=input_context, unlabeled=unlabeled
        )
        # N micro-batches stacked per step: one optimizer update per element.
        return train.batch(accum, drop_remainder=True) if accum > 1 else train

    def eval_fn(input_context):
        _, evaluation = make_datasets(config, inputs, tft_output, input_context=input_context)
        # Coordinator-scheduled steps must never run out of data on a worker.
        return evaluation.repeat() if choice.uses_coordinator else evaluation

    if choice.uses_coordinator:
        # Built once eagerly on the coordinator: the input checks that cannot
        # run inside the workers' traced dataset functions fail here, early.
        make_datasets(config, inputs, tft_output)
        creator = keras.utils.experimental.DatasetCreator
        return creator(train_fn), creator(eval_fn)
    strategy = choice.strategy
    return strategy.distribute_datasets_from_function(
        train_fn
    ), strategy.distribute_datasets_from_function(eval_fn)


BACKUP_DIR_NAME = "backup"


def backup_dir(inputs: TrainingInputs) -> str:
    """Where `fit` keeps its crash-recovery backup (see `TrainingInputs.from_fn_args`).

    Inputs built by hand (tests, benchmarks) without a `backup_dir` keep it
    inside their model run directory.
    """
    return inputs.backup_dir or os.path.join(inputs.model_run_dir, BACKUP_DIR_NAME)


class _ResumeLog(keras.callbacks.Callback):
    """Logs whether training resumed from a backup, and from which step."""

    def __init__(self, directory: str):
        super().__init__()
        self._directory = directory

    def on_train_begin(self, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step:
            logging.info("Trainer: resumed from the backup in %s at step %d", self._directory, step)
        else:
            logging.info("Trainer: no backup in %s; training from step 0", self._directory)
