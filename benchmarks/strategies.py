"""Trainer throughput of the taxi teacher under each strategy, and the cost of accumulation.

    .venv/bin/python benchmarks/strategies.py [--steps 200] [--workdir DIR]

One run measures, on the same data (the Chicago taxi CSV that ships in the
tfx wheel, transformed by the shipped taxi config's real `preprocessing_fn`
with TFT in-process, written as 4 gzip shards):

- `one_device`: `training.fit` on the CPU;
- `mirrored`: 2 logical CPU devices in one process;
- `multi_worker`: two worker processes on localhost (TF_CONFIG, free ports);
- `grad_accum`: one device, 4 micro-batches of 64 per update vs one batch of
  256 (the same global batch per optimizer update).

Every mode runs in a fresh process (logical devices and collectives are fixed
when TensorFlow starts), trains `steps` optimizer steps at the shipped global
batch (256) with the input cached in memory (so the figures are about the
training step, not parsing), and times every epoch after the first (tracing
and cache filling excluded). Prints JSON lines; the last one is the headline:
`{"one_device", "mirrored", "multi_worker"}` in examples/s and
`grad_accum_overhead` = step time with accumulation / without.

When a GPU is visible the same is measured on it with and without
`mixed_float16`; this machine has none, which the output says.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

GLOBAL_BATCH = 256
SHARDS = 4
EPOCHS = 5


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
    from components.testing.transform import analyze_and_transform

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


def run_mode(name: str, config, materialized: dict, workdir: str, tf_configs=(None,)) -> dict:
    """Runs one mode (one process per TF_CONFIG) and returns the chief's figures."""
    processes, results = [], []
    for index, tf_config in enumerate(tf_configs):
        inputs = {
            "train_files": materialized["train_files"],
            "eval_files": materialized["eval_files"],
            "transform_output": materialized["transform_output"],
            "serving_model_dir": os.path.join(workdir, name, "serving"),
            "model_run_dir": os.path.join(workdir, name, f"run{index}"),
            "train_steps": config.train.train_steps,
            "eval_steps": config.train.eval_steps,
        }
        spec_path = os.path.join(workdir, f"{name}{index}.json")
        result = os.path.join(workdir, f"{name}{index}.result.json")
        with open(spec_path, "w") as f:
            json.dump({"config": config.to_json(), "inputs": inputs, "result": result}, f)
        env = dict(os.environ)
        if tf_config is not None:
            env["TF_CONFIG"] = json.dumps(tf_config)
        log = open(os.path.join(workdir, f"{name}{index}.log"), "w")
        processes.append(
            (
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", spec_path],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
        results.append(result)
    try:
        for p, _ in processes:
            p.wait(timeout=1800)
    finally:
        for p, log in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    for (p, _), index in zip(processes, range(len(processes)), strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"{name}: process {index} failed; see {workdir}/{name}{index}.log")
    figures = [json.load(open(r)) for r in results]
    return next(f for f in figures if f["is_chief"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workdir", default="")
    parser.add_argument("--worker", default="")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    import portpicker
    import tensorflow as tf

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_strategies_")
    start = time.perf_counter()
    materialized = materialize(os.path.join(workdir, "data"))
    print(
        json.dumps(
            {
                "data": "taxi",
                "rows": materialized["rows"],
                "shards": SHARDS,
                "transform_s": round(time.perf_counter() - start, 1),
            }
        ),
        flush=True,
    )
    gpus = len(tf.config.list_physical_devices("GPU"))
    steps = args.steps
    figures = {}
    modes = {
        "one_device": (_config(steps, strategy={"kind": "one_device"}), (None,)),
        "mirrored": (_config(steps, strategy={"kind": "mirrored", "num_cpu_devices": 2}), (None,)),
    }
    ports = [portpicker.pick_unused_port() for _ in range(2)]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    modes["multi_worker"] = (
        _config(steps, strategy={"kind": "multi_worker_mirrored", "workers": 2}),
        tuple({"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(2)),
    )
    modes["grad_accum_4x64"] = (
        _config(
            steps,
            strategy={"kind": "one_device"},
            ingestion={"batch_size": GLOBAL_BATCH // 4},
            train={"grad_accum_steps": 4},
        ),
        (None,),
    )
    if gpus:
        modes["gpu_float32"] = (_config(steps, strategy={"kind": "one_device"}), (None,))
        modes["gpu_mixed_float16"] = (
            _config(
                steps, strategy={"kind": "one_device"}, train={"mixed_precision": "mixed_float16"}
            ),
            (None,),
        )
    for name, (config, tf_configs) in modes.items():
        figures[name] = run_mode(name, config, materialized, workdir, tf_configs)
        print(
            json.dumps(
                {
                    "mode": name,
                    **{
                        k: round(v, 4) if isinstance(v, float) else v
                        for k, v in figures[name].items()
                    },
                }
            ),
            flush=True,
        )
    if not gpus:
        print(
            json.dumps(
                {
                    "gpu": "none visible on this machine; GPU and mixed-precision figures not measured"
                }
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "one_device": round(figures["one_device"]["examples_per_s"], 1),
                "mirrored": round(figures["mirrored"]["examples_per_s"], 1),
                "multi_worker": round(figures["multi_worker"]["examples_per_s"], 1),
                "grad_accum_overhead": round(
                    figures["grad_accum_4x64"]["step_s"] / figures["one_device"]["step_s"], 3
                ),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
