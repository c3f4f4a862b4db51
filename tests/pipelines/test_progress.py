"""What a run shows on the console while the orchestrator runs (pipelines.progress)."""

from __future__ import annotations

import io
import logging
import os

import tensorflow as tf
from absl import logging as absl_logging

from pipelines import progress, rundir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run_log(tmp_path):
    log = open(tmp_path / rundir.LOG_NAME, "w")  # noqa: SIM115 - closed by the caller
    return rundir.RunLog(str(tmp_path / rundir.LOG_NAME), log, io.StringIO(), io.StringIO())


def _saved_model(path):
    module = tf.Module()
    module.f = tf.function(lambda x: x + 1, input_signature=[tf.TensorSpec([], tf.float32)])
    tf.saved_model.save(module, str(path))


def test_progress_survives_a_saved_model_export(tmp_path):
    # Writing a SavedModel (as Transform and every Trainer do) resets absl's
    # verbosity to its flag's value; the progress lines after it must still come.
    # absl's default verbosity, whatever earlier tests in this process set.
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.WARNING)
    out = io.StringIO()
    run_log = _run_log(tmp_path)
    try:
        with progress.console_logging(out, run_log):
            absl_logging.info("node %s is running.", "Transform")
            _saved_model(tmp_path / "model")
            absl_logging.info("node %s is finished.", "Transform")
            absl_logging.info("node %s is running.", "Trainer")
    finally:
        absl_logging.set_verbosity(verbosity)
    run_log.file.close()
    lines = out.getvalue().splitlines()
    assert [line.split("] ", 1)[1].split(" (")[0] for line in lines] == [
        "> Transform started",
        "< Transform finished",
        "> Trainer started",
    ], lines


def test_local_dag_runner_lines_are_progress_too(tmp_path):
    out = io.StringIO()
    run_log = _run_log(tmp_path)
    with progress.console_logging(out, run_log):
        absl_logging.info("Component %s is running.", "Pusher")
        absl_logging.info("Component %s is finished.", "Pusher")
    run_log.file.close()
    assert "> Pusher started" in out.getvalue() and "< Pusher finished" in out.getvalue()


def test_finished_line_reports_time_from_the_injected_clock():
    ticks = iter([100.0, 112.5])
    out = io.StringIO()
    handler = progress.ProgressHandler(out, clock=lambda: next(ticks))
    logger = logging.getLogger("tfxkit-test-progress")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("node %s is running.", "Evaluator")
        logger.info("node %s is finished.", "Evaluator")
    finally:
        logger.removeHandler(handler)
    assert out.getvalue().splitlines()[1].endswith("< Evaluator finished (12.5 s)")


def test_console_shows_what_matters_and_the_log_keeps_everything(tmp_path):
    out = io.StringIO()
    run_log = _run_log(tmp_path)
    library = logging.LogRecord(
        "absl", logging.WARNING, "/site-packages/tfx/x.py", 1, "ArtifactQuery noise", (), None
    )
    ours = logging.LogRecord(
        "absl",
        logging.WARNING,
        os.path.join(REPO, "components", "distiller", "run_fn.py"),
        1,
        "the student is larger than the teacher",
        (),
        None,
    )
    with progress.console_logging(out, run_log):
        logging.getLogger("absl").handle(ours)
        logging.getLogger("absl").handle(library)
        try:  # as TFX logs a config's first run, which has no drift baseline yet
            raise RuntimeError(
                "Error while resolving inputs: LatestArtifactStrategy returned None."
            )
        except RuntimeError as e:
            absl_logging.exception("[%s] Input resolution error: %s", progress.BASELINE_RESOLVER, e)
        absl_logging.error("Transform failed:\nline two of the message")
    run_log.file.close()
    console = run_log.err.getvalue().splitlines()
    assert console == [
        "WARNING: the student is larger than the teacher",
        "ERROR: Transform failed:",
    ], console
    log = open(run_log.path).read()
    for text in ("ArtifactQuery noise", "returned None", "Traceback", "line two of the message"):
        assert text in log, text


def test_console_logging_restores_the_logger(tmp_path):
    absl_logger = logging.getLogger("absl")
    before = (absl_logging.get_verbosity(), absl_logger.level, list(absl_logger.handlers))
    run_log = _run_log(tmp_path)
    with progress.console_logging(io.StringIO(), run_log):
        assert absl_logging.get_verbosity() == absl_logging.INFO
    run_log.file.close()
    assert (absl_logging.get_verbosity(), absl_logger.level, absl_logger.handlers) == before
    assert os.path.getsize(run_log.path) == 0
