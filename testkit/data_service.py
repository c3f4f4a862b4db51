"""A tf.data service of real processes on loopback: TensorFlow's dispatcher and workers.

`LocalService` starts `python -m components.data.service` processes on free ports, waits
(bounded) for each to listen, and stops them on every path; workers can be killed and the
dispatcher restarted from its journal, as a pod would be. One process is the product's
(`pipelines.local_service.ServiceProcess`, what a run with `ingestion.service.local_workers`
starts); this harness adds CPU pinning, the fault-tolerant journal and restarts.
"""

from __future__ import annotations

import os

from pipelines.local_service import START_TIMEOUT_S, ServiceProcess


class Server(ServiceProcess):
    """One dispatcher or worker process (`pipelines.local_service.ServiceProcess`),
    optionally pinned to `cpus` (`taskset`), listening once constructed."""

    def __init__(self, role: str, args: list[str], log_path: str, cpus: str = ""):
        super().__init__(role, args, log_path, ["taskset", "-c", cpus] if cpus else ())
        self.wait_listening(START_TIMEOUT_S)


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
