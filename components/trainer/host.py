"""Hosting a `run_fn` in the Trainer executor: the product's, or a user's under tfxkit settings.

`run_product_fn` is TFX's `GenericExecutor.Do` (run, then check the model was
written), with the executor's decoded payload handed to the run_fn (see
`components.trainer.fn_args`), which goes through `components.training.task`
itself.

`run_user_fn` hosts a user module (drop-in, see `components.config.stock_args`): the
task starts first (`task.run`), the user's `run_fn` runs inside
the configured strategy's scope and Keras precision policy, with
`fn_args.data_accessor.tf_dataset_factory` backed by tfxkit's input pipeline
(`components.trainer.data_accessor`); on a multi-worker job only the chief's
`serving_model_dir` is the model artifact (the others save to scratch,
`components.training.export.scratch_export_dir`), and a `backup_and_restore(fn_args)`
backup is removed after the chief's export (`Task.release`). A run_fn whose
Keras fit / evaluate gets the repeating dataset and no step count
(`train_args` / `eval_args` without `num_steps`) fails at once, as under
stock TFX, naming the argument.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from absl import logging
from tfx.components.util import udf_utils
from tfx.dsl.io import fileio

from components.compat import legacy_keras
from components.config import stock_args
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
    # Before the user module is imported: it must see tf_keras as tf.keras.
    legacy_keras.ensure_legacy_keras()
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
    scope = trainer.user_scope(settings.strategy)
    logging.info(
        "Trainer: running the user run_fn %s",
        f"under {choice.describe()}" if scope else "as stock TFX does (one device, no scope)",
    )
    with models.precision_policy(settings.mixed_precision), scope or contextlib.nullcontext():
        try:
            run_fn(fn_args)
        except RuntimeError as e:
            if scope and "Mixing different tf.distribute.Strategy" in str(e):
                raise RuntimeError(
                    f"strategy.kind: the user run_fn enters its own tf.distribute strategy inside the "
                    f"configured one ({choice.kind}); remove the run_fn's strategy, or leave "
                    f"strategy.kind 'auto' on one device to keep it: {e}"
                ) from e
            raise
        except ValueError as e:
            unset = _unset_step_args(e, fn_args)
            if not unset:
                raise
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
    if not choice.is_chief:
        export.discard_scratch_export(fn_args.serving_model_dir)
        return
    if not fileio.exists(serving_dir):
        raise RuntimeError(
            f"run_fn: the user run_fn wrote no model to fn_args.serving_model_dir ({serving_dir})"
        )
    trainer.release(backup.user_location(fn_args))


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
