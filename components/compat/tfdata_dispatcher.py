"""The workers a tf.data service dispatcher has registered, read over its gRPC API.

TensorFlow offers no Python call for this: a client of a dispatcher in
another process only learns that it has no worker by waiting forever for
data. The dispatcher's own gRPC service answers `GetWorkers` (TensorFlow's
`tensorflow/core/data/service/dispatcher.proto`: an empty request; the
response is `repeated WorkerInfo workers = 1`, each with `string address =
1`), so this module asks it directly. The two messages are declared here,
field numbers as in that file, because TensorFlow's wheel ships no Python
module for them.

The dispatcher keeps a worker in that list after the worker is gone, so a
caller that needs live workers probes each address (`answers`).
"""

from __future__ import annotations

import functools

_METHOD = "/tensorflow.data.DispatcherService/GetWorkers"


@functools.cache
def _response_class():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(
        name="tfxkit/tfdata_dispatcher_workers.proto", package="tfxkit.tfdata", syntax="proto3"
    )
    info = proto.message_type.add(name="WorkerInfo")
    info.field.add(name="address", number=1, type=9, label=1)  # string, optional
    response = proto.message_type.add(name="GetWorkersResponse")
    response.field.add(
        name="workers", number=1, type=11, label=3, type_name=".tfxkit.tfdata.WorkerInfo"
    )  # message, repeated
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tfxkit.tfdata.GetWorkersResponse")
    )


def registered_workers(target: str, timeout_seconds: float) -> list[str]:
    """The addresses of the workers the dispatcher at `target` (`host:port`) has registered.

    Raises:
      grpc.RpcError: the dispatcher did not answer within `timeout_seconds`.
    """
    import grpc

    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            _METHOD, request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw
        )
        reply = call(b"", timeout=timeout_seconds)  # GetWorkersRequest has no fields
    return [worker.address for worker in _response_class().FromString(reply).workers]


def answers(address: str, timeout_seconds: float) -> bool:
    """Whether a gRPC server at `address` (`host:port`) accepts a connection in time."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_seconds)
        except grpc.FutureTimeoutError:
            return False
    return True
