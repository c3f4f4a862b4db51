"""TFX's taxi native-Keras example, stock and with the two-import swap, side by side.

    .venv/bin/python benchmarks/drop_in.py [--train-steps 1000] [--repeats 3] [--workdir DIR]

One run executes the pipeline file from the tfx wheel
(`tfx/examples/chicago_taxi_pipeline/taxi_pipeline_native_keras.py`, its
module file `taxi_utils_native_keras.py` and the taxi CSV that ships with
it) twice through `BeamDagRunner`, each in a fresh process: once as it is,
once with only its `Transform` / `Trainer` imports changed to tfxkit's
(defaults everywhere: one device on a CPU machine, tfxkit's input pipeline
behind `data_accessor.tf_dataset_factory`, ingestion-ready Transform output).
Both use the example's own step counts unless `--train-steps` is given.

Prints one JSON line per run (wall time of the whole pipeline, Transform
and Trainer execution times from ML Metadata, the Evaluator's binary
accuracy, whether a model was pushed), then the headline: swapped / stock
ratios of mean wall time and mean Trainer time, each side's accuracy (mean
and standard deviation over `--repeats` runs: the example seeds nothing, so
run-to-run spread is its seed noise), the difference with its standard
error, and whether the pushed models' serving signatures are identical.
Runs alternate stock / swapped so that both sides see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from benchmarks.stats import diff_se, mean_std  # noqa: E402


def _execution_seconds(metadata_path: str) -> dict[str, float]:
    """Seconds each component's execution took (MLMD create -> last update), by class name."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    store = metadata_store.MetadataStore(config)
    types = {t.id: t.name for t in store.get_execution_types()}
    out = {}
    for execution in store.get_executions():
        name = types[execution.type_id].rsplit(".", 1)[-1]
        out[name] = (
            execution.last_update_time_since_epoch - execution.create_time_since_epoch
        ) / 1000.0
    return out


def _accuracy(pipeline_root: str) -> float | None:
    import tensorflow_model_analysis as tfma

    base = os.path.join(pipeline_root, "Evaluator", "evaluation")
    for run in sorted(os.listdir(base)):
        for metrics in tfma.load_metrics(os.path.join(base, run)):
            if metrics.slice_key.single_slice_keys:
                continue
            for entry in metrics.metric_keys_and_values:
                if entry.key.name == "binary_accuracy":
                    return round(entry.value.double_value.value, 4)
    return None


def run_side(side: str, root: str, train_steps: int | None) -> dict:
    """Runs one side in this process and returns its figures."""
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    from benchmarks import tfx_examples

    example = tfx_examples.TAXI
    module = tfx_examples.load_pipeline(
        example, os.path.join(root, "code"), swapped=side == "swapped", train_steps=train_steps
    )
    pipeline = tfx_examples.create_pipeline(example, module, root, tfx_examples.TAXI_DATA)
    start = time.perf_counter()
    BeamDagRunner().run(pipeline)
    wall = time.perf_counter() - start
    seconds = _execution_seconds(os.path.join(root, "metadata.db"))
    pushed = tfx_examples.pushed_models(root)
    return {
        "side": side,
        "wall_s": round(wall, 1),
        "transform_s": round(seconds.get("Transform", float("nan")), 1),
        "trainer_s": round(seconds.get("Trainer", float("nan")), 1),
        "binary_accuracy": _accuracy(os.path.join(root, "pipeline_root")),
        "pushed": bool(pushed),
        "signatures": json.dumps(tfx_examples.signatures(pushed[-1])) if pushed else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-steps", type=int, default=None, help="default: the example's 1000")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per side (accuracy spread needs 2 or more)"
    )
    parser.add_argument("--workdir", default="")
    parser.add_argument("--side", choices=["stock", "swapped"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="tfxkit-dropin-bench-")
    if args.side:
        result = run_side(args.side, workdir, args.train_steps)
        print("RESULT " + json.dumps(result), flush=True)
        return
    runs: dict[str, list[dict]] = {"stock": [], "swapped": []}
    for repeat in range(args.repeats):
        for side in ("stock", "swapped"):
            root = os.path.join(workdir, f"{side}-{repeat}")
            command = [sys.executable, os.path.abspath(__file__), "--side", side]
            command += ["--workdir", root]
            if args.train_steps is not None:
                command += ["--train-steps", str(args.train_steps)]
            env = {**os.environ, "PYTHONPATH": REPO_ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
            done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=REPO_ROOT)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                sys.stderr.write(done.stderr[-5000:])
                raise SystemExit(f"{side} run {repeat} failed (exit {done.returncode})")
            result = json.loads(lines[-1][len("RESULT ") :])
            runs[side].append(result)
            shown = {k: v for k, v in result.items() if k != "signatures"}
            print(json.dumps({"repeat": repeat, **shown}), flush=True)
    print(json.dumps(headline(runs, args.train_steps or 1000)))


def headline(runs: dict[str, list[dict]], train_steps: int) -> dict:
    """Swapped / stock ratios, both accuracies and their difference over the repeats."""
    stock, swapped = runs["stock"], runs["swapped"]
    out: dict = {"train_steps": train_steps, "repeats": len(stock)}
    for key in ("wall_s", "trainer_s"):
        ratio = statistics.fmean(r[key] for r in swapped) / statistics.fmean(r[key] for r in stock)
        out[f"{key[:-2]}_ratio_swapped_over_stock"] = round(ratio, 3)
    acc = {side: [r["binary_accuracy"] for r in side_runs] for side, side_runs in runs.items()}
    for side, values in acc.items():
        mean, std = mean_std(values)
        out[f"binary_accuracy_{side}"] = round(mean, 4)
        out[f"binary_accuracy_{side}_std"] = None if std is None else round(std, 4)
    diff = statistics.fmean(acc["swapped"]) - statistics.fmean(acc["stock"])
    se = diff_se(acc["swapped"], acc["stock"])
    out["accuracy_diff"] = round(diff, 4)
    out["accuracy_diff_se"] = None if se is None else round(se, 4)
    out["within_seed_noise"] = None if se is None else abs(diff) <= 2 * se
    signatures = {r["signatures"] for side_runs in runs.values() for r in side_runs}
    out["same_serving_signatures"] = len(signatures) == 1
    return out


if __name__ == "__main__":
    main()
