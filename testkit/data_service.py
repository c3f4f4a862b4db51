"""A tf.data service of real processes on loopback: TensorFlow's dispatcher and workers.

`LocalService` starts `python -m components.data.service` processes on free ports, waits
(bounded) for each to listen, and stops them on every path; workers can be killed and the
dispatcher restarted from its journal, as a pod would be. With a `testkit.netns.Network`
each server runs on a host of its own, at that host's address. One process is the product's
(`pipelines.local_service.ServiceProcess`, what a run with `ingestion.service.local_workers`
starts); this harness adds CPU pinning, the fault-tolerant journal and restarts.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from pipelines.local_service import START_TIMEOUT_S, ServiceProcess

if TYPE_CHECKING:
    from testkit.netns import Network


class Server(ServiceProcess):
    """One dispatcher or worker process (`pipelines.local_service.ServiceProcess`),
    optionally pinned to `cpus` (`taskset`) and run on `host` of `network`
    (`testkit.netns.Network`), listening once constructed; its `address` is then
    the host's."""

    def __init__(
        self,
        role: str,
        args: list[str],
        log_path: str,
        cpus: str = "",
        network: Network | None = None,
        host: str = "",
    ):
        prefix = network.prefix(host) if network is not None else []
        super().__init__(
            role, args, log_path, [*prefix, *(["taskset", "-c", cpus] if cpus else [])]
        )
        self.wait_listening(START_TIMEOUT_S)
        if network is not None:
            self.address = f"{network.address[host]}:{self.port}"


class LocalService:
    """A dispatcher and `workers` workers; a context manager that stops them all.

    Args:
      workdir: Where the servers' logs go.
      workers: Workers started with the dispatcher.
      journal_dir: The dispatcher's `work_dir` (fault-tolerant mode), '' for none.
      cpus: `taskset` CPU lists: `dispatcher` and `workers` keys (benchmarks).
      network: Separate hosts (`testkit.netns.Network`); None: all on loopback.
      hosts: On `network`, the `dispatcher` host and the `workers` hosts (one per
        worker, in the order they start).
    """

    def __init__(
        self,
        workdir: str,
        workers: int = 1,
        journal_dir: str = "",
        cpus: dict | None = None,
        network: Network | None = None,
        hosts: dict | None = None,
    ):
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.journal_dir = journal_dir
        self.cpus = cpus or {}
        self.network = network
        self.hosts = hosts or {}
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
            self.cpus.get("dispatcher", ""), self.network, self.hosts.get("dispatcher", ""),
        )  # fmt: skip

    def worker_host(self, index: int) -> str:
        """The host worker `index` runs on ('' on loopback)."""
        return self.hosts["workers"][index] if self.network is not None else ""

    def add_worker(self) -> Server:
        index = len(self.workers)
        host = self.worker_host(index)
        ip = self.network.address[host] if self.network is not None else "127.0.0.1"
        worker = Server(
            "worker",
            ["--dispatcher", self.address, "--worker_address", f"{ip}:%port%"],
            os.path.join(self.workdir, f"worker{index}.log"),
            self.cpus.get("workers", ""),
            self.network,
            host,
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
