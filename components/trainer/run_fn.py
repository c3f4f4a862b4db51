"""The Trainer's default `run_fn`: train and export the teacher.

Thin: unpack TFX's `FnArgs`, then `components.trainer.training` does the work.
"""

from __future__ import annotations

import tensorflow_transform as tft

from components.config import from_custom_config
from components.export import export_serving_model
from components.trainer import training


def run_fn(fn_args) -> None:
    """Trains and exports the teacher (TFX `run_fn` contract)."""
    config = from_custom_config(fn_args.custom_config)
    if config is None:
        raise ValueError("Trainer: custom_config carries no tfxkit config; use the tfxkit Trainer component")
    inputs = training.TrainingInputs.from_fn_args(fn_args, config)
    tft_output = tft.TFTransformOutput(inputs.transform_output)

    def build_and_compile():
        model = training.build_model(config, tft_output, config.teacher, "teacher")
        training.compile_classifier(model, config)
        return model

    model, _ = training.fit(config, inputs, build_and_compile)
    export_serving_model(model, tft_output, config.data.label.name, inputs.serving_model_dir)
