"""The tf.data service against the training host's own input pipeline, on Fashion-MNIST.

One run, one machine (2 cores). The data: the 60,000 Fashion-MNIST training images written
as the tfxkit Transform writes them (packed float features, uncompressed, with its layout
record), plus a `uid` feature to count examples. Every training side is a fresh child
process pinned to core 0 (`taskset -c 0`); the service's dispatcher and worker are
`python -m components.data.service` processes pinned to core 1. Cases:

- `input_bound`: the product's pipeline with the teachers' translate / flip views, feeding an
  MLP whose step costs about what its batch's input costs on core 0 (the `calibration` line
  of each case measures both there): (a) `local` (views on core 0) vs (b) `service`
  (`remote: augment`, views on core 1). Target (b)/(a) steps/s >= 1.5.
- `not_input_bound`: no views, a conv net whose steps dwarf parsing: `local` vs `service`
  (`remote: parse`). Target (b)/(a) >= 0.9 (the service costs at most 10%).
- `equal_cpu`: the `input_bound` job at equal total CPU: (a) `local` on both cores (`taskset
  -c 0,1`: the trainer's own views and steps may use both) vs (b) `service` as above
  (trainer on core 0, dispatcher and worker on core 1). `service_over_local_equal_cpu` is
  (b)/(a) steps/s; each side's CPU-seconds per step counts every process of it (the
  trainer's, and the service's dispatcher and worker) over the timed steps. The first
  framing asks what a worker on another host adds to a trainer; this one whether the same
  two cores do better as a service than as one local pipeline.
- `exactly_once`: two workers, `distributed_epoch`: one pass holds every uid once.
- `first_epoch`: the service's first (uncached) epoch, two workers on core 1, read by core 0
  against the limit, iterating parsed batches already in memory on core 0. Target >= 0.9.
  Every side is timed after its first batch (whose wait, `*_first_batch_s`, is reported
  apart: building the iterator and tracing its functions are not a per-example cost).
  Each side's CPU on core 0 per example (`*_client_cpu_us_per_example`): the trainer's cost
  of its input, which caps what one trainer core takes whatever the workers; the summary's
  `trainer_cpu_s_per_1e6_examples` gives it per 10^6 examples for reading here (`local`), the
  service with compression (`service_compressed`, `auto`) and without (`service_uncompressed`).
  Target <= 0.5 s (0.5 µs an example). Since d041b8d the workers hand over whole batches
  (`ingestion._ReadPlan.batched_remotely`); before, they sent parsed read batches that the
  trainer shuffled and re-batched, and this case ran one worker.

The workload is fixed before measuring: `MLP_UNITS` is what it was at 3f2f3c6. Earlier
workloads' results (the 536k MLP, `EARLIER_WORKLOADS`) are carried into the file as
`earlier_workload` rows, read from the results files committed with them.

Sides alternate in ABBA order over `--pairs` pairs (the first-epoch runs alternate which side
reads first), each run warms up before it is timed; ratios are per pair, reported as a
geometric mean with a 95% t interval. JSON lines: a `summary` line with the intervals and
targets, then the headline holding exactly `HEADLINE_KEYS`; the results go to
`benchmarks/results/tfdata_service.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

TRAINER_CPU = "0"
SERVICE_CPU = "1"
LABEL = "label_xf"
IMAGE = "image_xf"
# The teachers' views (pipelines/configs/fashion_mnist.yaml).
TRANSLATE, FLIP = 2, True
# The last line's keys, exactly (intervals, targets and the rest are on the line before).
HEADLINE_KEYS = (
    "service_speedup",
    "service_over_local_equal_cpu",
    "service_over_local_equal_cpu_ci95",
    "service_cost_ratio_not_input_bound",
    "exactly_once",
    "first_epoch_over_limit",
)
# The input-bound job's MLP: its step on core 0 costs about what its batch's input with
# views costs there (both measured by every run, `calibration` lines).
MLP_UNITS = (320, 160)
CASES = {
    # Hidden units chosen so one step costs about what its batch's views cost on one core.
    "input_bound": {"views": True, "model": "mlp", "remote": "augment"},
    "not_input_bound": {"views": False, "model": "conv", "remote": "parse"},
    # The input-bound job, its local side on both cores.
    "equal_cpu": {"views": True, "model": "mlp", "remote": "augment"},
}
# Where the local side of each case runs.
LOCAL_CPUS = {"equal_cpu": f"{TRAINER_CPU},{SERVICE_CPU}"}
# Results of earlier workloads (commit of the results file, the MLP it trained): the 536k
# MLP's step cost 1.4-1.7 times its input, a job bound by its model.
EARLIER_WORKLOADS = (("ea79663", (512, 256)), ("517083f", (512, 256)))


def write_data(directory: str) -> dict:
    """Fashion-MNIST train as the tfxkit Transform writes it; returns the files and layout JSON."""
    import numpy as np
    import pyarrow as pa
    import tensorflow as tf

    from components.data import fashion_mnist
    from testkit import transform

    images, labels = fashion_mnist.load_split("train")
    n = len(labels)
    pixels = (images.reshape(n, -1).astype(np.float32) / 255.0).reshape(-1)
    spec = {
        IMAGE: tf.io.FixedLenFeature([784], tf.float32),
        "uid": tf.io.FixedLenFeature([1], tf.float32),
        LABEL: tf.io.FixedLenFeature([], tf.int64),
    }

    def column(values, width):
        return pa.LargeListArray.from_arrays(
            pa.array(np.arange(0, len(values) + 1, width, dtype=np.int64)), pa.array(values)
        )

    def batches():
        for s in range(0, n, 1024):
            e = min(n, s + 1024)
            yield pa.RecordBatch.from_arrays(
                [
                    column(pixels[784 * s : 784 * e], 784),
                    column(np.arange(s, e, dtype=np.float32), 1),
                    column(labels[s:e].astype(np.int64), 1),
                ],
                [IMAGE, "uid", LABEL],
            )

    paths, built = transform.write_transformed_files(
        directory, spec, batches(), num_shards=8, compression="none", pack=True
    )
    return {"files": paths, "layout": built.to_json(), "examples": n}


def _dataset(data: dict, args, *, views: bool, dispatcher: str, remote: str, training: bool,
             job: str, cache: str = "none", compression: str = "none"):  # fmt: skip
    import tensorflow as tf

    from components.config import IngestionConfig, ServiceConfig
    from components.data import augment, ingestion, layout

    built = layout.Layout.from_json(data["layout"])
    config = IngestionConfig(
        batch_size=args.batch_size,
        eval_batch_size=args.batch_size,
        cache=cache,
        service=ServiceConfig(
            dispatcher=dispatcher, remote=remote or "parse", compression=compression
        ),
    )
    shapes = {IMAGE: (28, 28, 1)}

    def views_of(features, label, seed):
        return augment.augment_images(
            features, shapes, translate=TRANSLATE, flip=FLIP, seed=seed
        ), label

    remote_views = views and dispatcher and remote == "augment"
    remote_map = None
    if remote_views:

        def remote_map(features, label):
            return views_of(
                features, label, tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)
            )

    ds = ingestion.make_dataset(
        data["files"], built.feature_spec(), LABEL, config, batch_size=args.batch_size,
        compression="none", training=training, packing=built.packing,
        shard_stats=built.shard_stats(), seed=1, service_job=job if dispatcher else "",
        remote_map=remote_map,
    )  # fmt: skip
    if views and not remote_views:
        # As `training.inputs.augmented` does on the training host.
        ds = (
            ds.enumerate()
            .map(
                lambda i, batch: views_of(*batch, tf.stack([tf.constant(1, tf.int64), i])),
                num_parallel_calls=tf.data.AUTOTUNE,
            )
            .prefetch(tf.data.AUTOTUNE)
        )
    return ds


def _model(kind: str):
    """`mlp`: 304k parameters (`MLP_UNITS`), a step about as costly as its batch's input with
    views on one core: input-bound. (The 536k MLP before it cost 1.4-1.7 times its input,
    a job bound by its model, which capped the speedup below 1.5 however fast the service.)
    `conv`: a small conv net whose step costs several times its input."""
    import tf_keras as keras

    inp = keras.Input(shape=(784,), name=IMAGE)
    x = inp
    if kind == "mlp":
        for units in MLP_UNITS:
            x = keras.layers.Dense(units, activation="relu")(x)
    else:
        x = keras.layers.Reshape((28, 28, 1))(inp)
        for filters in (16, 32):
            x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            x = keras.layers.MaxPool2D()(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(64, activation="relu")(x)
    model = keras.Model({IMAGE: inp}, keras.layers.Dense(10)(x))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def child_train(job: dict) -> dict:
    """Steps/s of one training side (runs pinned to core 0)."""
    import tensorflow as tf

    args = argparse.Namespace(**job["args"])
    case = CASES[job["case"]]
    ds = _dataset(
        job["data"], args, views=case["views"], dispatcher=job["dispatcher"],
        remote=case["remote"], training=True, job=job["job"],
    )  # fmt: skip
    ds = ds.map(lambda f, label: ({IMAGE: f[IMAGE]}, label))
    model = _model(case["model"])
    iterator = iter(ds)
    step = tf.function(model.train_step)
    for _ in range(args.warmup):
        step(next(iterator))
    service_pids = job.get("service_pids", [])
    cpu, theirs = time.process_time(), sum(_cpu_seconds(p) for p in service_pids)
    start = time.perf_counter()
    for _ in range(args.steps):
        logs = step(next(iterator))
    float(logs["loss"])
    seconds = time.perf_counter() - start
    own = time.process_time() - cpu
    service_cpu = sum(_cpu_seconds(p) for p in service_pids) - theirs
    return {
        "steps_per_s": args.steps / seconds,
        "seconds": seconds,
        "trainer_cpu_s_per_step": own / args.steps,
        "service_cpu_s_per_step": service_cpu / args.steps,
        "cpu_s_per_step": (own + service_cpu) / args.steps,
    }


def child_calibrate(job: dict) -> dict:
    """On core 0: the case's model step alone (one batch held in memory) and its own input
    pipeline alone (iterated, no model), in steps/s; the input's share of a local step."""
    import tensorflow as tf

    args = argparse.Namespace(**job["args"])
    case = CASES[job["case"]]

    def rate(iterator, step=None) -> float:
        for _ in range(args.warmup):
            batch = next(iterator)
            if step is not None:
                step(batch)
        start = time.perf_counter()
        for _ in range(args.steps):
            batch = next(iterator)
            if step is not None:
                logs = step(batch)
        if step is not None:
            float(logs["loss"])
        return args.steps / (time.perf_counter() - start)

    def own_input():
        ds = _dataset(job["data"], args, views=case["views"], dispatcher="", remote="",
                      training=True, job="")  # fmt: skip
        return ds.map(lambda f, label: ({IMAGE: f[IMAGE]}, label))

    held = own_input().take(1).cache().repeat()
    model_rate = rate(iter(held), tf.function(_model(case["model"]).train_step))
    input_rate = rate(iter(own_input()))
    return {
        "model_steps_per_s": model_rate,
        "input_steps_per_s": input_rate,
        "input_share": (1 / input_rate) / (1 / input_rate + 1 / model_rate),
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The service's first-epoch sides: (name, views, remote, compression).
FIRST_EPOCH_SIDES = (
    ("parse", False, "parse", "none"),
    ("parse_compressed", False, "parse", "auto"),
    ("views", True, "augment", "none"),
)


def child_first_epoch(job: dict) -> dict:
    """One uncached epoch through the service, and on this core alone, read on core 0.

    Returns examples/s of: the service's first epoch (`remote: parse`, uncompressed and
    compressed; `views`: with the views made remotely), this core reading and parsing the
    files itself, and the limit (iterating parsed batches already in memory); and the CPU
    seconds per example this process (the trainer's side) and the service's workers spent.
    """
    args = argparse.Namespace(**job["args"])
    n = job["data"]["examples"]
    workers = job["worker_pids"]

    def rate(ds, examples: int = n) -> tuple[float, float, float, float]:
        """Over the first `examples` of the stream (the training stream's first epoch),
        after its first batch: examples/s, this process's and the workers' CPU seconds per
        example; and the seconds to the first batch (building the iterator, tracing its
        functions, the workers' start), apart, so the rest is what each example costs."""
        start = time.perf_counter()
        iterator = iter(ds)
        seen = int(next(iterator)[1].shape[0])
        first_batch_s = time.perf_counter() - start
        counted, cpu = 0, time.process_time()
        theirs = sum(_cpu_seconds(p) for p in workers)
        start = time.perf_counter()
        for _, label in iterator:
            counted += int(label.shape[0])
            if seen + counted >= examples:
                break
        wall = time.perf_counter() - start
        return (
            counted / wall,
            (time.process_time() - cpu) / counted,
            (sum(_cpu_seconds(p) for p in workers) - theirs) / counted,
            first_batch_s,
        )

    out = {}

    def on_service():
        for name, views, remote, compression in FIRST_EPOCH_SIDES:
            served = _dataset(job["data"], args, views=views, dispatcher=job["dispatcher"],
                              remote=remote, training=True, job=f"{job['job']}-{name}",
                              compression=compression)  # fmt: skip
            examples_per_s, client_cpu, worker_cpu, first_batch_s = rate(served)
            out[f"service_{name}_examples_per_s"] = examples_per_s
            out[f"service_{name}_client_cpu_us_per_example"] = client_cpu * 1e6
            out[f"service_{name}_worker_cpu_us_per_example"] = worker_cpu * 1e6
            out[f"service_{name}_first_batch_s"] = first_batch_s

    def on_this_core():
        local = _dataset(job["data"], args, views=False, dispatcher="", remote="", training=True,
                         job="", cache="none")  # fmt: skip
        runs = [rate(local) for _ in range(2)]
        out["local_parse_examples_per_s"] = max(r[0] for r in runs)
        out["local_parse_client_cpu_us_per_example"] = min(r[1] for r in runs) * 1e6
        out["local_parse_first_batch_s"] = min(r[3] for r in runs)

    # The side measured first alternates run by run (`service_first`).
    for side in (on_service, on_this_core) if job["service_first"] else (on_this_core, on_service):
        side()
    cached = _dataset(job["data"], args, views=False, dispatcher="", remote="", training=False,
                      job="", cache="none").cache()  # fmt: skip
    rate(cached)  # fills the cache
    runs = [rate(cached) for _ in range(2)]
    out["limit_examples_per_s"] = max(r[0] for r in runs)
    # What iterating costs this loop alone: the floor under every side's client CPU.
    out["limit_client_cpu_us_per_example"] = min(r[1] for r in runs) * 1e6
    out["examples"] = n
    return out


def _run_child(kind: str, job: dict, cpus: str = TRAINER_CPU) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": REPO_ROOT}  # fmt: skip
    command = ["taskset", "-c", cpus, sys.executable, __file__, "--child", kind]
    done = subprocess.run(
        command, input=json.dumps(job), capture_output=True, text=True, env=env, timeout=1800
    )
    if done.returncode != 0:
        raise RuntimeError(f"child {kind} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def earlier_workloads() -> list[dict]:
    """The input-bound results of `EARLIER_WORKLOADS`, from their committed results files."""
    rows = []
    for commit, units in EARLIER_WORKLOADS:
        done = subprocess.run(
            ["git", "-C", REPO_ROOT, "show", f"{commit}:benchmarks/results/tfdata_service.json"],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            rows.append({"case": "earlier_workload", "results_commit": commit,
                         "missing": done.stderr.strip()[:200]})  # fmt: skip
            continue
        earlier = json.loads(done.stdout)
        # The line with the intervals: `summary` since 3f2f3c6, the last line before.
        summary = next(
            line for line in reversed(earlier["lines"]) if "service_speedup_ci95" in line
        )
        rows.append({
            "case": "earlier_workload", "results_commit": commit,
            "measured_at": earlier["commit"][:12], "date": earlier["date"],
            "mlp_units": list(units), "service_speedup": summary["service_speedup"],
            "service_speedup_ci95": summary["service_speedup_ci95"],
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", default="")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--first-epoch-runs", type=int, default=4)
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--shared-with", default=None,
                        help="what else ran on the cores (None: the machine was idle)")  # fmt: skip
    parser.add_argument("--no-results", action="store_true", help="print only")
    args = parser.parse_args()
    if args.child:
        job = json.loads(sys.stdin.read())
        child = {"train": child_train, "calibrate": child_calibrate}.get(
            args.child, child_first_epoch
        )
        result = child(job)
        print(json.dumps(result))
        return

    from testkit import results
    from testkit.data_service import LocalService
    from testkit.stats import abba_order, ratio_interval, t_interval

    lines: list[dict] = []

    def emit(line: dict) -> None:
        lines.append(line)
        print(json.dumps(line), flush=True)

    work = tempfile.mkdtemp(prefix="tfdata_service_")
    data_dir = args.data_dir or os.path.join(work, "data")
    data_file = os.path.join(data_dir, "data.json")
    if not os.path.exists(data_file):
        os.makedirs(data_dir, exist_ok=True)
        with open(data_file, "w") as f:
            json.dump(write_data(data_dir), f)
    with open(data_file) as f:
        data = json.load(f)
    shared = {"args": {"batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup},
              "data": data}  # fmt: skip
    cpus = {"dispatcher": SERVICE_CPU, "workers": SERVICE_CPU}
    headline: dict = {}
    for case in [c for c in args.cases.split(",") if c]:
        calibration = _run_child("calibrate", {**shared, "case": case})
        emit({"case": case, "calibration": True,
              **{k: round(v, 3 if k == "input_share" else 2) for k, v in calibration.items()}})  # fmt: skip
        ratios, cpu_per_step = [], {"local": [], "service": []}
        local_cpus = LOCAL_CPUS.get(case, TRAINER_CPU)
        for pair, order in enumerate(abba_order(args.pairs, "local", "service")):
            rates = {}
            for side in order:
                job = {**shared, "case": case, "job": f"{case}-{pair}", "dispatcher": ""}
                if side == "service":
                    with LocalService(os.path.join(work, f"{case}{pair}"), 1, cpus=cpus) as svc:
                        pids = [svc.dispatcher.process.pid, svc.workers[0].process.pid]
                        rates[side] = _run_child(
                            "train", {**job, "dispatcher": svc.address, "service_pids": pids}
                        )
                else:
                    rates[side] = _run_child("train", job, cpus=local_cpus)
                cpu_per_step[side].append(rates[side]["cpu_s_per_step"])
            ratio = rates["service"]["steps_per_s"] / rates["local"]["steps_per_s"]
            ratios.append(ratio)
            emit({"case": case, "pair": pair, "order": list(order), "ratio": round(ratio, 3),
                  "local_cpus": local_cpus,
                  **{f"{s}_steps_per_s": round(r["steps_per_s"], 2) for s, r in rates.items()},
                  **{f"{s}_{k}": round(r[k], 4) for s, r in rates.items()
                     for k in ("cpu_s_per_step", "trainer_cpu_s_per_step", "service_cpu_s_per_step")}})  # fmt: skip
        mean, low, high = ratio_interval(ratios)
        key = {
            "input_bound": "service_speedup",
            "not_input_bound": "service_cost_ratio_not_input_bound",
            "equal_cpu": "service_over_local_equal_cpu",
        }[case]
        headline[key] = round(mean, 3)
        headline[f"{key}_ci95"] = [round(low, 3), round(high, 3)]
        headline[f"{case}_cpu_s_per_step_median"] = {
            side: round(float(sorted(v)[len(v) // 2]), 4) for side, v in cpu_per_step.items()
        }
    for row in earlier_workloads():
        emit(row)

    # Exactly once: two workers, one distributed_epoch pass read here.
    import tensorflow as tf  # noqa: F401  (after the children: this process is not timed)

    with LocalService(os.path.join(work, "once"), 2) as svc:
        ds = _dataset(data, argparse.Namespace(**shared["args"]), views=False,
                      dispatcher=svc.address, remote="parse", training=False, job="once")  # fmt: skip
        uids = [int(u) for features, _ in ds for u in features["uid"].numpy().reshape(-1)]
    exactly_once = sorted(uids) == list(range(data["examples"]))
    emit({"case": "exactly_once", "workers": 2, "examples_seen": len(uids),
          "distinct": len(set(uids)), "exactly_once": exactly_once})  # fmt: skip
    headline["exactly_once"] = exactly_once

    over, over_local = [], []
    client_cpu = {"local": [], "service_uncompressed": [], "service_compressed": []}
    for run in range(args.first_epoch_runs):
        with LocalService(os.path.join(work, f"first{run}"), 2, cpus=cpus) as svc:
            job = {**shared, "dispatcher": svc.address, "job": f"first{run}",
                   "worker_pids": [w.process.pid for w in svc.workers],
                   "service_first": run % 2 == 0}  # fmt: skip
            result = _run_child("first", job)
        over.append(result["service_parse_examples_per_s"] / result["limit_examples_per_s"])
        over_local.append(
            result["service_parse_examples_per_s"] / result["local_parse_examples_per_s"]
        )
        for side, key in (("local", "local_parse"), ("service_uncompressed", "service_parse"),
                          ("service_compressed", "service_parse_compressed")):  # fmt: skip
            client_cpu[side].append(result[f"{key}_client_cpu_us_per_example"])
        emit({"case": "first_epoch", "run": run, "service_first": run % 2 == 0, "workers": 2,
              **{k: round(v, 3 if "cpu" in k else 1) for k, v in result.items()},
              "over_limit": round(over[-1], 3), "over_local_parse": round(over_local[-1], 3)})  # fmt: skip
    for key, values in (
        ("first_epoch_over_limit", over),
        ("first_epoch_over_local_parse", over_local),
    ):
        mean, low, high = ratio_interval(values)
        headline[key] = round(mean, 3)
        headline[f"{key}_ci95"] = [round(low, 3), round(high, 3)]
    # CPU seconds per 10^6 examples = microseconds per example.
    headline["trainer_cpu_s_per_1e6_examples"] = {}
    for side, values in client_cpu.items():
        mean, low, high = t_interval(values)
        headline["trainer_cpu_s_per_1e6_examples"][side] = round(mean, 3)
        headline["trainer_cpu_s_per_1e6_examples"][f"{side}_ci95"] = [round(low, 3), round(high, 3)]
    headline["targets"] = {"service_speedup": 1.5, "service_cost_ratio_not_input_bound": 0.9,
                           "first_epoch_over_limit": 0.9,
                           "trainer_cpu_s_per_1e6_examples_service": 0.5}  # fmt: skip
    headline["batch_size"] = args.batch_size
    emit({"case": "summary", **headline})
    # The last line holds exactly the keys the issue names, compared across runs.
    emit({key: headline.get(key) for key in HEADLINE_KEYS})
    if not args.no_results:
        path = results.write("tfdata_service", lines, shared_with=args.shared_with,
                             argv=sys.argv[1:])  # fmt: skip
        print(f"results: {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
