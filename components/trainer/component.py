"""The Trainer component: stock TFX Trainer spec, tfxkit executor and run_fn."""

from __future__ import annotations

from tfx import v1 as tfx
from tfx.dsl.components.base import executor_spec
from tfx.types import BaseChannel

from components.config import CONFIG_KEY, PipelineConfig
from components.trainer import executor

DEFAULT_RUN_FN = "components.trainer.run_fn.run_fn"


class Trainer(tfx.components.Trainer):
    """Trains the configured model; a user `module_file` / `run_fn` still works.

    The validated `PipelineConfig` travels as JSON under one `custom_config`
    key; user-supplied `custom_config` entries are kept beside it.
    """

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(
        self,
        config: PipelineConfig,
        examples: BaseChannel,
        transform_graph: BaseChannel | None = None,
        schema: BaseChannel | None = None,
        base_model: BaseChannel | None = None,
        module_file: str | None = None,
        run_fn: str | None = None,
        custom_config: dict | None = None,
    ):
        if module_file is None and run_fn is None:
            run_fn = DEFAULT_RUN_FN
        super().__init__(
            examples=examples,
            transform_graph=transform_graph,
            schema=schema,
            base_model=base_model,
            module_file=module_file,
            run_fn=run_fn,
            train_args=tfx.proto.TrainArgs(splits=["train"], num_steps=config.train.train_steps),
            eval_args=tfx.proto.EvalArgs(splits=["eval"], num_steps=config.train.eval_steps),
            custom_config={**(custom_config or {}), CONFIG_KEY: config.to_json()},
        )
