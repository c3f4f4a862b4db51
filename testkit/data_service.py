"""A tf.data service of real processes on loopback: TensorFlow's dispatcher and workers.

`LocalService` starts `python -m components.data.service` processes on free ports, waits
(bounded) for each to listen, and stops them on every path; workers can be killed and the
dispatcher restarted from its journal, as a pod would be.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bound on one server's start (it imports TensorFlow) on 2 busy cores.
START_TIMEOUT_S = 120
# Bound on a server's exit after SIGTERM, before SIGKILL.
STOP_TIMEOUT_S = 15


class Server:
    """One dispatcher or worker process."""

    def __init__(self, role: str, args: list[str], log_path: str, cpus: str = ""):
        self.role = role
        self.log_path = log_path
        self.ready_file = f"{log_path}.address"
        if os.path.exists(self.ready_file):
            os.remove(self.ready_file)
        command = [
            sys.executable, "-m", "components.data.service", role, *args,
            "--ready_file", self.ready_file,
        ]  # fmt: skip
        if cpus:
            command = ["taskset", "-c", cpus, *command]
        # INFO logs kept: they say what a server that does not start is waiting for.
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "0"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (REPO_ROOT, env.get("PYTHONPATH"))))
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.address = self._wait_listening()

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if os.path.exists(self.ready_file):
                with open(self.ready_file) as f:
                    address = f.read().removeprefix("grpc://")
                # IPv4 loopback, as the servers bind it: `localhost` may resolve to ::1 first.
                return address.replace("localhost:", "127.0.0.1:")
            if self.process.poll() is not None:
                raise RuntimeError(f"tf.data service {self.role} exited at start:\n{self.tail()}")
            time.sleep(0.1)
        self.kill()
        raise TimeoutError(
            f"tf.data service {self.role} did not listen within {START_TIMEOUT_S} s:\n{self.tail()}"
        )

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def tail(self, chars: int = 3000) -> str:
        return self.log()[-chars:]

    def kill(self) -> None:
        """SIGKILL, as a node failure would end it."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL past `STOP_TIMEOUT_S`."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()


class LocalService:
    """A dispatcher and `workers` workers; a context manager that stops them all.

    Args:
      workdir: Where the servers' logs go.
      workers: Workers started with the dispatcher.
      journal_dir: The dispatcher's `work_dir` (fault-tolerant mode), '' for none.
      cpus: `taskset` CPU lists: `dispatcher` and `workers` keys (benchmarks).
    """

    def __init__(
        self, workdir: str, workers: int = 1, journal_dir: str = "", cpus: dict | None = None
    ):
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.journal_dir = journal_dir
        self.cpus = cpus or {}
        self.workers: list[Server] = []
        self.dispatcher: Server | None = None
        try:
            self.dispatcher = self._dispatcher(port=0)
            for _ in range(workers):
                self.add_worker()
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        """`host:port` of the dispatcher (what `ingestion.service.dispatcher` takes)."""
        return self.dispatcher.address

    def _dispatcher(self, port: int) -> Server:
        args = ["--port", str(port)]
        if self.journal_dir:
            args += ["--work_dir", self.journal_dir]
        return Server(
            "dispatcher", args, os.path.join(self.workdir, "dispatcher.log"),
            self.cpus.get("dispatcher", ""),
        )  # fmt: skip

    def add_worker(self) -> Server:
        index = len(self.workers)
        worker = Server(
            "worker",
            ["--dispatcher", self.address, "--worker_address", "127.0.0.1:%port%"],
            os.path.join(self.workdir, f"worker{index}.log"),
            self.cpus.get("workers", ""),
        )
        self.workers.append(worker)
        return worker

    def restart_dispatcher(self) -> None:
        """Kills the dispatcher and starts it again on its port (from its journal, if any)."""
        port = self.dispatcher.port
        self.dispatcher.kill()
        self.dispatcher = self._dispatcher(port)

    def close(self) -> None:
        for server in [*self.workers, self.dispatcher]:
            if server is not None:
                server.stop()

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
