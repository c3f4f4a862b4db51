"""`pipelines.interrupts.interruptible`: a Ctrl-C swallowed once is raised again until the block ends."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pipelines import interrupts


def test_a_swallowed_interrupt_is_raised_again_until_the_block_ends():
    swallowed = 0
    with interrupts.interruptible(repeat_seconds=0.2) as requested:
        with pytest.raises(KeyboardInterrupt):
            deadline = time.monotonic() + 10
            sent = False
            while time.monotonic() < deadline:
                try:
                    if not sent:
                        sent = True
                        os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.02)
                except KeyboardInterrupt:
                    swallowed += 1
                    if swallowed == 1:
                        continue  # what a finalizer or a library callback does with it
                    raise
        assert requested.is_set() and swallowed == 2


def test_after_the_block_sigint_is_the_callers_again_and_nothing_repeats():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with interrupts.interruptible(repeat_seconds=0.1):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert signal.getsignal(signal.SIGINT) is before
    # No repeat reaches this process once the block has ended.
    time.sleep(0.5)


def test_no_sigint_sets_nothing():
    with interrupts.interruptible(repeat_seconds=0.1) as requested:
        time.sleep(0.3)
    assert not requested.is_set()


def test_a_recorded_interrupt_is_raised_at_the_next_check_and_again_by_the_dag_guard():
    with interrupts.recording() as requested:
        interrupts.check(requested)  # nothing recorded: no-op
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass  # dropped, as a finalizer would
        assert requested.is_set()
        with pytest.raises(KeyboardInterrupt):
            interrupts.check(requested)
        # Already recorded when the guarded block starts: raised within the repeat.
        with pytest.raises(KeyboardInterrupt):
            with interrupts.interruptible(requested, 0.1):
                time.sleep(5)
