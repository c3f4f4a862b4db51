"""Ctrl-C that stops a local run wherever it lands.

Beam wraps a `KeyboardInterrupt` raised inside a step in a `RuntimeError`
("RuntimeError: KeyboardInterrupt"), and one raised where Python ignores
exceptions (a finalizer, a callback) is lost: the run then goes on to the
end. `interruptible()` wraps the DAG run: the first SIGINT is recorded and
raised as usual, and while the block has not returned it is raised again in
the main thread every `REPEAT_SECONDS`, so a lost one cannot let the run
finish; the caller reads `requested` to report the run as interrupted, not
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


@contextlib.contextmanager
def interruptible(repeat_seconds: float = REPEAT_SECONDS) -> Iterator[threading.Event]:
    """Runs the block with SIGINT recorded and re-raised until the block returns.

    Yields:
      An event set once SIGINT arrived. Outside the main thread (no signal can
      be handled there) nothing is installed and it is never set.
    """
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return
    done = threading.Event()

    def repeat() -> None:
        while not done.wait(repeat_seconds):
            _thread.interrupt_main()

    def handler(signum, frame):
        if not requested.is_set():
            requested.set()
            threading.Thread(target=repeat, name="tfxkit-interrupt", daemon=True).start()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested
    finally:
        done.set()
        signal.signal(signal.SIGINT, previous)
