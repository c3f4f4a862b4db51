"""Ctrl-C that stops a local run wherever it lands.

Beam wraps a `KeyboardInterrupt` raised inside a step in a `RuntimeError`
("RuntimeError: KeyboardInterrupt"), and one raised where Python ignores
exceptions (a finalizer, a callback) is lost: the run then goes on to the
end. `recording()` wraps a whole run: SIGINT is recorded and raised as
usual, and the run checks the record at its steps (`check`), so one lost
before the DAG runs still stops it there. `interruptible()` wraps the DAG
run: while it has not returned, a recorded SIGINT is raised again in the
main thread every `REPEAT_SECONDS`, so a lost one cannot let the run
finish; the caller reads the record to report the run as interrupted, not
failed.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from collections.abc import Iterator

# How often a Ctrl-C the run has not acted on is raised again.
REPEAT_SECONDS = 2.0


def check(requested: threading.Event | None) -> None:
    """Raises KeyboardInterrupt if SIGINT was recorded (and perhaps lost on its way)."""
    if requested is not None and requested.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def recording(requested: threading.Event | None = None) -> Iterator[threading.Event]:
    """Runs the block with SIGINT recorded in the yielded event, then raised as usual.

    Outside the main thread (no signal can be handled there) nothing is
    installed and the event is never set.
    """
    requested = requested or threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def handler(signum, frame):
        requested.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def interruptible(
    requested: threading.Event | None = None, repeat_seconds: float = REPEAT_SECONDS
) -> Iterator[threading.Event]:
    """Runs the block with SIGINT recorded and re-raised until the block returns.

    Args:
      requested: The record to use (`recording`'s), or None for a new one. One
        already set when the block starts is raised again at once.
      repeat_seconds: How often an interrupt the block has not acted on is raised again.

    Yields:
      An event set once SIGINT arrived. Outside the main thread (no signal can
      be handled there) nothing is installed and it is never set.
    """
    requested = requested or threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return
    done = threading.Event()

    def repeat() -> None:
        while not done.wait(repeat_seconds):
            _thread.interrupt_main()

    started = threading.Event()

    def start_repeating() -> None:
        if not started.is_set():
            started.set()
            threading.Thread(target=repeat, name="tfxkit-interrupt", daemon=True).start()

    def handler(signum, frame):
        requested.set()
        start_repeating()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        if requested.is_set():
            start_repeating()
        yield requested
    finally:
        done.set()
        signal.signal(signal.SIGINT, previous)
