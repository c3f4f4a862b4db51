"""Pusher with an atomic filesystem push (see `executor`) and an optional second gate."""

from __future__ import annotations

from typing import Any

from tfx import components as stock
from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import pusher_pb2
from tfx.types import channel, component_spec, standard_artifacts, standard_component_specs
from tfx.utils import json_utils

from components.pusher import executor

SERVED_BLESSING_KEY = executor.SERVED_BLESSING_KEY


class PusherSpec(standard_component_specs.PusherSpec):
    """Stock `PusherSpec` plus `served_blessing`: the blessing of a second Evaluator
    (a distilled student against the served model), required as well when given."""

    INPUTS = {
        **standard_component_specs.PusherSpec.INPUTS,
        SERVED_BLESSING_KEY: component_spec.ChannelParameter(
            type=standard_artifacts.ModelBlessing, optional=True
        ),
    }


class Pusher(stock.Pusher):
    """Pushes only models every given blessing blesses, atomically."""

    SPEC_CLASS = PusherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(
        self,
        model=None,
        model_blessing=None,
        infra_blessing=None,
        push_destination: pusher_pb2.PushDestination | None = None,
        custom_config: dict[str, Any] | None = None,
        served_blessing=None,
    ):
        """Stock `Pusher`'s arguments (without the deprecated executor override).

        Args:
          model: The model to push.
          model_blessing: The Evaluator's blessing.
          infra_blessing: InfraValidator's blessing.
          push_destination: Where to push (required: a filesystem destination
            is pushed atomically, others by the stock executor).
          custom_config: Passed to the executor.
          served_blessing: A second Evaluator's blessing (the distilled student
            against the served model); the model is pushed only if it too blesses.

        Raises:
          ValueError: without `push_destination` or `model`.
        """
        if push_destination is None:
            raise ValueError("Pusher: push_destination is required")
        if model is None:
            raise ValueError("Pusher: model is required")
        spec = PusherSpec(
            model=model,
            model_blessing=model_blessing,
            infra_blessing=infra_blessing,
            served_blessing=served_blessing,
            push_destination=push_destination,
            custom_config=json_utils.dumps(custom_config),
            pushed_model=channel.Channel(type=standard_artifacts.PushedModel),
        )
        base_component.BaseComponent.__init__(self, spec=spec)
