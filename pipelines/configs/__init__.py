"""The configs that ship with tfxkit, by name, and the JSON Schema of a config file.

`tfxkit run --config taxi` names `taxi.yaml` here; any other YAML path is
loaded as is. `tfxkit.schema.json` is what `tfxkit schema` prints: the shipped
YAML files point an editor at it (first line) to complete and check fields.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.config import ConfigError, PipelineConfig, json_schema, load_config_file

SHIPPED_CONFIG_DIR = Path(__file__).resolve().parent
SCHEMA_FILE = SHIPPED_CONFIG_DIR / "tfxkit.schema.json"


def resolve_config_path(name_or_path: str) -> Path:
    """Maps a shipped config name (`taxi`) or a YAML path to a file path.

    Raises:
      ConfigError: the file does not exist, or the name is not a shipped config.
    """
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            raise ConfigError(f"config: file {name_or_path!r} does not exist")
        return candidate
    shipped = SHIPPED_CONFIG_DIR / f"{name_or_path}.yaml"
    if not shipped.is_file():
        names = sorted(p.stem for p in SHIPPED_CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(
            f"config: {name_or_path!r} is neither a YAML file nor a shipped config ({', '.join(names)})"
        )
    return shipped


def load_config(name_or_path: str) -> PipelineConfig:
    """Loads and validates a config from a shipped name or a YAML file.

    Raises:
      ConfigError: naming the field path of the first invalid value.
    """
    return load_config_file(resolve_config_path(name_or_path))


def schema_text() -> str:
    """The JSON Schema of a config file, as `tfxkit schema` prints it and `SCHEMA_FILE` holds it."""
    return json.dumps(json_schema(), indent=2) + "\n"
