"""The Trainer's default `run_fn`: train and export the teacher.

Thin: `components.training.task.run_fn_task` (role, strategy, export, backup) around the
teacher's model and `Task.fit`; it runs unchanged as every replica of a multi-worker job.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow_transform as tft
import tf_keras as keras
from absl import logging

from components.training import fit as training
from components.training import task as task_lib


def run_fn(fn_args) -> None:
    """Trains and exports the teacher (TFX `run_fn` contract)."""
    task_lib.run_fn_task(
        fn_args,
        "Trainer",
        lambda task: run(task, training.TrainingInputs.from_fn_args(fn_args, task.config)),
    )


def run(
    task: task_lib.Task,
    inputs: training.TrainingInputs,
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> tuple[keras.Model, dict[str, float]]:
    """Trains the teacher as `task`, exports it from the chief, drops the backup.

    Returns:
      The trained model and its evaluation results.
    """
    config = task.config
    tft_output = tft.TFTransformOutput(inputs.transform_output)

    def build_and_compile():
        model = training.build_model(config, tft_output, config.teacher, "teacher")
        training.compile_classifier(model, config, inputs.train_steps)
        return model

    model, results = task.fit(inputs, build_and_compile, callbacks=callbacks)
    written = task.export(model, inputs)
    logging.info("Trainer: %s wrote %s", "chief" if task.is_chief else "non-chief task", written)
    return model, results
