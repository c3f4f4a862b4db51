"""Beam's signature reads, memoised for the duration of a run.

`cached_signatures()` memoises Beam's `get_signature` by function for a block of code
(bound methods through their function; other callables go to Beam every time); it is
installed only on the Beams it was read from (`EXPECTED_BEAM`).
"""

from __future__ import annotations

import contextlib
import threading
import types
import weakref
from collections.abc import Iterator

import apache_beam
from apache_beam.transforms import core, ptransform, util
from apache_beam.typehints import decorators

from components.compat import patching

# The two stacks' Beams: `get_signature` and the modules importing it by name
# are the same in both.
EXPECTED_BEAM = ("2.72", "2.77")
# What the patch compares against EXPECTED_BEAM (a module attribute so tests can fake it).
BEAM_VERSION: str = apache_beam.__version__
# Every module that calls `get_signature` by a name of its own (`from ... import get_signature`).
MODULES = (decorators, core, ptransform, util)
# Beam's own function: what the memo calls to read a signature, restored on exit.
BEAM_GET_SIGNATURE = decorators.get_signature

_LOCK = threading.Lock()
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cached_get_signature(func):
    bound = isinstance(func, types.MethodType)
    function = func.__func__ if bound else func
    if type(function) is not types.FunctionType:
        return BEAM_GET_SIGNATURE(func)
    with _LOCK:
        known = _cache.get(function)
        if known is not None and bound in known:
            return known[bound]
    signature = BEAM_GET_SIGNATURE(func)
    with _LOCK:
        _cache.setdefault(function, {})[bound] = signature
    return signature


def installable() -> bool:
    """Whether this Beam is one the patch was read from, with `get_signature` where expected."""
    return ".".join(BEAM_VERSION.split(".")[:2]) in EXPECTED_BEAM and all(
        getattr(module, "get_signature", None) in (BEAM_GET_SIGNATURE, _cached_get_signature)
        for module in MODULES
    )


def _install() -> None:
    for module in MODULES:
        module.get_signature = _cached_get_signature


def _restore() -> None:
    for module in MODULES:
        module.get_signature = BEAM_GET_SIGNATURE
    with _LOCK:
        _cache.clear()


_PATCH = patching.SharedPatch(_install, _restore)


@contextlib.contextmanager
def cached_signatures() -> Iterator[bool]:
    """Memoises Beam's `get_signature` until the block exits.

    Re-entrant and thread-safe (`components.compat.patching`): the outermost block
    installs the patch and restores Beam's function (and drops the memo) when
    it exits.

    Yields:
      Whether the memo is in place (False on another Beam version).
    """
    if not installable():
        yield False
        return
    with _PATCH.active():
        yield True
