"""Trainer executor: validates the config first, then runs TFX's GenericExecutor."""

from __future__ import annotations

from tfx.components.trainer import executor as tfx_trainer_executor
from tfx.types import standard_component_specs

from components.config import from_custom_config


class Executor(tfx_trainer_executor.GenericExecutor):
    """Fails fast on an invalid config, before any input is read."""

    def Do(self, input_dict, output_dict, exec_properties):
        from_custom_config(exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY))
        super().Do(input_dict, output_dict, exec_properties)
