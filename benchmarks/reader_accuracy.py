"""Does tfxkit's reader change what a model learns? One Transform output, two readers.

    .venv/bin/python -m benchmarks.reader_accuracy [--example mnist|taxi] [--batch-size N]
        [--train-steps N] [--repeats 8] [--workdir DIR] [--shared-with TEXT] [--no-results]

`benchmarks/drop_in.py` compares whole pipelines, where the Transforms differ
too. This isolates the reader: a TFX example's model (its module's input
function and model builder, from the tfx wheel, under the `MirroredStrategy`
its `run_fn` enters) trains on the transformed examples of one stock
Transform run, once through stock's `tf_dataset_factory` and once through
tfxkit's (`components.trainer.data_accessor`, the drop-in defaults). Same
files, same model code, same batch size and steps; both sides are evaluated
on the whole eval split through stock's reader. `--example` (`EXAMPLES`):
`mnist` (`input_fn`, `build_keras_model`; batch 256 by default, where the
input is most of a step) or `taxi` (`_input_fn`, `_build_keras_model` at
the layer sizes its `run_fn` builds; the example's own batch of 40 and 1000
steps), written to `reader_accuracy.json` and `reader_accuracy_taxi.json`. Each run is a fresh process: a warm-up
run of each side (not counted), then `--repeats` pairs (at least 2), the
side that runs first alternating pair by pair (stock-tfxkit, tfxkit-stock,
...; balanced exactly with an even count).

Prints one JSON line per run (pair, which side ran first, side, eval
accuracy, seconds in `fit`), then the headline: each side's accuracy (mean
and standard deviation), the difference with its standard error, whether
the readers are equivalent within +-`ACCURACY_MARGIN` by two one-sided
tests (`accuracy_equivalent_within_margin`, with the difference's 90%
interval; Welch, unpaired: the two runs of a pair share no seed), and
`fit` time, tfxkit over stock: the geometric mean of the pairs' ratios
(paired: run back to back) with its 95% t interval. The whole output goes
to `benchmarks/results/reader_accuracy.json`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from testkit import fresh_process  # noqa: E402
from testkit import results as results_lib  # noqa: E402
from testkit.stats import (  # noqa: E402
    abba_order,
    compare_accuracies,
    equivalent,
    ratio_interval,
)

SIDES = ("stock", "tfxkit")
# Each example's default batch size and steps: MNIST's at batch 256 (input-heavy, the
# file this benchmark first wrote), taxi's as its pipeline trains (`DEFAULT_STEPS` of
# `drop_in.py`, its run_fn's batch of 40).
EXAMPLES = {
    "mnist": {"batch_size": 256, "train_steps": 5000},
    "taxi": {"batch_size": 40, "train_steps": 1000},
}
# The DNN layer sizes taxi's run_fn builds; they are local to its run_fn, so they are
# repeated here, and `_taxi_model` checks the run_fn still says so.
TAXI_RUN_FN_LINES = ("first_dnn_layer_size = 100", "num_dnn_layers = 4", "dnn_decay_factor = 0.7")
TAXI_HIDDEN_UNITS = [max(2, int(100 * 0.7**i)) for i in range(4)]
# The largest accuracy difference still called "the same" (as `drop_in.py`'s).
ACCURACY_MARGIN = 0.01


def transform_once(root: str, example_key: str = "mnist") -> str:
    """Runs the stock pipeline of `example_key` up to its Transform under `root`; returns its
    pipeline root."""
    from tfx.orchestration import pipeline as tfx_pipeline
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    from testkit import tfx_examples

    example = tfx_examples.BY_KEY[example_key]
    module = tfx_examples.load_pipeline(example, os.path.join(root, "code"), swapped=False)
    pipeline = tfx_examples.create_pipeline(
        example, module, root, tfx_examples.data_root(example, root)
    )
    # TFX's partial run: the Transform and what it needs, nothing downstream.
    BeamDagRunner().run(pipeline, run_options=tfx_pipeline.RunOptions(to_nodes=["Transform"]))
    return pipeline.pipeline_info.pipeline_root


def _only(pattern: str) -> str:
    (path,) = glob.glob(pattern)
    return path


def _taxi_model():
    """Taxi's input function, its model as its run_fn builds it, and its label key.

    Raises:
      AssertionError: if the run_fn no longer sizes its DNN as `TAXI_RUN_FN_LINES` say.
    """
    import inspect

    from tfx.examples.chicago_taxi_pipeline import taxi_utils_native_keras as taxi

    source = inspect.getsource(taxi.run_fn)
    missing = [line for line in TAXI_RUN_FN_LINES if line not in source]
    assert not missing, f"taxi's run_fn no longer holds {missing}: update TAXI_HIDDEN_UNITS"
    return (
        taxi._input_fn,
        lambda: taxi._build_keras_model(hidden_units=TAXI_HIDDEN_UNITS),
        taxi._transformed_name(taxi._LABEL_KEY),
    )


def _mnist_model():
    """MNIST's input function, model builder and label key."""
    from tfx.examples.mnist import mnist_utils_native_keras_base as base

    return base.input_fn, base.build_keras_model, base.transformed_name(base.LABEL_KEY)


def train_once(
    side: str, pipeline_root: str, batch_size: int, train_steps: int, example_key: str = "mnist"
) -> dict:
    """One run of the example's model on `side`'s reader; returns its eval accuracy and fit seconds."""
    from components.compat import legacy_keras

    legacy_keras.ensure_legacy_keras()
    import tensorflow as tf
    import tensorflow_transform as tft
    from tfx.components.trainer import fn_args_utils
    from tfx.components.util import tfxio_utils
    from tfx.proto import example_gen_pb2
    from tfx_bsl.public.tfxio import TensorFlowDatasetOptions

    from components.config.dropin import DropInSettings
    from components.trainer import data_accessor

    graph = _only(os.path.join(pipeline_root, "Transform", "transform_graph", "*"))
    examples = _only(os.path.join(pipeline_root, "Transform", "transformed_examples", "*"))
    transform_output = tft.TFTransformOutput(graph)

    def stock(file_pattern, options, schema=None):
        return tfxio_utils.make_tfxio(
            file_pattern=file_pattern,
            telemetry_descriptors=[],
            payload_format=example_gen_pb2.PayloadFormat.FORMAT_TF_EXAMPLE,
            schema=schema,
        ).TensorFlowDataset(options)

    factory = stock
    if side == "tfxkit":
        # The scratch directory holds a file cache only when ingestion asks for one.
        scratch = os.path.join(os.path.dirname(pipeline_root), "scratch")
        factory = data_accessor.make_tf_dataset_factory(DropInSettings(), graph, scratch)
    accessor = fn_args_utils.DataAccessor(factory, None, None)
    input_fn, build_model, label_key = _taxi_model() if example_key == "taxi" else _mnist_model()
    train = input_fn(
        [os.path.join(examples, "Split-train", "*")], accessor, transform_output, batch_size
    )
    with tf.distribute.MirroredStrategy().scope():
        model = build_model()
    start = time.perf_counter()
    model.fit(train, steps_per_epoch=train_steps, verbose=0)
    fit_s = time.perf_counter() - start
    whole_eval = stock(
        [os.path.join(examples, "Split-eval", "*")],
        TensorFlowDatasetOptions(
            batch_size=batch_size,
            label_key=label_key,
            num_epochs=1,
            shuffle=False,
        ),
        transform_output.transformed_metadata.schema,
    )
    _, accuracy = model.evaluate(whole_eval, verbose=0)
    return {"side": side, "accuracy": round(float(accuracy), 4), "fit_s": round(fit_s, 1)}


def headline(runs: list[dict], batch_size: int, train_steps: int) -> dict:
    """Both sides' accuracies, their difference with its standard error and an
    equivalence test, and the fit time ratio over the pairs (each run carries its
    `pair`); the tests and intervals are None with one pair."""
    out: dict = {"batch_size": batch_size, "train_steps": train_steps}
    acc = {side: [r["accuracy"] for r in runs if r["side"] == side] for side in SIDES}
    out["repeats"] = min(len(values) for values in acc.values())
    out.update(compare_accuracies(acc, "tfxkit", "stock", lambda side: f"{side}_accuracy"))
    # The equivalence test below is the verdict; "within 2 SE" is not one.
    del out["within_seed_noise"]
    out["accuracy_margin"] = ACCURACY_MARGIN
    fit = {(r["pair"], r["side"]): r["fit_s"] for r in runs}
    pairs = sorted({p for p, _ in fit if all((p, side) in fit for side in SIDES)})
    ratios = [fit[pair, "tfxkit"] / fit[pair, "stock"] for pair in pairs]
    if out["repeats"] < 2:
        out["accuracy_equivalent_within_margin"] = out["accuracy_diff_ci90"] = None
        out["fit_ratio_tfxkit_over_stock"] = round(ratios[0], 3)
        out["fit_ratio_ci95"] = None
        return out
    tost = equivalent(acc["tfxkit"], acc["stock"], ACCURACY_MARGIN)
    out["accuracy_equivalent_within_margin"] = tost["equivalent"]
    out["accuracy_diff_ci90"] = [round(v, 4) for v in tost["interval"]]
    mean, low, high = ratio_interval(ratios)
    out["fit_ratio_tfxkit_over_stock"] = round(mean, 3)
    out["fit_ratio_ci95"] = [round(low, 3), round(high, 3)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="mnist")
    parser.add_argument("--batch-size", type=int, help="default: the example's (EXAMPLES)")
    parser.add_argument("--train-steps", type=int, help="default: the example's (EXAMPLES)")
    parser.add_argument(
        "--repeats", type=int, default=8, help="pairs (a run per side), the first side alternating"
    )
    parser.add_argument("--workdir", default="")
    parser.add_argument(
        "--shared-with", default="", help="what else ran on the cores (default: idle)"
    )
    parser.add_argument("--no-results", action="store_true", help="do not write benchmarks/results")
    parser.add_argument("--transform", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--pipeline-root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.batch_size = args.batch_size or EXAMPLES[args.example]["batch_size"]
    args.train_steps = args.train_steps or EXAMPLES[args.example]["train_steps"]
    if args.transform or args.side:
        if args.transform:
            result = {"pipeline_root": transform_once(args.workdir, args.example)}
        else:
            result = train_once(
                args.side, args.pipeline_root, args.batch_size, args.train_steps, args.example
            )
        fresh_process.print_result(result)
        return
    if args.repeats < 2:
        parser.error("--repeats: at least 2 (one pair has no spread to give an interval)")
    workdir = args.workdir or tempfile.mkdtemp(prefix="reader_accuracy_")
    this = ["-m", "benchmarks.reader_accuracy", "--example", args.example]
    transform = fresh_process.run([*this, "--transform", "--workdir", workdir], "the Transform")
    pipeline_root = transform["pipeline_root"]
    sizes = ["--batch-size", str(args.batch_size), "--train-steps", str(args.train_steps)]
    # A warm-up run of each side: file caches and the first TensorFlow import.
    for side in SIDES:
        child = [*this, "--side", side, "--pipeline-root", pipeline_root, *sizes]
        fresh_process.run(child, f"{side} warm-up run")
    runs = []
    for pair, order in enumerate(abba_order(args.repeats, *SIDES)):
        for side in order:
            child = [*this, "--side", side, "--pipeline-root", pipeline_root, *sizes]
            result = fresh_process.run(child, f"{side} run {pair}")
            runs.append({"pair": pair, "first": order[0], **result})
            print(json.dumps(runs[-1]), flush=True)
    summary = {"example": args.example, **headline(runs, args.batch_size, args.train_steps)}
    print(json.dumps(summary), flush=True)
    if not args.no_results:
        path = results_lib.write(
            "reader_accuracy",
            [*runs, summary],
            shared_with=args.shared_with or None,
            argv=sys.argv[1:],
            stem="reader_accuracy"
            if args.example == "mnist"
            else f"reader_accuracy_{args.example}",
        )
        print(f"# wrote {os.path.relpath(path, REPO_ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
