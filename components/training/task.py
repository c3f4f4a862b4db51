"""The lifecycle of one training task: every entry that trains goes through it.

The entries: the Trainer's own `run_fn` (`components.trainer.run_fn`, which
the student baseline runs too), the Distiller's (`components.distiller.run_fn`)
and a user's `run_fn` hosted by the Trainer executor
(`components.trainer.host`). In the order TensorFlow needs:

1. `start`: AutoGraph calls tf_keras's own code as it is
   (`components.compat.legacy_keras.keep_libraries_unconverted`), and the strategy is
   created before any other TensorFlow op runs in this process (logical
   devices and collective ops must be set up first).
   A parameter-server `ps` task serves until the job ends and an evaluator
   task has nothing to do (the Evaluator component evaluates the export):
   both get None. A training task goes on.
2. Training runs in the strategy's scope: `training.fit` enters it for the
   product's models, `user_scope` wraps a user's `run_fn`.
3. `export`: only the chief writes the serving model; every other worker
   saves a throwaway copy (saving is a collective all workers join) into
   scratch space, which is deleted (`components.training.export`).
4. `release`: the backup is removed after a successful export, by the chief
   only, so a task killed during the export still resumes from it.
"""

from __future__ import annotations

import dataclasses

import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.compat import legacy_keras
from components.config import PipelineConfig, StrategyConfig, payload
from components.training import backup, strategies
from components.training import fit as training
from components.training.export import export_from_task


@dataclasses.dataclass(frozen=True)
class Task:
    """A training task of a tfxkit `run_fn`: what its component passed, where it stands.

    Attributes:
      payload: The executor's decoded payload (its `config` is set).
      choice: This task's strategy and place in the cluster (a trainer).
    """

    payload: payload.Payload
    choice: strategies.StrategyChoice

    @property
    def config(self) -> PipelineConfig:
        return self.payload.config


def start(strategy: StrategyConfig, component: str) -> strategies.StrategyChoice | None:
    """Creates the strategy and resolves this process's role.

    Args:
      strategy: The configured strategy section.
      component: Name used in log lines (`Trainer`, `Distiller`).

    Returns:
      The strategy choice of a task that trains; None for an evaluator task,
      after a parameter-server task's server has stopped.
    """
    legacy_keras.keep_libraries_unconverted()
    choice = strategies.create_strategy(strategy)
    if choice.role == strategies.ROLE_SERVER:
        logging.info(
            "%s: serving as %s:%d of the parameter-server cluster",
            component,
            choice.task_type,
            choice.task_id,
        )
        strategies.start_server(choice.tf_config).join()
        return None
    if choice.role == strategies.ROLE_EVALUATOR:
        logging.info(
            "%s: evaluator task; the Evaluator component evaluates the export, nothing to do",
            component,
        )
        return None
    return choice


def from_fn_args(fn_args, component: str, *, needs_data: bool = True) -> Task | None:
    """The first step of every tfxkit `run_fn`: the payload, then `start`.

    The payload is the one the executor decoded (`components.config.payload.of`);
    a `run_fn` called directly decodes `fn_args.custom_config` once here.

    Args:
      fn_args: TFX's `FnArgs`.
      component: Name used in log lines and errors (`Trainer`, `Distiller`).
      needs_data: Whether the run_fn reads the config's data section (the
        Distiller of a `student_fn` does not).

    Returns:
      The task, or None for a task that does not train (see `start`).

    Raises:
      ValueError: when `custom_config` carries no tfxkit config.
    """
    decoded = payload.of(fn_args)
    if decoded.config is None:
        raise ValueError(
            f"{component}: custom_config carries no tfxkit config; use the tfxkit {component} component"
        )
    if needs_data:
        decoded.config.require_data(f"the {component}'s own run_fn")
    choice = start(decoded.config.strategy, component)
    return None if choice is None else Task(decoded, choice)


def user_scope(strategy: StrategyConfig, choice: strategies.StrategyChoice):
    """The scope a user run_fn runs in, or None to run it as stock TFX does.

    `auto` resolving to a single replica (one device, no cluster) is what
    stock TFX gives a run_fn, so no scope is entered: a run_fn that creates
    and enters its own strategy (TFX's penguin example does) keeps working.
    Any configured kind, or `auto` finding several devices or a cluster,
    runs the run_fn inside that strategy's scope.
    """
    if strategy.kind == "auto" and choice.num_replicas == 1 and choice.tf_config is None:
        return None
    return choice.strategy.scope()


def release(backup_dir: str, choice: strategies.StrategyChoice) -> None:
    """Removes the task's backup after the export (chief only; see `backup.remove`)."""
    backup.remove(backup_dir, is_chief=choice.is_chief)


def export(
    model: keras.Model,
    config: PipelineConfig,
    inputs: training.TrainingInputs,
    choice: strategies.StrategyChoice,
    save=None,
) -> str:
    """Exports the serving model (chief only), then removes the training backup.

    Args:
      save: Writes the serving model into a directory (see
        `components.training.export.export_from_task`); default: tfxkit's signatures.

    Returns:
      Where this task wrote (the serving dir on the chief, a task scratch
      directory, since removed, elsewhere).
    """
    written = export_from_task(
        model,
        tft.TFTransformOutput(inputs.transform_output),
        inputs.label(config),
        inputs.serving_model_dir,
        is_chief=choice.is_chief,
        task_type=choice.task_type,
        task_id=choice.task_id,
        scratch_dir=inputs.model_run_dir,
        save=save,
    )
    release(inputs.backup_dir, choice)
    return written
