"""`fn_args.data_accessor.tf_dataset_factory` backed by tfxkit's input pipeline.

`tfxkit_data_accessor` gives a user's `run_fn` a `tf_dataset_factory`
(`make_tf_dataset_factory`) that returns stock TFX's batches from
`components.data.ingestion` over `components.data.stored_input`; inputs it does not
handle go to TFX's own factory.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import tensorflow as tf
from absl import logging
from tensorflow_transform.tf_metadata import schema_utils
from tfx.components.trainer import fn_args_utils
from tfx.components.util import tfxio_utils
from tfx.proto import example_gen_pb2
from tfx_bsl.public.tfxio import TensorFlowDatasetOptions

from components.config import IngestionConfig
from components.config.dropin import DropInSettings
from components.data import ingestion, layout, service, stored_input

DatasetFactory = Callable[..., tf.data.Dataset]


def _count_records(stored: stored_input.StoredInput) -> int:
    if stored.shard_stats is not None:
        return sum(stored.shard_stats[f].records for f in stored.files)
    ds = tf.data.TFRecordDataset(
        list(stored.files), compression_type=layout.compression_type(stored.compression)
    )
    return int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def make_tf_dataset_factory(
    settings: DropInSettings,
    transform_output: str | None,
    scratch_dir: str,
    num_workers: int = 1,
) -> DatasetFactory:
    """A `tf_dataset_factory(file_pattern, options, schema)` with stock semantics.

    Args:
      settings: The drop-in settings (`ingestion` tunes parallelism, prefetch,
        determinism and caching).
      transform_output: The transform graph directory (its layout record, if
        any, describes the transformed examples), or None.
      scratch_dir: Where a file cache lives (`ingestion.cache: file`).
      num_workers: Workers of a multi-worker strategy: above 1 the dataset
        lets tf.distribute shard it by data, as stock TFX datasets are.
    """
    record = layout.read_layout(transform_output) if transform_output else None

    def factory(file_pattern, options: TensorFlowDatasetOptions, schema=None) -> tf.data.Dataset:
        # A user's run_fn may read examples other than the Transform's output
        # (raw examples beside a transform graph): those are read as stock.
        stored = stored_input.resolve(
            file_pattern,
            schema_utils.schema_as_feature_spec(schema).feature_spec,
            record,
            reader="tf_dataset_factory",
            accept_unrecorded=True,
        )
        split_key = _split_key(options.label_key, stored.produced)
        on_service = _on_service(settings.ingestion, options)
        config = _reader_config(settings.ingestion, options, on_service)
        ds = _read(stored, options, config, split_key, scratch_dir, on_service)
        ds = _as_stock(ds, stored, options, split_key)
        if num_workers > 1 and not on_service:
            # (On the service, the job hands each replica its share.)
            distribute = tf.data.Options()
            distribute.experimental_distribute.auto_shard_policy = (
                tf.data.experimental.AutoShardPolicy.DATA
            )
            ds = ds.with_options(distribute)
        return ds

    return factory


def _split_key(label_key: str | None, produced) -> str:
    """The feature the reader splits off as the label (the first one without a label key).

    Raises:
      ValueError: naming a `label_key` the schema does not hold.
    """
    if label_key is not None and label_key not in produced:
        raise ValueError(
            f"tf_dataset_factory: label_key {label_key!r} is not in the schema ({sorted(produced)})"
        )
    # The reader always splits off a label; without one it is put back (`_as_stock`).
    return label_key or sorted(produced)[0]


def _on_service(tuned: IngestionConfig, options: TensorFlowDatasetOptions) -> bool:
    """Whether the reads go through the tf.data service: on, and more than one evaluation pass.

    Raises:
      ValueError: for an exact number of passes on the service, naming the fix.
    """
    on_service = tuned.service.enabled and not single_pass_of(options)
    epochs = options.num_epochs
    if on_service and epochs is not None:
        # Seen: one run in about sixteen lost examples of a pass, with no worker lost.
        raise ValueError(
            f"tf_dataset_factory: ingestion.service cannot give exactly num_epochs={epochs} passes: "
            "the tf.data service hands out each file at most once per pass, and a pass can come "
            "short; ask for num_epochs=None (repeat) and bound training by steps (as TFX's "
            "examples do), or turn the service off (ingestion.service.dispatcher: '')"
        )
    return on_service


def _reader_config(
    tuned: IngestionConfig, options: TensorFlowDatasetOptions, on_service: bool
) -> IngestionConfig:
    """The `ingestion` section with the caller's batch, shuffle, threads and order applied.

    The section's own tuning wins where it sets a value; the options fill the rest.
    """
    # A finite number of passes must be exact: the reader's non-deterministic
    # mode has been seen to cross a pass boundary early, so it reads
    # deterministically then (as stock does unless `sloppy_ordering`).
    deterministic = not on_service and (
        tuned.deterministic
        or options.num_epochs is not None
        or (
            not options.sloppy_ordering
            and (not options.shuffle or options.shuffle_seed is not None)
        )
    )
    return dataclasses.replace(
        tuned,
        batch_size=options.batch_size,
        eval_batch_size=options.batch_size,
        shuffle_buffer=options.shuffle_buffer_size if options.shuffle else 0,
        num_parallel_reads=tuned.num_parallel_reads or max(0, options.reader_num_threads),
        num_parallel_calls=tuned.num_parallel_calls or max(0, options.parser_num_threads),
        prefetch=tuned.prefetch or max(0, options.prefetch_buffer_size),
        deterministic=deterministic,
    )


def _read(
    stored: stored_input.StoredInput,
    options: TensorFlowDatasetOptions,
    config: IngestionConfig,
    split_key: str,
    scratch_dir: str,
    on_service: bool,
) -> tf.data.Dataset:
    """`ingestion.make_dataset` over the stored input: one pass, or training's endless stream."""
    files = list(stored.files)
    single_pass = single_pass_of(options)
    cache_path = ""
    if config.cache == "file" and not single_pass:
        cache_path = stored.cache_path(scratch_dir)
    return ingestion.make_dataset(
        files,
        stored.feature_spec,
        split_key,
        _plain_config(config, single_pass),
        batch_size=options.batch_size,
        compression=stored.compression,
        training=not single_pass,
        packing=stored.packing,
        shard_stats=stored.shard_stats,
        cache_path=cache_path,
        seed=options.shuffle_seed,
        # A job per file set: the user's train and eval reads are two jobs.
        service_job=service.job_name(config.service, scratch_dir, _files_key(files))
        if on_service
        else "",
    )


def _as_stock(
    ds: tf.data.Dataset,
    stored: stored_input.StoredInput,
    options: TensorFlowDatasetOptions,
    split_key: str,
) -> tf.data.Dataset:
    """The reader's batches with stock's passes, final batch, label and prefetch."""
    epochs = options.num_epochs
    if single_pass_of(options):
        if options.drop_final_batch:
            ds = ds.rebatch(options.batch_size, drop_remainder=True)
    elif epochs is not None:
        # Exactly `epochs` passes, batched across pass boundaries as stock does.
        total = epochs * _count_records(stored)
        ds = (
            ds.unbatch()
            .take(total)
            .batch(options.batch_size, drop_remainder=options.drop_final_batch)
        )
    else:
        # The reader repeats forever already, but its re-batching hides that
        # from tf.data (cardinality UNKNOWN). Stock's dataset is a `repeat()`
        # (INFINITE), and that is what makes Keras refuse `fit` / `evaluate`
        # without a step count (fn_args.train_steps / eval_steps None)
        # instead of running forever; the outer repeat restores it.
        ds = ds.repeat()
    if options.label_key is None:
        ds = ds.map(lambda features, value: {**features, split_key: value})
    return ds.prefetch(tf.data.AUTOTUNE)


def single_pass_of(options) -> bool:
    """One unshuffled pass is the reader's evaluation mode; anything else its
    training mode (shuffled if asked, repeated forever, full batches)."""
    return options.num_epochs == 1 and not options.shuffle


def _files_key(files) -> str:
    return hashlib.sha256("\n".join(sorted(files)).encode()).hexdigest()[:12]


def _plain_config(config: IngestionConfig, single_pass: bool) -> IngestionConfig:
    # Caching only pays (and is only allowed) for repeated reads.
    return dataclasses.replace(config, cache="none") if single_pass else config


def tfxkit_data_accessor(
    fn_args,
    examples,
    settings: DropInSettings,
    num_workers: int = 1,
) -> fn_args_utils.DataAccessor:
    """`fn_args.data_accessor` with the tfxkit `tf_dataset_factory`.

    Examples whose payload is not tf.Example, or that carry a data view, keep
    TFX's factory (as do calls without a schema); the record-batch factory and
    the data view decoder stay TFX's.
    """
    stock = fn_args.data_accessor
    payload, data_view = tfxio_utils.resolve_payload_format_and_data_view_uri(examples)
    if payload != example_gen_pb2.PayloadFormat.FORMAT_TF_EXAMPLE or data_view:
        logging.info(
            "Trainer: examples are not plain tf.Examples; keeping TFX's tf_dataset_factory"
        )
        return stock
    fast = make_tf_dataset_factory(
        settings, fn_args.transform_output, fn_args.model_run_dir, num_workers
    )

    def tf_dataset_factory(file_pattern, options, schema=None):
        if schema is None:
            return stock.tf_dataset_factory(file_pattern, options, schema)
        return fast(file_pattern, options, schema)

    return stock._replace(tf_dataset_factory=tf_dataset_factory)
