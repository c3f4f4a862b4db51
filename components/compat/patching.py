"""A replacement kept in place while any block asks for it (no TFX types).

The product speeds some library internals up for the length of an execution
by replacing a module attribute (`components.compat.beam_signatures`: Beam's
`get_signature`; `components.compat.user_code`: TFX's user-code install). Such a
replacement is process-wide, and blocks nest (a Transform inside another
component's run, two executions on threads of one process), so it must go in
when the first block enters and come out when the last one exits, whatever
raised in between. `SharedPatch` is that count, in one place.
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
