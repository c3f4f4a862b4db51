"""High-throughput `tf.data` input pipelines over Transform output (no TFX types).

`make_dataset` lists, interleaves, batches serialized records, parses whole batches,
caches, shuffles and prefetches; `resolve_cache` decides `cache: auto` from the recorded
shard stats. A corrupt shard or a spec mismatch fails with an `IngestionError` naming the file.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from absl import logging
from google.protobuf.message import DecodeError
from tensorflow.python.util import deprecation

from components.config import IngestionConfig
from components.data import codes, layout, memory, service
from components.data.layout import IngestionError

AUTOTUNE = tf.data.AUTOTUNE
# The dataset functions below have no Python control flow for AutoGraph to
# convert; skipping it saves tracing time and spurious conversion warnings.
_plain = tf.autograph.experimental.do_not_convert
# Records are read and parsed in batches of at least this many: per-batch costs
# (interleave, checks, the parse op) shrink, and `rebatch` cuts batches to size.
READ_BATCH = 4096
# When training shuffles: the shuffle window holds at least this many read
# batches (smaller ones where the buffer is small), read from as many files at
# once where there are that many, so one window mixes several files' stretches.
# With 3 batches of 4096 from 2 files (the autotuned interleave on 2 cores), a
# window of label-sorted files held 2-3 classes: less random than stock TFX's
# example buffer (`benchmarks/results/shuffle_quality.json`).
SHUFFLE_BLOCKS = 8
# Batches the service's workers hand over are buffered here up to this many bytes (at
# least 2, at most `SERVICE_PREFETCH_MAX` batches) unless `ingestion.prefetch` sets a
# depth: the workers' batches come in bursts, and autotuned prefetch (or 4 batches)
# kept too few of them, slower than the trainer-side shuffle window it replaced; 16 to
# 64 batches were faster (a scratch A/B, commit 2e29956; Fashion-MNIST batches of 512
# are 1.6 MB, 40 of them). `benchmarks/results/tfdata_service.json` measures the result.
SERVICE_PREFETCH_BYTES = 64 * 2**20
SERVICE_PREFETCH_MAX = 64


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
    _check_features(path, features, spec, packing)


def _check_features(
    path: str,
    features: Mapping[str, tf.train.Feature],
    spec: Mapping,
    packing: layout.Packing | None,
) -> None:
    """Checks one record's features (of the file `path`) against the parse spec.

    Raises:
      IngestionError: naming the file and the feature that is missing, of
        another kind or of another length than the spec says.
    """
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


@dataclasses.dataclass(frozen=True)
class _ReadPlan:
    """What one input pipeline reads and how, decided (and checked) once before any op is built.

    Attributes:
      files: The input files, sorted.
      compression: `gzip` or `none`, as the files were written.
      ctype: The matching TFRecordDataset compression type.
      spec: Parse spec of the records as stored.
      label_key: Key of the label among the parsed (and unpacked) features.
      packing: The packed feature layout, when the files hold one.
      shard_stats: Per-file stats the writer recorded, or None.
      config: The `ingestion` config section.
      training: Shuffle (if configured), repeat and yield full batches.
      per_replica_batch: Batch size of this input pipeline.
      num_pipelines: Input pipelines splitting the files.
      pipeline_id: This input pipeline's index.
      policy: `shard_policy` of the files over the pipelines.
      remote: `config.service.remote` when this dataset uses the service, else ''.
      service_job: The tf.data service job name ('' without the service).
      remote_map: Applied on the service's workers after parsing, or None.
      codebooks: Feature -> codebook of the features the workers send as codes
        when they batch (`batched_remotely`), else empty.
      shuffle: Whether files and examples are shuffled.
      cache: `none`, `memory` or `file`: where parsed training data is kept.
      cache_path: File cache prefix for `cache == 'file'`.
      seed: Shuffle seed.
    """

    files: tuple[str, ...]
    compression: str
    ctype: str
    spec: Mapping
    label_key: str
    packing: layout.Packing | None
    shard_stats: Mapping[str, layout.ShardStats] | None
    config: IngestionConfig
    training: bool
    per_replica_batch: int
    num_pipelines: int
    pipeline_id: int
    policy: str
    remote: str
    service_job: str
    remote_map: Callable | None
    codebooks: Mapping[str, np.ndarray]
    shuffle: bool
    cache: str
    cache_path: str
    seed: int | None

    @property
    def read_batch(self) -> int:
        """Records per read (and per shuffled block): `READ_BATCH`, or when shuffling small
        enough that the shuffle buffer holds `SHUFFLE_BLOCKS` of them; never below a batch."""
        block = READ_BATCH
        if self.shuffle:
            block = min(block, max(1, self.config.shuffle_buffer // SHUFFLE_BLOCKS))
        return max(self.per_replica_batch, block)

    @property
    def files_here(self) -> int:
        """Files this input pipeline reads."""
        if self.policy == "file":
            return len(self.files[self.pipeline_id :: self.num_pipelines])
        return len(self.files)

    @property
    def data_shards(self) -> int:
        """Pipelines sharing every file record by record (1 unless the policy is `data`)."""
        return self.num_pipelines if self.policy == "data" else 1

    @property
    def checkable_paths(self) -> bool:
        """Whether every file can be looked up by name as a pattern (no glob characters)."""
        return not any(c in path for path in self.files for c in "*?[\\")

    @property
    def fixed(self) -> bool:
        """Whether every feature is fixed-length, so whole batches can be re-sliced."""
        return all(isinstance(s, tf.io.FixedLenFeature) for s in self.spec.values())

    @property
    def unpacked_remotely(self) -> bool:
        """Whether the service's workers unpack and split off the label already."""
        return self.remote in ("parse", "augment") and self.fixed

    @property
    def batched_remotely(self) -> bool:
        """Whether the service's workers also shuffle and batch, so this process receives
        whole batches: whenever they unpack, nothing is cached here (a cache here replays
        one epoch, so it must be filled before the shuffle) and the dispatcher hands each
        file to one worker (`distributed_epoch`). Under `parallel_epochs` every worker
        reads every file with the same seed, so their batches would be the same batches:
        the copies are shuffled together here instead."""
        return (
            self.unpacked_remotely
            and self.cache == "none"
            and self.config.service.processing_mode == "distributed_epoch"
        )

    @property
    def parallel(self) -> int:
        return _tune(self.config.num_parallel_calls)


@dataclasses.dataclass(frozen=True)
class _ReadChecks:
    """What every file's stream is checked against as it is read.

    Attributes:
      accounting: Whether records (or bytes) are counted and checked at the
        end of each file.
      count_bytes: Whether bytes are counted (no recorded record counts, an
        uncompressed file's own size is the expectation).
      raw_bytes: Per-file bytes a complete read sees (-1: unknown).
      records: Per-file records a complete read sees (-1: unknown).
    """

    accounting: bool
    count_bytes: bool
    raw_bytes: tuple[int, ...]
    records: tuple[int, ...]


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
    codebooks: Mapping[str, Sequence[float]] | None = None,
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
        With fixed-length features and no cache (`remote: parse` or `augment`),
        shuffling and batching run there too: this process receives whole
        batches of the model's features and only prefetches. With a cache,
        this process caches, shuffles and re-batches what the workers parsed.
      remote_map: Applied to the read batches of `(features, label)` after
        parsing, on the service's workers (`service.remote: augment`).
      codebooks: Feature -> its codebook (`layout.Layout.codebooks`): where the
        service's workers batch, they send these features as uint8 codes
        (`components.data.codes`), which the consumer decodes (the product's
        training step does: `codes.decoding_step`). Only for a consumer that
        decodes; None or empty sends values.

    Returns:
      A `tf.data.Dataset`.

    Raises:
      IngestionError: if there are no files, a file disagrees with the parse
        spec or the recorded stats, or the configuration is inconsistent.
    """
    plan = _plan_read(
        files,
        feature_spec,
        label_key,
        config,
        batch_size=batch_size,
        compression=compression,
        training=training,
        packing=packing,
        shard_stats=shard_stats,
        input_context=input_context,
        cache_path=cache_path,
        seed=seed,
        service_job=service_job,
        remote_map=remote_map,
        codebooks=codebooks,
    )
    checks = _check_files(plan)
    ds = _read_files(plan, checks)
    ds = _parse_batches(ds, plan)
    ds = _cache_parsed(ds, plan)
    ds = _batch_examples(ds, plan)
    return _with_options(ds, plan.config)


def _plan_read(
    files: Sequence[str],
    feature_spec: Mapping,
    label_key: str,
    config: IngestionConfig,
    *,
    batch_size: int,
    compression: str,
    training: bool,
    packing: layout.Packing | None,
    shard_stats: Mapping[str, layout.ShardStats] | None,
    input_context: tf.distribute.InputContext | None,
    cache_path: str,
    seed: int | None,
    service_job: str,
    remote_map: Callable | None,
    codebooks: Mapping[str, Sequence[float]] | None = None,
) -> _ReadPlan:
    """`make_dataset`'s arguments checked and resolved into one `_ReadPlan`.

    Raises:
      IngestionError: as `make_dataset`, for everything found without reading a file.
    """
    files = sorted(files)
    ctype, spec = _check_spec(files, feature_spec, label_key, compression, packing)
    remote = _check_options(config, cache_path, service_job, remote_map)
    per_replica_batch, num_pipelines, pipeline_id = _pipeline_share(input_context, batch_size)
    # On the service, every input pipeline reads the one job, which hands
    # out each file once per epoch (`distributed_epoch`): nothing to shard.
    policy = shard_policy(len(files), 1 if remote else num_pipelines)
    cache = (
        _training_cache(config, spec, shard_stats, files, num_pipelines, remote)
        if training
        else "none"
    )
    plan = _ReadPlan(
        files=tuple(files),
        compression=compression,
        ctype=ctype,
        spec=spec,
        label_key=label_key,
        packing=packing,
        shard_stats=shard_stats,
        config=config,
        training=training,
        per_replica_batch=per_replica_batch,
        num_pipelines=num_pipelines,
        pipeline_id=pipeline_id,
        policy=policy,
        remote=remote,
        service_job=service_job,
        remote_map=remote_map,
        codebooks={},
        shuffle=training and config.shuffle_buffer > 0,
        cache=cache,
        cache_path=cache_path,
        seed=seed,
    )
    return dataclasses.replace(plan, codebooks=_sent_codebooks(plan, codebooks or {}))


def _sent_codebooks(
    plan: _ReadPlan, codebooks: Mapping[str, Sequence[float]]
) -> dict[str, np.ndarray]:
    """The codebooks of the features the workers send as codes: every float32 feature with
    a codebook, where they batch (else none: what this process re-batches stays values)."""
    if not codebooks:
        return {}
    if not plan.batched_remotely:
        if plan.config.service.codes == "on":
            logging.warning(
                "ingestion.service.codes: 'on', but the service's workers do not batch this "
                "read (a cache here, parallel_epochs, remote: read or variable-length "
                "features): they send values"
            )
        return {}
    produced = dict(plan.spec)
    if plan.packing is not None:
        produced.pop(plan.packing.feature)
        produced.update(
            {m.name: tf.io.FixedLenFeature(m.shape, m.dtype) for m in plan.packing.members}
        )
    books = {
        name: codes.check_book(name, book)
        for name, book in sorted(codebooks.items())
        if name in produced and name != plan.label_key and produced[name].dtype == tf.float32
    }
    if books:
        logging.info(
            "ingestion: the service's workers send %s as one-byte codes (%s values)",
            ", ".join(books),
            ", ".join(str(b.size) for b in books.values()),
        )
    return books


def _check_spec(
    files: Sequence[str],
    feature_spec: Mapping,
    label_key: str,
    compression: str,
    packing: layout.Packing | None,
) -> tuple[str, dict]:
    """Checks the files are given and the parse spec, packing and label agree.

    Returns:
      The TFRecordDataset compression type and the parse spec as a dict.

    Raises:
      IngestionError: naming the missing files, the bad compression, the
        packed feature or the label.
    """
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
    return ctype, spec


def _check_options(
    config: IngestionConfig, cache_path: str, service_job: str, remote_map: Callable | None
) -> str:
    """Checks the cache path and remote map fit the config.

    Returns:
      What runs on the service (`config.service.remote`), or '' when this
      dataset does not use it.

    Raises:
      IngestionError: for a file cache without a path, or a `remote_map`
        without `service.remote: augment`.
    """
    if config.cache == "file" and not cache_path:
        raise IngestionError(
            "ingestion.cache: 'file' needs a cache path (the Trainer uses its model run directory)"
        )
    remote = config.service.remote if config.service.enabled and service_job else ""
    if remote_map is not None and remote != "augment":
        raise IngestionError(
            "ingestion: remote_map runs on the service only (service.remote: augment)"
        )
    return remote


def _pipeline_share(
    input_context: tf.distribute.InputContext | None, batch_size: int
) -> tuple[int, int, int]:
    """This input pipeline's batch size, the number of pipelines and its index."""
    if input_context is None:
        return batch_size, 1, 0
    return (
        input_context.get_per_replica_batch_size(batch_size),
        input_context.num_input_pipelines,
        input_context.input_pipeline_id,
    )


def _training_cache(
    config: IngestionConfig,
    spec: Mapping,
    shard_stats: Mapping[str, layout.ShardStats] | None,
    files: Sequence[str],
    num_pipelines: int,
    remote: str,
) -> str:
    """The cache a training dataset uses (`resolve_cache`), logged when `auto` decides."""
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
    return cache


def _check_files(plan: _ReadPlan) -> _ReadChecks:
    """Checks the files against the recorded stats and their first records; returns the read checks.

    Raises:
      IngestionError: naming a file that is unrecorded, of the wrong size,
        unreadable, or whose first record disagrees with the parse spec.
    """
    expected = _expectations(plan.files, plan.compression, plan.shard_stats)
    # Not while tracing: a parameter-server worker's dataset function is a
    # graph and cannot read eagerly (it hangs); the coordinator checks first.
    if not tf.inside_function():
        for path in plan.files:
            _check_first_record(path, plan.ctype, plan.spec, plan.packing)
    if expected is None:
        unknown = (-1,) * len(plan.files)
        return _ReadChecks(accounting=False, count_bytes=False, raw_bytes=unknown, records=unknown)
    raw, records = expected
    # A recorded record count catches every incomplete read; without one, an
    # uncompressed file's own size is the expectation, so bytes are counted.
    return _ReadChecks(
        accounting=True,
        count_bytes=plan.shard_stats is None,
        raw_bytes=tuple(raw),
        records=tuple(records),
    )


def _read_files(plan: _ReadPlan, checks: _ReadChecks) -> tf.data.Dataset:
    """This pipeline's `(path, serialized batch)` elements, files read in parallel.

    Files are sharded (`policy == 'file'`) and, when training shuffles,
    reshuffled every epoch before they are interleaved.
    """
    file_ds = tf.data.Dataset.from_tensor_slices(
        (
            tf.constant(plan.files),
            tf.constant(checks.raw_bytes, tf.int64),
            tf.constant(checks.records, tf.int64),
        )
    )
    if plan.policy == "file":
        file_ds = file_ds.shard(plan.num_pipelines, plan.pipeline_id)
    if plan.shuffle:
        file_ds = file_ds.shuffle(len(plan.files), seed=plan.seed, reshuffle_each_iteration=True)
    reads = _tune(plan.config.num_parallel_reads)
    cycle = reads
    if plan.shuffle:
        # Open `SHUFFLE_BLOCKS` files at once (where there are that many) so the
        # shuffle mixes their stretches; `reads` of them are read in parallel.
        cycle = max(min(plan.files_here, SHUFFLE_BLOCKS), 1 if reads == AUTOTUNE else reads)
    return file_ds.interleave(
        _plain(functools.partial(_read_file, plan=plan, checks=checks)),
        cycle_length=cycle,
        num_parallel_calls=reads,
        # Round robin over the open files when shuffling: first-ready order
        # hands out runs of one file's batches, which the window cannot mix.
        deterministic=plan.config.deterministic or plan.shuffle,
    )


def _read_file(
    path: tf.Tensor,
    want_bytes: tf.Tensor,
    want_records: tf.Tensor,
    *,
    plan: _ReadPlan,
    checks: _ReadChecks,
) -> tf.data.Dataset:
    """One file's `(path, batch)` stream: this pipeline's records, checked complete at its end."""
    paths = tf.data.Dataset.from_tensors(path)
    if checks.accounting and plan.checkable_paths:
        paths = paths.map(_assert_present)
    batches = paths.flat_map(_plain(functools.partial(_open_file, plan=plan, checks=checks)))
    if not checks.accounting and plan.data_shards == 1:
        return batches.map(_plain(lambda batch: (path, batch)))
    zero = tf.constant(0, tf.int64)
    # The empty sentinel ends every file's stream, so its last step can check the count.
    sentinel = tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))
    return (
        batches.concatenate(sentinel)
        .scan(
            (zero, zero),
            _plain(
                functools.partial(
                    _count_and_share,
                    path=path,
                    want_bytes=want_bytes,
                    want_records=want_records,
                    plan=plan,
                    checks=checks,
                )
            ),
        )
        .filter(_plain(lambda _, batch: tf.size(batch) > 0))
    )


@_plain
def _assert_present(path: tf.Tensor) -> tf.Tensor:
    """`path`, once it is asserted to exist.

    `ignore_errors` (in `_open_file`) asks a file it could not open again and
    again: TFRecordDataset never moves past one, so a shard gone or unreadable
    when a later epoch re-reads it would spin forever instead of failing. It
    fails here, naming the file, as its stream starts: right before the reader
    opens it, not when `interleave` builds the stream (which, with parallel
    reads, can be long before, while the file still exists).
    """
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


def _open_file(path: tf.Tensor, *, plan: _ReadPlan, checks: _ReadChecks) -> tf.data.Dataset:
    """The file's serialized records in batches of `plan.read_batch`."""
    batches = tf.data.TFRecordDataset(path, compression_type=plan.ctype).batch(plan.read_batch)
    # A read error ends this file's stream instead of the whole dataset;
    # the byte and record count check at its end then fails naming the file.
    return batches.ignore_errors() if checks.accounting else batches


def _count_and_share(
    state: tuple[tf.Tensor, tf.Tensor],
    batch: tf.Tensor,
    *,
    path: tf.Tensor,
    want_bytes: tf.Tensor,
    want_records: tf.Tensor,
    plan: _ReadPlan,
    checks: _ReadChecks,
) -> tuple[tuple[tf.Tensor, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """One `scan` step over a file's batches: counts them and keeps this pipeline's records.

    Args:
      state: Records and data bytes seen in the file so far.
      batch: Serialized records (empty: the end-of-file sentinel).
      path: The file.
      want_bytes: The file's expected bytes (-1: unknown).
      want_records: The file's expected records (-1: unknown).
      plan: The read plan (its `data_shards` and `pipeline_id`).
      checks: The read checks (whether and what to count).

    Returns:
      The new state and `(path, this pipeline's records of batch)`.
    """
    seen, data_bytes = state
    n = tf.size(batch, out_type=tf.int64)
    asserts = []
    if checks.accounting:
        if checks.count_bytes:
            data_bytes += tf.reduce_sum(tf.cast(tf.strings.length(batch), tf.int64))
            complete = tf.equal(data_bytes + layout.RECORD_OVERHEAD_BYTES * seen, want_bytes)
        else:
            complete = tf.equal(seen, want_records)
        # Only the empty end-of-file sentinel can fail the check.
        asserts.append(
            tf.debugging.Assert(
                tf.logical_or(n > 0, complete),
                [
                    "ingestion: TFRecord shard",
                    path,
                    "is corrupt, truncated or unreadable; restore the file or re-run the Transform. Records read, "
                    "bytes read (-1: not counted), records and bytes expected (-1: not known):",
                    seen,
                    data_bytes + layout.RECORD_OVERHEAD_BYTES * seen
                    if checks.count_bytes
                    else tf.constant(-1, tf.int64),
                    want_records,
                    want_bytes,
                ],
            )
        )
    with tf.control_dependencies(asserts):
        if plan.data_shards > 1:
            # Record-level sharding within the file: record j of the file
            # goes to pipeline j % data_shards, whatever the file order.
            out = tf.boolean_mask(
                batch, tf.equal((seen + tf.range(n)) % plan.data_shards, plan.pipeline_id)
            )
        else:
            out = tf.identity(batch)
    return (seen + n, data_bytes), (path, out)


def _parse_batches(ds: tf.data.Dataset, plan: _ReadPlan) -> tf.data.Dataset:
    """Parses the read batches, on the service's workers where `plan.remote` says.

    Raises:
      IngestionError: for `service.remote: augment` over variable-length features.
    """
    config = plan.config
    if plan.remote == "read":
        ds = _on_service(ds, plan, "reading the training files")
    ds = ds.map(
        _plain(functools.partial(_parse, spec=plan.spec)),
        num_parallel_calls=plan.parallel,
        deterministic=config.deterministic,
    )
    if plan.remote in ("parse", "augment"):
        if plan.fixed:
            # Unpacked on the workers: the trainer receives the model's features.
            ds = ds.map(
                _plain(functools.partial(_split_label, plan=plan)),
                num_parallel_calls=plan.parallel,
                deterministic=config.deterministic,
            )
            if plan.remote_map is not None:
                ds = ds.map(plan.remote_map, num_parallel_calls=plan.parallel, deterministic=False)
            if plan.codebooks:
                # Before the shuffle: the workers move a quarter of the bytes too. Values
                # from the recorded files are in their codebooks; a view's are checked.
                checked = plan.remote_map is not None
                ds = ds.map(
                    _plain(functools.partial(_encode, books=plan.codebooks, checked=checked)),
                    num_parallel_calls=plan.parallel,
                    deterministic=config.deterministic,
                )
            if plan.batched_remotely:
                # Receiving is this process's cost per element (a copy of every byte
                # and a fixed cost per batch): whole batches, ready to train on, cost
                # it least (`benchmarks/results/tfdata_service.json`).
                ds = _shuffle_and_batch(ds, plan)
        elif plan.remote_map is not None:
            raise IngestionError(
                "ingestion.service.remote: 'augment' needs fixed-length features (image views "
                "apply to dense images); set remote: parse"
            )
        ds = _on_service(ds, plan, "reading and parsing the training files")
    return ds


def _parse(path: tf.Tensor, serialized: tf.Tensor, *, spec: Mapping) -> dict:
    """A batch of serialized tf.Examples parsed with `spec`."""
    # example_names puts the file into every parse error message.
    return tf.io.parse_example(serialized, spec, example_names=tf.fill(tf.shape(serialized), path))


def _encode(
    features: Mapping, label: tf.Tensor, *, books: Mapping, checked: bool
) -> tuple[dict, tf.Tensor]:
    return codes.encode_features(features, books, checked), label


def _split_label(parsed: Mapping, *, plan: _ReadPlan) -> tuple[dict, tf.Tensor]:
    """`(features, label)` of parsed features, the packed feature unpacked."""
    parsed = dict(parsed)
    if plan.packing is not None:
        parsed.update(plan.packing.unpack(parsed.pop(plan.packing.feature)))
    label = parsed.pop(plan.label_key)
    return parsed, label


def _on_service(remote_part: tf.data.Dataset, plan: _ReadPlan, what: str) -> tf.data.Dataset:
    """`remote_part`'s elements, produced by the tf.data service's workers."""
    if plan.training and plan.cache == "none" and not plan.batched_remotely:
        # One job for the whole run: repeated on the workers (their split
        # provider starts each epoch over), not by a new job per epoch here,
        # which would stall every epoch's end for the client's task refresh (~1 s).
        remote_part = remote_part.repeat()
    # Prefetched on the worker: it makes the next batch while one is in transit.
    served = service.distribute(
        remote_part.prefetch(AUTOTUNE), plan.config.service, plan.service_job, what=what
    )
    if not plan.batched_remotely:
        # Whatever arrives is shuffled and re-batched here, which buffers it.
        return served
    return served.prefetch(_service_prefetch(served.element_spec, plan))


def _service_prefetch(spec, plan: _ReadPlan) -> int:
    """Batches to buffer of what the workers hand over: `ingestion.prefetch` when set, else
    `SERVICE_PREFETCH_BYTES` worth of batches (within 2 and `SERVICE_PREFETCH_MAX`)."""
    if plan.config.prefetch > 0:
        return plan.config.prefetch
    per_example = sum(math.prod(s.shape[1:]) * s.dtype.size for s in tf.nest.flatten(spec))
    batch_bytes = max(1, per_example * plan.per_replica_batch)
    return max(2, min(SERVICE_PREFETCH_MAX, SERVICE_PREFETCH_BYTES // batch_bytes))


def _cache_parsed(ds: tf.data.Dataset, plan: _ReadPlan) -> tf.data.Dataset:
    """`ds` cached as `plan.cache` says (unchanged for `none`)."""
    if plan.cache == "none":
        return ds
    # Cached as parsed (and still packed: one tensor per batch to mix and
    # re-slice instead of one per feature), after all reading and parsing.
    if plan.cache == "file":
        suffix = f"_pipeline{plan.pipeline_id}" if plan.num_pipelines > 1 else ""
        return ds.cache(plan.cache_path + suffix)
    return ds.cache("")


def _batch_examples(ds: tf.data.Dataset, plan: _ReadPlan) -> tf.data.Dataset:
    """`_shuffle_and_batch`, unless the service's workers did it (`plan.batched_remotely`)."""
    return ds if plan.batched_remotely else _shuffle_and_batch(ds, plan)


def _shuffle_and_batch(ds: tf.data.Dataset, plan: _ReadPlan) -> tf.data.Dataset:
    """Parsed batches shuffled (when training), split into `(features, label)` and re-batched.

    Training repeats forever and yields full batches of `plan.per_replica_batch`;
    otherwise one pass, the last batch possibly smaller.
    """
    config = plan.config
    split = _plain(functools.partial(_split_label, plan=plan))
    if not plan.fixed:
        # Sparse features cannot be re-sliced or gathered as batches: mix and
        # re-batch them example by example (slower, same semantics).
        ds = ds.unbatch()
        if plan.shuffle:
            ds = ds.shuffle(config.shuffle_buffer, seed=plan.seed, reshuffle_each_iteration=True)
        if plan.training:
            ds = ds.repeat()
        ds = ds.batch(plan.per_replica_batch, drop_remainder=plan.training)
        return ds.map(split, num_parallel_calls=plan.parallel, deterministic=config.deterministic)
    if plan.shuffle:
        window = max(1, math.ceil(config.shuffle_buffer / plan.read_batch))
        ds = ds.shuffle(window, seed=plan.seed, reshuffle_each_iteration=True)
        ds = _permute_windows(
            ds, window * plan.read_batch, plan.seed, plan.parallel, config.deterministic
        )
    if not plan.unpacked_remotely:
        # Unpacked on big batches (few calls); `rebatch` then only slices.
        ds = ds.map(split, num_parallel_calls=plan.parallel, deterministic=config.deterministic)
    if plan.training:
        ds = ds.repeat()
    return ds.rebatch(plan.per_replica_batch, drop_remainder=plan.training)


def _with_options(ds: tf.data.Dataset, config: IngestionConfig) -> tf.data.Dataset:
    """`ds` prefetched, with the pipeline's determinism and autotuning, and no auto-sharding."""
    ds = ds.prefetch(_tune(config.prefetch))
    options = tf.data.Options()
    options.deterministic = config.deterministic
    options.autotune.enabled = True
    # Sharding is done explicitly (`_read_files`, `_count_and_share`); stop tf.distribute from re-sharding.
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
    return tf.data.Dataset.zip((ds, seeds)).map(
        _permute, num_parallel_calls=parallel, deterministic=deterministic
    )


@_plain
def _permute(batch, pair: tf.Tensor):
    """`batch`'s examples in a random order drawn from the stateless seed `pair`."""
    size = tf.shape(tf.nest.flatten(batch)[0])[0]
    order = tf.random.experimental.stateless_shuffle(tf.range(size), seed=pair)
    return tf.nest.map_structure(lambda t: tf.gather(t, order), batch)
