"""What a local run shows on the console while the orchestrator runs.

The console gets each component's start and end (from the orchestrator's own
log lines), warnings logged by this package, and errors from anywhere, one
line each; the run's log file gets every record with its traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator

from absl import logging as absl_logging

from pipelines.rundir import RunLog

# BeamDagRunner and LocalDagRunner log these at INFO around every node.
_EVENTS = {
    "node %s is running.": "started",
    "node %s is finished.": "finished",
    "Component %s is running.": "started",
    "Component %s is finished.": "finished",
}
_PACKAGE_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name) + os.sep
    for name in ("components", "pipelines")
)
BASELINE_RESOLVER = "latest_validated_schema"


def is_benign(record: logging.LogRecord) -> bool:
    """The drift-baseline resolver finding nothing on a config's first run.

    TFX logs that with `logging.exception` (a traceback) and records the
    resolver as failed, yet the gate runs without a baseline, as designed
    (the summary shows the resolver as `empty`).
    """
    return (
        record.msg == "[%s] Input resolution error: %s"
        and isinstance(record.args, tuple)
        and len(record.args) == 2
        and record.args[0] == BASELINE_RESOLVER
        and "returned None" in str(record.args[1])
    )


class ProgressHandler(logging.Handler):
    """Prints each component's start and end from the orchestrator's log lines."""

    def __init__(self, stream, clock=time.monotonic):
        super().__init__(logging.INFO)
        self.stream = stream
        self.clock = clock
        self.started: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        event = _EVENTS.get(str(record.msg))
        if event is None or not record.args:
            return
        node = record.args[0]
        now = self.clock()
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        if event == "started":
            self.started[node] = now
            line = f"[{stamp}] > {node} started"
        else:
            took = now - self.started.get(node, now)
            line = f"[{stamp}] < {node} finished ({took:.1f} s)"
        print(line, file=self.stream, flush=True)


class ConsoleWarnings(logging.Handler):
    """Warnings this package logs, and errors from anywhere, one line each."""

    def __init__(self, stream):
        super().__init__(logging.WARNING)
        self.stream = stream

    def filter(self, record: logging.LogRecord) -> bool:
        if is_benign(record):
            return False
        ours = (record.pathname or "").startswith(_PACKAGE_DIRS)
        return ours or record.levelno >= logging.ERROR

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage().strip().splitlines()
        except Exception:  # noqa: BLE001 - a bad format string must not end the run
            text = [str(record.msg)]
        first = text[0] if text else ""
        print(f"{record.levelname}: {first[:500]}", file=self.stream, flush=True)


class _LogFile(logging.Handler):
    def __init__(self, stream):
        super().__init__(logging.DEBUG)
        self.stream = stream
        self.setFormatter(
            logging.Formatter(
                "%(asctime)s %(levelname).1s %(name)s %(filename)s:%(lineno)d] %(message)s"
            )
        )

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - the log file must never end the run
            self.handleError(record)


@contextlib.contextmanager
def console_logging(stream, run_log: RunLog) -> Iterator[ProgressHandler]:
    """Routes log records for the duration of an orchestrator run.

    Every record reaching the `absl` logger (TFX, TFT, TFMA and this package
    log through it) at INFO and above goes to the run's log file; progress
    and what matters go to `stream` / the console's stderr.

    INFO is set as absl's verbosity (its `--verbosity` flag), not only as
    the logger's level: TensorFlow's `AutoTrackable._trackable_children`,
    which runs whenever a SavedModel is written (Transform's transform
    graph, every exported model), silences logging with
    `absl.logging.set_verbosity(FATAL)` and then restores the flag's value,
    which would otherwise put the logger back at WARNING and drop every
    progress line after Transform's.
    """
    absl_logger = logging.getLogger("absl")
    progress = ProgressHandler(stream)
    console = ConsoleWarnings(run_log.err)
    log_file = _LogFile(run_log.file)
    handlers = (progress, console, log_file)
    previous = (
        absl_logging.get_verbosity(),
        absl_logger.level,
        absl_logger.propagate,
        absl_logger.disabled,
    )
    for handler in handlers:
        absl_logger.addHandler(handler)
    absl_logging.set_verbosity(absl_logging.INFO)
    absl_logger.disabled = False
    # Root's handlers (Python's last-resort or a library's basicConfig) would
    # print the same records again.
    absl_logger.propagate = False
    try:
        yield progress
    finally:
        for handler in handlers:
            absl_logger.removeHandler(handler)
        absl_logging.set_verbosity(previous[0])
        absl_logger.setLevel(previous[1])
        absl_logger.propagate = previous[2]
        absl_logger.disabled = previous[3]
