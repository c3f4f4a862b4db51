"""The product's local Beam runner: Beam's in-process runners with no Prism attempt, pinned
unless `beam_args` name a runner, and Beam's default inside a local run."""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.util import assert_that, equal_to

from components.compat import beam_runner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture
def prism_attempts(monkeypatch):
    """Every start of a Prism run, refused as on a machine without the internet (Beam's
    DirectRunner then falls back to its in-process runners)."""
    from apache_beam.runners.portability import prism_runner

    attempts = []

    def refuse(self, pipeline, options):
        attempts.append(pipeline)
        raise ConnectionError("the Prism download is not reachable here")

    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", refuse)
    return attempts


def _squares(runner_args: list[str]) -> None:
    with beam.Pipeline(options=PipelineOptions(runner_args)) as p:
        assert_that(p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * x), equal_to([1, 4, 9]))


def test_beams_direct_runner_tries_prism_first_and_the_local_runner_does_not(
    prism_attempts, caplog
):
    _squares([])
    assert len(prism_attempts) == 1  # Beam's own DirectRunner: the download was tried
    caplog.set_level("INFO", logger="absl")
    _squares([f"--runner={beam_runner.RUNNER}"])
    assert len(prism_attempts) == 1
    assert any("pinned: no Prism download" in r.getMessage() for r in caplog.records)


def test_in_a_local_run_a_pipeline_without_a_runner_gets_the_local_runner(prism_attempts):
    with beam_runner.local_by_default():
        assert StandardOptions.DEFAULT_RUNNER == beam_runner.RUNNER
        _squares([])
    assert StandardOptions.DEFAULT_RUNNER == "DirectRunner"
    assert prism_attempts == []


# TFX's penguin example defines an absl flag `runner` (an enum of three runner names),
# and TFX's Beam executors parse their beam_pipeline_args as absl flags: a --runner
# argument naming the product's runner would be refused there.
TRANSFORM_UNDER_A_RUNNER_FLAG = """
import json, sys
from tfx.examples.penguin import penguin_pipeline_local  # defines the absl flag `runner`
from tfx.dsl.components.base.base_beam_executor import BaseBeamExecutor
from components.transform.executor import Executor
seen = {}
for name, args in (("none", ["--direct_num_workers=1"]), ("named", ["--runner=DirectRunner"])):
    executor = Executor(BaseBeamExecutor.Context(beam_pipeline_args=args, tmp_dir="/tmp"))
    seen[name] = [type(executor._make_beam_pipeline().runner).__name__, executor._beam_pipeline_args]
print(json.dumps(seen))
"""


@pytest.mark.multiprocess
def test_the_transform_picks_the_local_runner_as_a_default_not_an_argument(tmp_path):
    """No --runner added to its Beam args (so no clash with a script's own `runner` flag),
    the local runner where they name none, theirs where they do."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", TRANSFORM_UNDER_A_RUNNER_FLAG],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    runner, args = seen["none"]
    assert runner == "LocalRunner" and not any(a.startswith("--runner") for a in args)
    # The runner the args name wins (Beam's DirectRunner is its SwitchingDirectRunner).
    assert seen["named"][0] == "SwitchingDirectRunner"
