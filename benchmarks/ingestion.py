"""Input pipeline throughput: stock TFX reading vs tfxkit's Transform output + tf.data.

One run, one machine, the same examples for every case:

- data: `--examples` (default 2^20) examples with the taxi config's
  transformed schema (the feature names, dtypes and shapes the tfxkit
  Transform produces for `pipelines/configs/taxi.yaml`, value ranges as the
  config implies). They are encoded twice, by the stock TFX Transform
  encoder (`TransformProcessor._RecordBatchToExamplesFn`, written as GZIP
  TFRecords) and by the tfxkit Transform encoder (`writer.EncodeExamplesFn`:
  packed, written uncompressed, plus its layout record), both in the default
  shard count. Generated once into `--data-dir` and reused by later runs.
- cases, in examples/s, all consumed by the same Python loop:
  (a) `stock`: TFX's `data_accessor.tf_dataset_factory` on the stock files;
  (b) `ours_same_files`: `ingestion.make_dataset` on the stock files;
  (c) `ours_end_to_end`: `ingestion.make_dataset` on the tfxkit files, first
      epoch (its memory is measured in child processes reading a quarter and
      all of the files: with cache off, RSS from the first batch to the end of
      the epoch must not grow with the data);
  (d) `ours_cached`: the same with `ingestion.cache: memory`, later epochs;
  (e) `limit`: iterating already parsed batches cached in memory;
  and the taxi teacher's training steps/s fed by (c)'s pipeline vs fed by
  synthetic in-memory tensors of the same shapes.

Every figure is one JSON line; the last line holds the headline figures.
Timings are noisy on a shared machine: each case is run `--repeats` times and
the best is kept; compare ratios within one run.
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

# Distinct ids of a `vocabulary` feature in the synthetic data (the real taxi
# vocabularies are of this order).
VOCABULARY_SIZE = 100
DATA_VERSION = 1
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
    stock_records = (example for b in batches for _, example in stock_encoder.process((b, {})))
    stock_files = _write_shards(
        os.path.join(data_dir, "stock", "Split-train", "transformed_examples"),
        ".gz",
        settings.num_shards,
        stock_records,
        True,
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
        "ours_files": layout.split_files("train"),
        "seconds": round(time.perf_counter() - started, 1),
    }
    with open(marker, "w") as f:
        json.dump(description, f)
    return description


def drain(
    ds: tf.data.Dataset, examples: int, warm: int = 0, fill: bool = False
) -> tuple[int, float]:
    """Pulls batches until `examples` are seen and returns (examples, seconds).

    Args:
      ds: The dataset.
      examples: Examples to time.
      warm: Examples pulled untimed first from the same iterator.
      fill: Iterate a (finite) dataset once untimed first, e.g. to fill a cache.
    """
    if fill:
        for _ in ds:
            pass
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


def measure(
    name: str, make, examples: int, repeats: int, warm: int = 0, fill: bool = False
) -> float:
    """Best examples/s of `repeats` runs on fresh datasets; emits one JSON line."""
    best, cpu = 0.0, []
    for _ in range(repeats):
        cpu_started = time.process_time()
        seen, seconds = drain(make(), examples, warm, fill)
        best = max(best, seen / seconds)
        cpu.append(time.process_time() - cpu_started)
    emit(
        {
            "case": name,
            "examples": seen,
            "examples_per_s": round(best),
            "cpu_seconds": [round(c, 1) for c in cpu],
        }
    )
    return best


def stock_dataset(files: list[str], config: PipelineConfig) -> tf.data.Dataset:
    """What a stock TFX run_fn builds: `fn_args.data_accessor.tf_dataset_factory`."""
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
        batch_size=config.ingestion.batch_size, label_key=config.data.label.name
    )
    return factory(files, options, schema)


def ours(config: PipelineConfig, files, layout=None, training=True, **overrides) -> tf.data.Dataset:
    ingestion_config = dataclasses.replace(config.ingestion, **overrides)
    spec = layout.feature_spec() if layout else transformed_spec(config)
    return ingestion.make_dataset(
        files,
        spec,
        config.data.label.name,
        ingestion_config,
        batch_size=config.ingestion.batch_size,
        compression=layout.compression if layout else "gzip",
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
    parser.add_argument("--examples", type=int, default=2**20)
    parser.add_argument(
        "--stock-examples", type=int, default=2**18, help="examples timed for (a), the slowest case"
    )
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--train-steps", type=int, default=300, help="training steps per timed turn"
    )
    parser.add_argument("--train-rounds", type=int, default=4, help="turns of each training input")
    parser.add_argument("--child-peak-memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fraction", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.data_dir = args.data_dir or os.path.join(
        tempfile.gettempdir(), f"tfxkit_bench_ingestion_{args.examples}"
    )
    if args.child_peak_memory:
        child_peak_memory(args)
        return

    config = bench_config()
    data = generate(config, args.examples, args.data_dir)
    layout = transform_layout.read_layout(os.path.join(args.data_dir, "ours"))
    n = args.examples
    emit(
        {
            "data": args.data_dir,
            "examples": n,
            "stock_files": len(data["stock_files"]),
            "ours_files": len(data["ours_files"]),
            "stock_mb": round(sum(os.path.getsize(f) for f in data["stock_files"]) / 2**20, 1),
            "ours_mb": round(sum(os.path.getsize(f) for f in data["ours_files"]) / 2**20, 1),
            "generate_seconds": data["seconds"],
            "batch_size": config.ingestion.batch_size,
            "shuffle_buffer": config.ingestion.shuffle_buffer,
            "cpus": os.cpu_count(),
        }
    )
    stock_files, ours_files = data["stock_files"], data["ours_files"]
    stock = measure(
        "stock", lambda: stock_dataset(stock_files, config), args.stock_examples, args.repeats
    )
    same = measure("ours_same_files", lambda: ours(config, stock_files), n, args.repeats)
    end_to_end = measure(
        "ours_end_to_end", lambda: ours(config, ours_files, layout), n, args.repeats
    )
    cached = measure(
        "ours_cached",
        lambda: ours(config, ours_files, layout, cache="memory"),
        2 * n,
        args.repeats,
        warm=n,
    )

    def parsed():
        return ours(config, ours_files, layout, training=False, shuffle_buffer=0)

    # The limit: parsed batches already in memory, iterated as they are and
    # behind a prefetch (whichever is faster on this machine).
    limit = max(
        measure("limit", lambda: parsed().cache(), n, args.repeats, fill=True),
        measure(
            "limit_prefetched",
            lambda: parsed().cache().prefetch(tf.data.AUTOTUNE),
            n,
            args.repeats,
            fill=True,
        ),
    )
    for fraction in (0.25, 1.0):
        emit(
            {"case": "ours_end_to_end_memory", "fraction": fraction, **peak_memory(args, fraction)}
        )

    real_ds = ours(config, ours_files, layout)
    synthetic_ds = tf.data.Dataset.from_tensors(next(iter(real_ds))).repeat()
    rates = train_rates(
        config,
        {
            "real": real_ds,
            "real_cached": ours(config, ours_files, layout, cache="memory"),
            "synthetic": synthetic_ds,
        },
        args.train_steps,
        args.train_rounds,
    )
    best = {name: max(r) for name, r in rates.items()}
    real, synthetic = best["real"], best["synthetic"]
    emit(
        {
            "case": "train",
            "steps_per_s_best": {k: round(v, 1) for k, v in best.items()},
            "steps_per_s_runs": {k: [round(x) for x in v] for k, v in rates.items()},
            "real_cached_over_synthetic": round(best["real_cached"] / synthetic, 3),
            # Turn by turn, so a burst of load from other processes cancels out.
            "median_turn_ratio_real_over_synthetic": round(
                float(np.median(np.array(rates["real"]) / np.array(rates["synthetic"]))), 3
            ),
        }
    )
    emit(
        {
            "ratios": {
                "ours_same_files/stock": round(same / stock, 2),
                "ours_end_to_end/stock": round(end_to_end / stock, 2),
                "ours_cached/limit": round(cached / limit, 2),
                "train_real/synthetic": round(real / synthetic, 3),
            },
            "targets": {
                "ours_same_files/stock": 3,
                "ours_end_to_end/stock": 8,
                "ours_cached/limit": 0.9,
                "train_real/synthetic": 0.95,
            },
        }
    )
    emit(
        {
            "stock": round(stock),
            "ours_same_files": round(same),
            "ours_end_to_end": round(end_to_end),
            "ours_cached": round(cached),
            "limit": round(limit),
            "train_real_steps_per_s": round(real, 1),
            "train_synthetic_steps_per_s": round(synthetic, 1),
        }
    )


if __name__ == "__main__":
    main()
