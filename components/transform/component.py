"""The Transform component: TFX 1.16's Transform, argument for argument, plus tfxkit output.

`Transform` takes every argument of `tfx.components.Transform` with its stock meaning;
without a module it uses the config-generated `preprocessing_fn`
(`DEFAULT_PREPROCESSING_FN`), and it writes ingestion-ready output unless `stock_output` is set.
"""

from __future__ import annotations

from typing import Any

from tfx import components as stock
from tfx.dsl.components.base import executor_spec
from tfx.types import BaseChannel

from components.config import ConfigError, PipelineConfig, payload, stock_args
from components.transform import executor

DEFAULT_PREPROCESSING_FN = "components.data.preprocessing.preprocessing_fn"


class Transform(stock.Transform):
    """Transform whose output is ingestion-ready; a user module works unchanged.

    Args:
      examples, schema, module_file, preprocessing_fn, splits_config,
        analyzer_cache, materialize, disable_analyzer_cache,
        force_tf_compat_v1, custom_config, disable_statistics,
        stats_options_updater_fn: As for `tfx.components.Transform`.
      config: tfxkit settings. Without a user module: the `PipelineConfig`
        whose features generate the `preprocessing_fn` (required). With one:
        None (every default), `components.config.stock_args.DropInSettings`, a mapping of
        its fields, or a `PipelineConfig` or mapping of its sections (data optional).

    Raises:
      ConfigError: at construction, naming the argument: a missing module
        file, one without `preprocessing_fn` (or the named
        `stats_options_updater_fn`), an unknown function path, or the
        generated `preprocessing_fn` asked for without a full config.
    """

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(
        self,
        examples: BaseChannel,
        schema: BaseChannel,
        module_file: Any = None,
        preprocessing_fn: Any = None,
        splits_config: Any = None,
        analyzer_cache: BaseChannel | None = None,
        materialize: bool = True,
        disable_analyzer_cache: bool = False,
        force_tf_compat_v1: bool = False,
        custom_config: Any = None,
        disable_statistics: bool = False,
        stats_options_updater_fn: Any = None,
        *,
        config: Any = None,
    ):
        if module_file is not None and preprocessing_fn is not None:
            raise ConfigError(
                "preprocessing_fn: give either module_file or preprocessing_fn, not both"
            )
        if module_file is not None or preprocessing_fn is not None:
            full, settings = stock_args.resolve_settings(config)
            functions = {"preprocessing_fn": "module_file"}
            if isinstance(stats_options_updater_fn, str) and "." not in stats_options_updater_fn:
                functions[stats_options_updater_fn] = "stats_options_updater_fn"
            stock_args.check_module_file(module_file, functions)
            stock_args.check_function_path(preprocessing_fn, "preprocessing_fn")
            custom_config = payload.encode(custom_config, config=full, settings=settings)
        else:
            if not isinstance(config, PipelineConfig):
                raise ConfigError(
                    "config: without module_file or preprocessing_fn the Transform generates the "
                    "preprocessing_fn from the feature config and needs a PipelineConfig with a data "
                    f"section, got {type(config).__name__}; give module_file or preprocessing_fn to use "
                    "your own"
                )
            config.require_data(
                "without module_file or preprocessing_fn, the generated preprocessing_fn"
            )
            # Only what Transform reads, so other settings do not invalidate its cache.
            custom_config = payload.encode(custom_config, config=config.transform_view())
            preprocessing_fn = DEFAULT_PREPROCESSING_FN
        super().__init__(
            examples=examples,
            schema=schema,
            module_file=module_file,
            preprocessing_fn=preprocessing_fn,
            splits_config=splits_config,
            analyzer_cache=analyzer_cache,
            materialize=materialize,
            disable_analyzer_cache=disable_analyzer_cache,
            force_tf_compat_v1=force_tf_compat_v1,
            custom_config=custom_config,
            disable_statistics=disable_statistics,
            stats_options_updater_fn=stats_options_updater_fn,
        )
