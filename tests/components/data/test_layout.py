"""The Transform -> Trainer contract (`components.data.layout`), without TFX.

Shards are written here directly as tf.Examples in the stored format (the
packed feature plus the unpacked string), so every test runs without a Beam
runner or a TFX encoder; the writer's own output is tested in
`tests/components/data/test_ingestion.py` and `tests/components/transform/`.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from components.data import layout

# Transformed spec: two packable members and a string that stays on its own.
SPEC = {
    "x": tf.io.FixedLenFeature([2], tf.float32),
    "y": tf.io.FixedLenFeature([], tf.int64),
    "tag": tf.io.FixedLenFeature([1], tf.string),
}
NUM_EXAMPLES = 100
NUM_SHARDS = 4


def _example(i: int, packing: layout.Packing) -> bytes:
    # Storage order: float members, then int members (see `Packing`).
    feature = {
        packing.feature: tf.train.Feature(float_list=tf.train.FloatList(value=[i, -i, i % 2])),
        "tag": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"t{i % 3}".encode()])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@dataclasses.dataclass
class Written:
    files: list[str]
    layout: layout.Layout


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Written:
    """`NUM_EXAMPLES` packed examples round-robin in `NUM_SHARDS` uncompressed shards, with their layout."""
    directory = tmp_path_factory.mktemp("packed")
    packing = layout.plan_packing(SPEC)
    suffix = layout.shard_suffix("none")
    files = [
        str(directory / f"transformed_examples-{i:05d}-of-{NUM_SHARDS:05d}{suffix}")
        for i in range(NUM_SHARDS)
    ]
    writers = [tf.io.TFRecordWriter(f) for f in files]
    for i in range(NUM_EXAMPLES):
        writers[i % NUM_SHARDS].write(_example(i, packing))
    for w in writers:
        w.close()
    record = layout.Layout(
        compression="none",
        num_shards=NUM_SHARDS,
        packing=packing,
        parse_spec=layout.spec_to_json(layout.file_spec(SPEC, packing)),
        files=tuple(layout.ShardFile(f, "train", layout.scan_shard(f, "none")) for f in files),
    )
    return Written(files, record)


def test_written_shards_parse_with_the_recorded_spec(packed):
    spec = packed.layout.feature_spec()
    assert set(spec) == {layout.PACKED_FEATURE, "tag"}
    parsed = tf.io.parse_example(
        next(iter(tf.data.TFRecordDataset(packed.files[1]).batch(NUM_EXAMPLES))), spec
    )
    out = packed.layout.packing.unpack(parsed[layout.PACKED_FEATURE])
    np.testing.assert_array_equal(out["x"][0], [1.0, -1.0])
    assert out["y"].dtype == tf.int64 and out["y"].shape == (NUM_EXAMPLES // NUM_SHARDS,)


# --------------------------------------------------------------------------- #
# Shards: counts, stats and the one check that files are the recorded shards.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("workers,expected", [(1, 8), (2, 8), (3, 9), (5, 10), (6, 12), (16, 32)])
def test_default_shard_count(workers, expected):
    shards = layout.default_num_shards(workers)
    assert shards == expected
    assert shards >= 2 * workers and shards % workers == 0 and shards >= layout.MIN_DEFAULT_SHARDS


def test_scan_shard_counts_records_and_bytes(packed):
    stats = layout.scan_shard(packed.files[0], "none")
    assert stats == packed.layout.shard_stats()[packed.files[0]]
    assert (
        stats.records == NUM_EXAMPLES // 4
        and stats.raw_bytes == stats.file_bytes == os.path.getsize(packed.files[0])
    )


def test_compression_names_the_field():
    assert (layout.compression_type("gzip"), layout.compression_type("none")) == ("GZIP", "")
    assert (layout.shard_suffix("gzip"), layout.shard_suffix("none")) == (".gz", ".tfrecord")
    with pytest.raises(
        layout.IngestionError, match=r"transform\.compression: expected 'gzip' or 'none', got 'zip'"
    ):
        layout.compression_type("zip")


def test_check_shards_names_an_unrecorded_or_resized_file(packed, tmp_path):
    recorded = packed.layout.shard_stats()
    assert layout.check_shards(packed.files, recorded) == [recorded[f] for f in packed.files]
    stray = str(tmp_path / "stray.tfrecord")
    tf.io.gfile.copy(packed.files[0], stray)
    with pytest.raises(
        layout.LayoutError,
        match=r"'.*stray\.tfrecord' is not among the 4 shards the Transform recorded",
    ):
        layout.check_shards([*packed.files, stray], recorded)
    resized = dict(
        recorded, **{stray: dataclasses.replace(recorded[packed.files[0]], file_bytes=1)}
    )
    with pytest.raises(
        layout.LayoutError,
        match=r"shard '.*stray\.tfrecord' has \d+ bytes but the Transform wrote 1",
    ):
        layout.check_shards([stray], resized)
    # Readers catch the contract's errors as theirs.
    assert issubclass(layout.LayoutError, layout.IngestionError)


# --------------------------------------------------------------------------- #
# Packing.
# --------------------------------------------------------------------------- #


def _list_column(values, width=1):
    values = np.asarray(values)
    return pa.LargeListArray.from_arrays(
        pa.array(np.arange(0, len(values) + 1, width, dtype=np.int64)), pa.array(values)
    )


def test_pack_record_batch_round_trips_through_unpack():
    spec = {
        "a": tf.io.FixedLenFeature([2], tf.float32),
        "b": tf.io.FixedLenFeature([1], tf.int64),
        "y": tf.io.FixedLenFeature([], tf.int64),
        "s": tf.io.FixedLenFeature([1], tf.string),
    }
    packing = layout.plan_packing(spec)
    assert [m.name for m in packing.members] == ["a", "b", "y"]
    batch = pa.RecordBatch.from_arrays(
        [
            _list_column(np.array([1.5, 2.5, 3.5, 4.5], np.float32), 2),
            _list_column(np.array([7, 16_000_000], np.int64)),
            _list_column(np.array([0, 1], np.int64)),
            pa.LargeListArray.from_arrays(
                pa.array([0, 1, 2], pa.int64()), pa.array([b"x", b"z"], pa.large_binary())
            ),
        ],
        ["a", "b", "y", "s"],
    )
    packed = layout.pack_record_batch(batch, packing)
    assert packed.schema.names == ["s", layout.PACKED_FEATURE]
    matrix = np.asarray(packed.column(1).flatten()).reshape(2, packing.width)
    out = packing.unpack(tf.constant(matrix))
    np.testing.assert_array_equal(out["a"], [[1.5, 2.5], [3.5, 4.5]])
    np.testing.assert_array_equal(out["b"], [[7], [16_000_000]])
    assert out["b"].dtype == tf.int64 and out["y"].shape == (2,)


def test_packing_refuses_ids_float32_cannot_hold():
    packing = layout.plan_packing({"big_id": tf.io.FixedLenFeature([1], tf.int64)})
    batch = pa.RecordBatch.from_arrays(
        [_list_column(np.array([1, 2**24 + 1], np.int64))], ["big_id"]
    )
    with pytest.raises(
        ValueError,
        match=r"transform\.pack_features: feature 'big_id' has integer values beyond 16777216",
    ):
        layout.pack_record_batch(batch, packing)


def test_packing_refuses_a_feature_with_missing_values():
    packing = layout.plan_packing({"x": tf.io.FixedLenFeature([1], tf.float32)})
    column = pa.LargeListArray.from_arrays(
        pa.array([0, 1, 1], pa.int64()), pa.array([1.0], pa.float32())
    )
    with pytest.raises(
        ValueError, match=r"transform\.pack_features: feature 'x' does not have exactly 1 value"
    ):
        layout.pack_record_batch(pa.RecordBatch.from_arrays([column], ["x"]), packing)


def test_packed_name_clash_is_refused():
    with pytest.raises(
        layout.LayoutError,
        match=r"transform\.pack_features: a transformed feature is already named",
    ):
        layout.plan_packing({layout.PACKED_FEATURE: tf.io.FixedLenFeature([1], tf.float32)})


# --------------------------------------------------------------------------- #
# The layout record and the parse spec in it.
# --------------------------------------------------------------------------- #


def test_layout_record_round_trips_and_rejects_bad_records(packed, tmp_path):
    graph_uri = tmp_path / "transform_graph"
    graph_uri.mkdir()
    layout.write_layout(str(graph_uri), packed.layout)
    record = layout.read_layout(str(graph_uri))
    assert layout.Layout.from_json(record.to_json()) == record
    assert layout.read_layout(str(tmp_path)) is None
    (tmp_path / layout.LAYOUT_FILE).write_text(json.dumps({"format": "other", "version": 1}))
    with pytest.raises(
        layout.LayoutError, match=r"layout: .*tfxkit_layout\.json is format 'other'"
    ):
        layout.read_layout(str(tmp_path))
    broken = json.loads(record.to_json())
    del broken["files"]
    (tmp_path / layout.LAYOUT_FILE).write_text(json.dumps(broken))
    with pytest.raises(layout.LayoutError, match=r"is malformed .*re-run the Transform"):
        layout.read_layout(str(tmp_path))


def test_spec_json_defers_unsupported_kinds_to_the_transform_graph():
    sparse = tf.io.SparseFeature("i", "v", tf.float32, 10)
    spec = {
        "d": tf.io.FixedLenFeature([2], tf.int64),
        "v": tf.io.VarLenFeature(tf.string),
        "s": sparse,
    }
    data = layout.spec_to_json(spec)
    assert data["s"] == {"kind": "transform_graph"}
    assert layout.spec_from_json(data, spec) == spec
    with pytest.raises(
        layout.LayoutError, match=r"feature 's' is described by the transform graph"
    ):
        layout.spec_from_json(data)


def test_codebooks_round_trip_are_optional_and_a_bad_one_is_refused(packed):
    record = dataclasses.replace(packed.layout, codebooks={"x": (-0.5, 0.25, 1.0)})
    assert layout.Layout.from_json(record.to_json()).codebooks == {"x": (-0.5, 0.25, 1.0)}
    # A record written before codebooks reads as having none.
    older = json.loads(record.to_json())
    del older["codebooks"]
    assert layout.Layout.from_json(json.dumps(older)).codebooks == {}
    bad = json.loads(record.to_json())
    bad["codebooks"]["x"] = [1.0, 0.25]
    with pytest.raises(layout.LayoutError, match=r"codebook of 'x'.*re-run the Transform"):
        layout.Layout.from_json(json.dumps(bad), source="rec.json")
