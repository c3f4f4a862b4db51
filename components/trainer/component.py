"""The Trainer component: TFX 1.16's Trainer, argument for argument, plus tfxkit settings.

`Trainer` takes every argument of `tfx.components.Trainer` with its stock meaning; without
a module it trains the configured model (`DEFAULT_RUN_FN`), with one the user's `run_fn`
runs under the configured strategy and tfxkit's input pipeline.
"""

from __future__ import annotations

from typing import Any

from tfx import components as stock
from tfx.dsl.components.base import executor_spec
from tfx.proto import trainer_pb2
from tfx.types import BaseChannel

from components.compat import stack
from components.config import ConfigError, PipelineConfig, payload, stock_args
from components.trainer import executor

DEFAULT_RUN_FN = "components.trainer.run_fn.run_fn"


class Trainer(stock.Trainer):
    """Trains the configured model, or the user's `run_fn` under tfxkit's strategy and input pipeline.

    Args:
      statistics (TFX 1.21 only, first there as in stock), examples,
        transformed_examples, transform_graph, schema, base_model,
        hyperparameters, module_file, run_fn, train_args, eval_args,
        custom_config, custom_executor_spec: As for `tfx.components.Trainer`.
      config: tfxkit settings. Without a user module: the `PipelineConfig`
        whose model is trained (required). With one: None (every default),
        `components.config.stock_args.DropInSettings`, a mapping of its fields, or a
        `PipelineConfig` or mapping of its sections (data optional; its
        `train.train_steps` / `train.eval_steps` are the step counts of an
        omitted `train_args` / `eval_args`).

    Raises:
      ConfigError: at construction, naming the argument: a missing module
        file or one without `run_fn`, an unknown `run_fn` path, zero
        `train_args` steps, settings contradicting `train_args`, or the
        generated model asked for without a full config.
    """

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    if stack.TRAINER_TAKES_STATISTICS:
        # TFX 1.21's Trainer takes `statistics` first: stock positional calls keep their meaning.
        def __init__(
            self,
            statistics: BaseChannel | None = None,
            examples: BaseChannel | None = None,
            transformed_examples: BaseChannel | None = None,
            transform_graph: BaseChannel | None = None,
            schema: BaseChannel | None = None,
            base_model: BaseChannel | None = None,
            hyperparameters: BaseChannel | None = None,
            module_file: Any = None,
            run_fn: Any = None,
            train_args: Any = None,
            eval_args: Any = None,
            custom_config: Any = None,
            custom_executor_spec: Any = None,
            *,
            config: Any = None,
        ):
            self._build(**{k: v for k, v in locals().items() if k != "self"})

    else:

        def __init__(
            self,
            examples: BaseChannel | None = None,
            transformed_examples: BaseChannel | None = None,
            transform_graph: BaseChannel | None = None,
            schema: BaseChannel | None = None,
            base_model: BaseChannel | None = None,
            hyperparameters: BaseChannel | None = None,
            module_file: Any = None,
            run_fn: Any = None,
            train_args: Any = None,
            eval_args: Any = None,
            custom_config: Any = None,
            custom_executor_spec: Any = None,
            *,
            config: Any = None,
        ):
            self._build(**{k: v for k, v in locals().items() if k != "self"})

    def _build(
        self,
        *,
        statistics=None,
        examples,
        transformed_examples,
        transform_graph,
        schema,
        base_model,
        hyperparameters,
        module_file,
        run_fn,
        train_args,
        eval_args,
        custom_config,
        custom_executor_spec,
        config,
    ) -> None:
        user_module = module_file is not None or run_fn is not None
        if module_file is not None and run_fn is not None:
            raise ConfigError("run_fn: give either module_file or run_fn, not both")
        if custom_executor_spec is not None:
            raise ConfigError(
                "custom_executor_spec: the tfxkit Trainer runs its own executor; use "
                "tfx.components.Trainer for another one"
            )
        if user_module:
            full, settings = stock_args.resolve_settings(config)
            stock_args.check_module_file(module_file, {"run_fn": "module_file"})
            stock_args.check_function_path(run_fn, "run_fn")
            if full is not None and full.train.grad_accum_steps > 1:
                raise ConfigError(
                    "config.train.grad_accum_steps: gradient accumulation needs the tfxkit model "
                    "(a user run_fn compiles and fits its own); set it to 1"
                )
            stock_args.check_steps(train_args, eval_args, full)
            custom_config = payload.encode(custom_config, config=full, settings=settings)
            if full is not None:
                # A full config's step counts are the run's (`check_steps` holds
                # given args to them), as before user modules got the drop-in
                # path: an omitted `train_args` would otherwise leave
                # `fn_args.train_steps` None, and a stock run_fn's
                # `fit(steps_per_epoch=fn_args.train_steps)` no step count for
                # the repeating `tf_dataset_factory` dataset.
                if train_args is None:
                    train_args = trainer_pb2.TrainArgs(num_steps=full.train.train_steps)
                if eval_args is None:
                    eval_args = trainer_pb2.EvalArgs(num_steps=full.train.eval_steps)
        else:
            if not isinstance(config, PipelineConfig):
                raise ConfigError(
                    "config: without module_file or run_fn the Trainer trains the configured model and "
                    f"needs a PipelineConfig with a data section, got {type(config).__name__}; give "
                    "module_file or run_fn to train your own model"
                )
            config.require_data("without module_file or run_fn, the Trainer's generated model")
            stock_args.check_steps(train_args, eval_args, config)
            custom_config = payload.encode(custom_config, config=config)
            run_fn = DEFAULT_RUN_FN
            train_args = train_args or trainer_pb2.TrainArgs(
                splits=["train"], num_steps=config.train.train_steps
            )
            eval_args = eval_args or trainer_pb2.EvalArgs(
                splits=["eval"], num_steps=config.train.eval_steps
            )
        stock_statistics = {"statistics": statistics} if stack.TRAINER_TAKES_STATISTICS else {}
        super().__init__(
            **stock_statistics,
            examples=examples,
            transformed_examples=transformed_examples,
            transform_graph=transform_graph,
            schema=schema,
            base_model=base_model,
            hyperparameters=hyperparameters,
            module_file=module_file,
            run_fn=run_fn,
            train_args=train_args,
            eval_args=eval_args,
            custom_config=custom_config,
        )
