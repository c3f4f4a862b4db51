"""High-throughput `tf.data` input pipelines over Transform output (no TFX types).

`make_dataset` lists, interleaves, batches serialized records, parses whole batches,
caches, shuffles and prefetches; `resolve_cache` decides `cache: auto` from the recorded
shard stats. A corrupt shard or a spec mismatch fails with an `IngestionError` naming the file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import tensorflow as tf
from absl import logging
from google.protobuf.message import DecodeError
from tensorflow.python.util import deprecation

from components.config import IngestionConfig
from components.data import layout, memory, service
from components.data.layout import IngestionError

AUTOTUNE = tf.data.AUTOTUNE
# The dataset functions below have no Python control flow for AutoGraph to
# convert; skipping it saves tracing time and spurious conversion warnings.
_plain = tf.autograph.experimental.do_not_convert
# Records are read and parsed in batches of at least this many: per-batch costs
# (interleave, checks, the parse op) shrink, and `rebatch` cuts batches to size.
READ_BATCH = 4096


def shard_policy(num_files: int, num_pipelines: int) -> str:
    """How `num_pipelines` input pipelines split `num_files` files.

    Returns:
      `none` (one pipeline reads everything), `file` (each pipeline reads whole
      files: there are at least two per pipeline or an exact multiple, so the
      shares stay balanced) or `data` (every pipeline reads every file and
      keeps every `num_pipelines`-th record of it).
    """
    if num_pipelines <= 1:
        return "none"
    if num_files >= num_pipelines and (
        num_files % num_pipelines == 0 or num_files >= 2 * num_pipelines
    ):
        return "file"
    return "data"


# `cache: auto` keeps the parsed training data in memory when its estimate is
# at most this share of what the process can still allocate
# (`components.data.memory`): the rest stays for the model, the shuffle windows and
# the other datasets of the run (an evaluation dataset may cache too).
AUTO_CACHE_SHARE = 0.2
# Bytes a parsed tf.string value takes beside its text (TensorFlow's tstring).
_STRING_VALUE_BYTES = 32


def parsed_bytes(
    spec: Mapping, shard_stats: Mapping[str, layout.ShardStats] | None, files: Sequence[str]
) -> int | None:
    """An upper estimate of the parsed tensors of `files`; None when the record counts are unknown.

    Each record counts its serialized size (what variable-length values and
    strings hold) plus the dense size of every fixed-length feature, so the
    estimate is never below what a parsed record takes.
    """
    if shard_stats is None:
        return None
    stats = [shard_stats[f] for f in files if f in shard_stats]
    if len(stats) != len(files):
        return None
    per_record = 0
    for feature_spec in spec.values():
        if isinstance(feature_spec, tf.io.FixedLenFeature):
            values = math.prod(feature_spec.shape)
            size = (
                _STRING_VALUE_BYTES if feature_spec.dtype == tf.string else feature_spec.dtype.size
            )
            per_record += values * size
    return sum(s.raw_bytes + s.records * per_record for s in stats)


def resolve_cache(
    kind: str, estimate: int | None, available: int | None, num_pipelines: int = 1
) -> str:
    """The cache a training dataset uses: `kind`, or for `auto` `memory` when its share fits.

    Args:
      kind: `ingestion.cache`.
      estimate: `parsed_bytes` of every file the dataset's pipelines read.
      available: Bytes the process can still allocate (`components.data.memory`).
      num_pipelines: Input pipelines splitting the files (each caches its share).

    Returns:
      `none`, `memory` or `file`.
    """
    if kind != "auto":
        return kind
    if estimate is None or available is None:
        return "none"
    share = estimate / max(1, num_pipelines)
    return "memory" if share <= AUTO_CACHE_SHARE * available else "none"


def _tune(value: int) -> int:
    return AUTOTUNE if value == 0 else value


_KINDS = {tf.float32: "float_list", tf.int64: "int64_list", tf.string: "bytes_list"}


def _check_first_record(
    path: str, ctype: str, spec: Mapping, packing: layout.Packing | None
) -> None:
    """Checks one file's first record against the parse spec (cheap, early, named).

    The record comes from TensorFlow's C++ record reader, not a one-record
    `tf.data` pipeline: the same errors (a missing file, a corrupt or
    truncated record, bad gzip data), at about 0.3 ms a file instead of about
    12 ms, which a Trainer with many shards paid per dataset it built.
    """
    try:
        # The v1 reader is deprecated in favour of tf.data, which is the cost avoided here.
        with deprecation.silence():
            records = tf.compat.v1.io.tf_record_iterator(
                path, tf.io.TFRecordOptions(compression_type=ctype)
            )
        first = next(iter(records), None)
    except tf.errors.OpError as e:
        raise IngestionError(
            f"ingestion: TFRecord shard {path!r} is corrupt, truncated or unreadable: {e.message}"
        ) from e
    if first is None:
        return
    try:
        features = tf.train.Example.FromString(first).features.feature
    except DecodeError as e:
        raise IngestionError(
            f"ingestion: {path!r} does not hold serialized tf.Examples ({e})"
        ) from e
    for key, feature_spec in spec.items():
        if not isinstance(feature_spec, tf.io.FixedLenFeature | tf.io.VarLenFeature):
            continue
        packed = packing is not None and key == packing.feature
        if key not in features:
            if (
                isinstance(feature_spec, tf.io.VarLenFeature)
                or feature_spec.default_value is not None
            ):
                continue
            if packed:
                raise IngestionError(
                    f"ingestion: packed feature {key!r} is missing from {path!r}: the shard was not written with "
                    "transform.pack_features: true; re-run the Transform so every shard matches its layout record"
                )
            raise IngestionError(
                f"ingestion: feature {key!r} of the parse spec is missing from {path!r} "
                f"(it has: {', '.join(sorted(features))}); the files and the parse spec disagree: re-run the Transform"
            )
        kind = features[key].WhichOneof("kind") or "empty feature"
        want = _KINDS.get(feature_spec.dtype)
        if want is not None and kind != want:
            raise IngestionError(
                f"ingestion: feature {key!r} in {path!r} holds a {kind} but the parse spec expects "
                f"{feature_spec.dtype.name}; the files and the parse spec disagree: re-run the Transform"
            )
        if isinstance(feature_spec, tf.io.FixedLenFeature) and kind in _KINDS.values():
            count = len(getattr(features[key], kind).value)
            expected = math.prod(feature_spec.shape)
            if count != expected:
                raise IngestionError(
                    f"ingestion: feature {key!r} in {path!r} has {count} values but the parse spec expects "
                    f"{expected} (shape {list(feature_spec.shape)}); the files and the parse spec disagree: "
                    "re-run the Transform"
                )


def _expectations(
    files: Sequence[str], compression: str, shard_stats: Mapping[str, layout.ShardStats] | None
) -> tuple[list[int], list[int]] | None:
    """Per-file (raw bytes, records) a complete read must see, or None when unknown.

    Recorded stats are checked first (`layout.check_shards`: a recorded shard,
    at its recorded size); without them an uncompressed file is checked against its own size, and a
    gzip file relies on zlib's own checks (which name no file).
    """
    if shard_stats is not None:
        stats = layout.check_shards(files, shard_stats)
        return [s.raw_bytes for s in stats], [s.records for s in stats]
    if compression == "none":
        return [tf.io.gfile.stat(p).length for p in files], [-1] * len(files)
    return None


def make_dataset(
    files: Sequence[str],
    feature_spec: Mapping[str, tf.io.FixedLenFeature | tf.io.VarLenFeature],
    label_key: str,
    config: IngestionConfig,
    *,
    batch_size: int,
    compression: str,
    training: bool,
    packing: layout.Packing | None = None,
    shard_stats: Mapping[str, layout.ShardStats] | None = None,
    input_context: tf.distribute.InputContext | None = None,
    cache_path: str = "",
    seed: int | None = None,
    service_job: str = "",
    remote_map: Callable | None = None,
) -> tf.data.Dataset:
    """Builds a dataset of `(features, label)` batches.

    Args:
      files: TFRecord files of serialized tf.Examples.
      feature_spec: Parse spec of the records as stored (with the packed
        feature, not its members, when `packing` is given).
      label_key: Key of the label among the parsed (and unpacked) features,
        split off as the target.
      config: The `ingestion` config section.
      batch_size: Global batch size; divided by the number of replicas in
        sync when an `input_context` is given.
      compression: `gzip` or `none` (as the files were written).
      training: Shuffle (if configured), repeat forever and yield only full
        batches; otherwise one pass, the last batch possibly smaller.
      packing: The packed feature layout, when the files hold one.
      shard_stats: Per-file stats the writer recorded; files must match them.
      input_context: Set by `strategy.distribute_datasets_from_function`;
        the dataset then yields this input pipeline's share only.
      cache_path: File cache prefix when `config.cache == 'file'`.
      seed: Shuffle seed (the same on every worker).
      service_job: The tf.data service job (`service.job_name`) when
        `config.service` is on and this dataset uses it ('' keeps it here):
        reading, parsing and `remote_map` then run on the service's workers
        (repeated there for training, one job per run; one pass per job
        otherwise), and every input pipeline reads the one job (no sharding here).
        Shuffling, caching, re-batching and prefetch stay in this process.
      remote_map: Applied to the read batches of `(features, label)` after
        parsing, on the service's workers (`service.remote: augment`).

    Returns:
      A `tf.data.Dataset`.

    Raises:
      IngestionError: if there are no files, a file disagrees with the parse
        spec or the recorded stats, or the configuration is inconsistent.
    """
    files = sorted(files)
    if not files:
        raise IngestionError("ingestion: no input files were given")
    ctype = layout.compression_type(compression)
    spec = dict(feature_spec)
    if packing is not None:
        if spec.get(packing.feature) != packing.spec():
            raise IngestionError(
                f"ingestion: the parse spec must hold the packed feature {packing.feature!r} as "
                f"{packing.spec()}, got {spec.get(packing.feature)}"
            )
        clash = sorted(set(spec) & {m.name for m in packing.members})
        if clash:
            raise IngestionError(
                f"ingestion: features {clash} are both packed and stored on their own"
            )
    produced = layout.produced_features(spec, packing)
    if label_key not in produced:
        raise IngestionError(
            f"ingestion: label {label_key!r} is not among the parsed features ({sorted(produced)})"
        )
    if config.cache == "file" and not cache_path:
        raise IngestionError(
            "ingestion.cache: 'file' needs a cache path (the Trainer uses its model run directory)"
        )

    remote = config.service.remote if config.service.enabled and service_job else ""
    if remote_map is not None and remote != "augment":
        raise IngestionError(
            "ingestion: remote_map runs on the service only (service.remote: augment)"
        )

    per_replica_batch = batch_size
    num_pipelines, pipeline_id = 1, 0
    if input_context is not None:
        per_replica_batch = input_context.get_per_replica_batch_size(batch_size)
        num_pipelines, pipeline_id = (
            input_context.num_input_pipelines,
            input_context.input_pipeline_id,
        )
    # On the service, every input pipeline reads the one job, which hands
    # out each file once per epoch (`distributed_epoch`): nothing to shard.
    policy = shard_policy(len(files), 1 if remote else num_pipelines)
    shuffle = training and config.shuffle_buffer > 0
    cache = "none"
    if training:
        # `auto` decides by this process's memory, which is the dataset's only
        # while it is built eagerly: a parameter-server worker's dataset function
        # is traced on the coordinator and runs elsewhere, so it does not cache.
        available = None if tf.inside_function() else memory.available_bytes()
        estimate = parsed_bytes(spec, shard_stats, files)
        cache = resolve_cache(config.cache, estimate, available, num_pipelines)
        if remote == "augment":
            # A cache after remote augmentation would replay one epoch's views.
            cache = "none"
        if config.cache == "auto":
            logging.info(
                "ingestion: cache auto -> %s (parsed training data about %s MB, %s MB available)",
                cache,
                "unknown" if estimate is None else estimate // 2**20,
                "unknown" if available is None else available // 2**20,
            )
    cached = cache != "none"

    expected = _expectations(files, compression, shard_stats)
    # Not while tracing: a parameter-server worker's dataset function is a
    # graph and cannot read eagerly (it hangs); the coordinator checks first.
    if not tf.inside_function():
        for path in files:
            _check_first_record(path, ctype, spec, packing)
    accounting = expected is not None
    # A recorded record count catches every incomplete read; without one, an
    # uncompressed file's own size is the expectation, so bytes are counted.
    check_bytes = accounting and shard_stats is None
    raw, records = expected if accounting else ([-1] * len(files), [-1] * len(files))

    file_ds = tf.data.Dataset.from_tensor_slices(
        (tf.constant(files), tf.constant(raw, tf.int64), tf.constant(records, tf.int64))
    )
    if policy == "file":
        file_ds = file_ds.shard(num_pipelines, pipeline_id)
    if shuffle:
        file_ds = file_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)

    data_shards = num_pipelines if policy == "data" else 1
    # Whether every file can be looked up by name as a pattern (no glob characters).
    checkable_paths = not any(c in path for path in files for c in "*?[\\")
    read_batch = max(per_replica_batch, READ_BATCH)
    sentinel = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))

    @_plain
    def present(path):
        # `ignore_errors` (below) asks a file it could not open again and again:
        # TFRecordDataset never moves past one, so a shard gone or unreadable
        # when a later epoch re-reads it would spin forever instead of failing.
        # It fails here, naming the file, as its stream starts: right before the
        # reader opens it, not when `interleave` builds the stream (which, with
        # parallel reads, can be long before, while the file still exists).
        check = tf.debugging.Assert(
            tf.size(tf.io.matching_files(path)) > 0,
            [
                "ingestion: TFRecord shard",
                path,
                "is gone or cannot be listed (deleted or moved while training?); restore the file "
                "or re-run the Transform",
            ],
        )
        with tf.control_dependencies([check]):
            return tf.identity(path)

    @_plain
    def open_file(path):
        batches = tf.data.TFRecordDataset(path, compression_type=ctype).batch(read_batch)
        # A read error ends this file's stream instead of the whole dataset;
        # the byte and record count check at its end then fails naming the file.
        return batches.ignore_errors() if accounting else batches

    @_plain
    def read_file(path, want_bytes, want_records):
        paths = tf.data.Dataset.from_tensors(path)
        if accounting and checkable_paths:
            paths = paths.map(present)
        batches = paths.flat_map(open_file)
        if not accounting and data_shards == 1:
            return batches.map(_plain(lambda batch: (path, batch)))

        @_plain
        def step(state, batch):
            seen, data_bytes = state
            n = tf.size(batch, out_type=tf.int64)
            checks = []
            if accounting:
                if check_bytes:
                    data_bytes += tf.reduce_sum(tf.cast(tf.strings.length(batch), tf.int64))
                    complete = tf.equal(
                        data_bytes + layout.RECORD_OVERHEAD_BYTES * seen, want_bytes
                    )
                else:
                    complete = tf.equal(seen, want_records)
                # Only the empty end-of-file sentinel can fail the check.
                checks.append(
                    tf.debugging.Assert(
                        tf.logical_or(n > 0, complete),
                        [
                            "ingestion: TFRecord shard",
                            path,
                            "is corrupt, truncated or unreadable; restore the file or re-run the Transform. Records read, "
                            "bytes read (-1: not counted), records and bytes expected (-1: not known):",
                            seen,
                            data_bytes + layout.RECORD_OVERHEAD_BYTES * seen
                            if check_bytes
                            else tf.constant(-1, tf.int64),
                            want_records,
                            want_bytes,
                        ],
                    )
                )
            with tf.control_dependencies(checks):
                if data_shards > 1:
                    # Record-level sharding within the file: record j of the file
                    # goes to pipeline j % data_shards, whatever the file order.
                    out = tf.boolean_mask(
                        batch, tf.equal((seen + tf.range(n)) % data_shards, pipeline_id)
                    )
                else:
                    out = tf.identity(batch)
            return (seen + n, data_bytes), (path, out)

        zero = tf.constant(0, tf.int64)
        return (
            batches.concatenate(sentinel)
            .scan((zero, zero), step)
            .filter(_plain(lambda _, batch: tf.size(batch) > 0))
        )

    ds = file_ds.interleave(
        read_file,
        cycle_length=_tune(config.num_parallel_reads),
        num_parallel_calls=_tune(config.num_parallel_reads),
        deterministic=config.deterministic,
    )

    @_plain
    def parse(path, serialized):
        # example_names puts the file into every parse error message.
        return tf.io.parse_example(
            serialized, spec, example_names=tf.fill(tf.shape(serialized), path)
        )

    @_plain
    def finish(parsed):
        parsed = dict(parsed)
        if packing is not None:
            parsed.update(packing.unpack(parsed.pop(packing.feature)))
        label = parsed.pop(label_key)
        return parsed, label

    parallel = _tune(config.num_parallel_calls)
    fixed = all(isinstance(s, tf.io.FixedLenFeature) for s in spec.values())

    def on_service(remote_part, what):
        if training and not cached:
            # One job for the whole run: repeated on the workers (their split
            # provider starts each epoch over), not by a new job per epoch here,
            # which would stall every epoch's end for the client's task refresh (~1 s).
            remote_part = remote_part.repeat()
        # Prefetched on the worker: it makes the next batch while one is in transit.
        return service.distribute(
            remote_part.prefetch(AUTOTUNE), config.service, service_job, what=what
        )

    if remote == "read":
        ds = on_service(ds, "reading the training files")
    ds = ds.map(parse, num_parallel_calls=parallel, deterministic=config.deterministic)
    unpacked = False
    if remote in ("parse", "augment"):
        if fixed:
            # Unpacked on the workers: the trainer receives the model's features.
            ds = ds.map(finish, num_parallel_calls=parallel, deterministic=config.deterministic)
            unpacked = True
            if remote_map is not None:
                ds = ds.map(remote_map, num_parallel_calls=parallel, deterministic=False)
        elif remote_map is not None:
            raise IngestionError(
                "ingestion.service.remote: 'augment' needs fixed-length features (image views "
                "apply to dense images); set remote: parse"
            )
        ds = on_service(ds, "reading and parsing the training files")
    if cached:
        # Cached as parsed (and still packed: one tensor per batch to mix and
        # re-slice instead of one per feature), after all reading and parsing.
        suffix = f"_pipeline{pipeline_id}" if num_pipelines > 1 and cache == "file" else ""
        ds = ds.cache(cache_path + suffix if cache == "file" else "")
    if fixed:
        if shuffle:
            window = max(1, math.ceil(config.shuffle_buffer / read_batch))
            ds = ds.shuffle(window, seed=seed, reshuffle_each_iteration=True)
            ds = _permute_windows(ds, window * read_batch, seed, parallel, config.deterministic)
        if not unpacked:
            # Unpacked on big batches (few calls); `rebatch` then only slices.
            ds = ds.map(finish, num_parallel_calls=parallel, deterministic=config.deterministic)
        if training:
            ds = ds.repeat()
        ds = ds.rebatch(per_replica_batch, drop_remainder=training)
    else:
        # Sparse features cannot be re-sliced or gathered as batches: mix and
        # re-batch them example by example (slower, same semantics).
        ds = ds.unbatch()
        if shuffle:
            ds = ds.shuffle(config.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if training:
            ds = ds.repeat()
        ds = ds.batch(per_replica_batch, drop_remainder=training)
        ds = ds.map(finish, num_parallel_calls=parallel, deterministic=config.deterministic)
    ds = ds.prefetch(_tune(config.prefetch))

    options = tf.data.Options()
    options.deterministic = config.deterministic
    options.autotune.enabled = True
    # Sharding is done explicitly above; stop tf.distribute from re-sharding.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _permute_windows(
    ds: tf.data.Dataset, window: int, seed: int | None, parallel: int, deterministic: bool
) -> tf.data.Dataset:
    """Randomly permutes the examples within consecutive windows of `window` examples.

    One gather per window instead of one shuffle-buffer step per example: the
    cost stays per batch, so a cached dataset keeps its speed while examples
    still mix across batches (and files) each epoch.
    """
    ds = ds.rebatch(window)
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)

    @_plain
    def permute(batch, pair):
        size = tf.shape(tf.nest.flatten(batch)[0])[0]
        order = tf.random.experimental.stateless_shuffle(tf.range(size), seed=pair)
        return tf.nest.map_structure(lambda t: tf.gather(t, order), batch)

    return tf.data.Dataset.zip((ds, seeds)).map(
        permute, num_parallel_calls=parallel, deterministic=deterministic
    )
