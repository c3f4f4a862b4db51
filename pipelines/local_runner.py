"""Runs `create_pipeline` locally: BeamDagRunner (default) or LocalDagRunner.

Layout of an output directory:
  data/            built-in datasets written once (digits)
  pipeline_root/   TFX artifacts
  metadata.sqlite  ML Metadata
  serving/<name>/  pushed models (Pusher destination)
  summary.json     what ran, metrics, pushed model
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from components.config import PipelineConfig
from components.data import check_input, resolve_input
from pipelines.pipeline import PipelinePaths, create_pipeline
from pipelines.summary import format_summary, summarize_run, write_summary


def paths_for(config: PipelineConfig, output_dir: str) -> PipelinePaths:
    output_dir = os.path.abspath(output_dir)
    return PipelinePaths(
        pipeline_root=os.path.join(output_dir, "pipeline_root"),
        serving_dir=os.path.join(output_dir, "serving", config.name),
        metadata_path=os.path.join(output_dir, "metadata.sqlite"),
    )


class _ProgressHandler(logging.Handler):
    """Prints each component's start and end from the orchestrator's log lines."""

    _EVENTS = {"node %s is running.": "started", "node %s is finished.": "finished"}

    def __init__(self, stream):
        super().__init__(logging.INFO)
        self.stream = stream
        self.started: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        event = self._EVENTS.get(str(record.msg))
        if event is None or not record.args:
            return
        node = record.args[0]
        now = time.monotonic()
        if event == "started":
            self.started[node] = now
            line = f"[{time.strftime('%H:%M:%S')}] > {node} started"
        else:
            took = now - self.started.get(node, now)
            line = f"[{time.strftime('%H:%M:%S')}] < {node} finished ({took:.1f} s)"
        print(line, file=self.stream, flush=True)


def run(config: PipelineConfig, output_dir: str, runner: str = "beam", stream=sys.stdout) -> dict[str, Any]:
    """Checks the data, runs the pipeline, and writes `summary.json`.

    Returns:
      The summary dict (also written to `<output_dir>/summary.json`).

    Raises:
      components.data.DataError: bad input, before any component runs.
      RuntimeError: the pipeline failed (the summary says which component).
    """
    from tfx import v1 as tfx
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    if runner not in ("beam", "local"):
        raise ValueError(f"--runner: expected 'beam' or 'local', got {runner!r}")
    output_dir = os.path.abspath(output_dir)
    paths = paths_for(config, output_dir)
    data = resolve_input(config.data, os.path.join(output_dir, "data"))
    check_input(config.data, data)
    pipeline = create_pipeline(config, data, paths)
    dag_runner = BeamDagRunner() if runner == "beam" else tfx.orchestration.LocalDagRunner()

    # The orchestrator logs node start / end at INFO; show only those lines
    # (as progress) and keep everything else at WARNING and above.
    absl_logger = logging.getLogger("absl")
    handler = _ProgressHandler(stream)
    warnings_handler = logging.StreamHandler(sys.stderr)
    warnings_handler.setLevel(logging.WARNING)
    previous = (absl_logger.level, absl_logger.propagate)
    absl_logger.addHandler(handler)
    absl_logger.addHandler(warnings_handler)
    absl_logger.setLevel(logging.INFO)
    absl_logger.propagate = False
    error = None
    try:
        dag_runner.run(pipeline)
    except Exception as e:  # noqa: BLE001 - summarised, then re-raised below
        error = e
    finally:
        absl_logger.removeHandler(handler)
        absl_logger.removeHandler(warnings_handler)
        absl_logger.setLevel(previous[0])
        absl_logger.propagate = previous[1]
    summary = summarize_run(paths.metadata_path, config.name)
    if error is not None:
        summary["status"] = "failed"
        summary["error"] = f"{type(error).__name__}: {error}"
        summary["pushed_model"] = None
    write_summary(summary, output_dir)
    print(format_summary(summary), file=stream, flush=True)
    if error is not None:
        raise RuntimeError(f"pipeline {config.name!r} failed: {summary['error']}") from error
    return summary
