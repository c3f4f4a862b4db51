"""`StudentBaseline`: the student's shape trained alone, the yardstick of distillation.

A distilled student is worth its stage only if it beats the same network
trained without a teacher. With `distillation.scratch_baseline`, the
pipeline adds this Trainer: the `student` shape, hard labels only, and the
distilled student's steps (`distillation.student_train_steps`), schedule and
augmentation, so that the one difference from the Distiller is the teachers'
soft targets. The distillation report (`pipelines.report`) measures it beside
the teachers and the student and says whether the student improved on it.

It is a separate component type so that ML Metadata records its role
(`pipelines.roles`); the Distiller never consumes its model.
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
