"""Beam's Prism runner for tests: where the cached binary is, the Beam args that use it, and
an `EXTERNAL` SDK worker pool process (as a Flink TaskManager's sidecar runs one).

`make prism` builds the binary once per machine from the Go module proxy into
`~/.cache/tfxkit/prism/<version>/prism` (`TFXKIT_STACK_CACHE` moves the cache); the
current stack's root sees the same path. `TFXKIT_PRISM` names another binary.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from pipelines.precheck import PRISM_VERSION

# Bound on a worker pool's start (a Python process importing Beam).
POOL_START_TIMEOUT_S = 60.0


def cached_location() -> str:
    """Where `make prism` puts the binary."""
    cache = os.environ.get("TFXKIT_STACK_CACHE") or os.path.expanduser("~/.cache/tfxkit")
    return os.path.join(cache, "prism", PRISM_VERSION, "prism")


def location() -> str | None:
    """The Prism binary to run (`TFXKIT_PRISM`, else the cached build), None when absent."""
    path = os.environ.get("TFXKIT_PRISM") or cached_location()
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def _free_port() -> int:
    """A loopback port free now (the pool binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def beam_args(prism: str) -> list[str]:
    """Beam args that run a pipeline on `prism`, a server of its own for each pipeline."""
    return [
        "--runner=PrismRunner",
        f"--prism_location={prism}",
        # One Prism server per pipeline, stopped with it: no server outlives a test.
        "--experiments=disable_prism_server_singleton",
    ]


class WorkerPool:
    """Beam's Python SDK worker pool (`worker_pool_main`) on a free loopback port: the
    `EXTERNAL` environment a runner asks for workers. A context manager; the pool and
    every worker it started are killed on exit, whatever happened.

    A plain Python pool installs none of the packages a pipeline stages (`--extra_package`,
    as TFX stages a user module's wheel): its workers import what its `sys.path` holds, as
    the workers of a worker image import what the image has installed.

    Args:
      log_path: The pool's (and its workers') output.
      python_path: Directories its workers import from besides the repository (a user's
        module files, as a worker image would hold them).
    """

    def __init__(self, log_path: str, python_path: tuple[str, ...] = ()):
        self.log_path = log_path
        port = _free_port()
        self.address = f"localhost:{port}"
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, (repo, *python_path, os.environ.get("PYTHONPATH")))
            ),
            # The pool starts each worker as `python -c ...`: this interpreter's.
            "PATH": os.pathsep.join(
                filter(None, (os.path.dirname(sys.executable), os.environ.get("PATH")))
            ),
        }
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                 f"--service_port={port}"],
                cwd=repo,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group: the workers it forks die with it.
                start_new_session=True,
            )  # fmt: skip
        try:
            self._wait_listening(port, POOL_START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _wait_listening(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the SDK worker pool exited with {self.process.returncode} before it "
                    f"listened on port {port}; see {self.log_path}"
                )
            with socket.socket() as probe:
                probe.settimeout(1.0)
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(
            f"the SDK worker pool did not listen on port {port} within {timeout_s:.0f} s; "
            f"see {self.log_path}"
        )

    def beam_args(self) -> list[str]:
        """The Beam args that send a pipeline's SDK work to this pool."""
        return ["--environment_type=EXTERNAL", f"--environment_config={self.address}"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=30)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
