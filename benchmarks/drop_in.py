"""TFX's own examples, stock and with the two-import swap, side by side.

    .venv/bin/python benchmarks/drop_in.py [--example taxi|penguin|mnist|all] [--train-steps N]
        [--penguin-train-steps N] [--mnist-train-steps N] [--mnist-batch-size N]
        [--repeats 3] [--max-minutes M] [--workdir DIR]

Three examples from the tfx wheel (see `testkit.tfx_examples`):

- `taxi`: `chicago_taxi_pipeline/taxi_pipeline_native_keras.py`, its module
  file `taxi_utils_native_keras.py` and the taxi CSV that ships with it, at
  the example's own 1000 steps unless `--train-steps` is given: a 1000-step
  model, where an execution's fixed costs show;
- `penguin`: `penguin/penguin_pipeline_local.py` with `penguin_utils_keras.py`
  on the shared penguin CSV, at `--penguin-train-steps` (default 5000, the
  example's own is 100): a tiny MLP on batches of 20, so the Trainer's time
  is its input pipeline and per-step overhead;
- `mnist`: `mnist/mnist_pipeline_native_keras.py` with
  `mnist_utils_native_keras.py` (an MLP on 784 pixel floats, batches of 40,
  its own `MirroredStrategy`) on 12,000 real Fashion-MNIST images written in
  the example's format (`tfx_examples.mnist_data_root`), at
  `--mnist-train-steps` (default: the example's own 5000): an image example,
  where parsing 784-float examples is a real share of each step (input-heavy).

Each run executes the pipeline through `BeamDagRunner` twice, each in a
fresh process: once as it is, once with only its `Transform` / `Trainer`
imports changed to tfxkit's (defaults everywhere: one device on a CPU
machine, tfxkit's input pipeline behind `data_accessor.tf_dataset_factory`,
ingestion-ready Transform output).

Prints one JSON line per run (wall time of the whole pipeline, Transform and
Trainer execution times from ML Metadata, where the Trainer's and the
Transform's executions spent their time (`trainer_phases_s`,
`transform_phases_s`, see `benchmarks.phase_timing`), the seconds its
training dataset alone takes for the same batches (`input_alone_s`), the
Evaluator's accuracy, whether a model was pushed), then the headline, one
object per example under `examples`: swapped / stock ratios of mean wall
time, mean Trainer time and mean Transform time, each side's mean phases and
`input_alone_s`, each side's accuracy (mean and standard deviation over
`--repeats` runs: the examples seed nothing, so run-to-run spread is their
seed noise), the difference with its standard error, and whether the pushed
models' serving signatures are identical. Each repeat is a pair run back to
back, the side that goes first alternating (ABBA); the headline adds the
geometric mean of the per-pair ratios with its 95% interval, and judges
accuracy by two one-sided tests at the example's margin in
`ACCURACY_MARGINS` (no interval with fewer than 2 pairs).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)


def _helper(name: str):
    """A `testkit` helper loaded from its file, not through the `testkit` package.

    The stock side's child must import nothing of the product (its package
    `__init__` included), so it loads the helpers it shares with the tests
    this way; they import no product module at module level.
    """
    key = f"_drop_in_{name}"
    if key not in sys.modules:
        path = os.path.join(REPO_ROOT, "testkit", f"{name}.py")
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


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


# The Evaluator metric each example's accuracy is read from (TFMA's key name).
METRICS = {
    "taxi": "binary_accuracy",
    "penguin": "sparse_categorical_accuracy",
    "mnist": "sparse_categorical_accuracy",
}
DEFAULT_STEPS = {"taxi": 1000, "penguin": 5000, "mnist": 5000}
# Accuracies within this of each other count as equal (two one-sided tests, 5% each).
ACCURACY_MARGIN = 0.01
# Each example's margin. Penguin's Evaluator scores its 100 eval rows, so its
# accuracy moves in steps of 0.01: a margin of one row cannot be met by runs
# that differ by a row from seed noise alone; two rows can. Taxi's and MNIST's
# Evaluators score thousands of rows.
ACCURACY_MARGINS = {"taxi": ACCURACY_MARGIN, "penguin": 0.02, "mnist": ACCURACY_MARGIN}


def _accuracy(pipeline_root: str, metric: str) -> float | None:
    import tensorflow_model_analysis as tfma

    # The MNIST example names its Evaluator `Evaluator.mnist`.
    (evaluator,) = [d for d in os.listdir(pipeline_root) if d.startswith("Evaluator")]
    base = os.path.join(pipeline_root, evaluator, "evaluation")
    for run in sorted(os.listdir(base)):
        for metrics in tfma.load_metrics(os.path.join(base, run)):
            if metrics.slice_key.single_slice_keys:
                continue
            for entry in metrics.metric_keys_and_values:
                if entry.key.name == metric:
                    return round(entry.value.double_value.value, 4)
    return None


def run_side(
    name: str,
    side: str,
    root: str,
    train_steps: int | None,
    batch_size: int | None = None,
    data: str = "",
) -> dict:
    """Runs one side of example `name` in this process and returns its figures.

    `batch_size` changes the batch size in a copy of the example's module file;
    `data` is the data root the parent prepared (MNIST's is written with the
    product's Fashion-MNIST reader, which the stock side must not import).

    Raises:
      RuntimeError: on the stock side, if any product module was imported.
    """
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    from benchmarks import phase_timing

    tfx_examples = _helper("tfx_examples")
    example = tfx_examples.BY_KEY[name]
    module = tfx_examples.load_pipeline(
        example, os.path.join(root, "code"), swapped=side == "swapped", train_steps=train_steps
    )
    data = data or tfx_examples.data_root(example, root)
    module_file = (
        tfx_examples.module_file_with_batch(example, os.path.join(root, "code"), batch_size)
        if batch_size
        else ""
    )
    pipeline = tfx_examples.create_pipeline(example, module, root, data, module_file)
    product = sorted(m for m in sys.modules if m == "components" or m.startswith("components."))
    if side == "stock" and product:
        raise RuntimeError(f"the stock side imported product modules: {product[:5]}")
    phase_timing.install()
    start = time.perf_counter()
    BeamDagRunner().run(pipeline)
    wall = time.perf_counter() - start
    seconds = _execution_seconds(os.path.join(root, "metadata.db"))
    pushed = tfx_examples.pushed_models(root)
    return {
        "example": name,
        "side": side,
        "wall_s": round(wall, 1),
        "transform_s": round(seconds.get("Transform", float("nan")), 1),
        "trainer_s": round(seconds.get("Trainer", float("nan")), 1),
        **phase_timing.summary(),
        "input_alone_s": phase_timing.input_alone(),
        METRICS[name]: _accuracy(os.path.join(root, "pipeline_root"), METRICS[name]),
        "pushed": bool(pushed),
        "signatures": json.dumps(tfx_examples.signatures(pushed[-1])) if pushed else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", choices=["taxi", "penguin", "mnist", "all"], default="all")
    parser.add_argument(
        "--train-steps", type=int, default=None, help="taxi's steps (default: the example's 1000)"
    )
    parser.add_argument(
        "--penguin-train-steps",
        type=int,
        default=DEFAULT_STEPS["penguin"],
        help="penguin's steps (the example's own is 100)",
    )
    parser.add_argument(
        "--mnist-train-steps",
        type=int,
        default=DEFAULT_STEPS["mnist"],
        help="mnist's steps (input-heavy; the example's own is 5000)",
    )
    parser.add_argument(
        "--mnist-batch-size",
        type=int,
        default=None,
        help="mnist's batch size, changed in a copy of its module file (its own is 40)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs per side (accuracy spread needs 2 or more)"
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="per example: start no further ABBA block of two pairs once this many minutes "
        "of the example's pairs have passed; the results hold the pairs run, the headline "
        "`repeats` beside `repeats_planned` (default: no budget, every repeat)",
    )
    parser.add_argument("--workdir", default="")
    parser.add_argument(
        "--shared-with",
        default=None,
        help="what else ran on the cores (recorded with the results; default: an idle machine)",
    )
    parser.add_argument("--side", choices=["stock", "swapped"], help=argparse.SUPPRESS)
    parser.add_argument("--data-root", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="tfxkit-dropin-bench-")
    names = list(METRICS) if args.example == "all" else [args.example]
    steps = {
        "taxi": args.train_steps,
        "penguin": args.penguin_train_steps,
        "mnist": args.mnist_train_steps,
    }
    # Batch sizes other than the module's own (None: its own).
    batches = {"mnist": args.mnist_batch_size}
    if args.side:
        result = run_side(
            names[0], args.side, workdir, steps[names[0]], batches.get(names[0]), args.data_root
        )
        _helper("fresh_process").print_result(result)
        return
    from testkit import fresh_process, results, tfx_examples
    from testkit.stats import abba_order

    headlines, lines = {}, []
    for name in names:
        runs: dict[str, list[dict]] = {"stock": [], "swapped": []}
        # Prepared here, once: both sides read the same data root.
        data_root = tfx_examples.data_root(tfx_examples.BY_KEY[name], os.path.join(workdir, name))
        # ABBA: which side runs first alternates pair by pair, so machine drift
        # (a slow mode, a warming cache) cannot favour a side by its position.
        orders = abba_order(args.repeats, "stock", "swapped")
        budget = None if args.max_minutes is None else 60.0 * args.max_minutes
        for repeat, order in within_budget(orders, budget, time.monotonic):
            for side in order:
                root = os.path.join(workdir, f"{name}-{side}-{repeat}")
                command = [os.path.abspath(__file__), "--side", side]
                command += ["--example", name, "--workdir", root, "--data-root", data_root]
                if name == "taxi" and args.train_steps is not None:
                    command += ["--train-steps", str(args.train_steps)]
                if name != "taxi":
                    command += [f"--{name}-train-steps", str(steps[name])]
                if batches.get(name):
                    command += [f"--{name}-batch-size", str(batches[name])]
                result = fresh_process.run(command, f"{name} {side} run {repeat}")
                runs[side].append(result)
                shown = {k: v for k, v in result.items() if k != "signatures"}
                line = {"repeat": repeat, "order": list(order), **shown}
                lines.append(line)
                print(json.dumps(line), flush=True)
        headlines[name] = headline(
            runs, steps[name] or DEFAULT_STEPS[name], METRICS[name], ACCURACY_MARGINS[name]
        )
        headlines[name]["repeats_planned"] = args.repeats
        if batches.get(name):
            headlines[name]["batch_size"] = batches[name]
    lines.append({"examples": headlines})
    print(json.dumps(lines[-1]))
    # One file per example set, so a run of one example keeps the others' results; a
    # modified module (another batch size) is its own row and file.
    modified = "".join(
        f"_batch{b}" if args.example == n else f"_{n}_batch{b}"
        for n, b in batches.items()
        if b and n in names
    )
    path = results.write(
        "drop_in",
        lines,
        shared_with=args.shared_with,
        argv=sys.argv[1:],
        stem=f"drop_in_{args.example}{modified}",
    )
    print(f"results: {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)


def within_budget(orders: list, budget_s: float | None, clock) -> Iterator[tuple[int, tuple]]:
    """`(repeat, order)` for each pair of `orders` to run: all of them without a budget;
    with one, the pairs up to the first ABBA block (two pairs, one of each order) that
    would start after `budget_s` seconds of `clock` from the first call. Whole blocks
    only, so each side goes first as often as the other; the budget is time, not the
    figures so far, so stopping chooses nothing by the result. The clock is read as
    each block starts."""
    start = clock()
    for repeat, order in enumerate(orders):
        if budget_s is not None and repeat % 2 == 0 and repeat and clock() - start > budget_s:
            return
        yield repeat, order


def _mean_phases(runs: list[dict], key: str) -> dict[str, float]:
    phases = runs[0][key]
    return {p: round(statistics.fmean(r[key][p] for r in runs), 2) for p in phases}


def _mean_or_none(values: list) -> float | None:
    return None if None in values or not values else round(statistics.fmean(values), 2)


def headline(
    runs: dict[str, list[dict]], train_steps: int, metric: str, margin: float = ACCURACY_MARGIN
) -> dict:
    """One example's swapped / stock ratios, mean phases, both accuracies and their difference.

    The accuracies are judged equivalent when the difference's 90% interval
    lies within +-`margin` (the example's entry of `ACCURACY_MARGINS`).
    """
    from testkit.stats import (
        TooFewError,
        compare_accuracies,
        equivalent,
        ratio_interval,
    )

    stock, swapped = runs["stock"], runs["swapped"]
    out: dict = {"train_steps": train_steps, "repeats": len(stock)}
    for key in ("wall_s", "trainer_s", "transform_s"):
        ratio = statistics.fmean(r[key] for r in swapped) / statistics.fmean(r[key] for r in stock)
        out[f"{key[:-2]}_ratio_swapped_over_stock"] = round(ratio, 3)
        # Pair i is repeat i of each side (run back to back, order alternated):
        # the geometric mean of the pair ratios and its 95% interval.
        pairs = [b[key] / a[key] for a, b in zip(stock, swapped, strict=True)]
        try:
            gmean, low, high = ratio_interval(pairs)
            out[f"{key[:-2]}_pair_ratio_gmean"] = round(gmean, 3)
            out[f"{key[:-2]}_pair_ratio_ci95"] = [round(low, 3), round(high, 3)]
        except TooFewError:
            out[f"{key[:-2]}_pair_ratio_gmean"] = out[f"{key[:-2]}_pair_ratio_ci95"] = None
    for key in ("trainer_phases_s", "transform_phases_s"):
        out[key] = {side: _mean_phases(side_runs, key) for side, side_runs in runs.items()}
    out["input_alone_s"] = {
        side: _mean_or_none([r.get("input_alone_s") for r in side_runs])
        for side, side_runs in runs.items()
    }
    acc = {side: [r[metric] for r in side_runs] for side, side_runs in runs.items()}
    out.update(compare_accuracies(acc, "swapped", "stock", lambda side: f"{metric}_{side}"))
    # Equivalence, not "within 2 SE": two one-sided tests at the stated margin.
    try:
        tost = equivalent(acc["swapped"], acc["stock"], margin)
        out["accuracy_equivalent_within_margin"] = tost["equivalent"]
        out["accuracy_diff_ci90"] = [round(v, 4) for v in tost["interval"]]
    except TooFewError:
        out["accuracy_equivalent_within_margin"] = out["accuracy_diff_ci90"] = None
    out["accuracy_margin"] = margin
    signatures = {r["signatures"] for side_runs in runs.values() for r in side_runs}
    out["same_serving_signatures"] = len(signatures) == 1
    return out


if __name__ == "__main__":
    main()
