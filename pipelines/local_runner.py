"""Runs `create_pipeline` locally: BeamDagRunner (default) or LocalDagRunner.

`run` runs a config into an output directory laid out by `paths_for` (`pipeline_root/`,
`metadata.sqlite`, `serving/`, `data/`, `summary.json`, `tfxkit.log`, the report chart,
and `tfdata_service/` when the run starts a tf.data service, `ingestion.service.local_workers`).
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

from absl import logging

from components.config import PipelineConfig
from components.data.sources import check_input, resolve_input
from pipelines import interrupts, local_service, precheck, progress, report
from pipelines.pipeline import PipelinePaths, create_pipeline
from pipelines.rundir import (  # noqa: F401 - ConcurrentRunError and exclusive_run re-exported
    INPUT_CHECK_STAGE,
    SERVICE_START_STAGE,
    ConcurrentRunError,
    OutputDirError,
    RunLog,
    check_output_dir,
    disk_full_error,
    exclusive_run,
    log_to_file,
    refused_summary,
)
from pipelines.summary import format_summary, summarize_run, write_summary


def paths_for(config: PipelineConfig, output_dir: str) -> PipelinePaths:
    output_dir = os.path.abspath(output_dir)
    return PipelinePaths(
        pipeline_root=os.path.join(output_dir, "pipeline_root"),
        serving_dir=os.path.join(output_dir, "serving", config.name),
        metadata_path=os.path.join(output_dir, "metadata.sqlite"),
    )


def run(
    config: PipelineConfig, output_dir: str, runner: str = "beam", stream=None
) -> dict[str, Any]:
    """Checks the data, runs the pipeline, and writes `summary.json`.

    Every run that gets its output directory writes its own `summary.json`
    (a previous run's is replaced as the run starts) and its full log,
    `tfxkit.log`; the console (`stream`) gets progress, warnings that matter
    and the summary.

    With `ingestion.service.local_workers`, the run starts a tf.data service
    dispatcher and that many workers first (`pipelines.local_service`), gives
    its components the started dispatcher's address, and stops them on every
    path (success, failure, KeyboardInterrupt); `summary.json` records them
    (`tfdata_service`).

    Args:
      config: A validated config.
      output_dir: The output directory (created if missing).
      runner: `beam` (BeamDagRunner) or `local` (LocalDagRunner).
      stream: Where progress and the summary go (default: the console).

    Returns:
      The summary dict (also written to `<output_dir>/summary.json`).

    Raises:
      pipelines.rundir.OutputDirError: `output_dir` cannot be created or written.
      pipelines.rundir.ConcurrentRunError: another run uses `output_dir`.
      components.data.sources.DataError: bad input, before any component runs.
      RuntimeError: the pipeline failed (the summary says which component).
      pipelines.local_service.ServiceStartError: the local tf.data service
        did not start (the summary says so, before any component ran).
    """
    if runner not in ("beam", "local"):
        raise ValueError(f"--runner: expected 'beam' or 'local', got {runner!r}")
    output_dir = check_output_dir(output_dir)
    with exclusive_run(output_dir), log_to_file(output_dir) as run_log:
        return _run_locked(config, output_dir, runner, stream or run_log.out, run_log)


def _finish(
    summary: dict[str, Any],
    output_dir: str,
    stream,
    run_log: RunLog,
    service: local_service.LocalService | None = None,
) -> None:
    if service is not None:
        # Stopped before the summary is written, so that it records the outcome.
        service.stop()
        summary["tfdata_service"] = service.record()
    summary["log"] = run_log.path
    write_summary(summary, output_dir)
    print(format_summary(summary), file=stream, flush=True)
    if "distillation" in summary:
        print(report.format_report(summary["distillation"]), file=stream, flush=True)
    print(f"Full log: {run_log.path}", file=stream, flush=True)


def _run_locked(
    config: PipelineConfig, output_dir: str, runner: str, stream, run_log: RunLog
) -> dict[str, Any]:
    # Nothing of a previous run's result survives this point: until this run
    # ends, summary.json says it is running.
    started_ms = int(time.time() * 1000)
    write_summary(
        {"status": "running", "components": {}, "pushed_model": None, "log": run_log.path},
        output_dir,
    )
    paths = paths_for(config, output_dir)
    # The input check's warnings (files it ignores, columns no feature uses)
    # reach the console as the run's do.
    with progress.console_logging(stream, run_log):
        try:
            precheck.check_beam_args(config.beam_args)
            data = resolve_input(config.data, os.path.join(output_dir, "data"))
            check_input(config.data, data)
            precheck.check_service_ready(config)
        except Exception as e:
            _finish(
                refused_summary(INPUT_CHECK_STAGE, f"{type(e).__name__}: {e}"),
                output_dir,
                stream,
                run_log,
            )
            raise
    service = local_service.for_run(config, output_dir, stream)
    # Ctrl-C from here on is recorded, so one Python drops still stops the run
    # at its next step (`pipelines.interrupts`).
    with interrupts.recording() as requested:
        try:
            return _run_pipeline(
                config, data, paths, output_dir, runner, stream, run_log, service, started_ms,
                requested,
            )  # fmt: skip
        finally:
            # Every path: _finish stopped it already unless the run was
            # interrupted (KeyboardInterrupt) or failed while summarising.
            if service is not None:
                service.stop()


# What Beam adds to an exception raised inside a step ("... [while running 'Run[Distiller]']").
_BEAM_STEP = re.compile(r" \[while running '[^']*'\]")
_TRACEBACK = "Traceback (most recent call last):"


def beam_stages(beam_args) -> str:
    """Which runner the components' Beam pipelines get from `beam_args`, for the log."""
    options = precheck._beam_options(list(beam_args))
    if "--runner" not in options:
        from components.compat import beam_runner

        return f"Beam's in-process runners ({beam_runner.RUNNER}, pinned: no Prism download)"
    named = sorted(
        (index, f"{name}={value}")
        for name, (index, value) in options.items()
        if name in ("--environment_type", "--job_endpoint")
    )
    extras = f" ({', '.join(text for _, text in named)})" if named else ""
    return f"--runner={options['--runner'][1]} from beam_args{extras}"


def _describe(error: BaseException) -> str:
    """`Type: message` of what ended the run, as the component raised it.

    A component's exception reaches the orchestrator through Beam, which
    appends the step it ran in and, when it re-raises across a worker,
    the remote traceback; neither says anything the component's message
    does not, so both are dropped here (the run's log keeps the traceback).
    """
    if isinstance(error, KeyboardInterrupt):
        return "KeyboardInterrupt: the run was interrupted"
    message = _BEAM_STEP.sub("", str(error))
    if _TRACEBACK in message:
        head, _, trace = message.partition(_TRACEBACK)
        last = [line for line in trace.splitlines() if line.strip()][-1:]
        message = (head.strip() + " " + " ".join(last).strip()).strip()
    return f"{type(error).__name__}: {message}"


def _run_pipeline(
    config: PipelineConfig,
    data,
    paths: PipelinePaths,
    output_dir: str,
    runner: str,
    stream,
    run_log: RunLog,
    service: local_service.LocalService | None,
    started_ms: int,
    requested: threading.Event | None = None,
) -> dict[str, Any]:
    """Starts the run's service, builds and runs the DAG, summarises; `requested`
    records a Ctrl-C (`interrupts.recording`), checked between the steps."""
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner
    from tfx.orchestration.local.local_dag_runner import LocalDagRunner

    from components.compat import beam_runner, beam_signatures

    with progress.console_logging(stream, run_log):
        stage = SERVICE_START_STAGE
        try:
            if service is not None:
                service.start()
                # The components read the started dispatcher, as they would
                # read one the user runs.
                config = service.run_config(config)
            interrupts.check(requested)
            stage = INPUT_CHECK_STAGE
            pipeline = create_pipeline(config, data, paths)
            interrupts.check(requested)
        except (Exception, KeyboardInterrupt) as e:
            _finish(
                refused_summary(stage, _describe(e)),
                output_dir,
                stream,
                run_log,
                service,
            )
            raise
    dag_runner = BeamDagRunner() if runner == "beam" else LocalDagRunner()

    error = None
    # Every component runs in this process; Beam's signature reads are
    # memoised for all of them (components.compat.beam_signatures).
    # The orchestrator's own Beam pipeline (BeamDagRunner's) runs on Beam's in-process
    # runners too: no Prism download (components.compat.beam_runner).
    with (
        progress.console_logging(stream, run_log),
        beam_signatures.cached_signatures(),
        beam_runner.local_by_default(),
    ):
        logging.info("Beam stages: %s", beam_stages(config.beam_args))
        interrupted = None
        try:
            with interrupts.interruptible(requested) as interrupted:
                dag_runner.run(pipeline)
        except Exception as e:  # noqa: BLE001 - summarised, then re-raised below
            error = e
        except KeyboardInterrupt as e:
            # Summarised as a failure (what ran until then), then re-raised.
            error = e
        if interrupted is not None and interrupted.is_set() and error is not None:
            # Ctrl-C inside a Beam step comes back as Beam's RuntimeError.
            if not isinstance(error, KeyboardInterrupt):
                interrupt = KeyboardInterrupt()
                interrupt.__cause__ = error
                error = interrupt
    summary = summarize_run(paths.metadata_path, config.name, since_ms=started_ms)
    if error is not None:
        summary["status"] = "failed"
        summary["error"] = _describe(error)
        summary["pushed_model"] = None
    if isinstance(error, Exception):
        failed = next(
            (node for node, c in summary["components"].items() if c["status"] == "failed"), None
        )
        node_dir = os.path.join(paths.pipeline_root, failed or "")
        full = disk_full_error(error, failed, node_dir)
        if full is not None:
            # The cause in words; what the library raised stays beside it.
            summary["error"], summary["cause"] = full, summary["error"]
    elif error is None and config.distillation.enabled:
        summary["distillation"] = report.distillation_report(
            paths.metadata_path, config, output_dir
        )
    _finish(summary, output_dir, stream, run_log, service)
    if isinstance(error, KeyboardInterrupt):
        raise error
    if error is not None:
        raise RuntimeError(f"pipeline {config.name!r} failed: {summary['error']}") from error
    return summary
