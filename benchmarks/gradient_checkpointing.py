"""Gradient checkpointing (`train.gradient_checkpointing`): memory against step time.

    .venv/bin/python benchmarks/gradient_checkpointing.py [--batch 4096] [--steps 12]
        [--pairs 4] [--shared-with TEXT] [--no-results]

The shipped `fashion_mnist` config's conv teacher (three conv blocks, batch
norm, the MLP head), built by the Trainer's own model builder and compiled
with its optimizer, trains `--steps` steps on one in-memory batch of
28x28x1 images, once with checkpointing off and once on. Each side runs in a
fresh process (so one side's allocations cannot hide the other's): a
warm-up run of each side, then `--pairs` pairs (at least 2) whose first
side alternates (off-on, on-off, ...), and
reports per run:

- `peak_mb`: peak accelerator memory (`tf.config.experimental.get_memory_info`)
  when a GPU is visible, else the process's peak resident memory minus its
  resident memory just before the first step (what training added);
- `step_ms`: median wall time of a step after the first two (tracing
  excluded), and `step_cpu_ms`: the process's CPU time per step over the
  same steps, which other load on a shared machine disturbs far less.

Output: one JSON line per run, then the headline
`{"batch", "device", "pairs", "params", "memory_ratio", "step_time_ratio",
"step_cpu_time_ratio", "peak_mb_off", "peak_mb_on", "load_average_before",
"load_average_after"}`: each ratio (on / off) is the geometric mean of the
pairs' ratios, with its 95% t interval (`..._ci95`), the peaks are medians
over the pairs, and the load averages (1 minute) show whether the machine
was idle as recorded.
The whole output goes to `benchmarks/results/gradient_checkpointing.json`.
`--filters` trains a wider tower (e.g. `64,128,256`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from testkit import results as results_lib  # noqa: E402
from testkit.stats import abba_order, ratio_interval  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(checkpointing: bool, batch: int, steps: int, filters: str) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import dataclasses

    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from components.training import fit as training
    from pipelines.configs import load_config

    config = load_config("fashion_mnist")
    teacher = config.teacher
    if filters:
        conv = dataclasses.replace(teacher.conv, filters=tuple(int(f) for f in filters.split(",")))
        teacher = dataclasses.replace(teacher, conv=conv)
    config = dataclasses.replace(
        config,
        teacher=teacher,
        train=dataclasses.replace(config.train, gradient_checkpointing=checkpointing),
    )
    keras.utils.set_random_seed(0)
    gpu = bool(tf.config.list_physical_devices("GPU"))
    model = training.build_model(config, None, config.teacher, "teacher")
    training.compile_classifier(model, config, steps)
    rng = np.random.default_rng(0)
    feature = config.data.features[0].transformed_name
    x = {feature: rng.normal(size=(batch, 784)).astype("float32")}
    y = rng.integers(0, 10, size=(batch,))
    data = tf.data.Dataset.from_tensors((x, y)).repeat()

    times: list[float] = []
    cpu_times: list[float] = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)
            cpu_times.append(time.process_time() - self.cpu_start)

    before = _rss_mb()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[Timer()])
    if gpu:
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    return {
        "gradient_checkpointing": checkpointing,
        "device": "GPU" if gpu else "CPU",
        "batch": batch,
        "params": model.count_params(),
        "peak_mb": round(peak, 1),
        "step_ms": round(1000 * statistics.median(times[2:] or times), 1),
        "step_cpu_ms": round(1000 * statistics.mean(cpu_times[2:] or cpu_times), 1),
    }


def _run(side: str, args) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", side, "--batch", str(args.batch)]
        + ["--steps", str(args.steps), "--filters", args.filters],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def summarize(pairs: list[dict], batch: int) -> dict:
    """The headline from `pairs` (each {"off": run, "on": run}): per measure, the geometric
    mean of the on / off ratios and its 95% t interval (None with fewer than 2 pairs)."""
    headline = {"batch": batch, "device": pairs[0]["on"]["device"], "pairs": len(pairs)}
    headline["params"] = pairs[0]["on"]["params"]
    for name, key in (
        ("memory_ratio", "peak_mb"),
        ("step_time_ratio", "step_ms"),
        ("step_cpu_time_ratio", "step_cpu_ms"),
    ):
        ratios = [p["on"][key] / p["off"][key] for p in pairs]
        if len(ratios) < 2:
            headline[name], headline[name + "_ci95"] = round(ratios[0], 3), None
            continue
        mean, low, high = ratio_interval(ratios)
        headline[name] = round(mean, 3)
        headline[name + "_ci95"] = [round(low, 3), round(high, 3)]
    for side in ("off", "on"):
        headline[f"peak_mb_{side}"] = round(statistics.median(p[side]["peak_mb"] for p in pairs), 1)
    return headline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=4, help="off / on pairs, order alternated")
    parser.add_argument("--filters", default="", help="conv filters per block, e.g. 64,128,256")
    parser.add_argument(
        "--shared-with", default="", help="what else ran on the cores (default: idle)"
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    parser.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pairs < 2 and not args.child:
        parser.error("--pairs: at least 2 (one pair has no spread to give an interval)")
    if args.child:
        print(json.dumps(child(args.child == "on", args.batch, args.steps, args.filters)))
        return
    load_before = os.getloadavg()[0]
    # A warm-up run of each side first: file caches and the first TensorFlow import.
    for side in ("off", "on"):
        _run(side, args)
    lines, pairs = [], []
    for i, order in enumerate(abba_order(args.pairs, "off", "on")):
        pair = {}
        for side in order:
            pair[side] = _run(side, args)
            lines.append({"pair": i, "first": order[0], **pair[side]})
            print(json.dumps(lines[-1]), flush=True)
        pairs.append(pair)
    headline = summarize(pairs, args.batch)
    headline["load_average_before"] = round(load_before, 2)
    headline["load_average_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(headline), flush=True)
    if not args.no_results:
        path = results_lib.write(
            "gradient_checkpointing",
            [*lines, headline],
            shared_with=args.shared_with or None,
            argv=sys.argv[1:],
        )
        print(f"# wrote {os.path.relpath(path, REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
