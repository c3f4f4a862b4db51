"""TFX's own example pipelines with the two-import swap, end to end through BeamDagRunner.

The penguin Keras, taxi native-Keras and MNIST native-Keras pipelines are taken
from the tfx wheel as they are, with only their `Transform` / `Trainer` imports
changed (and tiny step counts, one in-memory Beam worker); every component must
run, the model must be pushed, and its serving signatures must be those the
stock Trainer's model has. Their module files get the Keras stock TFX gives them
(Keras 3), so the teachers the Distiller stages read are Keras 3 models, saved as
those examples save them. The swapped taxi run is also run with its Beam stages on
Beam's Prism runner, and what they wrote is compared with the in-process run's.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from components.data.layout import read_layout
from testkit import tfx_examples
from testkit.prism import WorkerPool, beam_args
from tests.conftest import needs_prism

PRISM, PRISM_MARKS = needs_prism()

# Steps per example. The taxi example's own Evaluator blesses (and so lets
# the Pusher push) only a model with binary accuracy >= 0.6 on the eval
# split; its Keras model starts unseeded, and after 5 steps it scored 0.72 in
# one run and below 0.6 in another (nothing pushed). At 200 steps it is
# trained, not a draw of its initial weights, for a few seconds more.
TRAIN_STEPS = {"taxi_native_keras": 200, "penguin_keras": 5, "mnist_native_keras": 20}
# Student steps of the distillation stage a user adds (`tfx_examples.add_distillation`):
# to the stock penguin run (a stock Trainer's teacher on stock Transform
# output) and to the swapped taxi run (the tfxkit Trainer's teacher, from
# the example's own run_fn).
DISTILL_STEPS = {
    ("penguin_keras", False): 20,
    ("taxi_native_keras", True): 50,
    ("mnist_native_keras", True): 20,
}


def _executed(root: str) -> set[str]:
    """Components that wrote outputs (an execution directory per output)."""
    pipeline_root = os.path.join(root, "pipeline_root")
    return set(os.listdir(pipeline_root))


# A bound for one example run on a loaded 2-core machine; a hang fails instead of blocking.
RUN_TIMEOUT_S = 1500


def _user_env() -> dict[str, str]:
    """The environment of a user's shell for an example run.

    TF_USE_LEGACY_KERAS unset (importing TFT into this test process set it
    here): a module file gets Keras 3 under stock TFX and the swap alike, as
    TFX's examples expect, and the Distiller reads the Keras 3 teachers they
    save. Runs side by side may share one GPU: each takes memory as it needs it.
    """
    env = {**os.environ, "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    env.pop("TF_USE_LEGACY_KERAS", None)
    return env


class _ExampleRun:
    """One example pipeline running in a child process (`run_example`)."""

    def __init__(
        self, example, workdir, data_root, swapped, enable_tuning=False, beam_pipeline_args=()
    ):
        kind = "swapped" if swapped else "stock"
        self.root = os.path.join(workdir, kind)
        self.result_path = os.path.join(workdir, f"{kind}.result.json")
        spec = {
            "example": example.name,
            "code_dir": os.path.join(workdir, "code"),
            "root": self.root,
            "data_root": data_root,
            "swapped": swapped,
            "train_steps": TRAIN_STEPS[example.name],
            "distill_steps": DISTILL_STEPS.get((example.name, swapped), 0),
            "enable_tuning": enable_tuning,
            "beam_pipeline_args": list(beam_pipeline_args),
            "result": self.result_path,
        }
        spec_path = os.path.join(workdir, f"{kind}.spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        self.log = open(os.path.join(workdir, f"{kind}.log"), "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.components.dropin.run_example", spec_path],
            cwd=tfx_examples.REPO_ROOT,
            # Runs side by side may share one GPU: each takes memory as it needs
            # it instead of all of it at start-up.
            env=_user_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def result(self):
        """Waits for the run; returns `(root, signatures)` once every node ran.

        `signatures` maps each pushed model to its signatures; the student's
        (when the run distils) are in `self.student_signatures`.
        """
        try:
            returncode = self.proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            self.stop()
        self.log.seek(0)
        assert returncode == 0, f"the example run failed:\n{self.log.read()[-8000:]}"
        with open(self.result_path) as f:
            result = json.load(f)
        self.student_signatures = result["student_signatures"]
        self.teacher = result.get("teacher")
        self.best_hyperparameters = result.get("best_hyperparameters")
        # Resolvers write no outputs; every other node of the example's own DAG must have run.
        nodes = {n for n in result["nodes"] if "resolver" not in n}
        # The MNIST example names its own `Trainer.mnist`, `Pusher.mnist`, ...
        assert {"Transform", "Trainer", "Pusher"} <= {n.split(".")[0] for n in nodes}
        assert nodes <= _executed(self.root), (
            f"not executed: {sorted(nodes - _executed(self.root))}"
        )
        return self.root, result["signatures"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)


PENGUIN_SKIP = (
    "the penguin and MNIST run_fns build their own MirroredStrategy; with several GPUs auto picks "
    "mirrored, which the drop-in Trainer refuses to nest (run with CUDA_VISIBLE_DEVICES=0)"
)


@pytest.fixture(scope="module")
def example_runs(request, tmp_path_factory):
    """Every example run this session's selected tests need, started at once.

    They are independent child processes, mostly single-threaded (Beam's
    in-memory runner), so running them side by side takes about half the
    wall time of running them one after another on two cores.

    Returns:
      `(example name, "stock" | "swapped")` -> `_ExampleRun`.
    """
    selected = {item.name for item in request.session.items if item.module is request.module}
    workdir = str(tmp_path_factory.mktemp("tfx_examples"))
    wanted = []
    if selected & {
        "test_taxi_native_keras_example_swapped_pushes_a_model_with_the_stock_signature",
        "test_taxi_native_keras_model_distils_into_a_student_fn_that_serves_like_it",
        *([PRISM_TEST] if PRISM else []),
    }:
        wanted.append((tfx_examples.TAXI, tfx_examples.TAXI_DATA, True))
    if (
        selected
        & {
            "test_penguin_keras_example_swapped_pushes_a_model_with_the_stock_signature",
            "test_penguin_stock_trainers_model_distils_into_a_student_fn_that_serves_like_it",
        }
        and os.path.isfile(tfx_examples.PENGUIN_CSV)
        and len(tf.config.list_physical_devices("GPU")) <= 1
    ):
        data_root = tfx_examples.penguin_data_root(workdir)
        # The swapped run keeps the example's own stock Tuner (enable_tuning=True):
        # every stock component runs beside the swapped ones as stock runs it.
        wanted += [
            (tfx_examples.PENGUIN, data_root, False),
            (tfx_examples.PENGUIN, data_root, True),
        ]
    if (
        selected
        & {
            "test_mnist_native_keras_example_swapped_pushes_a_model_with_the_stock_signature",
            "test_mnist_native_keras_model_distils_into_a_student_fn_that_serves_like_it",
        }
        and len(tf.config.list_physical_devices("GPU")) <= 1
    ):
        wanted.append((tfx_examples.MNIST, tfx_examples.mnist_sample_root(workdir), True))
    runs = {}
    with contextlib.ExitStack() as stack:
        try:
            for example, data_root, swapped in wanted:
                own = os.path.join(workdir, example.name)
                os.makedirs(own, exist_ok=True)
                runs[example.name, "swapped" if swapped else "stock"] = _ExampleRun(
                    example,
                    own,
                    data_root,
                    swapped,
                    enable_tuning=swapped and example is tfx_examples.PENGUIN,
                )
            if PRISM and selected & {PRISM_TEST}:
                runs[tfx_examples.TAXI.name, "prism"] = _prism_taxi_run(stack, workdir)
            yield runs
        finally:
            for run in runs.values():
                run.stop()
                run.log.close()


# The swapped taxi example on Prism, compared with the same run in-process.
PRISM_TEST = "test_the_swapped_taxi_pipeline_on_prism_writes_what_it_writes_in_process"


def _prism_taxi_run(stack: contextlib.ExitStack, workdir: str) -> _ExampleRun:
    """The swapped taxi example with its Beam stages on Prism and an `EXTERNAL` SDK worker
    pool (entered on `stack`, so it outlives the run), its module file on the workers'
    path, as a worker image holding the user's code has it: the pool runs plain Python
    workers, which install no staged package."""
    own = os.path.join(workdir, "taxi_on_prism")
    os.makedirs(own)
    module_dir = os.path.dirname(tfx_examples.TAXI.module_file)
    pool = stack.enter_context(
        WorkerPool(os.path.join(own, "worker_pool.log"), python_path=(module_dir,))
    )
    args = [*beam_args(PRISM), *pool.beam_args()]
    run = _ExampleRun(tfx_examples.TAXI, own, tfx_examples.TAXI_DATA, True, beam_pipeline_args=args)
    run.pool_log = pool.log_path
    return run


def _check_distilled(run, teacher_signatures) -> None:
    """The student was distilled from the Keras 3 teacher, evaluated against it, pushed, and
    serves like it.

    The teacher is read as the Distiller reads it: a Keras 3 model's positional
    call, each input named by the transformed feature it reads; called so on
    the Transform's output for raw eval examples, it gives what the teacher's
    own serving_default gives on them.
    """
    executed = _executed(run.root)
    assert {"Distiller", "StudentEvaluator", "StudentPusher"} <= executed
    (teacher,) = teacher_signatures.values()
    (student,) = run.student_signatures.values()
    assert student == teacher
    assert run.teacher["kind"] == "keras" and run.teacher["positional"], run.teacher
    assert run.teacher["max_abs_diff"] <= 1e-5, run.teacher


def _check_swapped_run(root: str) -> None:
    pushed = tfx_examples.pushed_models(root)
    assert len(pushed) == 1, "the swapped pipeline pushed no model"
    graph_root = os.path.join(root, "pipeline_root", "Transform", "transform_graph")
    (graph,) = [os.path.join(graph_root, d) for d in os.listdir(graph_root)]
    # The tfxkit Transform wrote its ingestion-ready layout for the user's preprocessing_fn.
    assert read_layout(graph) is not None


# TFX's penguin run_fn creates its own MirroredStrategy. With several GPUs
# visible, strategy.kind auto picks mirrored, and a strategy cannot be created
# inside another one's scope: the Trainer refuses that run naming
# strategy.kind (README, "Bring your own pipeline").
@pytest.mark.skipif(len(tf.config.list_physical_devices("GPU")) > 1, reason=PENGUIN_SKIP)
@pytest.mark.multiprocess
@pytest.mark.e2e
def test_penguin_keras_example_swapped_pushes_a_model_with_the_stock_signature(example_runs):
    """With its own stock Tuner: the swap breaks no stock component, and the Tuner's best
    hyperparameters reach the swapped Trainer's run_fn (which logs what it got)."""
    _, stock_signatures = example_runs[tfx_examples.PENGUIN.name, "stock"].result()
    run = example_runs[tfx_examples.PENGUIN.name, "swapped"]
    swapped, swapped_signatures = run.result()
    _check_swapped_run(swapped)
    assert "Tuner" in _executed(swapped)
    run.log.seek(0)
    got = [
        ast.literal_eval(line.split("HyperParameters for training: ", 1)[1].strip())
        for line in run.log
        if "HyperParameters for training: " in line
    ]
    assert len(got) == 1, "the swapped Trainer's run_fn logged no hyperparameters"
    assert got[0]["values"] == run.best_hyperparameters
    assert set(run.best_hyperparameters) == {"learning_rate", "num_layers"}
    (stock_sigs,) = stock_signatures.values()
    (swapped_sigs,) = swapped_signatures.values()
    assert swapped_sigs == stock_sigs


@pytest.mark.skipif(len(tf.config.list_physical_devices("GPU")) > 1, reason=PENGUIN_SKIP)
@pytest.mark.multiprocess
@pytest.mark.e2e
def test_penguin_stock_trainers_model_distils_into_a_student_fn_that_serves_like_it(
    example_runs,
):
    """Stock Transform and Trainer untouched; the Distiller, an Evaluator and a Pusher added."""
    run = example_runs[tfx_examples.PENGUIN.name, "stock"]
    _, signatures = run.result()
    _check_distilled(run, signatures)


@pytest.mark.multiprocess
@pytest.mark.e2e
def test_taxi_native_keras_example_swapped_pushes_a_model_with_the_stock_signature(example_runs):
    swapped, signatures = example_runs[tfx_examples.TAXI.name, "swapped"].result()
    _check_swapped_run(swapped)
    (sigs,) = signatures.values()
    # The stock module's signatures (taxi_utils_native_keras.run_fn): raw tf.Examples in,
    # the probability out, and the transform signature for TFMA (as JSON lists).
    assert sigs["serving_default"] == [
        [["examples", ["string", [None]]]],
        [["outputs", ["float32", [None, 1]]]],
    ]
    assert "transform_features" in sigs


@pytest.mark.multiprocess
@pytest.mark.e2e
def test_taxi_native_keras_model_distils_into_a_student_fn_that_serves_like_it(example_runs):
    run = example_runs[tfx_examples.TAXI.name, "swapped"]
    _, signatures = run.result()
    _check_distilled(run, signatures)


@pytest.mark.skipif(len(tf.config.list_physical_devices("GPU")) > 1, reason=PENGUIN_SKIP)
@pytest.mark.multiprocess
@pytest.mark.e2e
def test_mnist_native_keras_example_swapped_pushes_a_model_with_the_stock_signature(example_runs):
    swapped, signatures = example_runs[tfx_examples.MNIST.name, "swapped"].result()
    _check_swapped_run(swapped)
    (sigs,) = signatures.values()
    # The stock module's one signature (mnist_utils_native_keras.run_fn): raw tf.Examples
    # in, the ten class probabilities out (its model's last layer is a softmax).
    assert list(sigs) == ["serving_default"]
    ((inputs, outputs),) = [sigs["serving_default"]]
    assert inputs == [["examples", ["string", [None]]]]
    assert [shape for _, (_, shape) in outputs] == [[None, 10]]


@pytest.mark.skipif(len(tf.config.list_physical_devices("GPU")) > 1, reason=PENGUIN_SKIP)
@pytest.mark.multiprocess
@pytest.mark.e2e
def test_mnist_native_keras_model_distils_into_a_student_fn_that_serves_like_it(example_runs):
    run = example_runs[tfx_examples.MNIST.name, "swapped"]
    _, signatures = run.result()
    _check_distilled(run, signatures)
    assert run.teacher["positional"] == ["image_floats_xf"]


@PRISM_MARKS[0]
@pytest.mark.multiprocess
@pytest.mark.e2e
def test_the_swapped_taxi_pipeline_on_prism_writes_what_it_writes_in_process(
    example_runs, tmp_path
):
    """The swapped taxi example with its Beam stages on Beam's Prism runner and an
    `EXTERNAL` SDK worker pool, against the same run in-process (the one the taxi tests
    above read): its ExampleGen, StatisticsGen, SchemaGen and Evaluator are stock, its
    Transform is the product's (its writer and layout record included).

    Not the penguin example: it defines an absl `runner` flag that accepts only
    DirectRunner, FlinkRunner and SparkRunner, and TFX parses Beam args as absl flags, so
    that stock pipeline refuses `--runner=PrismRunner` whatever Transform it runs.
    """
    import glob

    from pipelines.summary import read_metrics
    from testkit import portable

    in_process = example_runs[tfx_examples.TAXI.name, "swapped"]
    on_prism = example_runs[tfx_examples.TAXI.name, "prism"]
    roots = {"in_process": in_process.result()[0], "prism": on_prism.result()[0]}
    here, there = (
        portable.beam_stage_outputs(os.path.join(roots[name], "pipeline_root"))
        for name in ("in_process", "prism")
    )
    assert portable.differences(here, there) == []
    assert there["layout_record"]["splits"]["train"]["records"] > 0
    with open(on_prism.pool_log, errors="replace") as f:
        assert "Starting worker with command" in f.read()
    # The stock Evaluator on Prism scores and blesses the run's model as it does in-process.
    prism_root = os.path.join(roots["prism"], "pipeline_root")
    (evaluation,) = glob.glob(os.path.join(prism_root, "Evaluator", "evaluation", "*"))
    (blessing,) = glob.glob(os.path.join(prism_root, "Evaluator", "blessing", "*"))
    metrics, blessed = portable.rerun_evaluator(
        os.path.join(roots["prism"], "metadata.db"), "taxi_native_keras_swapped", str(tmp_path), []
    )
    assert metrics and portable.differences(metrics, read_metrics(evaluation), rel=1e-6) == []
    assert blessed == os.path.exists(os.path.join(blessing, "BLESSED"))
