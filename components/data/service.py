"""Input processing on tf.data service workers: TensorFlow's own dispatcher and workers.

`distribute` sends a dataset through the service `ingestion.service` names, after
`check_no_python` (the service cannot run Python functions) and `check_reachable`
(a bounded wait, not a hang); `watching_workers` fails a training whose workers are all
lost and none returns; `python -m components.data.service dispatcher|worker`
starts TensorFlow's servers, as the Kubeflow pods, the tests and the benchmark do.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import logging as logging_lib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import tensorflow as tf
from absl import logging
from tensorflow.python.eager import cancellation

from components.compat import tfdata_dispatcher
from components.config import ServiceConfig
from components.config.runtime import (
    DISPATCHER_ENV,
    KUBEFLOW_DISPATCHER,
    check_dispatcher_address,
    local_workers_outside_run,
)
from components.data.layout import IngestionError

# Ops that call back into the Python interpreter of the process that built the
# dataset: a service worker is another process, which has no such interpreter
# state (`py_function`, `numpy_function`, `from_generator`).
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
# A worker gives up on a dispatcher it cannot reach after this long and exits
# (without it, workers outlive their job: tensorflow#56490).
WORKER_DISPATCHER_TIMEOUT_MS = 60_000
# How long a worker waits at start for its dispatcher to answer (a dispatcher pod
# may be scheduled after its workers'), and its exit status when none does.
WORKER_START_WAIT_SECONDS = 300.0
WORKER_NO_DISPATCHER_EXIT_STATUS = 3
# How long a dispatcher or worker asked to stop (SIGTERM / SIGINT) waits for
# TensorFlow's server to stop before its process ends anyway.
SERVER_STOP_GRACE_SECONDS = 5.0
# How often the server's main thread looks whether it was asked to stop.
STOP_POLL_SECONDS = 0.5
# While waiting for workers: how often to ask the dispatcher, how long one
# worker's address may take to answer, and how often to say what is awaited.
WORKER_POLL_SECONDS = 1.0
WORKER_PROBE_SECONDS = 2.0
WORKER_LOG_EVERY_SECONDS = 5.0
# While training reads from the service (`watching_workers`): how often the
# watcher asks the dispatcher, how often it says what it waits for while no
# worker answers, and how long a cancelled training may take to return before
# the process is ended instead.
WATCH_POLL_SECONDS = 3.0
WATCH_LOG_EVERY_SECONDS = 15.0
CANCEL_GRACE_SECONDS = 30.0
# The exit status of a process ended because its cancelled training did not return.
WATCH_EXIT_STATUS = 1


def resolve_address(config: ServiceConfig) -> str:
    """The `grpc://host:port` of the dispatcher `config.dispatcher` names.

    Raises:
      IngestionError: for `kubeflow` outside the Kubeflow job that sets its address,
        and for `local_workers` that no local run turned into an address.
    """
    address = config.dispatcher
    if not address and config.local_workers:
        raise IngestionError(local_workers_outside_run(config.local_workers))
    if address == KUBEFLOW_DISPATCHER:
        address = os.environ.get(DISPATCHER_ENV, "")
        if not address:
            raise IngestionError(
                f"ingestion.service.dispatcher: {KUBEFLOW_DISPATCHER!r} is the dispatcher the compiled Kubeflow "
                f"training job starts, which sets {DISPATCHER_ENV} on its trainers; it is not set here: give "
                "the address of a dispatcher you run (host:port), or '' for no service"
            )
        problem = check_dispatcher_address(address)
        if problem:
            raise IngestionError(f"{DISPATCHER_ENV}: {problem}")
    return address if address.startswith("grpc://") else f"grpc://{address}"


def _accepts(target: str, timeout_seconds: float) -> bool:
    """Whether `target` (`host:port`) accepts a TCP connection within the bound, retried
    every half second. A plain socket: the worker's process keeps TensorFlow's gRPC
    alone (no second gRPC library beside it)."""
    host, _, port = target.rpartition(":")
    deadline = time.monotonic() + timeout_seconds
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(
                (host.strip("[]"), int(port)), timeout=max(0.1, min(2.0, left))
            ):
                return True
        except (OSError, ValueError):
            if time.monotonic() + 0.5 >= deadline:
                return False
            time.sleep(0.5)


def check_reachable(address: str, timeout_seconds: float) -> None:
    """Waits at most `timeout_seconds` for the dispatcher at `address` to accept a connection.

    TensorFlow's client retries an unreachable dispatcher without end; this
    turns that into an error naming the address.

    Raises:
      IngestionError: naming the address when it does not answer in time.
    """
    if not tfdata_dispatcher.answers(address.removeprefix("grpc://"), timeout_seconds):
        raise IngestionError(
            f"ingestion.service.dispatcher: no tf.data service dispatcher answered at {address} within "
            f"{timeout_seconds:g} s (ingestion.service.connect_timeout_seconds); start it "
            "(python -m components.data.service dispatcher --port <port>) or fix the address"
        )


def wait_for_workers(address: str, wait_seconds: float) -> list[str]:
    """Waits at most `wait_seconds` for a registered worker of the dispatcher that answers.

    TensorFlow's client waits for data without end when the dispatcher has
    no worker (never started, pointed at another dispatcher, pods not
    scheduled, all crashed): the trainer would sit idle until the job's
    deadline. The dispatcher keeps a gone worker registered, so each
    registered address is probed too. Logs what it waits for every few seconds.

    Args:
      address: The dispatcher, `grpc://host:port`; it already answers (`check_reachable`).
      wait_seconds: `ingestion.service.worker_wait_seconds`.

    Returns:
      The addresses of the workers that answered.

    Raises:
      IngestionError: naming the dispatcher, the workers it has registered and
        how to start one, when none answers in time.
    """
    target = address.removeprefix("grpc://")
    started = time.monotonic()
    logged = started
    while True:
        registered, live = live_workers(target)
        waited = time.monotonic() - started
        if live:
            logging.info("ingestion: %d tf.data service worker(s) answer: %s", len(live), live)
            return live
        seen = f"{len(registered)} registered" + (
            f" ({', '.join(registered)}), none answering" if registered else ""
        )
        if waited >= wait_seconds:
            raise IngestionError(
                f"ingestion.service.worker_wait_seconds: the tf.data service dispatcher at {address} "
                f"has no worker that answers after {wait_seconds:g} s: {seen}. Start one "
                f"(python -m components.data.service worker --dispatcher {target}), or check that "
                "the workers point at this dispatcher and can start (on Kubeflow: their pods)"
            )
        if time.monotonic() - logged >= WORKER_LOG_EVERY_SECONDS:
            logging.warning(
                "ingestion: waiting for a tf.data service worker of %s: %s, %.0f of %g s "
                "(ingestion.service.worker_wait_seconds)",
                address,
                seen,
                waited,
                wait_seconds,
            )
            logged = time.monotonic()
        time.sleep(WORKER_POLL_SECONDS)


def live_workers(target: str) -> tuple[list[str], list[str]]:
    """The workers the dispatcher at `target` (`host:port`) has registered, and those that answer.

    The dispatcher never drops a registered worker from `GetWorkers`, even past
    its `worker_timeout_ms` (TensorFlow 2.16: that timeout only reaches snapshot
    streams), so every address is probed, all at once.

    Raises:
      grpc.RpcError: the dispatcher did not answer.
    """
    registered = tfdata_dispatcher.registered_workers(target, WORKER_PROBE_SECONDS * 5)
    if not registered:
        return [], []
    with futures.ThreadPoolExecutor(max_workers=min(16, len(registered))) as pool:
        up = list(
            pool.map(lambda w: tfdata_dispatcher.answers(w, WORKER_PROBE_SECONDS), registered)
        )
    return registered, [w for w, ok in zip(registered, up, strict=True) if ok]


class WorkerWatch:
    """A daemon thread failing a training whose tf.data service workers are all lost.

    TensorFlow's client waits without end for a worker when every worker of
    its job is gone: the trainer would sit idle until the job's deadline.
    Every `WATCH_POLL_SECONDS` the watch asks the dispatcher which registered
    workers answer (`live_workers`). When none has answered, and training has
    made no step (`progress`), for `wait_seconds`, it logs why, then calls
    `cancel` (which makes the blocked step raise) and records `message`; if
    the training has not returned `CANCEL_GRACE_SECONDS` later (or `cancel` is
    None), it writes the message to the log and stderr and ends the process
    (`WATCH_EXIT_STATUS`); a training that returned ends its process at exit
    (`watching_workers`). A worker answering again within the bound resets it.

    Args:
      address: The dispatcher, `grpc://host:port`.
      wait_seconds: `ingestion.service.worker_wait_seconds`.
      cancel: Makes the training's blocked call return with an error; None: none can.
      what: Names the training in the message (`Trainer`, `Distiller`).
    """

    def __init__(self, address: str, wait_seconds: float, cancel, what: str):
        self.address = address
        self.wait_seconds = wait_seconds
        self.what = what
        self.message = ""
        self._cancel = cancel
        self._stop = threading.Event()
        self._progress = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="tfdata-worker-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ends the watch (the training returned); waits a bounded time for its thread."""
        self._stop.set()
        self._thread.join(timeout=WORKER_PROBE_SECONDS * 10)

    def progress(self) -> None:
        """Training made a step (the workers' data still arrives, or it needs none now)."""
        self._progress = time.monotonic()

    def _poll(self, target: str) -> tuple[list[str], list[str], str]:
        """(registered, answering, why none could be asked: '' when the dispatcher answered)."""
        import grpc

        try:
            return (*live_workers(target), "")
        except grpc.RpcError as e:
            return [], [], f"the dispatcher does not answer ({e.code().name})"

    def _run(self) -> None:
        target = self.address.removeprefix("grpc://")
        most, absent_since, logged = 0, None, 0.0
        delay = 0.0  # The first poll at once: what answers before a loss is counted.
        while not self._stop.wait(delay):
            delay = WATCH_POLL_SECONDS
            registered, live, problem = self._poll(target)
            now = time.monotonic()
            if live:
                if absent_since is not None:
                    logging.info("ingestion: tf.data service worker(s) answer again: %s", live)
                most, absent_since = max(most, len(live)), None
                continue
            absent_since = absent_since or now
            seen = problem or (
                f"0 of {len(registered)} registered worker(s) answer"
                + (f" ({', '.join(registered)})" if registered else "")
                + f", {most} answered before"
            )
            stalled = now - max(absent_since, self._progress)
            if stalled >= self.wait_seconds:
                self._fail(seen)
                return
            if now - logged >= WATCH_LOG_EVERY_SECONDS:
                logging.warning(
                    "%s: waiting for a tf.data service worker of %s: %s; no training step for "
                    "%.0f s, failing at %g s (ingestion.service.worker_wait_seconds)",
                    self.what,
                    self.address,
                    seen,
                    stalled,
                    self.wait_seconds,
                )
                logged = now

    def _fail(self, seen: str) -> None:
        target = self.address.removeprefix("grpc://")
        self.message = (
            f"ingestion.service.worker_wait_seconds: {self.what}: every tf.data service worker of "
            f"the dispatcher at {self.address} is lost ({seen}) and training has waited "
            f"{self.wait_seconds:g} s for one without a step. Start a worker (python -m "
            f"components.data.service worker --dispatcher {target}; on Kubeflow: check the "
            "worker pods), or raise ingestion.service.worker_wait_seconds"
        )
        if self._stop.is_set():
            return
        _say(self.message)
        if self._cancel is not None:
            self._cancel()
            if self._stop.wait(CANCEL_GRACE_SECONDS):
                return
            _say(
                f"{self.what}: the training did not return within {CANCEL_GRACE_SECONDS:g} s of "
                f"being cancelled: ending the process (exit status {WATCH_EXIT_STATUS})"
            )
        else:
            _say(f"{self.what}: ending the process (exit status {WATCH_EXIT_STATUS})")
        os._exit(WATCH_EXIT_STATUS)


def _say(message: str) -> None:
    """`message` to the log and to stderr, flushed (the process may end next)."""
    logging.error("%s", message)
    print(message, file=sys.stderr, flush=True)


# The errors of trainings the watch cancelled. Each holds (through its
# traceback) the training's input iterator, which must never be destroyed:
# the cancelled step returns, but the iterator's own thread stays blocked on
# the lost worker (a tf.distribute `MultiDeviceIterator` does not cancel its
# host iterator), and destroying the iterator waits for that thread forever.
_CANCELLED: list[BaseException] = []


def _keep_until_exit(error: BaseException) -> None:
    """Keeps `error` (and the training's iterator) alive; the process then ends at its exit
    without finalizing TensorFlow's objects, which would wait for the lost worker forever."""
    if not _CANCELLED:
        atexit.register(_end_without_finalizing)
    _CANCELLED.append(error)


def _end_without_finalizing() -> None:
    message = (
        "ingestion.service: ending the process (exit status "
        f"{WATCH_EXIT_STATUS}) without destroying the input iterator of the training the tf.data "
        "service watch failed: TensorFlow would wait for its lost worker forever"
    )
    logging.warning("%s", message)
    for handler in logging.get_absl_handler(), *logging_lib.getLogger().handlers:
        handler.flush()
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(WATCH_EXIT_STATUS)


@contextlib.contextmanager
def watching_workers(
    config: ServiceConfig, what: str, *, cancellable: bool = True
) -> Iterator[WorkerWatch | None]:
    """Runs the block (a training reading from the service) under a `WorkerWatch`.

    Nothing is watched when the service is off. Function calls of the block
    run under a TensorFlow cancellation manager the watch cancels: a step
    blocked in the service iterator's `get_next` then raises
    `tf.errors.CancelledError`, which leaves the block as `IngestionError`
    naming the dispatcher, the workers and the field, so the component fails
    with that message. The cancelled training's input iterator cannot be
    destroyed (it waits for the lost worker), so it is kept, and the process
    ends at its exit with `WATCH_EXIT_STATUS` without finalizing TensorFlow.
    The manager is TensorFlow's process-wide one
    (`tensorflow.python.eager.cancellation`), so `cancellable=False` where
    something else sets it (the parameter-server coordinator's closures):
    the watch then ends the process at once, the message written first.

    Yields:
      The watch (for `WorkerWatch.progress`), or None when the service is off.

    Raises:
      IngestionError: the watch failed the training.
    """
    if not config.enabled:
        yield None
        return
    manager = None
    if cancellable and hasattr(cancellation, "CancellationManagerContext"):
        manager = cancellation.CancellationManager()
    watch = WorkerWatch(
        resolve_address(config),
        config.worker_wait_seconds,
        manager.start_cancel if manager is not None else None,
        what,
    )
    watch.start()
    try:
        with (
            cancellation.CancellationManagerContext(manager)
            if manager is not None
            else contextlib.nullcontext()
        ):
            yield watch
    except Exception as e:
        if watch.message:
            _keep_until_exit(e)
            raise IngestionError(watch.message) from e
        raise
    finally:
        watch.stop()


def python_ops(dataset: tf.data.Dataset) -> list[str]:
    """The Python-calling ops (`PYTHON_OPS`) in `dataset`'s graph and its functions, sorted."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())  # noqa: SLF001 (TF's only graph view)
    found = {node.op for node in graph.node if node.op in PYTHON_OPS}
    for function in graph.library.function:
        found.update(node.op for node in function.node_def if node.op in PYTHON_OPS)
    return sorted(found)


def check_no_python(dataset: tf.data.Dataset, what: str) -> None:
    """Refuses a dataset the service cannot run: one that calls Python functions.

    Raises:
      IngestionError: naming the ops and the fix.
    """
    found = python_ops(dataset)
    if found:
        raise IngestionError(
            f"ingestion.service: {what} calls Python ({', '.join(found)}: tf.py_function, "
            "tf.numpy_function or Dataset.from_generator), which a tf.data service worker, another "
            "process, cannot run; write that step with TensorFlow ops, or apply it after the service "
            "(to the dataset distribute returns), or turn the service off (dispatcher: '')"
        )


def job_name(config: ServiceConfig, run_key: str, split: str) -> str:
    """The service job of `split`: `config.job_name`, else one named after `run_key`.

    Every replica of a run derives the same name from the same `run_key`
    (its model run directory), so all of them read one job.
    """
    base = config.job_name or "tfxkit-" + hashlib.sha256(run_key.encode()).hexdigest()[:16]
    return f"{base}-{split}"


def distribute(
    dataset: tf.data.Dataset, config: ServiceConfig, name: str, *, what: str = "the input pipeline"
) -> tf.data.Dataset:
    """`dataset`'s elements, produced by the service's workers instead of this process.

    Args:
      dataset: The part of the pipeline the workers run. Finite: one pass
        (`distributed_epoch` hands out each file once). Repeated: the workers
        stream epoch after epoch in one job (each epoch's files handed out once;
        with several workers one epoch's end overlaps the next's start). A
        `repeat()` after this call instead starts a new job per pass, whose end
        the client notices only at its next task refresh (about a second).
      config: `ingestion.service`.
      name: The job (`job_name`); consumers passing the same name share its
        elements.
      what: Names `dataset` in errors.

    Raises:
      IngestionError: when the dataset calls Python or the dispatcher does not answer.
    """
    address = resolve_address(config)
    # A parameter-server worker's dataset function is traced on the
    # coordinator, which has built (and so checked) the same dataset eagerly.
    if not tf.inside_function():
        check_no_python(dataset, what)
        check_reachable(address, config.connect_timeout_seconds)
        wait_for_workers(address, config.worker_wait_seconds)
    logging.info(
        "ingestion: %s runs on the tf.data service at %s (job %s, %s)",
        what,
        address,
        name,
        config.processing_mode,
    )
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=config.processing_mode,
            service=address,
            job_name=name,
            compression="AUTO" if config.compression == "auto" else None,
        )
    )


def serve(argv: list[str] | None = None) -> None:
    """Runs a dispatcher or a worker until SIGTERM / SIGINT (the pods' and tests' entry point)."""
    parser = argparse.ArgumentParser(prog="python -m components.data.service")
    parser.add_argument("role", choices=("dispatcher", "worker"))
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--dispatcher", default="", help="worker: the dispatcher's host:port")
    parser.add_argument(
        "--work_dir", default="", help="dispatcher: journal directory (fault-tolerant mode)"
    )
    parser.add_argument(
        "--worker_address",
        default="",
        help="worker: host:port the dispatcher gives consumers ('' = localhost:<port>); "
        "in a pod, its DNS name",
    )
    parser.add_argument(
        "--dispatcher_wait_seconds",
        type=float,
        default=WORKER_START_WAIT_SECONDS,
        help="worker: how long to wait at start for the dispatcher to answer before exiting "
        "with an error naming it (TensorFlow's worker would retry without end)",
    )
    parser.add_argument(
        "--ready_file",
        default="",
        help="written (atomically) with the bound grpc:// address once the server listens",
    )
    args = parser.parse_args(argv)
    service = tf.data.experimental.service
    if args.role == "dispatcher":
        server = service.DispatchServer(
            service.DispatcherConfig(
                port=args.port,
                work_dir=args.work_dir or None,
                fault_tolerant_mode=bool(args.work_dir),
            )
        )
    else:
        if not args.dispatcher:
            parser.error("worker needs --dispatcher host:port")
        dispatcher = args.dispatcher.removeprefix("grpc://")
        if not _accepts(dispatcher, args.dispatcher_wait_seconds):
            print(
                f"tf.data service worker: no dispatcher answered at {dispatcher} within "
                f"{args.dispatcher_wait_seconds:g} s (--dispatcher_wait_seconds): start the "
                "dispatcher first, or fix --dispatcher (from this host the address must resolve "
                "and its port be open)",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(WORKER_NO_DISPATCHER_EXIT_STATUS)
        server = service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=args.dispatcher.removeprefix("grpc://"),
                worker_address=args.worker_address or None,
                port=args.port,
                dispatcher_timeout_ms=WORKER_DISPATCHER_TIMEOUT_MS,
            )
        )
    # Handlers before the server says it listens: a caller may stop it at once.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # The bound address, for a caller that asked for any port (`--port 0`).
    address = server.target if args.role == "dispatcher" else f"grpc://{server._address}"  # noqa: SLF001
    print(f"tfdata-service {args.role} listening on {address}", flush=True)
    if args.ready_file:
        # A file of its own: TensorFlow's logs may split a line of a shared stream.
        with open(args.ready_file + ".tmp", "w") as f:
            f.write(address)
        os.replace(args.ready_file + ".tmp", args.ready_file)
    # Woken at least every `STOP_POLL_SECONDS`: the kernel may hand a process's signal to
    # any of TensorFlow's threads, and then only the main thread's next bytecode runs the
    # handler; an untimed wait would never get there, and the server would outlive its
    # parent's death or its pod's stop.
    while not stop.wait(STOP_POLL_SECONDS):
        pass
    # Stopping is bounded: a worker's stop can wait for an RPC to its dispatcher, which
    # may be gone too (the parent that started both was killed), for as long as the
    # worker's dispatcher timeout; the process then outlived its parent.
    stopper = threading.Thread(target=server.stop, name="tfdata-server-stop", daemon=True)
    stopper.start()
    stopper.join(SERVER_STOP_GRACE_SECONDS)
    if stopper.is_alive():
        print(
            f"the tf.data {args.role} server had not stopped after "
            f"{SERVER_STOP_GRACE_SECONDS:.0f} s; ending the process anyway",
            file=sys.stderr,
            flush=True,
        )
    sys.stdout.flush()
    # TensorFlow's server threads do not always end after stop (tensorflow#56490).
    os._exit(0)


if __name__ == "__main__":
    serve()
