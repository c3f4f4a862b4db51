"""How random each reader's training order is: stock TFX, tuned stock and the product.

The data: `--examples` examples (default 2^17), each an `id` (its position in file
order), 16 float features and a `label`, written as the product's Transform writes by
default (8 GZIP TFRecord shards, the format stock TFX writes) with each file holding a
contiguous range of ids and the labels sorted by id (10 classes): the order of a CSV
sorted by its label or by time, the hard case for any reader's shuffle, since each file
holds one or two classes. Every side reads the same files:

- `stock`: TFX's `data_accessor.tf_dataset_factory`, as a stock `run_fn` calls it
  (tfx_bsl's defaults: a 10,000-example shuffle buffer);
- `stock_tuned`: the same with `sloppy_ordering`, what a user tuning stock picks;
- `product`: `ingestion.make_dataset` with the default `ingestion` section (files
  reshuffled each epoch, read batches shuffled in a buffer of about 10,000 examples
  and permuted in windows of that size).

Each side delivers `--epochs` epochs (batches of 64, training's endless stream, seeds
drawn afresh); each epoch's ids and labels are scored by `testkit.shuffle_quality`
(Spearman rank correlation with file order, the neighbour distance, the labels' lag-1
autocorrelation, the mean majority class share per batch beside chance's). No timing: the
figures do not depend on the machine's load. Results in
`benchmarks/results/shuffle_quality.json`; the last line holds each side's mean per
measure (`shuffle_quality`; |rank correlation|), their 95% intervals over epochs and
product - stock with its interval. More random is: |rank correlation| and label
autocorrelation nearer 0, neighbour distance nearer 1, majority share nearer chance's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

CLASSES = 10
WIDTH = 16
BATCH = 64
SHARDS = 8
SIDES = ("stock", "stock_tuned", "product")
MEASURES = (
    "rank_correlation",
    "neighbour_distance",
    "label_autocorrelation",
    "batch_majority_share",
    "batch_majority_share_random",
)


def label_of(example_id: int, examples: int) -> int:
    """Labels sorted by id: class k holds ids [k n / 10, (k + 1) n / 10)."""
    return example_id * CLASSES // examples


def write_files(directory: str, examples: int) -> list[str]:
    """`SHARDS` GZIP files, file k holding ids [k n / S, (k + 1) n / S) in order."""
    import numpy as np
    import tensorflow as tf

    from components.data import writer

    rng = np.random.default_rng(0)
    prefix = os.path.join(directory, "Split-train", "transformed_examples")
    tf.io.gfile.makedirs(os.path.dirname(prefix))
    paths = [writer.shard_path(prefix, k, SHARDS, ".gz") for k in range(SHARDS)]
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    bounds = [k * examples // SHARDS for k in range(SHARDS + 1)]
    for k, path in enumerate(paths):
        with tf.io.TFRecordWriter(path, options) as out:
            for i in range(bounds[k], bounds[k + 1]):
                feature = {
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "x": tf.train.Feature(
                        float_list=tf.train.FloatList(value=rng.standard_normal(WIDTH))
                    ),
                    "label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[label_of(i, examples)])
                    ),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                out.write(example.SerializeToString())
    return paths


def feature_spec() -> dict:
    import tensorflow as tf

    return {
        "id": tf.io.FixedLenFeature([1], tf.int64),
        "x": tf.io.FixedLenFeature([WIDTH], tf.float32),
        "label": tf.io.FixedLenFeature([1], tf.int64),
    }


def dataset(side: str, files: list[str], batch_size: int = BATCH):
    """The side's training stream over `files`: `(features, label)` batches of `batch_size`."""
    if side == "product":
        from components.config import IngestionConfig
        from components.data import ingestion

        return ingestion.make_dataset(
            files,
            feature_spec(),
            "label",
            dataclasses.replace(IngestionConfig(), batch_size=batch_size),
            batch_size=batch_size,
            compression="gzip",
            training=True,
        )
    from tensorflow_transform.tf_metadata import schema_utils
    from tfx.components.util import tfxio_utils
    from tfx.types import artifact_utils, standard_artifacts
    from tfx_bsl.public import tfxio

    examples = standard_artifacts.Examples()
    examples.uri = os.path.dirname(os.path.dirname(files[0]))
    examples.split_names = artifact_utils.encode_split_names(["train"])
    factory = tfxio_utils.get_tf_dataset_factory_from_artifact([examples], [])
    options = tfxio.TensorFlowDatasetOptions(
        batch_size=batch_size, label_key="label", sloppy_ordering=side == "stock_tuned"
    )
    return factory(files, options, schema_utils.schema_from_feature_spec(feature_spec()))


def delivered(
    side: str, files: list[str], examples: int, epochs: int, batch_size: int = BATCH
) -> tuple[list, list]:
    """The first `epochs * examples` delivered ids and labels, in order."""
    ids: list[int] = []
    labels: list[int] = []
    for features, label in dataset(side, files, batch_size):
        ids.extend(features["id"].numpy().reshape(-1).tolist())
        labels.extend(label.numpy().reshape(-1).tolist())
        if len(ids) >= epochs * examples:
            break
    return ids[: epochs * examples], labels[: epochs * examples]


def score(
    side: str, ids: list[int], labels: list[int], examples: int, batch_size: int = BATCH
) -> list[dict]:
    """One line per epoch: its measures and how many distinct examples it held."""
    from testkit import shuffle_quality

    lines = []
    for epoch in range(len(ids) // examples):
        part = slice(epoch * examples, (epoch + 1) * examples)
        line = {"side": side, "epoch": epoch, "distinct": len(set(ids[part])) / examples}
        line.update(shuffle_quality.report(ids[part], labels[part], batch_size))
        lines.append(line)
    return lines


def measure(work: str, examples: int, epochs: int, batch_size: int = BATCH) -> list[dict]:
    """Every side's scored epochs on freshly written label-sorted files under `work`."""
    files = write_files(work, examples)
    lines = []
    for side in SIDES:
        ids, labels = delivered(side, files, examples, epochs, batch_size)
        lines.extend(score(side, ids, labels, examples, batch_size))
    return lines


def summarize(lines: list[dict]) -> dict:
    """Per side, each measure's mean and 95% t interval over the epochs scored (the rank
    correlation as its absolute value: a reversed file order is no shuffle either); and
    product - stock per measure with a 95% interval (independent epochs, the smaller
    side's degrees of freedom)."""
    from testkit.stats import _t_quantile, diff_se, t_interval

    def values(side: str, measure: str) -> list[float]:
        picked = [line[measure] for line in lines if line.get("side") == side]
        return [abs(v) for v in picked] if measure == "rank_correlation" else picked

    quality, spread = {}, {}
    for side in SIDES:
        if not values(side, MEASURES[0]):
            continue
        quality[side], spread[side] = {}, {}
        for m in MEASURES:
            mean, low, high = t_interval(values(side, m))
            quality[side][m] = round(mean, 4)
            spread[side][m] = [round(low, 4), round(high, 4)]
    differences = {}
    if {"product", "stock"} <= set(quality):
        for m in MEASURES[:-1]:
            product, stock = values("product", m), values("stock", m)
            diff = statistics.fmean(product) - statistics.fmean(stock)
            half = _t_quantile(0.975, min(len(product), len(stock)) - 1) * diff_se(product, stock)
            differences[m] = [round(diff, 4), round(diff - half, 4), round(diff + half, 4)]
    return {
        "shuffle_quality": quality,
        "shuffle_quality_ci95": spread,
        "product_minus_stock_ci95": differences,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2**17)
    parser.add_argument("--epochs", type=int, default=10, help="epochs scored per side (>= 2)")
    parser.add_argument("--work", default="")
    parser.add_argument("--shared-with", default=None,
                        help="what else ran on the cores (no timing here: recorded only)")  # fmt: skip
    parser.add_argument("--no-results", action="store_true", help="print only")
    args = parser.parse_args()
    from testkit import results

    work = args.work or tempfile.mkdtemp(prefix="shuffle_quality_")
    lines = measure(work, args.examples, args.epochs)
    for line in lines:
        print(json.dumps(line), flush=True)
    lines.append(summarize(lines))
    print(json.dumps(lines[-1]), flush=True)
    if not args.no_results:
        results.write("shuffle_quality", lines, shared_with=args.shared_with, argv=sys.argv[1:])


if __name__ == "__main__":
    main()
