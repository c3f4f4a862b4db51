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

import tensorflow as tf
from absl import logging

from components.config import ServiceConfig
from components.config.runtime import (
    DISPATCHER_ENV,
    KUBEFLOW_DISPATCHER,
    check_dispatcher_address,
)
from components.data.layout import IngestionError

# Ops that call back into the Python interpreter of the process that built the
# dataset: a service worker is another process, which has no such interpreter
# state (`py_function`, `numpy_function`, `from_generator`).
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
# A worker gives up on a dispatcher it cannot reach after this long and exits
# (without it, workers outlive their job: tensorflow#56490).
WORKER_DISPATCHER_TIMEOUT_MS = 60_000


def resolve_address(config: ServiceConfig) -> str:
    """The `grpc://host:port` of the dispatcher `config.dispatcher` names.

    Raises:
      IngestionError: for `kubeflow` outside the Kubeflow job that sets its address.
    """
    address = config.dispatcher
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
