"""Hosting a `run_fn` in the Trainer executor: the product's, or a user's under tfxkit settings.

`run_product_fn` is TFX's `GenericExecutor.Do` with the decoded payload handed to the
`run_fn`; `run_user_fn` runs a user module's `run_fn` inside the training task: the
configured strategy's scope and precision policy, tfxkit's `data_accessor`, the chief's export.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

from absl import logging
from tfx.components.util import udf_utils
from tfx.dsl.io import fileio

from components.compat import legacy_keras, user_code
from components.config import stock_args
from components.data import service
from components.trainer import data_accessor
from components.training import backup, cluster, export, models, task


def run_product_fn(run_fn: Callable, fn_args) -> None:
    """Runs a tfxkit `run_fn` as TFX's GenericExecutor does, then checks the model was written.

    Raises:
      RuntimeError: (TFX's message) when no model was written.
    """
    logging.info("Training model.")
    run_fn(fn_args)
    # Only the chief exports (`task.export`): another replica of a training
    # job, a parameter server or an evaluator writes no model, and may end
    # before the chief's export lands.
    tf_config = cluster.read_tf_config()
    if tf_config is not None and not tf_config.is_chief:
        return
    if not fileio.exists(fn_args.serving_model_dir):
        raise RuntimeError("run_fn failed to generate model.")
    logging.info(
        "Training complete. Model written to %s. ModelRun written to %s",
        fn_args.serving_model_dir,
        fn_args.model_run_dir,
    )


def run_user_fn(
    settings: stock_args.DropInSettings,
    exec_properties,
    make_fn_args: Callable[[], object],
    examples,
) -> None:
    """Runs the user's `run_fn` under the configured strategy, with the fast data accessor.

    Args:
      settings: The drop-in settings the component carried.
      exec_properties: The executor's (they name the user's `run_fn`).
      make_fn_args: Builds TFX's `FnArgs`; called only for a task that
        trains, after its strategy exists.
      examples: The examples artifacts the data accessor reads.

    Raises:
      RuntimeError: when the run_fn enters its own strategy inside the
        configured one, or the chief's run_fn wrote no model.
      ValueError: naming `train_args.num_steps` / `eval_args.num_steps` when
        Keras got the repeating dataset and no step count.
    """
    # The user module gets the Keras stock TFX would give it: tf.keras is
    # left as the process has it (components.compat.legacy_keras).
    task.run(
        settings.strategy,
        "Trainer",
        lambda trainer: _run_user_fn(trainer, settings, exec_properties, make_fn_args, examples),
    )


def _run_user_fn(
    trainer: task.Task,
    settings: stock_args.DropInSettings,
    exec_properties,
    make_fn_args: Callable[[], object],
    examples,
) -> None:
    choice = trainer.choice
    fn_args = make_fn_args()
    fn_args.data_accessor = data_accessor.tfxkit_data_accessor(
        fn_args,
        examples,
        settings,
        num_workers=choice.tf_config.num_workers if choice.tf_config else 1,
    )
    serving_dir = fn_args.serving_model_dir
    if not choice.is_chief:
        # Every worker must save (a collective), only the chief into the artifact.
        fn_args.serving_model_dir = export.scratch_export_dir(
            fn_args.model_run_dir, choice.task_type, choice.task_id
        )
    run_fn = udf_utils.get_fn(exec_properties, "run_fn")
    legacy_keras.check_one_keras(
        sys.modules[run_fn.__module__], _user_fn(exec_properties).removeprefix("the user ")
    )
    scope = trainer.user_scope(settings.strategy)
    keras_in_use = legacy_keras.tf_keras_module()
    logging.info(
        "Trainer: running the user run_fn %s, with tf.keras = %s",
        f"under {choice.describe()}" if scope else "as stock TFX does (one device, no scope)",
        keras_in_use.__name__,
    )
    # A run_fn reading fn_args.data_accessor through the tf.data service is
    # watched as the product's own training is: all workers lost for
    # ingestion.service.worker_wait_seconds fails it, naming the dispatcher,
    # instead of a wait without end (it makes no step the watch can see).
    with (
        service.watching_workers(
            settings.ingestion.service, "Trainer", cancellable=not choice.uses_coordinator
        ),
        models.precision_policy(settings.mixed_precision, keras_in_use),
        scope or contextlib.nullcontext(),
    ):
        try:
            run_fn(fn_args)
        except RuntimeError as e:
            if scope and "Mixing different tf.distribute.Strategy" in str(e):
                raise RuntimeError(
                    f"strategy.kind: the user run_fn enters its own tf.distribute strategy inside the "
                    f"configured one ({choice.kind}); remove the run_fn's strategy, or leave "
                    f"strategy.kind 'auto' on one device to keep it: {e}"
                ) from e
            raise user_code.UserCodeError(
                f"{_user_fn(exec_properties)} raised {type(e).__name__}: {e}"
            ) from e
        except ValueError as e:
            unset = _unset_step_args(e, fn_args)
            if not unset:
                raise user_code.UserCodeError(
                    f"{_user_fn(exec_properties)} raised ValueError: {e}"
                ) from e
            args, fields = (" / ".join(names) for names in zip(*unset, strict=True))
            raise ValueError(
                f"{args}: not set, so {fields} {'is' if len(unset) == 1 else 'are'} None and "
                "the user run_fn's Keras fit or evaluate got no step count for the repeating "
                "dataset of fn_args.data_accessor.tf_dataset_factory "
                "(TensorFlowDatasetOptions.num_epochs None repeats forever, as in stock TFX); "
                "give the Trainer train_args=tfx.proto.TrainArgs(num_steps=N) / "
                "eval_args=tfx.proto.EvalArgs(num_steps=N) (or a full config with "
                f"train.train_steps / train.eval_steps), or a finite num_epochs: {e}"
            ) from e
        except Exception as e:
            raise user_code.UserCodeError(
                f"{_user_fn(exec_properties)} raised {type(e).__name__}: {e}"
            ) from e
    if not choice.is_chief:
        export.discard_scratch_export(fn_args.serving_model_dir)
        return
    if not fileio.exists(serving_dir):
        raise RuntimeError(
            f"run_fn: the user run_fn wrote no model to fn_args.serving_model_dir ({serving_dir})"
        )
    trainer.release(backup.user_location(fn_args))


def _user_fn(exec_properties) -> str:
    """The user's run_fn as the Trainer was given it: a function path, or its module file."""
    if exec_properties.get("run_fn"):
        return f"the user run_fn {exec_properties['run_fn']!r}"
    module = exec_properties.get("module_file") or exec_properties.get("module_path")
    return f"the user run_fn of module_file {module!r}"


# What Keras (tf_keras) raises for fit / evaluate on an infinite dataset without steps.
_NO_STEPS_MESSAGES = (
    "infinitely repeating dataset, please specify",
    "infinite dataset, you must specify the number of steps",
)


def _unset_step_args(error: ValueError, fn_args) -> list[tuple[str, str]]:
    """`(Trainer argument, fn_args field)` to name when Keras refused an infinite dataset without steps."""
    if not any(m in str(error) for m in _NO_STEPS_MESSAGES):
        return []
    return [
        (arg, f"fn_args.{field}")
        for arg, field in (
            ("train_args.num_steps", "train_steps"),
            ("eval_args.num_steps", "eval_steps"),
        )
        if getattr(fn_args, field) is None
    ]
