"""Which code trained a long benchmark's saved models: its runs' directory key, and
whether its results may be written.

A benchmark that saves models and resumes across sessions keeps them under
`run_key()`: the commit, when nothing is uncommitted, so a run resumes only
on the code that trained what it saved; with uncommitted changes, a name no
other run shares. It writes results only when `why_unwritable` finds that one
clean commit trained everything.
"""

from __future__ import annotations

import time

from components.testing import results as results_lib


def run_key(cwd: str = results_lib.REPO_ROOT) -> str:
    """The directory of this code's runs: the commit's first 12 hex digits, or a
    new `dirty-<ns>` name when files are uncommitted (or git cannot say)."""
    recorded = results_lib.commit(cwd)
    if recorded.get("dirty") is False and recorded.get("commit"):
        return recorded["commit"][:12]
    return f"dirty-{time.time_ns()}"


def why_unwritable(started: str, now: str) -> str:
    """Why a run keyed `started` (`run_key` when it began) writes no results when
    `run_key` is `now` at its end; '' when it may."""
    if started.startswith("dirty-"):
        return "the code had uncommitted changes when the run started"
    if now != started:
        return f"HEAD moved from {started} to {now} during the run"
    return ""
