"""`StudentBaseline`: the student's shape trained alone, the yardstick of distillation.

A Trainer of its own component type on `baseline_config`: the `student` shape, hard labels
only, and the distilled student's steps, schedule and augmentation, so the one difference
from the Distiller is the teachers' soft targets. With a `distillation.baselines` entry it
trains that model (and augmentation) instead, on the same steps and schedule: what a user
would train alone in place of distilling.
"""

from __future__ import annotations

import dataclasses

from tfx.types import BaseChannel

from components.config import PipelineConfig
from components.config.distillation import BaselineConfig
from components.trainer.component import Trainer


def baseline_config(
    config: PipelineConfig, baseline: BaselineConfig | None = None
) -> PipelineConfig:
    """The Trainer config of the scratch baseline: the student's shape and steps.

    With `baseline`, its model and augmentation where it sets them. The
    result trains one model, so its distillation stage is off (the
    student-smaller-than-teacher rule does not apply to it).
    """
    model = baseline.model if baseline and baseline.model else config.student
    augmentation = (
        baseline.augmentation if baseline and baseline.augmentation else config.train.augmentation
    )
    return dataclasses.replace(
        config,
        teacher=model,
        train=dataclasses.replace(
            config.train, train_steps=config.student_train_steps(), augmentation=augmentation
        ),
        distillation=dataclasses.replace(
            config.distillation,
            enabled=False,
            scratch_baseline=False,
            baselines=(),
            # No teacher to cache, and a baseline's augmentation may differ from the Distiller's.
            cache_teacher_logits=False,
        ),
    )


class StudentBaseline(Trainer):
    """Trains `config.student` (or `baseline`'s model) from scratch on hard labels (see
    module docstring)."""

    def __init__(
        self,
        config: PipelineConfig,
        examples: BaseChannel,
        transform_graph: BaseChannel,
        schema: BaseChannel | None = None,
        baseline: BaselineConfig | None = None,
    ):
        super().__init__(
            config=baseline_config(config, baseline),
            examples=examples,
            transform_graph=transform_graph,
            schema=schema,
        )
