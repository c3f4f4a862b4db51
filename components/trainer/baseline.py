"""`StudentBaseline`: the student's shape trained alone, the yardstick of distillation.

A Trainer of its own component type on `PipelineConfig.alone_config`: the `student` shape, hard labels
only, and the distilled student's steps, schedule and augmentation, so the one difference
from the Distiller is the teachers' soft targets. `ModelBaseline` trains a
`distillation.baselines` entry (its model and augmentation) the same way: what a user
would train alone in place of distilling.
"""

from __future__ import annotations

from tfx.types import BaseChannel

from components.config import PipelineConfig
from components.config.distillation import BaselineConfig
from components.trainer.component import Trainer


class StudentBaseline(Trainer):
    """Trains `config.student` from scratch on hard labels (see module docstring), on
    `PipelineConfig.alone_config`."""

    def __init__(
        self,
        config: PipelineConfig,
        examples: BaseChannel,
        transform_graph: BaseChannel,
        schema: BaseChannel | None = None,
        baseline: BaselineConfig | None = None,
    ):
        super().__init__(
            config=config.alone_config(baseline),
            examples=examples,
            transform_graph=transform_graph,
            schema=schema,
        )


class ModelBaseline(StudentBaseline):
    """Trains one `distillation.baselines` entry alone: a component type of its own, so
    the report tells it from the scratch baseline whatever the nodes are named."""

    def __init__(
        self,
        config: PipelineConfig,
        baseline: BaselineConfig,
        examples: BaseChannel,
        transform_graph: BaseChannel,
        schema: BaseChannel | None = None,
    ):
        super().__init__(config, examples, transform_graph, schema, baseline=baseline)
