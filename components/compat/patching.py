"""A replacement kept in place while any block asks for it (no TFX types).

`SharedPatch` installs a process-wide module-attribute replacement when the first block
enters and removes it when the last one exits, whatever raised in between.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class SharedPatch:
    """Runs `install` when the outermost `active()` block enters, `restore` when it exits.

    Re-entrant and thread-safe: nested and concurrent blocks share one
    installation.
    """

    def __init__(self, install: Callable[[], None], restore: Callable[[], None]):
        self._install = install
        self._restore = restore
        self._lock = threading.Lock()
        self._depth = 0

    @property
    def depth(self) -> int:
        """How many blocks are inside `active()` now."""
        return self._depth

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._install()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._restore()
