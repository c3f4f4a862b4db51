"""The Trainer's default `run_fn`: train and export the teacher.

Thin: the task lifecycle (`components.training.task`: role, export, backup)
around `components.training.fit`. The same `run_fn` runs unchanged as
every replica of a multi-worker job: the strategy comes from the config and
`TF_CONFIG` (as the TFJob operator or Vertex AI set it). Workers and
parameter servers of a parameter-server cluster serve until they are
stopped; the evaluator task has nothing to do (TFX's Evaluator evaluates the
exported model); every training task trains, and only the chief writes the
serving model.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.config import PipelineConfig
from components.training import fit as training
from components.training import strategies
from components.training import task as task_lib


def run_fn(fn_args) -> None:
    """Trains and exports the teacher (TFX `run_fn` contract)."""
    task = task_lib.from_fn_args(fn_args, "Trainer")
    if task is None:
        return
    run(task.config, training.TrainingInputs.from_fn_args(fn_args, task.config), task.choice)


def run(
    config: PipelineConfig,
    inputs: training.TrainingInputs,
    choice: strategies.StrategyChoice,
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> tuple[keras.Model, dict[str, float]]:
    """Trains the teacher under `choice`, exports it from the chief, drops the backup.

    Returns:
      The trained model and its evaluation results.
    """
    tft_output = tft.TFTransformOutput(inputs.transform_output)

    def build_and_compile():
        model = training.build_model(config, tft_output, config.teacher, "teacher")
        training.compile_classifier(model, config, inputs.train_steps)
        return model

    model, results = training.fit(
        config, inputs, build_and_compile, choice=choice, callbacks=callbacks
    )
    written = task_lib.export(model, config, inputs, choice)
    logging.info("Trainer: %s wrote %s", "chief" if choice.is_chief else "non-chief task", written)
    return model, results
