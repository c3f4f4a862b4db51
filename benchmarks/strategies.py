"""Trainer throughput of the taxi teacher under each strategy, and the cost of accumulation.

    .venv/bin/python benchmarks/strategies.py [--steps 500] [--repeats 4] [--workdir DIR]
        [--shared-with TEXT] [--no-results]

One run measures, on the same data (the Chicago taxi CSV that ships in the
tfx wheel, transformed by the shipped taxi config's real `preprocessing_fn`
with TFT in-process, written as 4 gzip shards):

- `one_device`: `training.fit` on the CPU;
- `mirrored`: 2 logical CPU devices in one process;
- `multi_worker`: two worker processes on localhost (TF_CONFIG, ports picked
  free for each run);
- `grad_accum_4x64`: one device, 4 micro-batches of 64 per update vs one
  batch of 256 (the same global batch per optimizer update).

Every run is a fresh process (logical devices and collectives are fixed
when TensorFlow starts) with its own directories (no backup of an earlier
run to resume from), trains `--steps` optimizer steps (5 equal epochs) at
the shipped global batch (256) with the input cached in memory (so the
figures are about the training step, not parsing), and times every epoch
after the first (tracing and cache filling excluded). A warm-up run of
every mode comes first (not printed); then `--repeats` rounds (at least 2)
run every mode, the order reversed round by round (A B C D, D C B A, ...),
so drift cannot favour a mode by its position (exactly so with an even
count). Each round gives each mode's ratio to its base in the same round;
the headline is their geometric mean with a 95% t interval over the rounds.
A failed process fails the run naming its log, and its peers are killed.

Prints JSON lines (the data, whether a GPU is visible, then one per measured
run), the headline last:
`{"rounds", "examples_per_s": {mode: median}, "mirrored_speedup",
"multi_worker_speedup" (examples/s over one_device's), "grad_accum_overhead"
(step time over one_device's), on a GPU "mixed_float16_speedup"
(examples/s over gpu_float32's), each with `..._ci95`, "steps",
"load_average_before", "load_average_after" (1, 5 and 15 minutes)}`. The
whole output goes to `benchmarks/results/strategies.json`.

When a GPU is visible, every mode runs on the GPUs rather than the CPU
(`gpu_float32` then repeats `one_device`'s config as the base of the
mixed-precision ratio), and the model is also measured with
`mixed_float16`; this machine has none, which the output says.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from testkit import results as results_lib  # noqa: E402
from testkit.stats import alternating_order, ratio_interval  # noqa: E402

GLOBAL_BATCH = 256
SHARDS = 4
EPOCHS = 5
RUN_TIMEOUT_S = 1800


def _config(steps: int, **sections):
    from components.config import from_dict, to_dict
    from pipelines.configs import load_config

    data = to_dict(load_config("taxi"))
    data["ingestion"].update(
        {"batch_size": GLOBAL_BATCH, "cache": "memory", "shuffle_buffer": 10000}
    )
    data["train"].update(
        {
            "train_steps": steps,
            "steps_per_epoch": max(1, steps // EPOCHS),
            "eval_steps": 1,
            "checkpoint_every_steps": 10 * steps,
        }
    )
    for section, values in sections.items():
        data[section].update(values)
    return from_dict(data)


def materialize(workdir: str) -> dict:
    """Transforms the taxi CSV with the shipped config's preprocessing_fn (real TFT)."""
    import tensorflow as tf

    from components.data.sources import taxi_csv_path
    from testkit.transform import analyze_and_transform

    # Only its data section and preprocessing_fn matter here, not the schedule.
    config = _config(1, train={"warmup_steps": 0})
    kinds = {f.name: f.kind for f in config.data.features}
    dtypes = {"float": tf.float32, "int_categorical": tf.int64, "string_categorical": tf.string}
    spec = {name: tf.io.VarLenFeature(dtypes[kind]) for name, kind in kinds.items()}
    spec[config.data.label.name] = tf.io.VarLenFeature(tf.int64)
    convert = {
        "float": float,
        "int_categorical": lambda v: int(float(v)),
        "string_categorical": str.encode,
    }
    instances = []
    with open(taxi_csv_path()) as f:
        for row in csv.DictReader(f):
            instance = {
                k: [convert[kind](row[k])] if row[k] != "" else [] for k, kind in kinds.items()
            }
            label = row[config.data.label.name]
            instance[config.data.label.name] = [int(float(label))] if label != "" else []
            instances.append(instance)
    transformed, coder, transform_output = analyze_and_transform(instances, spec, config, workdir)
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    files = []
    for shard in range(SHARDS):
        path = os.path.join(workdir, "train", f"data-{shard:05d}-of-{SHARDS:05d}.gz")
        tf.io.gfile.makedirs(os.path.dirname(path))
        with tf.io.TFRecordWriter(path, options) as writer:
            for instance in transformed[shard::SHARDS]:
                writer.write(coder.encode(instance))
        files.append(path)
    return {
        "transform_output": transform_output,
        "train_files": files,
        "eval_files": files[:1],
        "rows": len(transformed),
    }


# --------------------------------------------------------------------------- #
# One measured run (in its own process)
# --------------------------------------------------------------------------- #


def worker(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    from components.config import PipelineConfig
    from components.training import strategies

    config = PipelineConfig.from_json(spec["config"])
    choice = strategies.create_strategy(config.strategy)
    import tensorflow_transform as tft
    import tf_keras as keras

    from components.training import fit as training

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.durations = []

        def on_epoch_begin(self, epoch, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.durations.append(time.perf_counter() - self._start)

    inputs = training.TrainingInputs(**spec["inputs"])
    tft_output = tft.TFTransformOutput(inputs.transform_output)

    def build_and_compile():
        model = training.build_model(config, tft_output, config.teacher, "teacher")
        training.compile_classifier(model, config)
        return model

    timer = EpochTimer()
    training.fit(config, inputs, build_and_compile, choice=choice, callbacks=[timer])
    steps_per_epoch = config.train.steps_per_epoch
    measured = timer.durations[1:]
    step_s = sum(measured) / (len(measured) * steps_per_epoch)
    update_batch = config.ingestion.batch_size * config.train.grad_accum_steps
    with open(spec["result"], "w") as f:
        json.dump(
            {
                "replicas": choice.num_replicas,
                "is_chief": choice.is_chief,
                "step_s": step_s,
                "steps_per_s": 1.0 / step_s,
                "examples_per_s": update_batch / step_s,
            },
            f,
        )


def run_mode(name: str, config, materialized: dict, rundir: str, tf_configs=(None,)) -> dict:
    """Runs one mode (one process per TF_CONFIG) under `rundir`, which must be new (a
    backup left there would be resumed), and returns the chief's figures."""
    os.makedirs(rundir)
    processes, logs, results = [], [], []
    try:
        for index, tf_config in enumerate(tf_configs):
            inputs = {
                "train_files": materialized["train_files"],
                "eval_files": materialized["eval_files"],
                "transform_output": materialized["transform_output"],
                "serving_model_dir": os.path.join(rundir, "serving"),
                "model_run_dir": os.path.join(rundir, f"run{index}"),
                "train_steps": config.train.train_steps,
                "eval_steps": config.train.eval_steps,
            }
            spec_path = os.path.join(rundir, f"spec{index}.json")
            result = os.path.join(rundir, f"result{index}.json")
            with open(spec_path, "w") as f:
                json.dump({"config": config.to_json(), "inputs": inputs, "result": result}, f)
            env = dict(os.environ)
            if tf_config is not None:
                env["TF_CONFIG"] = json.dumps(tf_config)
            logs.append(open(os.path.join(rundir, f"process{index}.log"), "w"))
            processes.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", spec_path],
                    env=env,
                    stdout=logs[-1],
                    stderr=subprocess.STDOUT,
                )
            )
            results.append(result)
        _wait_all(name, processes, rundir, RUN_TIMEOUT_S)
    finally:
        # On every path this process survives (return or exception; not a SIGKILL or
        # SIGTERM of the parent itself): nothing left running (a worker whose peer failed
        # would wait on it), every log closed.
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    figures = [json.load(open(r)) for r in results]
    return next(f for f in figures if f["is_chief"])


def _wait_all(name: str, processes: list, rundir: str, timeout_s: float) -> None:
    """Waits for every process under one deadline.

    Raises:
      RuntimeError: at the first poll (every 0.2 s) that finds a process exited
        non-zero, naming it and its log (the lowest index among those found; a peer
        that gave up on it within the same 0.2 s may be named instead), rather than
        after the others finish; or at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in processes]
        for index, code in enumerate(codes):
            if code not in (None, 0):
                raise RuntimeError(
                    f"{name}: process {index} exited with {code}; see {rundir}/process{index}.log"
                )
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: not finished after {timeout_s:g} s; see {rundir}/")
        time.sleep(0.2)


def modes(steps: int, gpus: int) -> dict:
    """Each mode's config and a function giving its processes' TF_CONFIGs (fresh free
    ports for every run of a multi-worker mode)."""
    import portpicker

    def two_workers():
        cluster = {"worker": [f"localhost:{portpicker.pick_unused_port()}" for _ in range(2)]}
        return tuple({"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(2))

    def single():
        return (None,)

    found = {
        "one_device": (_config(steps, strategy={"kind": "one_device"}), single),
        "mirrored": (_config(steps, strategy={"kind": "mirrored", "num_cpu_devices": 2}), single),
        "multi_worker": (
            _config(steps, strategy={"kind": "multi_worker_mirrored", "workers": 2}),
            two_workers,
        ),
        "grad_accum_4x64": (
            _config(
                steps,
                strategy={"kind": "one_device"},
                ingestion={"batch_size": GLOBAL_BATCH // 4},
                train={"grad_accum_steps": 4},
            ),
            single,
        ),
    }
    if gpus:
        found["gpu_float32"] = (_config(steps, strategy={"kind": "one_device"}), single)
        found["gpu_mixed_float16"] = (
            _config(
                steps, strategy={"kind": "one_device"}, train={"mixed_precision": "mixed_float16"}
            ),
            single,
        )
    return found


# Headline ratios: (name, mode, base, figure): the mode's figure over the base's in the
# same round.
RATIOS = (
    ("mirrored_speedup", "mirrored", "one_device", "examples_per_s"),
    ("multi_worker_speedup", "multi_worker", "one_device", "examples_per_s"),
    ("grad_accum_overhead", "grad_accum_4x64", "one_device", "step_s"),
    ("mixed_float16_speedup", "gpu_mixed_float16", "gpu_float32", "examples_per_s"),
)


def summarize(rounds: list[dict]) -> dict:
    """The headline from `rounds` (each {mode: the chief's figures}): each mode's median
    examples/s, and per ratio of `RATIOS` whose modes ran, the geometric mean over the
    rounds of mode / base in the same round with its 95% t interval (None with fewer
    than 2 rounds)."""
    names = list(rounds[0])
    headline = {
        "rounds": len(rounds),
        "examples_per_s": {
            m: round(statistics.median(r[m]["examples_per_s"] for r in rounds), 1) for m in names
        },
    }
    for name, mode, base, figure in RATIOS:
        if mode not in names or base not in names:
            continue
        ratios = [r[mode][figure] / r[base][figure] for r in rounds]
        if len(ratios) < 2:
            headline[name], headline[name + "_ci95"] = round(ratios[0], 3), None
            continue
        mean, low, high = ratio_interval(ratios)
        headline[name] = round(mean, 3)
        headline[name + "_ci95"] = [round(low, 3), round(high, 3)]
    return headline


def _emit(line: dict) -> dict:
    print(json.dumps(line), flush=True)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=500, help=f"optimizer steps a run (a multiple of {EPOCHS})"
    )
    parser.add_argument(
        "--repeats", type=int, default=4, help="rounds of every mode, the order alternated"
    )
    parser.add_argument("--workdir", default="")
    parser.add_argument(
        "--shared-with", default="", help="what else ran on the cores (default: idle)"
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.repeats < 2:
        parser.error("--repeats: at least 2 (one round has no spread to give an interval)")
    if args.steps < 2 * EPOCHS or args.steps % EPOCHS:
        parser.error(
            f"--steps: a multiple of {EPOCHS}, at least {2 * EPOCHS} (runs train {EPOCHS} "
            "equal epochs and the first is not timed)"
        )
    if args.workdir and os.path.isdir(args.workdir) and os.listdir(args.workdir):
        parser.error(f"--workdir: {args.workdir!r} is not empty; runs never reuse a directory")
    # Before this process's own TensorFlow import adds to it.
    load_before = os.getloadavg()
    import tensorflow as tf

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_strategies_")
    start = time.perf_counter()
    materialized = materialize(os.path.join(workdir, "data"))
    lines = [
        _emit(
            {
                "data": "taxi",
                "rows": materialized["rows"],
                "shards": SHARDS,
                "transform_s": round(time.perf_counter() - start, 1),
            }
        )
    ]
    gpus = len(tf.config.list_physical_devices("GPU"))
    if not gpus:
        lines.append(
            _emit(
                {
                    "gpu": "none visible on this machine; GPU and mixed-precision figures not measured"
                }
            )
        )
    found = modes(args.steps, gpus)
    # A warm-up run of every mode: file caches, the first TensorFlow import and gRPC setup.
    for name, (config, tf_configs) in found.items():
        run_mode(name, config, materialized, os.path.join(workdir, "warmup", name), tf_configs())
    rounds = []
    for i, order in enumerate(alternating_order(list(found), args.repeats)):
        figures = {}
        for name in order:
            config, tf_configs = found[name]
            rundir = os.path.join(workdir, f"round{i}", name)
            figures[name] = run_mode(name, config, materialized, rundir, tf_configs())
            lines.append(
                _emit(
                    {
                        "round": i,
                        "position": order.index(name),
                        "mode": name,
                        **{
                            k: round(v, 6) if isinstance(v, float) else v
                            for k, v in figures[name].items()
                        },
                    }
                )
            )
        rounds.append(figures)
    headline = summarize(rounds)
    headline["steps"] = args.steps
    # 1, 5 and 15 minutes: whether the machine was idle as recorded.
    headline["load_average_before"] = [round(v, 2) for v in load_before]
    headline["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    lines.append(_emit(headline))
    if not args.no_results:
        path = results_lib.write(
            "strategies", lines, shared_with=args.shared_with or None, argv=sys.argv[1:]
        )
        print(f"# wrote {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
