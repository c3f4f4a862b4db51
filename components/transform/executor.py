"""Transform executor: validates the config first, then runs TFX's Transform."""

from __future__ import annotations

import contextlib

import tensorflow_transform.beam as tft_beam
from tfx.components.transform import executor as tfx_transform_executor
from tfx.types import standard_component_specs

from components.config import from_custom_config


@contextlib.contextmanager
def _without_deep_copy():
    """Turns off TFT's deep-copy optimisation for the duration of a run.

    TFX's executor always enables it, and TFT 1.16's `deep_copy` builds Beam
    `AppliedPTransform`s with a constructor signature Beam 2.72 no longer has,
    so any multi-phase `preprocessing_fn` (an analyzer over another analyzer's
    output, e.g. z-scoring after mean imputation) fails. The optimisation only
    avoids re-reading the input for later phases; without it results are equal.
    """
    original = tft_beam.Context.__dict__["get_use_deep_copy_optimization"]
    tft_beam.Context.get_use_deep_copy_optimization = classmethod(lambda cls: False)
    try:
        yield
    finally:
        tft_beam.Context.get_use_deep_copy_optimization = original


class Executor(tfx_transform_executor.Executor):
    """Fails fast on an invalid config, before Beam starts."""

    def Do(self, input_dict, output_dict, exec_properties):
        from_custom_config(exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY))
        with _without_deep_copy():
            super().Do(input_dict, output_dict, exec_properties)
