"""The Transform's shard writer on Beam's in-process runner: exact shard count, every record once, no record grouped."""

from __future__ import annotations

import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from apache_beam.testing.util import assert_that, equal_to

from components.data import writer

BEAM_ARGS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def _settings(tmp_path, num_shards: int, compression: str) -> writer.OutputSettings:
    return writer.OutputSettings(
        num_shards=num_shards,
        compression=compression,
        pack_features=False,
        staging_dir=str(tmp_path / "staging"),
    )


def _write(tmp_path, records: list[bytes], settings: writer.OutputSettings) -> tuple[str, list]:
    """Writes `records`; the prefix and the shard paths, which the transform must yield."""
    prefix = str(tmp_path / "Split-train" / "transformed_examples")
    os.makedirs(os.path.dirname(prefix))
    expected = [
        writer.shard_path(prefix, i, settings.num_shards, settings.suffix)
        for i in range(settings.num_shards)
    ]
    with beam.Pipeline(argv=BEAM_ARGS) as pipeline:
        paths = (
            pipeline | beam.Create(records, reshuffle=False) | writer.WriteShards(prefix, settings)
        )
        assert_that(paths, equal_to(expected))
    return prefix, expected


def _read(paths: list[str], compression: str) -> list[bytes]:
    kind = "GZIP" if compression == "gzip" else ""
    return [r.numpy() for r in tf.data.TFRecordDataset(paths, compression_type=kind)]


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_every_record_lands_once_in_exactly_the_configured_shards(tmp_path, compression):
    records = [f"record {i}".encode() * (1 + i % 7) for i in range(2000)]
    settings = _settings(tmp_path, 4, compression)
    prefix, expected = _write(tmp_path, records, settings)
    # Only the shards are left: the part files and their directory are gone.
    assert sorted(os.listdir(os.path.dirname(prefix))) == [os.path.basename(p) for p in expected]
    assert sorted(_read(expected, compression)) == sorted(records)
    # Round-robin dealing spreads the records evenly over the shards.
    counts = [len(_read([p], compression)) for p in expected]
    assert max(counts) - min(counts) <= 4, counts


def test_shards_no_record_reached_are_written_empty(tmp_path):
    settings = _settings(tmp_path, 6, "gzip")
    prefix, written = _write(tmp_path, [b"a", b"b"], settings)
    assert len(written) == 6
    assert sorted(_read(written, "gzip")) == [b"a", b"b"]
    assert sum(len(_read([p], "gzip")) == 0 for p in written) == 4


def test_a_bundle_hands_on_one_part_name_per_shard_not_its_records(tmp_path):
    """What is grouped by shard is a name per bundle and shard, so memory does not grow with rows."""
    fn = writer.WriteBundleParts(str(tmp_path), 3)
    fn.start_bundle()
    for i in range(1000):
        assert list(fn.process(b"x%d" % i) or []) == []
    out = [wv.value for wv in fn.finish_bundle()]
    assert sorted(shard for shard, _ in out) == [0, 1, 2]
    assert sorted(r for _, path in out for r in _read([path], "none")) == sorted(
        b"x%d" % i for i in range(1000)
    )


def test_codebooks_merge_over_splits_an_empty_split_adding_nothing():
    """A feature keeps a codebook only where every split has one (None past the limit
    is left out of a split's record); a split without examples adds no values."""
    merged = writer._merge_codebooks(
        [{"x": [0.0, 1.0], "y": [2.0]}, {"x": [], "y": [3.0]}, {"x": [0.5]}]
    )
    assert merged == {"x": (0.0, 0.5, 1.0)}
    assert writer._merge_codebooks([{"x": []}]) == {}
    wide = [{"x": list(range(200))}, {"x": list(range(100, 300))}]
    assert writer._merge_codebooks(wide) == {}


def test_the_codebooks_combine_keeps_each_features_values_or_none_past_the_limit():
    fn = writer.CodebooksFn(["few", "many", "absent"])

    def batch(few, many):
        return pa.RecordBatch.from_arrays(
            [pa.array([[v] for v in few]), pa.array([[v] for v in many])], ["few", "many"]
        )

    a = fn.add_input(fn.create_accumulator(), (batch([1.0, 2.0] * 100, range(200)), None))
    b = fn.add_input(fn.create_accumulator(), (batch([2.0, 3.0] * 100, range(200, 400)), None))
    out = fn.extract_output(fn.merge_accumulators([a, b]))
    assert out == {"few": [1.0, 2.0, 3.0]}  # 'many' past 256, 'absent' not in the data
    assert fn.extract_output(fn.create_accumulator())["few"] == []
    assert np.asarray(out["few"], np.float32).dtype == np.float32
