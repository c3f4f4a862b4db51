"""Stored Transform output resolved once for both front doors (`components.data.stored_input`).

The resolver is tested on small shards written here directly (a layout record
over uncompressed packed shards, stock-like files compressed or not under any
name); the last tests run both front doors, the Trainer's `make_datasets` and
the stock-compatible `tf_dataset_factory`, over real transformed penguins
re-written the ways stock output may come, and check they read the same
examples (before one resolver they disagreed: the Trainer assumed stock output
was gzip, the factory took the compression from the file names).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import tensorflow as tf
import tensorflow_transform as tft
from tfx_bsl.public.tfxio import TensorFlowDatasetOptions

from components.config.dropin import DropInSettings
from components.data import layout, stored_input
from components.data.layout import IngestionError, LayoutError
from components.trainer import data_accessor
from components.training import fit as training
from components.training.inputs import make_datasets
from tests.components.training import penguins

SPEC = {
    "x": tf.io.FixedLenFeature([2], tf.float32),
    "label": tf.io.FixedLenFeature([1], tf.int64),
}
NUM_EXAMPLES = 40
NUM_SHARDS = 4
# An uncompressed TFRecord starts with its first record's length, little-endian:
# a record of this many bytes makes the file start with the gzip magic 1f 8b.
GZIP_MAGIC_LENGTH = 0x8B1F


def _example(i: int) -> bytes:
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i, -i])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path: str, records, compression: str) -> str:
    options = tf.io.TFRecordOptions(compression_type=layout.compression_type(compression))
    with tf.io.TFRecordWriter(path, options) as writer:
        for record in records:
            writer.write(record)
    return path


def _records(path: str, compression: str) -> list[bytes]:
    ds = tf.data.TFRecordDataset(path, compression_type=layout.compression_type(compression))
    return [r.numpy() for r in ds]


# --------------------------------------------------------------------------- #
# Compression, read from the files.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", ["data.gz", "data.tfrecord", "data-00000-of-00001"])
@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_compression_is_read_from_the_bytes_whatever_the_name(tmp_path, name, compression):
    path = _write(str(tmp_path / name), [_example(i) for i in range(3)], compression)
    assert stored_input.file_compression(path) == compression
    assert stored_input.detect_compression([path]) == compression


def test_an_uncompressed_record_that_starts_like_gzip_is_uncompressed(tmp_path):
    # The magic bytes alone would call this file gzip; its valid TFRecord
    # header (length + masked CRC32C, as TensorFlow wrote it) says otherwise.
    record = b"\x07" * GZIP_MAGIC_LENGTH
    path = _write(str(tmp_path / "big.gz"), [record], "none")
    with open(path, "rb") as f:
        assert f.read(2) == stored_input.GZIP_MAGIC
    assert stored_input.file_compression(path) == "none"
    assert _records(path, stored_input.detect_compression([path])) == [record]


def test_empty_files_say_nothing_and_mixed_files_are_refused(tmp_path):
    empty = str(tmp_path / "empty.tfrecord")
    open(empty, "wb").close()
    assert stored_input.file_compression(empty) is None
    assert stored_input.detect_compression([empty]) == "none"
    gz = _write(str(tmp_path / "a.gz"), [_example(0)], "gzip")
    assert stored_input.detect_compression([empty, gz]) == "gzip"
    plain = _write(str(tmp_path / "b.tfrecord"), [_example(1)], "none")
    with pytest.raises(
        IngestionError, match=r"'.*a\.gz' is gzip-compressed but '.*b\.tfrecord' is not"
    ):
        stored_input.detect_compression([gz, empty, plain])


# --------------------------------------------------------------------------- #
# Resolving: layout record or stock output.
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class Recorded:
    files: list[str]
    record: layout.Layout


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Recorded:
    """Packed uncompressed shards of a `train` split with their layout record."""
    directory = tmp_path_factory.mktemp("recorded")
    packing = layout.plan_packing(SPEC)

    def packed(i):
        # Storage order: float members, then int members (see `layout.Packing`).
        values = tf.train.FloatList(value=[i, -i, i % 2])
        feature = {packing.feature: tf.train.Feature(float_list=values)}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    files = [
        _write(
            str(directory / f"shard-{s}{layout.shard_suffix('none')}"),
            [packed(i) for i in range(s, NUM_EXAMPLES, NUM_SHARDS)],
            "none",
        )
        for s in range(NUM_SHARDS)
    ]
    record = layout.Layout(
        compression="none",
        num_shards=NUM_SHARDS,
        packing=packing,
        parse_spec=layout.spec_to_json(layout.file_spec(SPEC, packing)),
        files=tuple(layout.ShardFile(f, "train", layout.scan_shard(f, "none")) for f in files),
    )
    return Recorded(files, record)


def _pattern(files) -> str:
    return os.path.join(os.path.dirname(files[0]), "*")


def test_a_layout_record_gives_spec_packing_compression_and_stats(recorded):
    stored = stored_input.resolve(_pattern(recorded.files), SPEC, recorded.record, reader="Trainer")
    assert stored.files == tuple(recorded.files)
    assert stored.recorded
    assert stored.packing == recorded.record.packing
    assert set(stored.feature_spec) == {layout.PACKED_FEATURE}
    assert stored.compression == "none"
    assert stored.shard_stats == recorded.record.shard_stats()
    # The reader yields the packed members, not the packed vector.
    assert stored.produced == {"x", "label"}


def test_files_the_record_does_not_list_are_refused_or_read_as_stock(recorded, tmp_path):
    stray = _write(str(tmp_path / "stray.gz"), [_example(i) for i in range(5)], "gzip")
    patterns = [_pattern(recorded.files), stray]
    with pytest.raises(
        LayoutError, match=r"'.*stray\.gz' is not among the 4 shards the Transform recorded"
    ):
        stored_input.resolve(patterns, SPEC, recorded.record, reader="Trainer")
    # A user's run_fn reading other examples beside the record: stock output.
    stored = stored_input.resolve(
        [stray], SPEC, recorded.record, reader="tf_dataset_factory", accept_unrecorded=True
    )
    assert not stored.recorded and stored.packing is None
    assert (stored.compression, stored.feature_spec) == ("gzip", SPEC)
    assert stored.produced == set(SPEC)


@pytest.mark.parametrize("accept_unrecorded", [False, True])
def test_a_missing_recorded_shard_is_refused_by_every_reader(recorded, accept_unrecorded):
    with pytest.raises(LayoutError, match=r"shard '.*shard-2\.tfrecord' \(10 records.*missing"):
        stored_input.resolve(
            recorded.files[:2] + recorded.files[3:],
            SPEC,
            recorded.record,
            reader="Trainer",
            accept_unrecorded=accept_unrecorded,
        )


def test_stock_output_keeps_the_given_spec_and_lists_each_file_once(tmp_path):
    files = [_write(str(tmp_path / f"part-{i}"), [_example(i)], "gzip") for i in range(2)]
    stored = stored_input.resolve(
        [str(tmp_path / "part-*"), files[0]], SPEC, None, reader="Trainer"
    )
    assert stored.files == tuple(files)
    assert (stored.feature_spec, stored.packing, stored.shard_stats) == (SPEC, None, None)
    assert stored.compression == "gzip"
    with pytest.raises(
        ValueError, match=r"Trainer: no transformed example files match \['.*nothing-\*'\]"
    ):
        stored_input.resolve(
            [str(tmp_path / "nothing-*")],
            SPEC,
            None,
            reader="Trainer",
            what="transformed example files",
        )
    with pytest.raises(ValueError, match=r"tf_dataset_factory: no files match \['.*nothing'\]"):
        stored_input.resolve(str(tmp_path / "nothing"), SPEC, None, reader="tf_dataset_factory")


def test_the_cache_path_is_one_per_file_list(recorded, tmp_path):
    scratch = str(tmp_path / "scratch")

    def cache_path(files, record):
        return stored_input.resolve(files, SPEC, record, reader="Trainer").cache_path(scratch)

    everything = cache_path(recorded.files, recorded.record)
    assert os.path.dirname(everything) == os.path.join(scratch, "ingestion_cache")
    assert os.path.isdir(os.path.dirname(everything))
    assert cache_path(list(reversed(recorded.files)), recorded.record) == everything
    stray = _write(str(tmp_path / "stray.gz"), [_example(0)], "gzip")
    assert cache_path([stray], None) != everything


# --------------------------------------------------------------------------- #
# Both front doors over the same stock output.
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def penguin_data(tmp_path_factory, penguin_inputs):
    """Real transformed penguins as stock TFX Transform writes them (gzip `.gz`, no record)."""
    root = str(tmp_path_factory.mktemp("penguins_stored"))
    return penguins.penguins_config(), penguin_inputs, root


# How stock-like output may be stored: stock's own form, gzip under another
# name, and uncompressed (the Trainer used to assume gzip, the factory to trust
# the name).
REWRITES = {
    "gzip_named_gz": ("gzip", ".gz"),
    "gzip_unnamed": ("gzip", ""),
    "uncompressed": ("none", ".tfrecord"),
}


@pytest.mark.parametrize("rewrite", sorted(REWRITES))
def test_both_front_doors_read_the_same_stock_output(penguin_data, tmp_path, rewrite):
    config, data, root = penguin_data
    compression, suffix = REWRITES[rewrite]
    split_dir = tmp_path / "eval"
    split_dir.mkdir()
    for i, path in enumerate(data.eval_files):
        _write(str(split_dir / f"data-{i}{suffix}"), _records(path, "gzip"), compression)
    pattern = str(split_dir / "*")
    tft_output = tft.TFTransformOutput(data.transform_output)
    label = config.data.label.name

    inputs = training.TrainingInputs(
        **{**penguins.inputs_for(data, root, rewrite, config), "eval_files": [pattern]}
    )
    _, evaluation = make_datasets(config, inputs, tft_output)
    factory = data_accessor.make_tf_dataset_factory(
        DropInSettings(), data.transform_output, str(tmp_path / "scratch")
    )
    options = TensorFlowDatasetOptions(
        batch_size=config.ingestion.eval_batch_size, num_epochs=1, shuffle=False, label_key=label
    )
    accessed = factory([pattern], options, tft_output.transformed_metadata.schema)

    def rows(dataset):
        feature = f"{penguins.FLOAT_FEATURES[0]}_xf"
        return sorted(
            (round(float(x), 5), int(y))
            for features, labels in dataset
            for x, y in zip(
                features[feature].numpy().reshape(-1),
                labels.numpy().reshape(-1),
                strict=True,
            )
        )

    trainer_rows = rows(evaluation)
    assert len(trainer_rows) == penguins.EVAL_ROWS
    assert rows(accessed) == trainer_rows
