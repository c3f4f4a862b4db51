"""Whether a training task's peers answer, and a watchdog for a cluster that never forms.

`reachable` / `unreachable` probe peers; `watch_formation` runs the watchdog process
(`python -m components.training.peers`) around the call that forms the cluster: past the
bound it names the peers that never answered and ends the task. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from concurrent import futures

# Bound on one reachability probe (a lost pod's address refuses or times out).
PROBE_TIMEOUT_S = 2.0
# How long past its bound the watchdog lets the task's own error arrive first
# (TensorFlow raises one at the bound on tasks other than the coordination
# leader: an exception, better than the end of the process).
FORMATION_GRACE_S = 2.0


def reachable(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether `host:port` accepts a TCP connection (a running task's server does)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def unreachable(addresses: Mapping[str, str]) -> list[str]:
    """The names (keys) whose address accepts no connection, probed at once."""
    if not addresses:
        return []
    names = list(addresses)
    with futures.ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
        up = list(pool.map(lambda name: reachable(addresses[name]), names))
    return [name for name, ok in zip(names, up, strict=True) if not ok]


@contextlib.contextmanager
def watch_formation(
    peers: Mapping[str, str],
    seconds: float,
    describe: Mapping[str, str],
    grace: float = FORMATION_GRACE_S,
) -> Iterator[None]:
    """Ends this process if the block (forming the cluster) runs longer than `seconds` + `grace`.

    Args:
      peers: Every other task of the cluster, `worker:1` -> `host:port`.
      seconds: The bound.
      describe: `task` (this task, `worker:0`), `kind` (the strategy) and
        `source` (what set the bound), for the message.
      grace: Added to the bound before the watchdog acts.
    """
    spec = {
        "pid": os.getpid(),
        "seconds": seconds,
        "grace": grace,
        "peers": dict(peers),
        **describe,
    }
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "components.training.peers", json.dumps(spec)],
        stdin=subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    try:
        yield
    finally:
        # End of input tells the watchdog the block is over.
        watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(timeout=10)


def message(spec: Mapping, missing: list[str]) -> str:
    """What the watchdog writes when the cluster did not form in time."""
    bound = f"within {spec['seconds']:g} s ({spec['source']})"
    if missing:
        who = ", ".join(f"{name} ({spec['peers'][name]})" for name in missing)
        what = f"{who} did not join the {spec['kind']} cluster of {spec['task']} {bound}"
    else:
        what = (
            f"the {spec['kind']} cluster of {spec['task']} did not form {bound}, "
            "though every other task accepts connections"
        )
    return (
        f"Strategy: {what}; ending {spec['task']} (SIGKILL, exit status 137) so that the job "
        "restarts its tasks or fails (kubeflow.max_restarts). Every task must be running: is "
        "each pod scheduled and started?"
    )


def _watch(spec: dict) -> None:
    ready, _, _ = select.select([sys.stdin], [], [], spec["seconds"] + spec.get("grace", 0))
    if ready:
        return  # The block ended (or the task died): nothing to do.
    print(message(spec, unreachable(spec["peers"])), file=sys.stderr, flush=True)
    with contextlib.suppress(ProcessLookupError):
        os.kill(spec["pid"], signal.SIGKILL)


if __name__ == "__main__":
    _watch(json.loads(sys.argv[1]))
