"""Runs `create_pipeline` locally: BeamDagRunner (default) or LocalDagRunner.

Layout of an output directory:
  data/            built-in datasets written once (digits)
  pipeline_root/   TFX artifacts
  metadata.sqlite  ML Metadata
  serving/<name>/  pushed models (Pusher destination)
  summary.json     what ran, metrics, pushed model (and, with distillation,
                   the teacher-vs-student table of `pipelines.report`)
  distillation_report.png  accuracy vs parameters / latency (distillation runs)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import sys
import time
from typing import Any

from components.config import PipelineConfig
from components.data import check_input, resolve_input
from pipelines import report
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


class ConcurrentRunError(RuntimeError):
    """Another run holds the output directory (pipeline root + ML Metadata)."""


@contextlib.contextmanager
def exclusive_run(output_dir: str):
    """Holds an exclusive lock on `output_dir` for the duration of a run.

    Two orchestrators writing one SQLite ML Metadata store and one pipeline
    root at once can interleave executions and fail with "database is
    locked" half-way; the second run is refused up front instead. The lock is
    an `flock`, so the kernel releases it when a killed run's process dies.

    Raises:
      ConcurrentRunError: naming the process that holds the lock.
    """
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, ".tfxkit.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            raise ConcurrentRunError(
                f"another tfxkit run (pid {holder}) is using {output_dir}; "
                "wait for it to finish or pass a different --output"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def run(
    config: PipelineConfig, output_dir: str, runner: str = "beam", stream=None
) -> dict[str, Any]:
    """Checks the data, runs the pipeline, and writes `summary.json`.

    Returns:
      The summary dict (also written to `<output_dir>/summary.json`).

    Raises:
      components.data.DataError: bad input, before any component runs.
      RuntimeError: the pipeline failed (the summary says which component).
    """
    if runner not in ("beam", "local"):
        raise ValueError(f"--runner: expected 'beam' or 'local', got {runner!r}")
    output_dir = os.path.abspath(output_dir)
    stream = stream or sys.stdout
    with exclusive_run(output_dir):
        return _run_locked(config, output_dir, runner, stream)


def _run_locked(config: PipelineConfig, output_dir: str, runner: str, stream) -> dict[str, Any]:
    from tfx import v1 as tfx
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

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
    elif config.distillation.enabled:
        summary["distillation"] = report.distillation_report(
            paths.metadata_path, config, output_dir
        )
    write_summary(summary, output_dir)
    print(format_summary(summary), file=stream, flush=True)
    if "distillation" in summary:
        print(report.format_report(summary["distillation"]), file=stream, flush=True)
    if error is not None:
        raise RuntimeError(f"pipeline {config.name!r} failed: {summary['error']}") from error
    return summary
