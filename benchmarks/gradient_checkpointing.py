"""Gradient checkpointing (`train.gradient_checkpointing`): memory against step time.

    .venv/bin/python benchmarks/gradient_checkpointing.py [--batch 1024] [--steps 12]

The shipped `fashion_mnist` config's conv teacher (three conv blocks, batch
norm, the MLP head), built by the Trainer's own model builder and compiled
with its optimizer, trains `--steps` steps on one in-memory batch of
28x28x1 images, once with checkpointing off and once on. Each side runs in a
fresh process (so one side's allocations cannot hide the other's) and
reports:

- `peak_mb`: peak accelerator memory (`tf.config.experimental.get_memory_info`)
  when a GPU is visible, else the process's peak resident memory minus its
  resident memory just before the first step (what training added);
- `step_ms`: median wall time of a step after the first two (tracing
  excluded), and `step_cpu_ms`: the process's CPU time per step over the
  same steps, which other load on a shared machine disturbs far less.

Output: one JSON line per side, then the headline
`{"batch", "device", "memory_ratio", "step_time_ratio",
"step_cpu_time_ratio"}` (on / off).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--filters", default="", help="conv filters per block, e.g. 64,128,256")
    parser.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "on", args.batch, args.steps, args.filters)))
        return
    rows = {}
    for side in ("off", "on"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", side, "--batch", str(args.batch)]
            + ["--steps", str(args.steps), "--filters", args.filters],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows[side] = json.loads(out.strip().splitlines()[-1])
        print(json.dumps(rows[side]), flush=True)
    off, on = rows["off"], rows["on"]
    print(
        json.dumps(
            {
                "batch": args.batch,
                "device": on["device"],
                "params": on["params"],
                "memory_ratio": round(on["peak_mb"] / off["peak_mb"], 3),
                "step_time_ratio": round(on["step_ms"] / off["step_ms"], 3),
                "step_cpu_time_ratio": round(on["step_cpu_ms"] / off["step_cpu_ms"], 3),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
