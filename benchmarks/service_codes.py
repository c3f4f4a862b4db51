"""The trainer's CPU per example receiving the product's batches as codes or as values.

The product's own path (`ingestion.make_dataset` with `service_job`, `remote: parse`, no
cache: the workers read, parse, shuffle and batch), on the 60,000 Fashion-MNIST training
images written as the tfxkit Transform writes them (`tfdata_service.write_data`: packed,
uncompressed, with the layout record, whose codebook for the image holds its 256 values).
Two workers and the dispatcher (`python -m components.data.service`) pinned to core 1,
this process (the trainer) pinned to core 0. Sides, each a training stream of
`--examples` examples after `--warmup` batches:

- `values`: the workers send float32 images (`ingestion.service.codes: off`);
- `codes`: they send the image as one-byte codes (`codes: auto`, what the product's
  Trainer and Distiller receive), which the training step decodes;

each at batch 512 (the demo's) and 4,096 (an accelerator's). Per side: this process's CPU
seconds per example (`time.process_time`, every thread), examples/s and the workers' CPU
per example (from /proc). The decode is not in the trainer's input cost: on an
accelerator it runs in the step on the device; `decode_cpu_us_per_example` gives what it
costs where the step runs on this core instead (a gather of one batch, timed alone).

Sides alternate (as listed, then reversed) over `--pairs` rounds; per batch size the
paired ratio codes / values of trainer CPU is a geometric mean with a 95% t interval.
Target: the trainer's CPU at most 0.5 µs an example (issue 63, item 2), shown where the
whole interval lies at or below it. Results: `benchmarks/results/service_codes.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

TRAINER_CPU, SERVICE_CPU = 0, 1
SIZES = (512, 4096)
SIDES = ("values", "codes")
TARGET_US_PER_EXAMPLE = 0.5


def _dataset(data: dict, size: int, side: str, address: str, job: str):
    from benchmarks.tfdata_service import LABEL
    from components.config import IngestionConfig, ServiceConfig
    from components.data import layout
    from components.data.ingestion import make_dataset

    built = layout.Layout.from_json(data["layout"])
    config = IngestionConfig(
        batch_size=size,
        eval_batch_size=size,
        cache="none",
        deterministic=False,
        service=ServiceConfig(dispatcher=address, remote="parse", compression="none"),
    )
    return make_dataset(
        data["files"], built.feature_spec(), LABEL, config, batch_size=size,
        compression="none", training=True, packing=built.packing,
        shard_stats=built.shard_stats(), seed=1, service_job=job,
        codebooks=built.codebooks if side == "codes" else None,
    )  # fmt: skip


def measure(data: dict, size: int, side: str, address: str, job: str, args, workers) -> dict:
    from benchmarks.tfdata_service import IMAGE, _cpu_seconds

    ds = _dataset(data, size, side, address, job)
    dtype = ds.element_spec[0][IMAGE].dtype.name
    iterator = iter(ds)
    for _ in range(args.warmup):
        next(iterator)
    batches = max(20, args.examples // size)
    cpu, wall = time.process_time(), time.perf_counter()
    theirs = sum(_cpu_seconds(p) for p in workers)
    for _ in range(batches):
        next(iterator)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    theirs = sum(_cpu_seconds(p) for p in workers) - theirs
    examples = batches * size
    return {
        "image_dtype": dtype,
        "trainer_cpu_us_per_example": cpu / examples * 1e6,
        "examples_per_s": examples / wall,
        "workers_cpu_us_per_example": theirs / examples * 1e6,
    }


def decode_cost(data: dict, size: int, repeats: int = 50) -> float:
    """Microseconds of this core per example to decode a batch of codes (the step's gather)."""
    import numpy as np
    import tensorflow as tf

    from benchmarks.tfdata_service import IMAGE
    from components.data import codes, layout

    book = np.asarray(layout.Layout.from_json(data["layout"]).codebooks[IMAGE], np.float32)
    table = tf.constant(book)
    batch = tf.constant(np.random.default_rng(0).integers(0, book.size, (size, 784), np.uint8))
    decode = tf.function(lambda c: tf.reduce_sum(codes.decode(c, table)))
    decode(batch)
    start = time.process_time()
    for _ in range(repeats):
        decode(batch)
    return (time.process_time() - start) / (repeats * size) * 1e6


def summarize(runs: dict[str, list[dict]], decode_us: dict[int, float]) -> tuple[list[dict], dict]:
    """Per-side means and intervals, and per size the paired ratio codes / values."""
    from testkit.stats import ratio_interval, t_interval

    rows, headline = [], {"target_us_per_example": TARGET_US_PER_EXAMPLE}
    for size in SIZES:
        for side in SIDES:
            results = runs[f"{side}-{size}"]
            row = {"case": "side", "side": side, "size": size,
                   "image_dtype": results[0]["image_dtype"]}  # fmt: skip
            for key in ("trainer_cpu_us_per_example", "examples_per_s",
                        "workers_cpu_us_per_example"):  # fmt: skip
                mean, low, high = t_interval([r[key] for r in results])
                digits = 0 if key == "examples_per_s" else 3
                row[key] = round(mean, digits)
                row[f"{key}_ci95"] = [round(low, digits), round(high, digits)]
            rows.append(row)
            headline[f"trainer_cpu_us_per_example_{side}_{size}"] = row[
                "trainer_cpu_us_per_example"
            ]
            headline[f"trainer_cpu_us_per_example_{side}_{size}_ci95"] = row[
                "trainer_cpu_us_per_example_ci95"
            ]
        ratios = [
            c["trainer_cpu_us_per_example"] / v["trainer_cpu_us_per_example"]
            for c, v in zip(runs[f"codes-{size}"], runs[f"values-{size}"], strict=True)
        ]
        mean, low, high = ratio_interval(ratios)
        headline[f"codes_over_values_trainer_cpu_{size}"] = round(mean, 3)
        headline[f"codes_over_values_trainer_cpu_{size}_ci95"] = [round(low, 3), round(high, 3)]
        headline[f"decode_cpu_us_per_example_{size}"] = round(decode_us[size], 3)
    best = headline[f"trainer_cpu_us_per_example_codes_{SIZES[-1]}_ci95"]
    headline["meets_target"] = best[1] <= TARGET_US_PER_EXAMPLE
    headline["target_within_interval"] = best[0] <= TARGET_US_PER_EXAMPLE
    return rows, headline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--examples", type=int, default=200_000, help="timed per side")
    parser.add_argument("--warmup", type=int, default=10, help="batches before timing")
    parser.add_argument("--shared-with", default=None,
                        help="what else ran on the cores (None: the machine was idle)")  # fmt: skip
    parser.add_argument("--no-results", action="store_true", help="print only")
    args = parser.parse_args()
    # Pinned before TensorFlow starts its thread pools (the service's processes are
    # pinned to their own core by `taskset`).
    os.sched_setaffinity(0, {TRAINER_CPU})

    from benchmarks.tfdata_service import write_data
    from testkit import results
    from testkit.data_service import LocalService
    from testkit.stats import alternating_order

    lines: list[dict] = []

    def emit(line: dict) -> None:
        lines.append(line)
        print(json.dumps(line), flush=True)

    names = [f"{side}-{size}" for size in SIZES for side in SIDES]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    cpus = {"dispatcher": str(SERVICE_CPU), "workers": str(SERVICE_CPU)}
    with tempfile.TemporaryDirectory(prefix="service_codes_") as work:
        data = write_data(os.path.join(work, "data"))
        with LocalService(os.path.join(work, "service"), 2, cpus=cpus) as svc:
            workers = [w.pid for w in svc.workers]
            for r, order in enumerate(alternating_order(names, args.pairs)):
                for name in order:
                    side, size = name.split("-")
                    result = measure(
                        data, int(size), side, svc.address, f"{name}-{r}", args, workers
                    )
                    runs[name].append(result)
                    emit({"case": "run", "round": r, "side": side, "size": int(size),
                          **{k: v if isinstance(v, str) else round(v, 4)
                             for k, v in result.items()}})  # fmt: skip
        rows, headline = summarize(runs, {size: decode_cost(data, size) for size in SIZES})
    for row in rows:
        emit(row)
    emit(headline)
    if not args.no_results:
        path = results.write("service_codes", lines, shared_with=args.shared_with,
                             argv=sys.argv[1:])  # fmt: skip
        print(f"results: {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
