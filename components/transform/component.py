"""The Transform component: stock TFX Transform spec driven by the feature config."""

from __future__ import annotations

from tfx import v1 as tfx
from tfx.dsl.components.base import executor_spec
from tfx.types import BaseChannel

from components.config import CONFIG_KEY, PipelineConfig
from components.transform import executor

DEFAULT_PREPROCESSING_FN = "components.transform.preprocessing.preprocessing_fn"


class Transform(tfx.components.Transform):
    """Transform whose `preprocessing_fn` is generated from the feature config.

    A user `module_file` or `preprocessing_fn` still works (stock behaviour);
    splits config and the analyzer cache are passed through unchanged.
    """

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(
        self,
        config: PipelineConfig,
        examples: BaseChannel,
        schema: BaseChannel,
        module_file: str | None = None,
        preprocessing_fn: str | None = None,
        splits_config=None,
        analyzer_cache: BaseChannel | None = None,
        disable_analyzer_cache: bool = False,
        custom_config: dict | None = None,
    ):
        if module_file is None and preprocessing_fn is None:
            preprocessing_fn = DEFAULT_PREPROCESSING_FN
        super().__init__(
            examples=examples,
            schema=schema,
            module_file=module_file,
            preprocessing_fn=preprocessing_fn,
            splits_config=splits_config,
            analyzer_cache=analyzer_cache,
            disable_analyzer_cache=disable_analyzer_cache,
            custom_config={**(custom_config or {}), CONFIG_KEY: config.to_json()},
        )
