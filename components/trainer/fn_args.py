"""What a run_fn hosted by the tfxkit Trainer receives: TFX's `FnArgs` plus one declared field."""

from __future__ import annotations

import attr
from tfx.components.trainer import fn_args_utils

from components.config import payload


@attr.s
class FnArgs(fn_args_utils.FnArgs):
    """TFX's `FnArgs` with the executor's decoded payload.

    Attributes:
      tfxkit_payload: The `components.config.payload.Payload` the executor
        decoded once; `payload.of(fn_args)` returns it without parsing
        `custom_config` again (which stays the dict stock TFX gives a run_fn).
    """

    tfxkit_payload = attr.ib(type=payload.Payload, default=None)


def with_payload(fn_args: fn_args_utils.FnArgs, decoded: payload.Payload) -> FnArgs:
    """`fn_args` as the tfxkit `FnArgs` carrying `decoded`."""
    fields = {f.name: getattr(fn_args, f.name) for f in attr.fields(fn_args_utils.FnArgs)}
    return FnArgs(**fields, tfxkit_payload=decoded)
