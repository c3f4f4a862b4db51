"""Pusher with an atomic filesystem push (see `executor`)."""

from __future__ import annotations

from tfx import components as stock
from tfx.dsl.components.base import executor_spec

from components.pusher import executor


class Pusher(stock.Pusher):
    """Stock Pusher spec; pushes only blessed models, atomically."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)
