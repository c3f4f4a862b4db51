"""A stock TFX pipeline with the two-import swap, its Beam stages on Beam's Prism runner
with an `EXTERNAL` SDK worker pool, against the same pipeline in-process: TFX's taxi
native-Keras example, whose ExampleGen, StatisticsGen, SchemaGen and Evaluator are stock
and whose Transform is the product's (its writer and layout record included).

(Not the penguin example: it defines an absl `runner` flag that accepts only
DirectRunner, FlinkRunner and SparkRunner, and TFX parses Beam args as absl flags, so
that stock pipeline refuses `--runner=PrismRunner` whatever Transform it runs.)
"""

from __future__ import annotations

import os

import pytest

from testkit import portable, tfx_examples
from testkit.prism import WorkerPool, beam_args
from tests.components.dropin.test_tfx_examples_e2e import _ExampleRun
from tests.conftest import needs_prism

PRISM, pytestmark = needs_prism()


@pytest.fixture(scope="module")
def taxi_runs(tmp_path_factory):
    """The swapped taxi pipeline in-process and on Prism, side by side."""
    workdir = tmp_path_factory.mktemp("taxi_prism")
    data_root = tfx_examples.TAXI_DATA
    # The example's module file on the workers' path, as a worker image holding the user's
    # code has it: the pool runs plain Python workers, which install no staged package.
    module_dir = os.path.dirname(tfx_examples.TAXI.module_file)
    with WorkerPool(str(workdir / "worker_pool.log"), python_path=(module_dir,)) as pool:
        runs = {}
        try:
            for name, args in (
                ("in_process", ()),
                ("prism", [*beam_args(PRISM), *pool.beam_args()]),
            ):
                own = workdir / name
                os.makedirs(own)
                runs[name] = _ExampleRun(
                    tfx_examples.TAXI, str(own), data_root, True, beam_pipeline_args=args
                )
            for run in runs.values():
                run.result()
        finally:
            for run in runs.values():
                run.stop()
                run.log.close()
        with open(workdir / "worker_pool.log", errors="replace") as f:
            pool_log = f.read()
    return {name: run.root for name, run in runs.items()}, pool_log


def test_the_swapped_taxi_pipeline_on_prism_writes_what_it_writes_in_process(taxi_runs, tmp_path):
    roots, pool_log = taxi_runs
    here, there = (
        portable.beam_stage_outputs(os.path.join(roots[name], "pipeline_root"))
        for name in ("in_process", "prism")
    )
    assert portable.differences(here, there) == []
    assert there["layout_record"]["splits"]["train"]["records"] > 0
    assert "Starting worker with command" in pool_log
    # The stock Evaluator on Prism scores and blesses the run's model as it does in-process.
    import glob

    from pipelines.summary import read_metrics

    prism_root = os.path.join(roots["prism"], "pipeline_root")
    (evaluation,) = glob.glob(os.path.join(prism_root, "Evaluator", "evaluation", "*"))
    (blessing,) = glob.glob(os.path.join(prism_root, "Evaluator", "blessing", "*"))
    metrics, blessed = portable.rerun_evaluator(
        os.path.join(roots["prism"], "metadata.db"), "taxi_native_keras_swapped", str(tmp_path), []
    )
    assert metrics and portable.differences(metrics, read_metrics(evaluation), rel=1e-6) == []
    assert blessed == os.path.exists(os.path.join(blessing, "BLESSED"))
