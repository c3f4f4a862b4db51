"""Every Beam stage of the config pipeline on Beam's Prism runner, its SDK work in an
`EXTERNAL` worker pool process (as a Flink TaskManager's sidecar runs it), against the
same pipeline on the in-process runner: the same examples, statistics, schema, transform
graph, transformed examples, layout record, and the same evaluation and blessing.

Prism speaks the job API and the Fn API worker protocol that Flink and Dataflow speak:
DoFns are pickled and shipped to a separate worker process, no state is shared between
stages, side inputs and file outputs go through the Fn API. `make prism` builds it once
per machine (Go module proxy); without it these tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from components.config import to_dict
from testkit import portable
from testkit.prism import WorkerPool, beam_args
from tests.conftest import CLI_RUN_TIMEOUT_SECONDS, REPO, needs_prism

PRISM, pytestmark = needs_prism()


@pytest.fixture(scope="module")
def prism_run(tiny_taxi_run, tmp_path_factory):
    """The tiny taxi run's config again, every Beam stage on Prism with an EXTERNAL pool."""
    work = tmp_path_factory.mktemp("prism")
    with WorkerPool(str(work / "worker_pool.log")) as pool:
        data = to_dict(tiny_taxi_run["config"])
        data["beam_args"] = [*beam_args(PRISM), *pool.beam_args()]
        config_path = work / "tiny_taxi_prism.yaml"
        config_path.write_text(yaml.safe_dump(data))
        out = work / "out"
        result = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "run", "--config", str(config_path),
             "--output", str(out)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": REPO},
            capture_output=True,
            text=True,
            timeout=CLI_RUN_TIMEOUT_SECONDS,
        )  # fmt: skip
        with open(work / "worker_pool.log", errors="replace") as f:
            pool_log = f.read()
    assert result.returncode == 0, result.stderr[-5000:]
    with open(out / "summary.json") as f:
        summary = json.load(f)
    return {"output": str(out), "summary": summary, "pool_log": pool_log}


def test_every_beam_stage_on_prism_writes_what_the_in_process_run_wrote(prism_run, tiny_taxi_run):
    here = portable.beam_stage_outputs(os.path.join(tiny_taxi_run["output"], "pipeline_root"))
    there = portable.beam_stage_outputs(os.path.join(prism_run["output"], "pipeline_root"))
    assert portable.differences(here, there) == []
    assert there["examples"]["Split-train"]["records"] > 1000
    assert there["layout_record"]["splits"]["train"]["files"] == 8
    # The run pushed a model, and its SDK work ran in the pool's worker processes.
    assert prism_run["summary"]["pushed_model"]
    assert "Starting worker with command" in prism_run["pool_log"]
    with open(os.path.join(prism_run["output"], "tfxkit.log"), errors="replace") as f:
        log = f.read()
    assert "Beam stages: --runner=PrismRunner from beam_args (--environment_type=EXTERNAL" in log


def test_the_evaluator_on_prism_scores_and_blesses_as_in_process(prism_run, tmp_path):
    """The two runs trained different models (which records share a shard follows the
    runner, and the Trainer reads shards in order): the Prism run's own Evaluator inputs,
    evaluated again in-process, must give its metrics and its blessing."""
    import glob

    from pipelines.summary import read_metrics

    output = prism_run["output"]
    (evaluation,) = glob.glob(os.path.join(output, "pipeline_root", "Evaluator", "evaluation", "*"))
    (blessing,) = glob.glob(os.path.join(output, "pipeline_root", "Evaluator", "blessing", "*"))
    metrics, blessed = portable.rerun_evaluator(
        os.path.join(output, "metadata.sqlite"), "taxi", str(tmp_path), []
    )
    # Within float rounding: a metric is a sum whose order follows the runner's bundles.
    assert metrics and portable.differences(metrics, read_metrics(evaluation), rel=1e-6) == []
    assert blessed == os.path.exists(os.path.join(blessing, "BLESSED"))
