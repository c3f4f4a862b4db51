"""Loading and dumping configs: YAML files, plain data, JSON.

pydantic's `TypeAdapter` does the typed work; this module only chooses the
input mode and maps its errors to `ConfigError`s that name the field path.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pydantic
import yaml

from components.config.sections import PipelineConfig
from components.config.validation import ConfigError, config_error


@functools.cache
def _adapter(cls: type = PipelineConfig) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def from_dict(data: Any) -> PipelineConfig:
    """Builds and validates a `PipelineConfig` from plain (YAML / JSON) data.

    Raises:
      ConfigError: naming the field path of the first invalid value.
    """
    # Plain data is validated as JSON: strict scalars (no '1' for 1, no 1.5 for
    # an integer) yet lists for tuples and mappings for sections, as a user writes them.
    try:
        text = json.dumps(data)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"config: expected plain data (mappings, lists, strings, numbers, booleans): {e}"
        ) from e
    try:
        return _adapter().validate_json(text)
    except pydantic.ValidationError as e:
        raise config_error(e, PipelineConfig) from None


def to_dict(config: Any) -> dict[str, Any]:
    """Converts a config (or one section) to plain JSON/YAML-serialisable data (`from_dict` reads it back)."""
    return _adapter(type(config)).dump_python(config, mode="json")


def load_config_file(path: str | Path) -> PipelineConfig:
    """Loads and validates a config from a YAML file.

    Raises:
      ConfigError: the file is missing or not YAML, or a value is invalid.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config: file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config: {path} is not valid YAML: {e}") from e
    return from_dict(data or {})


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a config file, with the `Attributes:` docs as field descriptions."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **_adapter().json_schema()}
