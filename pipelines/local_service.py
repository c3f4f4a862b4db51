"""The tf.data service a local run starts for itself: `ingestion.service.local_workers`.

`LocalService` starts `python -m components.data.service dispatcher` and N workers on
free ports (each binds port 0 and writes the address it got to a ready file), waits a
bounded time for each to listen, and logs them under `<output>/tfdata_service/`. The run
stops them on every path (success, failure, Ctrl-C); if the run's process dies without
stopping them, the kernel sends them SIGTERM (`PR_SET_PDEATHSIG`). No TensorFlow here:
the servers import it, each in its own process.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from components.config import PipelineConfig

SERVICE_DIR = "tfdata_service"
# Bound on one server's start (it imports TensorFlow) on 2 busy cores.
START_TIMEOUT_S = 120
# Bound on a server's exit after SIGTERM, before SIGKILL.
STOP_TIMEOUT_S = 15
_PR_SET_PDEATHSIG = 1


class ServiceStartError(RuntimeError):
    """A dispatcher or worker exited or did not listen in time; the message has its log's end."""


def _package_root() -> str:
    """The directory holding the `components` package this process runs, for the servers' path."""
    import components

    return os.path.dirname(os.path.dirname(os.path.abspath(components.__file__)))


def _die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` asking the kernel to SIGTERM the child when this process dies (Linux).

    The kernel watches the thread that starts the child, not the process: a
    child started from another thread would be ended when that thread ends,
    so only the main thread's children get the request.
    """
    if (
        not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        # Between fork and exec: no allocation-heavy Python, only the call.
        zero = ctypes.c_ulong(0)
        prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGTERM), zero, zero, zero)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


class ServiceProcess:
    """One dispatcher or worker: `python -m components.data.service <role>`, started at once.

    Its output goes to `log_path`; it writes its bound address to
    `<log_path>.address` once it listens (`wait_listening` reads it).

    Args:
      role: `dispatcher` or `worker`.
      args: The role's arguments (`--port 0`, `--dispatcher host:port`, ...).
      log_path: The server's log file (appended to).
      command_prefix: A command the server runs under (e.g. `taskset -c 1`).
    """

    def __init__(
        self, role: str, args: Sequence[str], log_path: str, command_prefix: Sequence[str] = ()
    ):
        self.role = role
        self.log_path = log_path
        self.ready_file = f"{log_path}.address"
        self.address = ""
        if os.path.exists(self.ready_file):
            os.remove(self.ready_file)
        command = [
            *command_prefix, sys.executable, "-m", "components.data.service", role, *args,
            "--ready_file", self.ready_file,
        ]  # fmt: skip
        root = _package_root()
        # The input pipeline runs on CPU: a server must not take accelerator
        # memory from the trainer. INFO logs kept: they say what a server
        # that does not start is waiting for.
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "0"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group: a Ctrl-C reaches the run, which stops it.
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def wait_listening(self, timeout_s: float = START_TIMEOUT_S) -> str:
        """Waits at most `timeout_s` for the server to listen; returns (and keeps) its `host:port`.

        Raises:
          ServiceStartError: it exited, or did not listen in time (it is then killed).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(self.ready_file):
                with open(self.ready_file) as f:
                    address = f.read().removeprefix("grpc://")
                # IPv4 loopback, as the servers bind it: `localhost` may resolve to ::1 first.
                self.address = address.replace("localhost:", "127.0.0.1:")
                return self.address
            if self.process.poll() is not None:
                raise ServiceStartError(
                    f"tf.data service {self.role} exited at start (code {self.process.returncode}); "
                    f"its log {self.log_path} ends:\n{self.tail()}"
                )
            time.sleep(0.1)
        self.kill()
        raise ServiceStartError(
            f"tf.data service {self.role} did not listen within {timeout_s:g} s; its log "
            f"{self.log_path} ends:\n{self.tail()}"
        )

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def tail(self, chars: int = 3000) -> str:
        return self.log()[-chars:]

    def kill(self) -> None:
        """SIGKILL to its process group, then reaps it."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM to its process group, then SIGKILL past `STOP_TIMEOUT_S`."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()


class LocalService:
    """A dispatcher and `workers` workers on this machine, for one run.

    `start` starts them (stopping what it started if one fails); `stop` stops
    them all and may be called any number of times, also before `start`.

    Args:
      directory: Where the servers' logs and ready files go.
      workers: Workers started with the dispatcher.
      stream: Where the start and stop are said (None: nowhere).
    """

    def __init__(self, directory: str, workers: int, stream=None):
        self.directory = directory
        self.num_workers = workers
        self.stream = stream
        self.dispatcher: ServiceProcess | None = None
        self.workers: list[ServiceProcess] = []
        self.stopped = False

    @property
    def address(self) -> str:
        """`host:port` of the dispatcher (what `ingestion.service.dispatcher` takes)."""
        return self.dispatcher.address if self.dispatcher else ""

    def servers(self) -> list[ServiceProcess]:
        return [s for s in (self.dispatcher, *self.workers) if s is not None]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Starts the dispatcher, then every worker at once; waits at most `timeout_s` for each.

        Raises:
          ServiceStartError: a server exited or did not listen in time; every
            server started is stopped first.
        """
        os.makedirs(self.directory, exist_ok=True)
        try:
            self.dispatcher = ServiceProcess(
                "dispatcher", ["--port", "0"], os.path.join(self.directory, "dispatcher.log")
            )
            self.dispatcher.wait_listening(timeout_s)
            for i in range(self.num_workers):
                self.workers.append(
                    ServiceProcess(
                        "worker",
                        ["--dispatcher", self.address, "--port", "0"]
                        + ["--worker_address", "127.0.0.1:%port%"],
                        os.path.join(self.directory, f"worker-{i}.log"),
                    )
                )
            # Started together, so they import TensorFlow side by side.
            for worker in self.workers:
                worker.wait_listening(timeout_s)
        except BaseException:
            self.stop()
            raise
        self._say(
            f"tf.data service: started a dispatcher at {self.address} and {self.num_workers} "
            f"worker(s) for this run (ingestion.service.local_workers); logs in {self.directory}"
        )

    def stop(self) -> None:
        """Stops every server started (workers first); says so the first time."""
        servers = self.servers()
        for server in [*self.workers, self.dispatcher]:
            if server is not None:
                server.stop()
        if servers and not self.stopped:
            self._say(
                f"tf.data service: stopped the dispatcher and {len(self.workers)} worker(s) "
                "started for this run"
            )
        self.stopped = True

    def record(self) -> dict[str, Any]:
        """What `summary.json` keeps of the service (`tfdata_service`)."""
        return {
            "dispatcher": self.address,
            "workers": self.num_workers,
            "worker_addresses": [w.address for w in self.workers],
            "logs": [s.log_path for s in self.servers()],
            "pids": [s.pid for s in self.servers()],
            "stopped": self.stopped,
        }

    def run_config(self, config: PipelineConfig) -> PipelineConfig:
        """`config` with the started dispatcher as `ingestion.service.dispatcher` (no local_workers)."""
        service = dataclasses.replace(
            config.ingestion.service, dispatcher=self.address, local_workers=0
        )
        ingestion = dataclasses.replace(config.ingestion, service=service)
        return dataclasses.replace(config, ingestion=ingestion)

    def _say(self, line: str) -> None:
        if self.stream is not None:
            print(line, file=self.stream, flush=True)

    def __enter__(self) -> LocalService:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def for_run(config: PipelineConfig, output_dir: str, stream=None) -> LocalService | None:
    """The service `config` asks a local run to start (not started yet), or None."""
    workers = config.ingestion.service.local_workers
    if not workers:
        return None
    return LocalService(os.path.join(output_dir, SERVICE_DIR), workers, stream)
