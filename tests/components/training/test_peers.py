"""The formation watchdog: a separate process ends a task whose cluster never forms.

Each case runs the watched block in its own Python process (the watchdog
SIGKILLs the process it watches), with a bound of a fraction of a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from components.training import peers
from tests.conftest import closed_address

REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
# Python start, the watchdog's start and one refused probe, on 2 busy cores.
PROCESS_TIMEOUT_S = 60


def watched(block_seconds: float, bound: float, peers_: dict) -> subprocess.CompletedProcess:
    """Runs a block of `block_seconds` under `watch_formation(peers_, bound)` in a fresh process."""
    code = textwrap.dedent(
        f"""
        import json, time
        from components.training import peers
        describe = {{"task": "worker:0", "kind": "multi_worker_mirrored", "source": "the test"}}
        peers_ = json.loads({json.dumps(json.dumps(peers_))})
        with peers.watch_formation(peers_, {bound}, describe, grace=0):
            time.sleep({block_seconds})
        print("formed")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=PROCESS_TIMEOUT_S,
    )


def test_a_cluster_that_does_not_form_in_time_ends_the_task_naming_the_missing_peer():
    missing = closed_address()
    done = watched(block_seconds=PROCESS_TIMEOUT_S, bound=0.5, peers_={"worker:1": missing})
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "formed" not in done.stdout
    assert (
        f"Strategy: worker:1 ({missing}) did not join the multi_worker_mirrored cluster of "
        "worker:0 within 0.5 s (the test); ending worker:0 (SIGKILL, exit status 137)"
    ) in done.stderr


def test_a_cluster_that_forms_in_time_is_left_alone():
    done = watched(block_seconds=0.1, bound=30, peers_={"worker:1": closed_address()})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "formed" and "did not join" not in done.stderr


def test_the_message_says_when_every_peer_answers():
    spec = {
        "task": "worker:0",
        "kind": "multi_worker_mirrored",
        "source": "strategy.collective_timeout_seconds",
        "seconds": 120,
        "peers": {"worker:1": "w1:2222"},
    }
    assert peers.message(spec, []).startswith(
        "Strategy: the multi_worker_mirrored cluster of worker:0 did not form within 120 s "
        "(strategy.collective_timeout_seconds), though every other task accepts connections; "
    )
