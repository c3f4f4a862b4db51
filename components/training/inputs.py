"""The Trainer's inputs: transformed examples to `(features, label)` batches (no TFX types).

`make_datasets` builds the train and eval datasets from the stored Transform output, with
`data.labeled_fraction` (`partially_labeled`) and `train.augmentation` (`augmented`);
`distributed_datasets` hands them to the strategy; `TrainingInputs` carries plain paths.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.config import PipelineConfig
from components.data import augment as augment_lib
from components.data import ingestion, labels, layout, service, stored_input
from components.data.pseudo_labels import PseudoLabels
from components.training import backup, strategies


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
      backup_dir: Crash-recovery backup location, from `components.training.backup`:
        `backup.product_location` for inputs from `from_fn_args`; when not
        given, `backup.run_dir_location` (inside `model_run_dir`), filled in
        at construction.
      label_key: The transformed label feature, when the config has no data
        section to name it (the Distiller of a `student_fn`).
    """

    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]
    transform_output: str
    serving_model_dir: str
    model_run_dir: str
    train_steps: int
    eval_steps: int
    backup_dir: str = ""
    label_key: str = ""

    def __post_init__(self):
        if not self.backup_dir:
            object.__setattr__(self, "backup_dir", backup.run_dir_location(self.model_run_dir))

    def label(self, config: PipelineConfig) -> str:
        """The transformed label feature: `label_key`, else the config's `data.label.name`."""
        return self.label_key or config.data.label.name

    @classmethod
    def from_fn_args(cls, fn_args, config: PipelineConfig, label_key: str = "") -> TrainingInputs:
        return cls(
            train_files=tuple(fn_args.train_files),
            eval_files=tuple(fn_args.eval_files),
            transform_output=fn_args.transform_output,
            serving_model_dir=fn_args.serving_model_dir,
            model_run_dir=fn_args.model_run_dir,
            train_steps=fn_args.train_steps or config.train.train_steps,
            eval_steps=fn_args.eval_steps or config.train.eval_steps,
            backup_dir=backup.product_location(fn_args, config),
            label_key=label_key,
        )


# What the training input does with examples whose label `data.labeled_fraction` withholds.
DROP_UNLABELED = "drop"
MASK_UNLABELED = "mask"


def make_datasets(
    config: PipelineConfig,
    inputs: TrainingInputs,
    tft_output: tft.TFTransformOutput,
    input_context: tf.distribute.InputContext | None = None,
    unlabeled: str | PseudoLabels = DROP_UNLABELED,
    decoding_step: bool = False,
    accelerated: bool = False,
) -> tuple[tf.data.Dataset, tf.data.Dataset]:
    """Train (repeated, shuffled) and eval datasets of `(features, label)`.

    Only the train dataset is augmented (`train.augmentation`, see
    `augmented`); under mixup its label is an `augment.MixedLabels`.

    The record format comes from the layout record the tfxkit Transform wrote
    into the transform graph (compression, packing, parse spec, every shard
    with its sizes); without one the input is stock TFX Transform output
    (tf.Examples in the transform graph's feature spec, compressed as the
    files say). `stored_input.resolve` decides, as for `tf_dataset_factory`.

    Args:
      config: The validated pipeline config.
      inputs: Paths of the run.
      tft_output: The transform graph of the transformed examples.
      input_context: This input pipeline's place among all of them (from
        `distribute_datasets_from_function`); None reads everything.
      unlabeled: What training does with the examples `data.labeled_fraction`
        withholds the label of (see `partially_labeled`).
      decoding_step: The consumer's training step decodes coded features
        (`codes.decoding_step`, as `fit` installs it): training may then
        receive them from the service as codes (`service_codebooks`).
      accelerated: The step runs on accelerators (`StrategyChoice.accelerated`).

    Returns:
      `(train, eval)`.

    Raises:
      ValueError: (`LayoutError` / `IngestionError`) naming the file when the
        transformed examples disagree with the layout record.
    """
    label_key = inputs.label(config)
    labeled_fraction = config.data.labeled_fraction if config.data is not None else 1.0
    record = _layout_record(inputs.transform_output)
    graph_spec = tft_output.transformed_feature_spec()

    remote = config.ingestion.service.remote if config.ingestion.service.enabled else ""
    remote_views = remote == "augment"
    settings = config.train.augmentation
    here = settings.mixup or settings.input_noise or (settings.image_views and not remote_views)
    partial = labeled_fraction < 1.0 or isinstance(unlabeled, PseudoLabels)
    # Codes only where nothing on this host reads the features before the step.
    blocked = _codes_blocked(here, partial)
    books = service_codebooks(config, record, accelerated, blocked) if decoding_step else {}
    # A coded stream is another dataset: its own job, which no values reader joins.
    train_job = "train-codes" if books else "train"

    def remote_map(features, label):
        return _remote_views(features, config), label

    def dataset(patterns, training, batch_size):
        stored = stored_input.resolve(
            patterns, graph_spec, record, reader="Trainer", what="transformed example files"
        )
        cache_path = ""
        if training and config.ingestion.cache == "file":
            cache_path = stored.cache_path(inputs.model_run_dir)
        on_service = training and bool(remote)
        return ingestion.make_dataset(
            list(stored.files),
            stored.feature_spec,
            label_key,
            config.ingestion,
            batch_size=batch_size,
            compression=stored.compression,
            training=training,
            packing=stored.packing,
            shard_stats=stored.shard_stats,
            input_context=input_context,
            cache_path=cache_path,
            seed=config.train.seed,
            service_job=service.job_name(config.ingestion.service, inputs.model_run_dir, train_job)
            if on_service
            else "",
            remote_map=remote_map if on_service and remote_views else None,
            codebooks=books if on_service else None,
        )

    train = dataset(inputs.train_files, True, config.ingestion.batch_size)
    if partial:
        # Before augmentation: the labeled subset is decided on the stored example.
        batch_size = config.ingestion.batch_size
        if input_context is not None:
            # As `ingestion.make_dataset` batches for a distributed input pipeline.
            batch_size = input_context.get_per_replica_batch_size(batch_size)
        train = partially_labeled(
            train, labeled_fraction, unlabeled, batch_size, seed=config.train.seed
        )
    if here:
        train = augmented(train, config, input_context, views=not remote_views)
    return train, dataset(inputs.eval_files, False, config.ingestion.eval_batch_size)


def _layout_record(transform_output: str) -> layout.Layout | None:
    record = layout.read_layout(transform_output)
    if record is None:
        logging.info(
            "Trainer: no tfxkit layout record in %s; reading stock TFX Transform output",
            transform_output,
        )
    return record


def _codes_blocked(here: bool, partial: bool) -> str:
    """Why training cannot receive codes from the service, or ''."""
    if here:
        return "mixup, input noise or image views on the training host read the features first"
    if partial:
        return "data.labeled_fraction or pseudo-labels read the features first"
    return ""


def service_codebooks(
    config: PipelineConfig, record: layout.Layout | None, accelerated: bool, blocked: str = ""
) -> dict[str, tuple[float, ...]]:
    """The codebooks training may receive its features' codes with (`ingestion.service.codes`).

    The layout record's, with the service on and `codes: on`, or `auto` on
    accelerators (where the step's decode is cheap) without views on the workers
    (whose codes are checked there, unmeasured); else none. `blocked`: why the
    training host needs values (''). `codes: on` that cannot be honoured says why.
    """
    service = config.ingestion.service
    if not service.enabled or service.codes == "off":
        return {}
    if service.codes == "auto" and (not accelerated or service.remote == "augment"):
        return {}
    why = blocked
    if not why and (record is None or not record.codebooks):
        why = (
            "the layout record holds no codebook (no dense float feature of at most 256 "
            "values, or Transform output written before codebooks: re-run the Transform)"
        )
    if why:
        if service.codes == "on":
            logging.warning("ingestion.service.codes: 'on', but training receives values: %s", why)
        return {}
    return dict(record.codebooks)


def _image_views(features, config: PipelineConfig, seed: tf.Tensor):
    """`train.augmentation`'s translate / flip views of a batch's image features."""
    settings = config.train.augmentation
    shapes = {f.transformed_name: f.shape for f in config.data.features if f.shape}
    return augment_lib.augment_images(
        features, shapes, translate=settings.translate, flip=settings.flip, seed=seed
    )


def _remote_views(features, config: PipelineConfig):
    """`_image_views` of a read batch on a service worker, seeded from its own random state
    (which worker gets which batch is not reproducible anyway, so neither are the views)."""
    return _image_views(
        features, config, tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)
    )


def partially_labeled(
    dataset: tf.data.Dataset,
    fraction: float,
    unlabeled: str | PseudoLabels,
    batch_size: int,
    seed: int | None = None,
) -> tf.data.Dataset:
    """Applies `data.labeled_fraction` to repeated training batches of `(features, label)`.

    Args:
      dataset: Batches from `make_dataset` (repeated, so re-batching never ends short).
      fraction: Fraction of examples that keep their label (`labels.labeled_mask`).
      unlabeled: `DROP_UNLABELED`: train on the labeled examples only (a
        teacher, or a student from scratch); `MASK_UNLABELED`: keep every
        example and give the others the label `UNLABELED`, so the Distiller
        learns soft targets on them and hard labels on the rest;
        `PseudoLabels` (Noisy Student): the kept unlabeled examples get
        their pseudo-label and are repeated as balancing asked, the others
        are dropped. An example is unlabeled when `fraction` withholds its
        label or its stored label is negative.
      batch_size: Examples per batch of this input pipeline.
      seed: Of the shuffle that separates repeated pseudo-labeled examples.
    """
    if isinstance(unlabeled, PseudoLabels):

        def relabel(features, label):
            # One fingerprint per batch serves the labeled mask and the lookup.
            fingerprints = labels.feature_fingerprints(features)
            known = labels.labeled_by_fingerprint(fingerprints, fraction) & (
                tf.reshape(label, [-1]) >= 0
            )
            return unlabeled.apply(features, label, known, fingerprints)

        # Repeated examples of one batch would share a batch: mix them first.
        relabeled = dataset.map(relabel, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
        return (
            relabeled.shuffle(16 * batch_size, seed=seed)
            .batch(batch_size, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )
    if unlabeled == MASK_UNLABELED:

        def mask(features, label):
            known = labels.labeled_mask(features, fraction)
            shape = tf.shape(label)
            flat = tf.where(known, tf.reshape(label, [-1]), tf.cast(labels.UNLABELED, label.dtype))
            return features, tf.reshape(flat, shape)

        return dataset.map(mask, num_parallel_calls=tf.data.AUTOTUNE)
    if unlabeled != DROP_UNLABELED:
        raise ValueError(
            f"unlabeled: expected {DROP_UNLABELED!r} or {MASK_UNLABELED!r}, got {unlabeled!r}"
        )

    def labeled_only(features, label):
        # One vectorised fingerprint per batch, not one per example.
        known = labels.labeled_mask(features, fraction)
        return tf.nest.map_structure(lambda t: tf.boolean_mask(t, known), (features, label))

    kept = dataset.map(labeled_only, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    return kept.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


# Stateless-seed stream of mixup, apart from the image views' streams (one per image feature).
MIXUP_STREAM = 0x6D6978
# ... and of the tabular input noise.
NOISE_STREAM = 0x6E6F69


def augmented(
    dataset: tf.data.Dataset,
    config: PipelineConfig,
    input_context: tf.distribute.InputContext | None = None,
    views: bool = True,
) -> tf.data.Dataset:
    """Training batches with `train.augmentation` applied: image views, input noise, then mixup.

    `views=False` leaves the image views out: the service's workers made them
    (`ingestion.service.remote: augment`).

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
    dense = sorted(f.transformed_name for f in config.data.features if not f.is_categorical)
    tabular = sorted(
        f.transformed_name for f in config.data.features if not f.is_categorical and not f.shape
    )
    pipeline_id = input_context.input_pipeline_id if input_context is not None else 0
    pipelines = input_context.num_input_pipelines if input_context is not None else 1

    def augment(index, batch):
        features, label = batch
        seed = tf.stack([tf.constant(config.train.seed, tf.int64), index * pipelines + pipeline_id])
        if views and settings.image_views:
            features = _image_views(features, config, seed)
        if settings.input_noise:
            features = augment_lib.input_noise(
                features,
                tabular,
                settings.input_noise,
                tf.random.experimental.stateless_fold_in(seed, NOISE_STREAM),
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


def distributed_datasets(
    config: PipelineConfig,
    inputs: TrainingInputs,
    tft_output: tft.TFTransformOutput,
    choice: strategies.StrategyChoice,
    unlabeled: str | PseudoLabels = DROP_UNLABELED,
    decoding_step: bool = False,
):
    """Per-input-pipeline train and eval datasets, distributed by the strategy.

    Each input pipeline builds its own `make_datasets` (its share, at the
    per-replica batch size) through `strategy.distribute_datasets_from_function`,
    or, under the parameter-server strategy, through a `DatasetCreator` the
    `ClusterCoordinator` schedules on every worker. With `train.grad_accum_steps`
    = N > 1 each training element stacks N micro-batches (one optimizer update).
    `decoding_step`: as `make_datasets` (`fit` sets it, having made the model's step decode).

    Returns:
      `(train, eval)` for `model.fit` / `model.evaluate`.
    """
    accum = config.train.grad_accum_steps

    def train_fn(input_context):
        train, _ = make_datasets(
            config,
            inputs,
            tft_output,
            input_context=input_context,
            unlabeled=unlabeled,
            decoding_step=decoding_step,
            accelerated=choice.accelerated,
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
        make_datasets(
            config, inputs, tft_output, decoding_step=decoding_step, accelerated=choice.accelerated
        )
        creator = keras.utils.experimental.DatasetCreator
        return creator(train_fn), creator(eval_fn)
    strategy = choice.strategy
    return strategy.distribute_datasets_from_function(
        train_fn
    ), strategy.distribute_datasets_from_function(eval_fn)
