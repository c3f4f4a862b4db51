"""High-throughput tf.data input pipelines over Transform output (no TFX types).

The order of operations is what makes it fast on few cores:

1. list the files (reshuffled every epoch when training) and shard them
   across input pipelines when there are enough files;
2. read them with a parallel `interleave`;
3. shard by record when there are too few files to shard by file;
4. `batch` the *serialized* records first, then parse whole batches with the
   vectorised `tf.io.parse_example` in a parallel `map` (one op per batch,
   not one per example, which is what makes stock TFX parsing slow);
5. `cache` after parsing (so later epochs skip reading and parsing), then
   shuffle, repeat and `prefetch`, everything autotuned unless configured.

With `deterministic=True` the element order is reproducible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from components.config import IngestionConfig

AUTOTUNE = tf.data.AUTOTUNE


def _tune(value: int) -> int:
    return AUTOTUNE if value == 0 else value


def _compression_type(compression: str) -> str:
    if compression not in ("gzip", "none"):
        raise ValueError(f"transform.compression: expected 'gzip' or 'none', got {compression!r}")
    return "GZIP" if compression == "gzip" else ""


def make_dataset(
    files: Sequence[str],
    feature_spec: Mapping[str, tf.io.FixedLenFeature],
    label_key: str,
    config: IngestionConfig,
    *,
    batch_size: int,
    compression: str,
    training: bool,
    input_context: tf.distribute.InputContext | None = None,
    cache_path: str = "",
    seed: int | None = None,
) -> tf.data.Dataset:
    """Builds a dataset of `(features, label)` batches.

    Args:
      files: TFRecord files of serialized tf.Examples.
      feature_spec: Parse spec of the features and the label.
      label_key: Key of the label in `feature_spec`, split off as the target.
      config: The `ingestion` config section.
      batch_size: Global batch size; divided by the number of replicas in
        sync when an `input_context` is given.
      compression: `gzip` or `none` (as Transform wrote the files).
      training: Shuffle (if configured) and repeat forever.
      input_context: Set by `strategy.distribute_datasets_from_function`;
        the dataset then yields this input pipeline's share only.
      cache_path: File cache prefix when `config.cache == 'file'`.
      seed: Shuffle seed.

    Returns:
      A `tf.data.Dataset`.

    Raises:
      ValueError: if there are no files or the configuration is inconsistent.
    """
    files = sorted(files)
    if not files:
        raise ValueError("ingestion: no input files were given")
    if label_key not in feature_spec:
        raise ValueError(f"ingestion: label {label_key!r} is not in the parse spec ({sorted(feature_spec)})")
    compression_type = _compression_type(compression)
    per_replica_batch = batch_size
    num_pipelines, pipeline_id = 1, 0
    if input_context is not None:
        per_replica_batch = input_context.get_per_replica_batch_size(batch_size)
        num_pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
    shuffle = training and config.shuffle_buffer > 0
    shard_by_file = num_pipelines > 1 and len(files) >= num_pipelines

    file_ds = tf.data.Dataset.from_tensor_slices(files)
    if shard_by_file:
        file_ds = file_ds.shard(num_pipelines, pipeline_id)
    if shuffle and config.cache == "none":
        # New file order each epoch; with a cache the order is frozen after the
        # first epoch anyway and the element shuffle below does the mixing.
        file_ds = file_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)

    options = tf.data.Options()
    options.deterministic = config.deterministic
    options.autotune.enabled = True
    # Sharding is done explicitly above; stop tf.distribute from re-sharding.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF

    ds = file_ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type=compression_type),
        cycle_length=_tune(config.num_parallel_reads),
        num_parallel_calls=_tune(config.num_parallel_reads),
        deterministic=config.deterministic,
    )
    if num_pipelines > 1 and not shard_by_file:
        ds = ds.shard(num_pipelines, pipeline_id)

    spec = dict(feature_spec)

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        label = parsed.pop(label_key)
        return parsed, label

    cached = config.cache != "none"
    if cached:
        # Cache parsed examples (not batches) so the per-epoch shuffle mixes
        # individual examples across batches.
        ds = ds.batch(per_replica_batch).map(parse, num_parallel_calls=_tune(config.num_parallel_calls))
        ds = ds.unbatch().cache(cache_path if config.cache == "file" else "")
        if shuffle:
            ds = ds.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if training:
            ds = ds.repeat()
        ds = ds.batch(per_replica_batch, drop_remainder=training)
    else:
        if shuffle:
            ds = ds.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if training:
            ds = ds.repeat()
        ds = ds.batch(per_replica_batch, drop_remainder=training)
        ds = ds.map(parse, num_parallel_calls=_tune(config.num_parallel_calls), deterministic=config.deterministic)
    ds = ds.prefetch(_tune(config.prefetch))
    return ds.with_options(options)
