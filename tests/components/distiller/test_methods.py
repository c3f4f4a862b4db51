"""The Distiller decides its method once: `run_fn.TRAINERS`, one trainer per method."""

from __future__ import annotations

import typing

from components.config.distillation import DistillationConfig
from components.distiller import run_fn


def test_every_method_the_config_accepts_has_one_trainer():
    accepted = typing.get_args(typing.get_type_hints(DistillationConfig)["method"])
    assert sorted(run_fn.TRAINERS) == sorted(accepted)
    assert sorted(run_fn.TRAINERS) == ["kd", "m_on_m", "noisy_student"]
