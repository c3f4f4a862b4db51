"""Input pipeline throughput: stock TFX reading vs tfxkit's Transform output + tf.data.

One run, one machine, the same examples for every case:

- data: `--examples` (default 2^20) examples with the taxi config's
  transformed schema (the feature names, dtypes and shapes the tfxkit
  Transform produces for `pipelines/configs/taxi.yaml`, value ranges as the
  config implies). They are encoded by the stock TFX Transform encoder
  (`TransformProcessor._RecordBatchToExamplesFn`), written twice (GZIP
  TFRecords, as stock TFX writes them, and uncompressed), and by the tfxkit
  Transform encoder (`writer.EncodeExamplesFn`: packed, uncompressed, plus
  its layout record), all in the default shard count. Generated once into
  `--data-dir` and reused by later runs.
- cases, in examples/s, all consumed by the same Python loop, each timing
  the same `--timed-examples` after `--warm-examples` pulled untimed from the
  same iterator, on a fresh dataset:
  (a) `stock`: TFX's `data_accessor.tf_dataset_factory` on the stock files,
      as a stock run_fn calls it (tfx_bsl's defaults);
  (a') `stock_tuned`: the same with the best settings tfx_bsl offers
      (`sloppy_ordering`, the readers, parsers and prefetch autotuned: its
      defaults already autotune them), what a user tuning stock would pick;
  (b) `ours_same_files`: `ingestion.make_dataset` on the stock files (the
      reader alone changes);
  (b') `ours_uncompressed`: on the stock encoding, uncompressed (the
      compression alone changes);
  (c) `ours_end_to_end`: on the tfxkit files (packing too), first epoch
      (its memory is measured in child processes reading a quarter and all of
      the files: with cache off, RSS from the first batch to the end of the
      epoch must not grow with the data);
  (d) `ours_cached`: the same with `ingestion.cache: memory`, after one
      untimed epoch filled the cache;
  (e) `limit`: iterating already parsed batches cached in memory, behind a
      prefetch, after the same untimed fill as (d).
  Every file is read once, untimed, before the first repeat (no case reads
  cold files).
  The cases run interleaved: every repeat runs each case once, the order
  reversed every other repeat (ABBA), so drift cannot favour a case. Each
  case reports its median and range; each ratio is a geometric mean of the
  per-repeat ratios with a 95% t interval.
- the taxi teacher's training steps/s fed by (c)'s pipeline vs fed by
  synthetic in-memory tensors of the same shapes, turn by turn.
- how random each reader's order is (`shuffle_quality` on the headline,
  per case): two epochs of `benchmarks/shuffle_quality.py`'s label-sorted
  files (`--shuffle-examples`) at this benchmark's batch and shuffle buffer.

Every figure is one JSON line; the last line holds the headline figures.
The machine should be otherwise idle (`--shared-with` says what was not).
The output goes to `benchmarks/results/ingestion.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from components.config import PipelineConfig  # noqa: E402
from components.data import ingestion
from components.data import layout as transform_layout
from components.training import models
from pipelines.configs import load_config  # noqa: E402
from testkit import results as results_lib
from testkit import stats

# Distinct ids of a `vocabulary` feature in the synthetic data (the real taxi
# vocabularies are of this order).
VOCABULARY_SIZE = 100
DATA_VERSION = 2
RECORD_BATCH_ROWS = 8192


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def bench_config() -> PipelineConfig:
    """The taxi config, writing uncompressed packed output (the fast layout)."""
    config = load_config("taxi")
    transform = dataclasses.replace(
        config.transform, num_shards=0, compression="none", pack_features=True
    )
    ingestion_config = dataclasses.replace(config.ingestion, cache="none")
    return dataclasses.replace(config, transform=transform, ingestion=ingestion_config)


def transformed_spec(config: PipelineConfig) -> dict[str, tf.io.FixedLenFeature]:
    """The transformed feature spec the tfxkit Transform produces for `config`."""
    spec = {}
    for f in config.data.features:
        dtype = tf.int64 if f.is_categorical else tf.float32
        spec[f.transformed_name] = tf.io.FixedLenFeature([f.size], dtype)
    spec[config.data.label.name] = tf.io.FixedLenFeature([], tf.int64)
    return spec


def cardinalities(config: PipelineConfig) -> dict[str, int]:
    """Ids per categorical feature (raw name), as `preprocessing.num_ids` gives them."""
    out = {}
    for f in config.data.features:
        t = f.effective_transform
        if t == "bucketize":
            out[f.name] = f.num_buckets
        elif f.is_categorical and t == "identity":
            out[f.name] = f.num_buckets + 1
        elif f.is_categorical:
            out[f.name] = VOCABULARY_SIZE + f.oov_buckets
    return out


def _list_column(values: np.ndarray, rows: int, width: int) -> pa.Array:
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int64))
    return pa.LargeListArray.from_arrays(offsets, pa.array(values))


def record_batches(config: PipelineConfig, n: int, seed: int = 0) -> list[pa.RecordBatch]:
    """Transformed RecordBatches, in the column layout TFT hands to the writer."""
    rng = np.random.default_rng(seed)
    cards = cardinalities(config)
    batches = []
    for start in range(0, n, RECORD_BATCH_ROWS):
        rows = min(RECORD_BATCH_ROWS, n - start)
        columns, names = [], []
        for f in config.data.features:
            if f.is_categorical:
                values = rng.integers(0, cards[f.name], size=rows * f.size, dtype=np.int64)
            else:
                values = rng.standard_normal(rows * f.size).astype(np.float32)
            columns.append(_list_column(values, rows, f.size))
            names.append(f.transformed_name)
        label = rng.integers(0, config.data.label.num_classes, size=rows, dtype=np.int64)
        columns.append(_list_column(label, rows, 1))
        names.append(config.data.label.name)
        batches.append(pa.RecordBatch.from_arrays(columns, names))
    return batches


def _write_shards(prefix: str, suffix: str, num_shards: int, records, gzip: bool) -> list[str]:
    """Writes records round-robin into `num_shards` files named as Beam names them."""
    paths = [f"{prefix}-{i:05d}-of-{num_shards:05d}{suffix}" for i in range(num_shards)]
    tf.io.gfile.makedirs(os.path.dirname(prefix))
    options = tf.io.TFRecordOptions(compression_type="GZIP" if gzip else "")
    writers = [tf.io.TFRecordWriter(p, options) for p in paths]
    try:
        for i, record in enumerate(records):
            writers[i % num_shards].write(record)
    finally:
        for w in writers:
            w.close()
    return paths


def generate(config: PipelineConfig, n: int, data_dir: str) -> dict:
    """Writes the stock and tfxkit files once; returns their description.

    Records are encoded by the writers' own code: TFX's stock
    `TransformProcessor._RecordBatchToExamplesFn` and tfxkit's
    `writer.EncodeExamplesFn` (packing included); the shards are written
    directly rather than through a Beam runner, whose per-element cost would
    make generating a million examples take minutes here.
    """
    marker = os.path.join(data_dir, "complete.json")
    if os.path.exists(marker):
        with open(marker) as f:
            description = json.load(f)
        if description.get("version") == DATA_VERSION and description.get("examples") == n:
            return description
    from tensorflow_transform.tf_metadata import schema_utils
    from tfx.components.transform import executor as tfx_transform_executor

    from components.data import writer

    started = time.perf_counter()
    spec = transformed_spec(config)
    schema = schema_utils.schema_from_feature_spec(spec)
    batches = record_batches(config, n)
    settings = writer.OutputSettings.from_config(config, os.path.join(data_dir, "staging"))
    packing = writer.plan_packing(schema, settings)

    stock_encoder = tfx_transform_executor.TransformProcessor._RecordBatchToExamplesFn(schema)

    def stock_records():
        return (example for b in batches for _, example in stock_encoder.process((b, {})))

    # The stock encoding twice: GZIP (as stock TFX writes it) and uncompressed.
    stock_files, uncompressed_files = (
        _write_shards(
            os.path.join(data_dir, directory, "Split-train", "transformed_examples"),
            suffix,
            settings.num_shards,
            stock_records(),
            gzip,
        )
        for directory, suffix, gzip in (("stock", ".gz", True), ("stock_uncompressed", "", False))
    )
    ours_encoder = writer.EncodeExamplesFn(schema, packing)
    ours_records = (example for b in batches for example in ours_encoder.encode(b))
    ours_prefix = os.path.join(data_dir, "ours", "Split-train", "transformed_examples")
    ours_files = _write_shards(
        ours_prefix, settings.suffix, settings.num_shards, ours_records, False
    )
    staged = {
        ours_prefix: {
            "output_path": ours_prefix,
            "packing": transform_layout.packing_to_json(packing),
            "shards": [writer.describe_shard(p, settings.compression) for p in ours_files],
        }
    }
    layout = writer.build_layout(staged, {ours_prefix: "train"}, spec, settings)
    transform_layout.write_layout(os.path.join(data_dir, "ours"), layout)
    description = {
        "version": DATA_VERSION,
        "examples": n,
        "stock_files": stock_files,
        "uncompressed_files": uncompressed_files,
        "ours_files": layout.split_files("train"),
        "seconds": round(time.perf_counter() - started, 1),
    }
    with open(marker, "w") as f:
        json.dump(description, f)
    return description


def drain(ds: tf.data.Dataset, examples: int, warm: int = 0) -> tuple[int, float]:
    """Pulls `warm` examples untimed, then times batches until `examples` are seen.

    Returns:
      (examples timed, seconds).
    """
    iterator = iter(ds)
    seen = 0
    while seen < warm:
        seen += int(next(iterator)[1].shape[0])
    seen = 0
    started = time.perf_counter()
    for batch in iterator:
        seen += int(batch[1].shape[0])
        if seen >= examples:
            break
    return seen, time.perf_counter() - started


@dataclasses.dataclass
class Case:
    """One way of reading: a fresh dataset per run, and what it pulls untimed first."""

    make: object
    warm: int


def run_cases(cases: dict[str, Case], examples: int, repeats: int) -> dict[str, list[float]]:
    """Examples/s of every case in every repeat, the cases interleaved
    (`stats.alternating_order`)."""
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for r, order in enumerate(stats.alternating_order(list(cases), repeats)):
        for name in order:
            seen, seconds = drain(cases[name].make(), examples, cases[name].warm)
            rates[name].append(seen / seconds)
        print(
            f"# repeat {r}: " + ", ".join(f"{n} {rates[n][-1]:.0f}" for n in order), file=sys.stderr
        )
    return rates


def spread(values: list[float], digits: int = 0) -> dict:
    """Median, range and every run of one case."""
    return {
        "median": round(float(np.median(values)), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "runs": [round(v, digits) for v in values],
    }


def ratio(top: list[float], bottom: list[float]) -> list[float]:
    """Geometric mean of the per-repeat ratios and its 95% t interval."""
    return [
        round(x, 3) for x in stats.ratio_interval([a / b for a, b in zip(top, bottom, strict=True)])
    ]


def stock_dataset(files: list[str], config: PipelineConfig, tuned: bool = False) -> tf.data.Dataset:
    """What a stock TFX run_fn builds: `fn_args.data_accessor.tf_dataset_factory`.

    `tuned`: tfx_bsl's best settings: `sloppy_ordering` (order not kept, as
    the product's reader with `ingestion.deterministic: false`); readers,
    parsers and prefetch are autotuned by its defaults already.
    """
    from tensorflow_transform.tf_metadata import schema_utils
    from tfx.components.util import tfxio_utils
    from tfx.types import artifact_utils, standard_artifacts
    from tfx_bsl.public import tfxio

    examples = standard_artifacts.Examples()
    examples.uri = os.path.dirname(os.path.dirname(files[0]))
    examples.split_names = artifact_utils.encode_split_names(["train"])
    factory = tfxio_utils.get_tf_dataset_factory_from_artifact([examples], [])
    schema = schema_utils.schema_from_feature_spec(transformed_spec(config))
    options = tfxio.TensorFlowDatasetOptions(
        batch_size=config.ingestion.batch_size,
        label_key=config.data.label.name,
        sloppy_ordering=tuned,
        shuffle_buffer_size=config.ingestion.shuffle_buffer,
    )
    return factory(files, options, schema)


def ours(
    config: PipelineConfig, files, layout=None, training=True, compression="gzip", **overrides
) -> tf.data.Dataset:
    ingestion_config = dataclasses.replace(config.ingestion, **overrides)
    spec = layout.feature_spec() if layout else transformed_spec(config)
    return ingestion.make_dataset(
        files,
        spec,
        config.data.label.name,
        ingestion_config,
        batch_size=config.ingestion.batch_size,
        compression=layout.compression if layout else compression,
        training=training,
        packing=layout.packing if layout else None,
        shard_stats=layout.shard_stats() if layout else None,
        seed=config.train.seed,
    )


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child_peak_memory(args) -> None:
    """(c) on the first `--fraction` of the tfxkit files; prints its memory."""
    config = bench_config()
    layout = transform_layout.read_layout(os.path.join(args.data_dir, "ours"))
    files = layout.split_files("train")
    files = files[: max(1, round(len(files) * args.fraction))]
    examples = sum(layout.shard_stats()[f].records for f in files)
    baseline = _rss_mb()
    ds = ours(config, files, layout)
    iterator = iter(ds)
    seen = int(next(iterator)[1].shape[0])
    first_batch = _rss_mb()
    for batch in iterator:
        seen += int(batch[1].shape[0])
        if seen >= examples:
            break
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "files": len(files),
                "examples": seen,
                "rss_before_mb": round(baseline),
                "rss_at_first_batch_mb": round(first_batch),
                "rss_at_end_mb": round(_rss_mb()),
                # The process peak includes importing TensorFlow and TFX.
                "process_peak_rss_mb": round(peak),
            }
        )
    )


def peak_memory(args, fraction: float) -> dict:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child-peak-memory",
        "--data-dir",
        args.data_dir,
        "--fraction",
        str(fraction),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def train_rates(
    config: PipelineConfig, datasets: dict[str, tf.data.Dataset], steps: int, rounds: int
) -> dict:
    """Training steps/s of one taxi teacher fed by each dataset in turn.

    The datasets take turns (`rounds` times, `steps` steps each, the first
    steps of a turn untimed), so load from other processes hits them alike.
    """
    from components.training import fit as training

    keras.utils.set_random_seed(config.train.seed)
    model = models.build_classifier(config.data, config.teacher, cardinalities(config), "teacher")
    training.compile_classifier(model, config)
    skip = min(10, steps // 4)

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == skip:
                self.started = time.perf_counter()
            elif batch == steps - 1:
                self.rate = (steps - 1 - skip) / (time.perf_counter() - self.started)

    for ds in datasets.values():
        model.fit(ds, steps_per_epoch=2 * skip + 2, epochs=1, verbose=0)
    rates = {name: [] for name in datasets}
    for _ in range(rounds):
        for name, ds in datasets.items():
            clock = Clock()
            model.fit(ds, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
            rates[name].append(clock.rate)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2**20, help="examples in the data")
    parser.add_argument(
        "--timed-examples", type=int, default=2**18, help="examples every case times per run"
    )
    parser.add_argument(
        "--warm-examples", type=int, default=2**14, help="examples every run pulls untimed first"
    )
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--repeats", type=int, default=6, help="interleaved runs of every case")
    parser.add_argument(
        "--train-steps", type=int, default=300, help="training steps per timed turn"
    )
    parser.add_argument("--train-rounds", type=int, default=4, help="turns of each training input")
    parser.add_argument(
        "--shuffle-examples",
        type=int,
        default=2**16,
        help="examples of the label-sorted files the shuffle quality is scored on",
    )
    parser.add_argument("--shared-with", default="", help="what else ran on the cores")
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    parser.add_argument("--child-peak-memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fraction", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.data_dir = args.data_dir or os.path.join(
        tempfile.gettempdir(), f"tfxkit_bench_ingestion_{args.examples}"
    )
    if args.child_peak_memory:
        child_peak_memory(args)
        return
    if args.repeats < 2:
        parser.error("--repeats must be at least 2: one run per case gives no interval")
    if args.timed_examples + args.warm_examples > args.examples:
        parser.error("--timed-examples + --warm-examples must fit in one epoch of --examples")

    config = bench_config()
    data = generate(config, args.examples, args.data_dir)
    layout = transform_layout.read_layout(os.path.join(args.data_dir, "ours"))
    n, timed, warm = args.examples, args.timed_examples, args.warm_examples
    lines = []

    def out(record: dict) -> None:
        emit(record)
        lines.append(record)

    out(
        {
            "data": args.data_dir,
            "examples": n,
            "timed_examples": timed,
            "warm_examples": warm,
            "repeats": args.repeats,
            "files": {k: len(data[k]) for k in ("stock_files", "uncompressed_files", "ours_files")},
            "mb": {
                k: round(sum(os.path.getsize(f) for f in data[k]) / 2**20, 1)
                for k in ("stock_files", "uncompressed_files", "ours_files")
            },
            "generate_seconds": data["seconds"],
            "batch_size": config.ingestion.batch_size,
            "shuffle_buffer": config.ingestion.shuffle_buffer,
            "cpus": os.cpu_count(),
        }
    )
    stock_files, ours_files = data["stock_files"], data["ours_files"]
    plain_files = data["uncompressed_files"]

    def parsed():
        return ours(config, ours_files, layout, training=False, shuffle_buffer=0)

    filled = n + config.ingestion.shuffle_buffer + warm

    cases = {
        "stock": Case(lambda: stock_dataset(stock_files, config), warm),
        "stock_tuned": Case(lambda: stock_dataset(stock_files, config, tuned=True), warm),
        "ours_same_files": Case(lambda: ours(config, stock_files), warm),
        "ours_uncompressed": Case(lambda: ours(config, plain_files, compression="none"), warm),
        "ours_end_to_end": Case(lambda: ours(config, ours_files, layout), warm),
        # One untimed epoch fills the cache (plus the shuffle buffer's fill);
        # the limit pulls as many untimed, behind the same prefetch.
        "ours_cached": Case(lambda: ours(config, ours_files, layout, cache="memory"), filled),
        "limit": Case(lambda: parsed().cache().repeat().prefetch(tf.data.AUTOTUNE), filled),
    }
    # Every file once, untimed, so no case of the first repeat reads cold files.
    for files, compression in ((stock_files, "GZIP"), (plain_files, ""), (ours_files, "")):
        for _ in tf.data.TFRecordDataset(files, compression, buffer_size=2**20).batch(4096):
            pass
    rates = run_cases(cases, timed, args.repeats)
    for name, values in rates.items():
        out({"case": name, "examples_per_s": spread(values)})
    for fraction in (0.25, 1.0):
        out({"case": "ours_end_to_end_memory", "fraction": fraction, **peak_memory(args, fraction)})

    real_ds = ours(config, ours_files, layout)
    synthetic_ds = tf.data.Dataset.from_tensors(next(iter(real_ds))).repeat()
    # (A cached input is not timed here: each turn's fit starts a new
    # iterator, which would discard a cache it had not filled.)
    steps = train_rates(
        config, {"real": real_ds, "synthetic": synthetic_ds}, args.train_steps, args.train_rounds
    )
    out({"case": "train", "steps_per_s": {k: spread(v, 1) for k, v in steps.items()}})
    ratios = {
        "ours_end_to_end/stock": ratio(rates["ours_end_to_end"], rates["stock"]),
        "ours_end_to_end/stock_tuned": ratio(rates["ours_end_to_end"], rates["stock_tuned"]),
        "stock_tuned/stock": ratio(rates["stock_tuned"], rates["stock"]),
        # The three steps from tuned stock to the product's output, one change each.
        "step_reader": ratio(rates["ours_same_files"], rates["stock_tuned"]),
        "step_uncompressed": ratio(rates["ours_uncompressed"], rates["ours_same_files"]),
        "step_packing": ratio(rates["ours_end_to_end"], rates["ours_uncompressed"]),
        "ours_cached/limit": ratio(rates["ours_cached"], rates["limit"]),
        "train_real/synthetic": ratio(steps["real"], steps["synthetic"]),
    }
    # How random each reader's order is, at this benchmark's batch and buffer, on
    # label-sorted files (`benchmarks/shuffle_quality.py`); every `ours_*` case
    # shuffles as `product` does.
    from benchmarks import shuffle_quality

    quality_lines = shuffle_quality.measure(
        os.path.join(args.data_dir, "shuffle_quality"),
        args.shuffle_examples,
        2,
        config.ingestion.batch_size,
    )
    for line in quality_lines:
        out({"case": "shuffle_quality", **line})
    quality = shuffle_quality.summarize(quality_lines)["shuffle_quality"]
    out(
        {
            "examples_per_s_median": {k: round(float(np.median(v))) for k, v in rates.items()},
            "ratios_geomean_ci95": ratios,
            "shuffle_quality": {
                case: quality["product" if case.startswith("ours") else case]
                for case in ("stock", "stock_tuned", "ours_same_files", "ours_end_to_end")
            },
        }
    )
    if not args.no_results:
        path = results_lib.write(
            "ingestion", lines, shared_with=args.shared_with or None, argv=sys.argv[1:]
        )
        print(f"# wrote {os.path.relpath(path, results_lib.REPO_ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
