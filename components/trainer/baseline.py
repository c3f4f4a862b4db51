"""`StudentBaseline`: the student's shape trained alone, the yardstick of distillation.

A Trainer of its own component type on `baseline_config`: the `student` shape, hard labels
only, and the distilled student's steps, schedule and augmentation, so the one difference
from the Distiller is the teachers' soft targets.
"""

from __future__ import annotations

import dataclasses

from tfx.types import BaseChannel

from components.config import PipelineConfig
from components.trainer.component import Trainer


def baseline_config(config: PipelineConfig) -> PipelineConfig:
    """The Trainer config of the scratch baseline: the student's shape and steps.

    The result trains one model, so its distillation stage is off (the
    student-smaller-than-teacher rule does not apply to it).
    """
    return dataclasses.replace(
        config,
        teacher=config.student,
        train=dataclasses.replace(config.train, train_steps=config.student_train_steps()),
        distillation=dataclasses.replace(
            config.distillation, enabled=False, scratch_baseline=False
        ),
    )


class StudentBaseline(Trainer):
    """Trains `config.student` from scratch on hard labels (see module docstring)."""

    def __init__(
        self,
        config: PipelineConfig,
        examples: BaseChannel,
        transform_graph: BaseChannel,
        schema: BaseChannel | None = None,
    ):
        super().__init__(
            config=baseline_config(config),
            examples=examples,
            transform_graph=transform_graph,
            schema=schema,
        )
