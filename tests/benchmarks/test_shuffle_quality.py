"""`benchmarks/shuffle_quality.py`: its label-sorted files, its scoring and summary on written numbers,
and one short real read per side."""

from __future__ import annotations

import tensorflow as tf

from benchmarks import shuffle_quality as bench


def test_files_hold_contiguous_ids_with_labels_sorted(tmp_path):
    paths = bench.write_files(str(tmp_path), 800)
    assert len(paths) == bench.SHARDS
    first = tf.data.TFRecordDataset(paths[1], compression_type="GZIP")
    ids = [
        tf.train.Example.FromString(r.numpy()).features.feature["id"].int64_list.value[0]
        for r in first
    ]
    assert ids == list(range(100, 200))
    assert [bench.label_of(i, 800) for i in (0, 79, 80, 799)] == [0, 0, 1, 9]


def test_scores_each_epoch_and_averages_per_side():
    examples = 128
    kept = list(range(examples)) * 2
    labels = [bench.label_of(i, examples) for i in kept]
    lines = bench.score("stock", kept, labels, examples)
    assert [line["epoch"] for line in lines] == [0, 1]
    assert lines[0]["rank_correlation"] == 1.0 and lines[0]["distinct"] == 1.0
    # Kept order: a batch of 64 spans 5 classes of 12.8 ids, the largest 13 of them.
    assert lines[0]["batch_majority_share"] == round(13 / 64, 4)
    product = [
        {"side": "product", "epoch": e, **{m: 0.5 + e / 10 for m in bench.MEASURES}} for e in (0, 1)
    ]
    product[1]["rank_correlation"] = -0.6  # a reversed order counts as kept
    summary = bench.summarize([*lines, *product])
    assert summary["shuffle_quality"]["stock"]["rank_correlation"] == 1.0
    assert summary["shuffle_quality"]["product"]["rank_correlation"] == 0.55
    assert summary["shuffle_quality"]["product"]["label_autocorrelation"] == 0.55
    low, high = summary["shuffle_quality_ci95"]["product"]["label_autocorrelation"]
    assert low < 0.55 < high
    # The stock side's two epochs are equal: the difference's spread is the product's.
    diff, low, high = summary["product_minus_stock_ci95"]["batch_majority_share"]
    assert diff == round(0.55 - 13 / 64, 4) and low < diff < high


def test_every_side_delivers_whole_epochs_of_the_files(tmp_path):
    examples = 640
    paths = bench.write_files(str(tmp_path), examples)
    for side in bench.SIDES:
        ids, labels = bench.delivered(side, paths, examples, 1)
        assert sorted(ids) == list(range(examples)), side
        assert labels == [bench.label_of(i, examples) for i in ids], side
