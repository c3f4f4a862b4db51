"""`testkit/portable.py`: what it keeps of a run's outputs and what it lets differ."""

from __future__ import annotations

import gzip
import os

import tensorflow as tf

from testkit import portable


def _example(**features) -> bytes:
    feature = {}
    for name, value in features.items():
        if isinstance(value, float):
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write(path, records, compressed):
    options = tf.io.TFRecordOptions(compression_type="GZIP" if compressed else "")
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for record in records:
            writer.write(record)


def test_records_read_back_from_gzip_and_plain_files(tmp_path):
    records = [_example(a=i, x=float(i) / 3) for i in range(50)]
    _write(tmp_path / "r.gz", records, compressed=True)
    _write(tmp_path / "r", records, compressed=False)
    assert portable._records(str(tmp_path / "r.gz")) == records
    assert portable._records(str(tmp_path / "r")) == records
    with gzip.open(tmp_path / "r.gz") as f:
        assert f.read()  # a real GZIP file


def test_a_split_is_the_same_multiset_whatever_the_shards_and_order(tmp_path):
    records = [_example(a=i, x=float(i)) for i in range(20)]
    for name, shards in (("one", [records]), ("two", [records[13:], records[:13][::-1]])):
        split = tmp_path / name / "Split-train"
        os.makedirs(split)
        for i, shard in enumerate(shards):
            _write(split / f"part-{i}.gz", shard, compressed=True)
    one = portable.record_multisets(str(tmp_path / "one"))
    assert one == portable.record_multisets(str(tmp_path / "two"))
    assert one["Split-train"]["records"] == 20
    assert portable.example_columns(str(tmp_path / "one")) == portable.example_columns(
        str(tmp_path / "two")
    )


def test_differences_allow_float_rounding_and_nothing_else():
    a = {"mean": 13.262166550701382, "n": 3, "names": ["a", "b"], "rows": [[1.0], [2.0]]}
    close = {"mean": 13.262166550701384, "n": 3, "names": ["a", "b"], "rows": [[1.0], [2.0]]}
    assert portable.differences(a, close) == []
    assert portable.differences(a, close, rel=0) == [
        ".mean: 13.262166550701382 against 13.262166550701384"
    ]
    assert portable.differences(a, {**close, "n": 4}) == [".n: 3 against 4"]
    assert portable.differences(a, {**close, "names": ["a"]}) == [".names: 2 against 1 items"]
    assert portable.differences(a, {**close, "rows": [[1.0], [2.1]]}) == [
        ".rows[1][0]: 2.0 against 2.1"
    ]
    assert portable.differences(a, {"n": 3}) == [
        ".mean: only in one",
        ".names: only in one",
        ".rows: only in one",
    ]


def _num_stats(median, bounds, counts, top=100.0):
    return {
        "commonStats": {"numNonMissing": "1000"},
        "mean": 50.0,
        "min": 0.0,
        "max": top,
        "median": median,
        "histograms": [
            {
                "buckets": [
                    {"lowValue": low, "highValue": high, "sampleCount": count}
                    for (low, high), count in zip(bounds, counts, strict=True)
                ],
                "type": "QUANTILES",
            }
        ],
    }


def test_sketched_statistics_differ_within_the_sketchs_epsilon_and_no_further():
    # 1000 values spread over [0, 100]: epsilon 0.01 allows 10 in a bucket's count and,
    # 10 ranks spanning about 1.0 there, about 1.0 in a bound or the median; a mean is
    # summed, so it keeps the float tolerance.
    a = _num_stats(50.0, [(0.0, 49.0), (49.0, 100.0)], [500.0, 500.0])
    moved = _num_stats(50.9, [(0.0, 49.9), (49.9, 100.0)], [509.0, 491.0])
    path = ".features[0].numStats"
    assert portable.differences({"numStats": a}, {"numStats": moved}, path=".features[0]") == []
    assert portable.differences(
        {"numStats": a},
        {"numStats": _num_stats(51.5, [(0.0, 49.0), (49.0, 100.0)], [500.0, 500.0])},
        path=".features[0]",
    ) == [f"{path}.median: 50.0 against 51.5"]
    assert portable.differences(
        {"numStats": a},
        {"numStats": _num_stats(50.0, [(0.0, 49.0), (49.0, 100.0)], [520.0, 480.0])},
        path=".features[0]",
    ) == [
        f"{path}.histograms[0].buckets[0].sampleCount: 500.0 against 520.0",
        f"{path}.histograms[0].buckets[1].sampleCount: 500.0 against 480.0",
    ]
    assert portable.differences(
        {"numStats": a}, {"numStats": {**moved, "mean": 50.1}}, path=".features[0]"
    ) == [f"{path}.mean: 50.0 against 50.1"]
    three = _num_stats(50.0, [(0.0, 30.0), (30.0, 60.0), (60.0, 100.0)], [300.0, 300.0, 400.0])
    assert portable.differences({"numStats": a}, {"numStats": three}, path=".features[0]") == [
        f"{path}.histograms[0].buckets: 2 against 3 items"
    ]


def test_a_quantile_moves_by_ranks_not_by_the_range_where_values_are_skewed():
    # Half the values in [0, 1], half spread to 1000: 10 ranks span 0.02 around a
    # median of 0.5, where a tenth of the range would allow 100.
    skewed = _num_stats(0.5, [(0.0, 1.0), (1.0, 1000.0)], [500.0, 500.0], top=1000.0)
    path = ".features[0].numStats"
    near = _num_stats(0.51, [(0.0, 1.0), (1.0, 1000.0)], [500.0, 500.0], top=1000.0)
    assert portable.differences({"numStats": skewed}, {"numStats": near}, path=".features[0]") == []
    moved = _num_stats(0.7, [(0.0, 1.0), (1.0, 1000.0)], [500.0, 500.0], top=1000.0)
    assert portable.differences({"numStats": skewed}, {"numStats": moved}, path=".features[0]") == [
        f"{path}.median: 0.5 against 0.7"
    ]
    # In the sparse tail 10 ranks span about 20: a bound there may move that much.
    tail = _num_stats(0.5, [(0.0, 1.0), (1.0, 985.0)], [500.0, 500.0], top=1000.0)
    assert portable.differences({"numStats": skewed}, {"numStats": tail}, path=".features[0]") == []
    standard = {**skewed, "histograms": [{"buckets": [{"lowValue": 0.0, "highValue": 500.0}]}]}
    shifted = {**skewed, "histograms": [{"buckets": [{"lowValue": 0.0, "highValue": 500.5}]}]}
    # A STANDARD histogram's bounds split min..max evenly: nothing sketched moves them.
    assert portable.differences(
        {"numStats": standard}, {"numStats": shifted}, path=".features[0]"
    ) == [f"{path}.histograms[0].buckets[0].highValue: 500.0 against 500.5"]
