"""The tf.data input pipeline on files written by the Transform's own encoder.

Each dataset is small and written without a Beam runner (the Transform
writer's `EncodeExamplesFn`, round-robin into shards, plus its layout
record), so these tests exercise the real record format quickly. Every example
carries a unique `uid`, so multisets and orders of examples can be compared.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from tensorflow_transform.tf_metadata import schema_utils
from tfx_bsl.public import tfxio

from components.config import IngestionConfig
from components.data import ingestion, memory
from components.data import layout as transform_layout
from testkit import transform as transformed_files

LABEL = "label"
# A transformed spec with every kind the pipeline handles: floats (scalar and
# vector), an integer id, an int64 scalar label, and a string (never packed).
SPEC = {
    "uid": tf.io.FixedLenFeature([1], tf.float32),
    "vec": tf.io.FixedLenFeature([3], tf.float32),
    "cat": tf.io.FixedLenFeature([1], tf.int64),
    "tag": tf.io.FixedLenFeature([1], tf.string),
    LABEL: tf.io.FixedLenFeature([], tf.int64),
}
NUM_EXAMPLES = 1000
BATCH = 32
CONFIG = IngestionConfig(
    batch_size=BATCH, eval_batch_size=BATCH, shuffle_buffer=200, deterministic=True
)
# Examples per record batch handed to the encoder, as TFT hands them over.
CHUNK = 128


def _column(values: np.ndarray, width: int) -> pa.Array:
    rows = len(values) // width
    return pa.LargeListArray.from_arrays(
        pa.array(np.arange(0, rows * width + 1, width, dtype=np.int64)), pa.array(values)
    )


def _record_batches(n: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    uid = np.arange(n, dtype=np.float32)
    # 64 levels, z-scored as the Transform does pixels: a codebook of 64 values.
    levels = rng.integers(0, 64, 3 * n).astype(np.float32) / np.float32(63.0)
    vec = ((levels - np.float32(0.4)) / np.float32(0.3)).astype(np.float32)
    cat = rng.integers(0, 50, n, dtype=np.int64)
    tag = np.array([f"t{i % 5}".encode() for i in range(n)], dtype=object)
    label = rng.integers(0, 2, n, dtype=np.int64)
    batches = []
    for s in range(0, n, CHUNK):
        e = min(n, s + CHUNK)
        batches.append(
            pa.RecordBatch.from_arrays(
                [
                    _column(uid[s:e], 1),
                    _column(vec[3 * s : 3 * e], 3),
                    _column(cat[s:e], 1),
                    pa.LargeListArray.from_arrays(
                        pa.array(np.arange(e - s + 1, dtype=np.int64)),
                        pa.array(list(tag[s:e]), pa.large_binary()),
                    ),
                    _column(label[s:e], 1),
                ],
                ["uid", "vec", "cat", "tag", LABEL],
            )
        )
    return batches


@dataclasses.dataclass
class Written:
    files: list[str]
    layout: transform_layout.Layout

    def make(self, config=CONFIG, *, training=True, **kwargs):
        return ingestion.make_dataset(
            self.files,
            self.layout.feature_spec(),
            LABEL,
            config,
            batch_size=kwargs.pop("batch_size", BATCH),
            compression=self.layout.compression,
            training=training,
            packing=self.layout.packing,
            shard_stats=kwargs.pop("shard_stats", self.layout.shard_stats()),
            seed=kwargs.pop("seed", 3),
            **kwargs,
        )


def write(
    directory, *, pack: bool, compression: str, num_shards: int = 4, n: int = NUM_EXAMPLES
) -> Written:
    """Writes `n` examples as the tfxkit Transform encodes them; returns files and layout."""
    files, built = transformed_files.write_transformed_files(
        str(directory),
        SPEC,
        _record_batches(n),
        num_shards=num_shards,
        compression=compression,
        pack=pack,
    )
    return Written(files, built)


def _rows(features, label) -> list[tuple]:
    """Canonical per-example tuples of a parsed batch."""
    uid = np.asarray(features["uid"]).reshape(-1)
    vec = np.asarray(features["vec"]).reshape(len(uid), -1)
    cat = np.asarray(features["cat"]).reshape(-1)
    tag = np.asarray(features["tag"]).reshape(-1)
    label = np.asarray(label).reshape(-1)
    return [
        (int(uid[i]), tuple(np.round(vec[i], 5)), int(cat[i]), bytes(tag[i]), int(label[i]))
        for i in range(len(uid))
    ]


def take_examples(ds: tf.data.Dataset, n: int | None = None) -> list[tuple]:
    """The first `n` examples (all when None) in order."""
    out = []
    for features, label in ds:
        out.extend(_rows(features, label))
        if n is not None and len(out) >= n:
            break
    return out if n is None else out[:n]


def stock_examples(written: Written) -> list[tuple]:
    """What stock TFX (tfx_bsl's TFExampleRecord) reads from unpacked files."""
    schema = schema_utils.schema_from_feature_spec(SPEC)
    source = tfxio.TFExampleRecord(file_pattern=written.files, schema=schema)
    ds = source.TensorFlowDataset(
        tfxio.TensorFlowDatasetOptions(
            batch_size=BATCH, num_epochs=1, shuffle=False, label_key=LABEL
        )
    )
    return take_examples(ds)


@pytest.mark.parametrize("pack", [True, False])
def test_the_layout_records_a_codebook_for_each_float_feature_of_few_values(tmp_path, pack):
    """`vec`'s 64 levels get one, with each value once; `uid` (1,000 values) none."""
    written = write(tmp_path, pack=pack, compression="none")
    assert set(written.layout.codebooks) == {"vec"}
    values = np.concatenate([b.column(1).flatten().to_numpy() for b in _record_batches(1000)])
    assert written.layout.codebooks["vec"] == tuple(np.unique(values).tolist())
    again = transform_layout.Layout.from_json(written.layout.to_json())
    assert again.codebooks == written.layout.codebooks


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return write(tmp_path_factory.mktemp("packed"), pack=True, compression="none")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same examples in stock format (unpacked GZIP), read by stock TFX."""
    written = write(tmp_path_factory.mktemp("stock"), pack=False, compression="gzip")
    return sorted(stock_examples(written))


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_one_epoch_equals_stock_multiset(tmp_path, reference, pack, compression):
    written = write(tmp_path, pack=pack, compression=compression)
    assert len(reference) == NUM_EXAMPLES
    epoch = take_examples(written.make(training=True), NUM_EXAMPLES)
    assert sorted(epoch) == reference
    assert sorted(take_examples(written.make(training=False))) == reference
    if not pack:
        # Unpacked output stays readable by stock TFX readers.
        assert sorted(stock_examples(written)) == reference


def test_layout_describes_the_files(packed):
    layout = packed.layout
    assert layout.packing is not None
    assert [m.name for m in layout.packing.members] == ["uid", "vec", "cat", LABEL]
    assert layout.packing.width == 1 + 3 + 1 + 1
    assert set(layout.feature_spec()) == {transform_layout.PACKED_FEATURE, "tag"}
    assert sum(f.stats.records for f in layout.files) == NUM_EXAMPLES
    for path in packed.files:
        # Every record parses with the recorded spec (parse_example is strict).
        for serialized in tf.data.TFRecordDataset(path).batch(1000):
            tf.io.parse_example(serialized, layout.feature_spec())


# Shards -> the sharding each worker count gets: by file with enough files
# (an exact multiple, or two per worker), by record otherwise.
POLICIES = {
    6: {1: "none", 2: "file", 3: "file"},
    1: {1: "none", 2: "data", 3: "data"},
    4: {2: "file", 3: "data"},
}


@pytest.mark.parametrize(
    "num_shards,workers",
    [(s, w) for s, by_workers in POLICIES.items() for w in by_workers],
    ids=lambda v: str(v),
)
def test_workers_share_every_example_exactly_once(tmp_path, num_shards, workers):
    written = write(tmp_path, pack=True, compression="none", num_shards=num_shards, n=301)
    assert ingestion.shard_policy(num_shards, workers) == POLICIES[num_shards][workers]
    shares = []
    for worker in range(workers):
        context = tf.distribute.InputContext(workers, worker, workers)
        eval_share = take_examples(
            written.make(training=False, input_context=context, batch_size=BATCH * workers)
        )
        # The training stream's first epoch is exactly the same share.
        train_share = take_examples(
            written.make(training=True, input_context=context, batch_size=BATCH * workers),
            len(eval_share),
        )
        assert sorted(train_share) == sorted(eval_share)
        shares.append(eval_share)
    counts = collections.Counter(uid for share in shares for (uid, *_) in share)
    assert set(counts) == set(range(301)), "an example was dropped"
    assert set(counts.values()) == {1}, "an example went to two workers"


def test_cache_does_not_change_epoch_contents(packed):
    plain = take_examples(
        packed.make(dataclasses.replace(CONFIG, cache="none"), training=True), 2 * NUM_EXAMPLES
    )
    cached = take_examples(
        packed.make(dataclasses.replace(CONFIG, cache="memory"), training=True), 2 * NUM_EXAMPLES
    )
    for start in (0, NUM_EXAMPLES):
        assert sorted(plain[start : start + NUM_EXAMPLES]) == sorted(
            cached[start : start + NUM_EXAMPLES]
        )
        assert len(set(cached[start : start + NUM_EXAMPLES])) == NUM_EXAMPLES


def test_file_cache_matches_memory_cache(packed, tmp_path):
    config = dataclasses.replace(CONFIG, cache="file", shuffle_buffer=0)
    from_file = take_examples(
        packed.make(config, cache_path=str(tmp_path / "cache")), 2 * NUM_EXAMPLES
    )
    in_memory = take_examples(
        packed.make(dataclasses.replace(config, cache="memory")), 2 * NUM_EXAMPLES
    )
    assert from_file == in_memory
    assert tf.io.gfile.glob(str(tmp_path / "cache*"))


# Long enough for the reader's workers to finish opening the files they started.
SETTLE_S = 1.0


def _error_without_its_files(written: Written, config: IngestionConfig, **kwargs) -> str | None:
    """The error a training dataset raises once its files are gone; None if it reads on.

    Two epochs are drawn first, so a cache is complete; then the shards are
    deleted and two more epochs are drawn. Only a cached dataset gets them.
    """
    iterator = iter(written.make(config, training=True, **kwargs))
    epoch_batches = -(-NUM_EXAMPLES // BATCH)
    for _ in range(2 * epoch_batches):
        next(iterator)
    # The reader's background workers start the next epoch's files as the last
    # batches are drawn: they check a file is there and open it. A file removed
    # between those two steps is retried by TensorFlow's reader forever
    # (`ingestion._assert_present`), a window the product narrows to the open call
    # itself; the test lets the workers settle so it removes files the way a
    # user does, not inside that window.
    time.sleep(SETTLE_S)
    for path in written.files:
        os.remove(path)
    try:
        for _ in range(2 * epoch_batches):
            next(iterator)
    except (tf.errors.OpError, ingestion.IngestionError) as e:
        return str(e)
    return None


@pytest.mark.parametrize("cache", ["auto", "memory"])
def test_auto_cache_keeps_small_recorded_data_in_memory(tmp_path, cache):
    written = write(tmp_path, pack=False, compression="gzip")
    assert _error_without_its_files(written, dataclasses.replace(CONFIG, cache=cache)) is None


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_a_shard_gone_after_the_first_epoch_fails_naming_it(tmp_path, compression):
    # Without a cache every epoch opens the files again: a vanished shard must
    # fail the read (not spin: the reader would retry a file it cannot open forever).
    written = write(tmp_path, pack=False, compression=compression)
    error = _error_without_its_files(written, dataclasses.replace(CONFIG, cache="none"))
    assert error is not None and "is gone" in error
    assert any(os.path.basename(path) in error for path in written.files)


def test_auto_cache_reads_files_again_when_the_data_would_not_fit(tmp_path, monkeypatch):
    written = write(tmp_path, pack=False, compression="gzip")
    estimate = ingestion.parsed_bytes(SPEC, written.layout.shard_stats(), written.files)
    # Room for the estimate, but not within the share `auto` may take.
    room = int(estimate / ingestion.AUTO_CACHE_SHARE) - 1
    monkeypatch.setattr(memory, "available_bytes", lambda: room)
    assert "is gone" in _error_without_its_files(written, CONFIG)


def test_auto_cache_reads_files_again_without_recorded_stats(tmp_path):
    # Uncompressed files without stats are checked against their own sizes.
    written = write(tmp_path, pack=False, compression="none")
    assert "is gone" in _error_without_its_files(written, CONFIG, shard_stats=None)


def test_parsed_bytes_counts_serialized_records_and_dense_values(tmp_path):
    written = write(tmp_path, pack=False, compression="none", num_shards=2)
    stats = written.layout.shard_stats()
    # uid 1 float, vec 3 floats, cat 1 int64, tag 1 string, label 1 int64.
    dense = 4 + 3 * 4 + 8 + ingestion._STRING_VALUE_BYTES + 8
    raw = sum(stats[f].raw_bytes for f in written.files)
    assert ingestion.parsed_bytes(SPEC, stats, written.files) == raw + NUM_EXAMPLES * dense
    assert ingestion.parsed_bytes(SPEC, None, written.files) is None
    # A file the stats do not cover leaves the size unknown.
    assert ingestion.parsed_bytes(SPEC, stats, [*written.files, "other"]) is None


@pytest.mark.parametrize(
    "kind,estimate,available,pipelines,expected",
    [
        ("auto", 100, 500, 1, "memory"),
        ("auto", 101, 500, 1, "none"),
        ("auto", 200, 500, 2, "memory"),
        ("auto", None, 500, 1, "none"),
        ("auto", 100, None, 1, "none"),
        ("none", 1, 10**12, 1, "none"),
        ("memory", 10**12, 1, 1, "memory"),
        ("file", 1, 1, 1, "file"),
    ],
)
def test_resolve_cache(kind, estimate, available, pipelines, expected):
    # AUTO_CACHE_SHARE of 500 bytes is 100: each pipeline's share must fit in it.
    assert ingestion.AUTO_CACHE_SHARE * 500 == 100
    assert ingestion.resolve_cache(kind, estimate, available, pipelines) == expected


def test_shuffle_reorders_every_epoch(packed):
    stream = take_examples(packed.make(training=True), 3 * NUM_EXAMPLES)
    epochs = [stream[i * NUM_EXAMPLES : (i + 1) * NUM_EXAMPLES] for i in range(3)]
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    # Examples mix across batches, not only batch order.
    first_batches = [{uid for uid, *_ in e[:BATCH]} for e in epochs]
    assert first_batches[0] != first_batches[1]
    # A fixed seed and deterministic=True reproduce the same stream.
    assert take_examples(packed.make(training=True), 3 * NUM_EXAMPLES) == stream


@pytest.mark.parametrize("cache", ["none", "memory"])
def test_deterministic_without_shuffle_never_reorders(packed, cache):
    config = dataclasses.replace(CONFIG, shuffle_buffer=0, deterministic=True, cache=cache)
    stream = take_examples(packed.make(config, training=True), 3 * NUM_EXAMPLES)
    assert (
        stream[:NUM_EXAMPLES]
        == stream[NUM_EXAMPLES : 2 * NUM_EXAMPLES]
        == stream[2 * NUM_EXAMPLES :]
    )
    assert take_examples(packed.make(config, training=True), NUM_EXAMPLES) == stream[:NUM_EXAMPLES]
    assert stream[:NUM_EXAMPLES] == take_examples(packed.make(config, training=False))


def test_training_batches_are_full_and_typed(packed):
    features, label = next(iter(packed.make(training=True, batch_size=48)))
    assert label.shape == (48,) and label.dtype == tf.int64
    assert features["vec"].shape == (48, 3) and features["vec"].dtype == tf.float32
    assert features["cat"].shape == (48, 1) and features["cat"].dtype == tf.int64
    assert features["tag"].dtype == tf.string
    assert LABEL not in features and transform_layout.PACKED_FEATURE not in features


def test_sparse_features_take_the_example_path(tmp_path):
    # A VarLen feature cannot be re-sliced as dense batches; results must not change.
    written = write(tmp_path, pack=False, compression="none", n=100)
    spec = dict(written.layout.feature_spec(), tag=tf.io.VarLenFeature(tf.string))
    ds = ingestion.make_dataset(
        written.files, spec, LABEL, CONFIG, batch_size=BATCH, compression="none", training=False
    )
    uids = []
    for features, _ in ds:
        assert isinstance(features["tag"], tf.SparseTensor)
        uids.extend(int(u) for u in features["uid"].numpy().reshape(-1))
    assert sorted(uids) == list(range(100))


# --------------------------------------------------------------------------- #
# Bad input: every failure names the file (and the feature where there is one).
# --------------------------------------------------------------------------- #


def _corrupt_middle(path):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_corrupt_shard_fails_naming_the_file(tmp_path, compression):
    written = write(tmp_path, pack=True, compression=compression)
    bad = written.files[2]
    _corrupt_middle(bad)
    # Found while reading (or, for gzip, already by the first-record check,
    # since zlib inflates a whole buffer): either way the file is named.
    with pytest.raises(
        (ingestion.IngestionError, tf.errors.InvalidArgumentError),
        match=rf"TFRecord shard.*{os.path.basename(bad)}.*corrupt, truncated or unreadable",
    ):
        take_examples(written.make(training=False))


def test_shard_truncated_at_a_record_boundary_fails_before_reading(tmp_path):
    written = write(tmp_path, pack=True, compression="none")
    bad = written.files[1]
    records = [r.numpy() for r in tf.data.TFRecordDataset(bad)]
    with tf.io.TFRecordWriter(bad) as w:
        for r in records[:-3]:
            w.write(r)
    with pytest.raises(
        ingestion.IngestionError,
        match=rf"shard '.*{os.path.basename(bad)}' has \d+ bytes but the Transform wrote",
    ):
        written.make(training=False)


def test_truncated_shard_without_layout_fails_naming_the_file(tmp_path):
    written = write(tmp_path, pack=True, compression="none")
    bad = written.files[0]
    data = open(bad, "rb").read()
    open(bad, "wb").write(data[: len(data) - 7])
    ds = ingestion.make_dataset(
        written.files,
        written.layout.feature_spec(),
        LABEL,
        CONFIG,
        batch_size=BATCH,
        compression="none",
        training=False,
        packing=written.layout.packing,
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"TFRecord shard.*{os.path.basename(bad)}.*corrupt, truncated or unreadable",
    ):
        take_examples(ds)


def test_shard_missing_the_packed_feature_names_file_and_feature(tmp_path):
    packed = write(tmp_path / "p", pack=True, compression="none")
    unpacked = write(tmp_path / "u", pack=False, compression="none")
    # One shard replaced by an unpacked one (and its stats, so only the format differs).
    bad = packed.files[3]
    tf.io.gfile.copy(unpacked.files[3], bad, overwrite=True)
    stats = dict(
        packed.layout.shard_stats(), **{bad: unpacked.layout.shard_stats()[unpacked.files[3]]}
    )
    with pytest.raises(
        ingestion.IngestionError,
        match=rf"packed feature 'packed_features' is missing from '.*{os.path.basename(bad)}'",
    ):
        ingestion.make_dataset(
            packed.files,
            packed.layout.feature_spec(),
            LABEL,
            CONFIG,
            batch_size=BATCH,
            compression="none",
            training=True,
            packing=packed.layout.packing,
            shard_stats=stats,
        )


def test_record_missing_the_packed_feature_mid_file_names_file_and_feature(tmp_path):
    packed = write(tmp_path / "p", pack=True, compression="none")
    unpacked = write(tmp_path / "u", pack=False, compression="none")
    bad = packed.files[0]
    records = [r.numpy() for r in tf.data.TFRecordDataset(bad)]
    records[100] = next(iter(tf.data.TFRecordDataset(unpacked.files[0]))).numpy()
    with tf.io.TFRecordWriter(bad) as w:
        for r in records:
            w.write(r)
    ds = ingestion.make_dataset(
        packed.files,
        packed.layout.feature_spec(),
        LABEL,
        CONFIG,
        batch_size=BATCH,
        compression="none",
        training=False,
        packing=packed.layout.packing,
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"Name: .*{os.path.basename(bad)}, Feature: packed_features",
    ):
        take_examples(ds)


@pytest.mark.parametrize(
    "feature,wrong,message",
    [
        (
            "vec",
            tf.io.FixedLenFeature([4], tf.float32),
            r"feature 'vec' in '.*' has 3 values but the parse spec expects 4",
        ),
        (
            "cat",
            tf.io.FixedLenFeature([1], tf.float32),
            r"feature 'cat' in '.*' holds a int64_list but the parse spec expects float32",
        ),
        (
            "extra",
            tf.io.FixedLenFeature([1], tf.float32),
            r"feature 'extra' of the parse spec is missing from '.*'",
        ),
    ],
)
def test_parse_spec_disagreeing_with_files_names_file_and_feature(
    tmp_path, feature, wrong, message
):
    written = write(tmp_path, pack=False, compression="none", n=50)
    spec = dict(written.layout.feature_spec(), **{feature: wrong})
    with pytest.raises(ingestion.IngestionError, match=message + r".*re-run the Transform"):
        ingestion.make_dataset(
            written.files,
            spec,
            LABEL,
            CONFIG,
            batch_size=BATCH,
            compression="none",
            training=False,
            shard_stats=written.layout.shard_stats(),
        )


def test_unrecorded_and_missing_shards_are_named(packed, tmp_path):
    stray = str(tmp_path / "Split-train" / "stray.tfrecord")
    with pytest.raises(
        ingestion.IngestionError,
        match=r"'.*stray\.tfrecord' is not among the 4 shards the Transform recorded",
    ):
        ingestion.make_dataset(
            packed.files + [stray],
            packed.layout.feature_spec(),
            LABEL,
            CONFIG,
            batch_size=BATCH,
            compression="none",
            training=False,
            packing=packed.layout.packing,
            shard_stats=packed.layout.shard_stats(),
        )
    with pytest.raises(
        transform_layout.LayoutError, match=r"'.*stray\.tfrecord' is not among the 4 shards"
    ):
        packed.layout.check_listed(packed.files + [stray])
    with pytest.raises(
        transform_layout.LayoutError,
        match=rf"shard '.*{os.path.basename(packed.files[2])}' .* is missing",
    ):
        packed.layout.check_listed(packed.files[:2] + packed.files[3:])


def test_bad_arguments_name_the_field(packed):
    with pytest.raises(
        ingestion.IngestionError, match=r"transform\.compression: expected 'gzip' or 'none'"
    ):
        ingestion.make_dataset(
            packed.files,
            packed.layout.feature_spec(),
            LABEL,
            CONFIG,
            batch_size=8,
            compression="zip",
            training=False,
        )
    with pytest.raises(
        ingestion.IngestionError, match=r"ingestion\.cache: 'file' needs a cache path"
    ):
        packed.make(dataclasses.replace(CONFIG, cache="file"))
    with pytest.raises(
        ingestion.IngestionError, match=r"label 'nope' is not among the parsed features"
    ):
        ingestion.make_dataset(
            packed.files,
            packed.layout.feature_spec(),
            "nope",
            CONFIG,
            batch_size=8,
            compression="none",
            training=False,
            packing=packed.layout.packing,
        )
    with pytest.raises(ingestion.IngestionError, match=r"no input files"):
        ingestion.make_dataset(
            [], {}, LABEL, CONFIG, batch_size=8, compression="none", training=False
        )
