"""The one training task: every entry that trains goes through `Task` and `run`.

The entries: the Trainer's `run_fn` (which the student baseline runs too), the
Distiller's (configured student and `student_fn`) and a user's `run_fn` hosted
by the Trainer executor. `run` creates the strategy before any other TensorFlow
op, gives parameter servers and evaluators nothing to train, and hands a
trainer's `Task` (role, strategy, scope, export, backup release) to the body.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.compat import legacy_keras
from components.config import PipelineConfig, StrategyConfig, payload
from components.training import backup, strategies
from components.training import fit as training
from components.training.export import export_from_task

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Task:
    """A training task: its component, strategy and role, and what its executor passed.

    Attributes:
      component: Name used in log lines and errors (`Trainer`, `Distiller`).
      choice: This task's strategy and place in the cluster (always a trainer:
        parameter servers and evaluators get no `Task`, see `run`).
      payload: The executor's decoded payload; None for a user's `run_fn`
        (its settings travel apart) and for a `Task` built around a config.
    """

    component: str
    choice: strategies.StrategyChoice
    payload: payload.Payload | None = None

    @property
    def config(self) -> PipelineConfig:
        if self.payload is None or self.payload.config is None:
            raise ValueError(
                f"{self.component}: this task carries no tfxkit config; use the tfxkit {self.component} component"
            )
        return self.payload.config

    @property
    def is_chief(self) -> bool:
        return self.choice.is_chief

    def scope(self):
        """The strategy scope the product's models are built and trained in."""
        return self.choice.strategy.scope()

    def user_scope(self, strategy: StrategyConfig):
        """The scope a user run_fn runs in, or None to run it as stock TFX does.

        `auto` resolving to a single replica (one device, no cluster) is what
        stock TFX gives a run_fn, so no scope is entered: a run_fn that creates
        and enters its own strategy (TFX's penguin example does) keeps working.
        Any configured kind, or `auto` finding several devices or a cluster,
        runs the run_fn inside that strategy's scope.
        """
        choice = self.choice
        if strategy.kind == "auto" and choice.num_replicas == 1 and choice.tf_config is None:
            return None
        return self.scope()

    def fit(self, inputs: training.TrainingInputs, build_and_compile, **kwargs):
        """`training.fit` of this task's config under this task's strategy."""
        return training.fit(
            self.config,
            inputs,
            build_and_compile,
            choice=self.choice,
            component=self.component,
            **kwargs,
        )

    def export(
        self,
        model: keras.Model,
        inputs: training.TrainingInputs,
        save=None,
        *,
        release: bool = True,
    ) -> str:
        """Exports the serving model (chief only), then removes the training backup.

        Only the chief writes the serving model; every other worker saves a
        throwaway copy (saving is a collective all workers join) into scratch
        space, which is deleted (`components.training.export`).

        Args:
          save: Writes the serving model into a directory (see
            `components.training.export.export_from_task`); default: tfxkit's signatures.
          release: Remove the training backup afterwards (False: the caller
            releases it later, e.g. after a model built from this one).

        Returns:
          Where this task wrote (the serving dir on the chief, a task scratch
          directory, since removed, elsewhere).
        """
        choice = self.choice
        written = export_from_task(
            model,
            tft.TFTransformOutput(inputs.transform_output),
            inputs.label(self.config),
            inputs.serving_model_dir,
            is_chief=choice.is_chief,
            task_type=choice.task_type,
            task_id=choice.task_id,
            scratch_dir=inputs.model_run_dir,
            save=save,
        )
        if release:
            self.release(inputs.backup_dir)
        return written

    def release(self, backup_dir: str) -> None:
        """Removes the task's backup after the export: by the chief only, so a
        task killed during the export still resumes from it (`backup.remove`)."""
        backup.remove(backup_dir, is_chief=self.choice.is_chief)


def start(
    strategy: StrategyConfig, component: str, decoded: payload.Payload | None = None
) -> Task | None:
    """Creates the strategy and resolves this process's role.

    AutoGraph is told to call tf_keras's own code as it is
    (`legacy_keras.keep_libraries_unconverted`) and the strategy is created
    before any other TensorFlow op runs in this process (logical devices and
    collective ops must be set up first).

    Returns:
      The task of a process that trains; None for an evaluator task, and for
      a parameter-server task after its server has stopped.
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
    return Task(component, choice, decoded)


def run(
    strategy: StrategyConfig,
    component: str,
    body: Callable[[Task], T],
    decoded: payload.Payload | None = None,
) -> T | None:
    """The one way into training: `start`, then `body(task)` on a task that trains.

    Returns:
      What `body` returned; None on a parameter server or an evaluator.
    """
    task = start(strategy, component, decoded)
    return None if task is None else body(task)


def run_fn_task(fn_args, component: str, body: Callable[[Task], T], *, needs_data: bool = True):
    """`run` for a tfxkit `run_fn`: the executor's payload, checked, then `run`.

    The payload is the one the executor decoded (`components.config.payload.of`);
    a `run_fn` called directly decodes `fn_args.custom_config` once here.

    Args:
      fn_args: TFX's `FnArgs`.
      component: Name used in log lines and errors (`Trainer`, `Distiller`).
      body: The run_fn's work, given the task.
      needs_data: Whether the run_fn reads the config's data section (the
        Distiller of a `student_fn` does not).

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
    return run(decoded.config.strategy, component, body, decoded)


def start_for(config: PipelineConfig, component: str) -> Task | None:
    """`start` for a config built in code (tests, benchmarks): its strategy, its config."""
    return start(config.strategy, component, payload.Payload(config=config))
