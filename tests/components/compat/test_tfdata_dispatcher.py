"""`compat.tfdata_dispatcher`: the registered workers, read from a real in-process dispatcher."""

from __future__ import annotations

import time

import portpicker
import tensorflow as tf

from components.compat import tfdata_dispatcher

# Bound on a started worker's registration with the dispatcher.
REGISTER_TIMEOUT_S = 60


def test_the_registered_workers_are_read_and_a_closed_port_does_not_answer():
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    target = dispatcher.target.removeprefix("grpc://")
    worker = None
    try:
        assert tfdata_dispatcher.registered_workers(target, 10) == []
        port = portpicker.pick_unused_port()
        worker = service.WorkerServer(service.WorkerConfig(dispatcher_address=target, port=port))
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        while not tfdata_dispatcher.registered_workers(target, 10):
            assert time.monotonic() < deadline, "the worker did not register"
            time.sleep(0.2)
        assert tfdata_dispatcher.registered_workers(target, 10) == [f"localhost:{port}"]
        assert tfdata_dispatcher.answers(f"localhost:{port}", 5)
    finally:
        if worker is not None:
            worker.stop()
        dispatcher.stop()
    assert not tfdata_dispatcher.answers(f"127.0.0.1:{portpicker.pick_unused_port()}", 1)
