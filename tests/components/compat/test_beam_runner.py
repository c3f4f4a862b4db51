"""The product's local Beam runner: Beam's in-process runners with no Prism attempt, pinned
unless `beam_args` name a runner, and Beam's default inside a local run."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.util import assert_that, equal_to

from components.compat import beam_runner


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], ["--runner=components.compat.beam_runner.LocalRunner"]),
        (
            ["--direct_num_workers=2"],
            ["--direct_num_workers=2", "--runner=components.compat.beam_runner.LocalRunner"],
        ),
        (
            ["--runner=PrismRunner", "--prism_location=/p"],
            ["--runner=PrismRunner", "--prism_location=/p"],
        ),
        (["--runner", "FlinkRunner"], ["--runner", "FlinkRunner"]),
    ],
)
def test_the_local_runner_is_added_only_where_no_runner_is_named(args, expected):
    assert beam_runner.pinned(args) == expected


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
    _squares(beam_runner.pinned([]))
    assert len(prism_attempts) == 1
    assert any("pinned: no Prism download" in r.getMessage() for r in caplog.records)


def test_in_a_local_run_a_pipeline_without_a_runner_gets_the_local_runner(prism_attempts):
    with beam_runner.local_by_default():
        assert StandardOptions.DEFAULT_RUNNER == beam_runner.RUNNER
        _squares([])
    assert StandardOptions.DEFAULT_RUNNER == "DirectRunner"
    assert prism_attempts == []


def test_the_config_pipeline_pins_its_components_runner_unless_beam_args_name_one(
    taxi_config, tmp_path
):
    import dataclasses

    from components.data.sources import resolve_input
    from pipelines import local_runner, pipeline

    def args_of(config):
        built = pipeline.create_pipeline(
            config,
            resolve_input(config.data, str(tmp_path / "data")),
            local_runner.paths_for(config, str(tmp_path)),
        )
        return built.beam_pipeline_args

    assert args_of(taxi_config)[-1] == f"--runner={beam_runner.RUNNER}"
    prism = ["--runner=PrismRunner", "--prism_location=/opt/prism"]
    assert args_of(dataclasses.replace(taxi_config, beam_args=tuple(prism))) == prism
