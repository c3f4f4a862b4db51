"""Input processing on tf.data service workers: TensorFlow's own dispatcher and workers.

`distribute` sends a dataset through the service `ingestion.service` names, after
`check_no_python` (the service cannot run Python functions) and `check_reachable`
(a bounded wait, not a hang); `python -m components.data.service dispatcher|worker`
starts TensorFlow's servers, as the Kubeflow pods, the tests and the benchmark do.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import threading
import time

import tensorflow as tf
from absl import logging

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
# While waiting for workers: how often to ask the dispatcher, how long one
# worker's address may take to answer, and how often to say what is awaited.
WORKER_POLL_SECONDS = 1.0
WORKER_PROBE_SECONDS = 2.0
WORKER_LOG_EVERY_SECONDS = 5.0


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


def check_reachable(address: str, timeout_seconds: float) -> None:
    """Waits at most `timeout_seconds` for the dispatcher at `address` to accept a connection.

    TensorFlow's client retries an unreachable dispatcher without end; this
    turns that into an error naming the address.

    Raises:
      IngestionError: naming the address when it does not answer in time.
    """
    import grpc  # TensorFlow's own dependency; imported here, only where it is used.

    target = address.removeprefix("grpc://")
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_seconds)
    except grpc.FutureTimeoutError:
        raise IngestionError(
            f"ingestion.service.dispatcher: no tf.data service dispatcher answered at {address} within "
            f"{timeout_seconds:g} s (ingestion.service.connect_timeout_seconds); start it "
            "(python -m components.data.service dispatcher --port <port>) or fix the address"
        ) from None
    finally:
        channel.close()


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
        registered = tfdata_dispatcher.registered_workers(target, WORKER_PROBE_SECONDS * 5)
        live = [w for w in registered if tfdata_dispatcher.answers(w, WORKER_PROBE_SECONDS)]
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
        server = service.WorkerServer(
            service.WorkerConfig(
                dispatcher_address=args.dispatcher.removeprefix("grpc://"),
                worker_address=args.worker_address or None,
                port=args.port,
                dispatcher_timeout_ms=WORKER_DISPATCHER_TIMEOUT_MS,
            )
        )
    # The bound address, for a caller that asked for any port (`--port 0`).
    address = server.target if args.role == "dispatcher" else f"grpc://{server._address}"  # noqa: SLF001
    print(f"tfdata-service {args.role} listening on {address}", flush=True)
    if args.ready_file:
        # A file of its own: TensorFlow's logs may split a line of a shared stream.
        with open(args.ready_file + ".tmp", "w") as f:
            f.write(address)
        os.replace(args.ready_file + ".tmp", args.ready_file)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    sys.stdout.flush()
    # TensorFlow's server threads do not always end after stop (tensorflow#56490).
    os._exit(0)


if __name__ == "__main__":
    serve()
