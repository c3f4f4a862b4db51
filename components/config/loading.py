"""Loading and dumping configs: YAML files, plain data, JSON.

pydantic's `TypeAdapter` does the typed work (`components.config.validation`,
which maps its errors to `ConfigError`s that name the field path); this
module only chooses the input mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from components.config.pipeline import PipelineConfig
from components.config.validation import ConfigError, adapter, from_plain, to_plain


def from_dict(data: Any) -> PipelineConfig:
    """Builds and validates a full `PipelineConfig` from plain (YAML / JSON) data.

    A config file describes its data: a missing (or null) `data` section is
    refused, naming it. Only a config for a user's own module goes without
    one (`components.config.stock_args.resolve_settings`).

    Raises:
      ConfigError: naming the field path of the first invalid value.
    """
    if isinstance(data, Mapping) and data.get("data") is None:
        # Validated as an empty section, so the error says what to set.
        data = {**data, "data": {}}
    return from_plain(PipelineConfig, data)


def module_config_from_dict(data: Any, prefix: str = "") -> PipelineConfig:
    """Builds and validates a `PipelineConfig` for a user's own module from plain data.

    As `from_dict`, but the data section may be left out: the user's module
    file decides the features (see `components.config.stock_args`).

    Args:
      data: Plain data in the form of a config file.
      prefix: Starts every error path (`config` for a component argument).

    Raises:
      ConfigError: naming the field path of the first invalid value.
    """
    return from_plain(PipelineConfig, data, prefix)


def to_dict(config: Any) -> dict[str, Any]:
    """Converts a config (or one section) to plain JSON/YAML-serialisable data (`from_dict` reads it back)."""
    return to_plain(config)


def load_config_file(path: str | Path) -> PipelineConfig:
    """Loads and validates a config from a YAML file.

    Raises:
      ConfigError: the file is missing or not YAML, or a value is invalid.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config: file {str(path)!r} does not exist")
    return from_dict(read_yaml(path.read_text(), str(path)) or {})


def read_yaml(text: str, source: str = "<config>") -> Any:
    """Parses YAML config text into plain data, refusing a key given twice in one mapping.

    YAML parsers keep the last of two equal keys without a word: a second
    `train:` block would silently replace the first one's schedule. Build a
    `config=` mapping for a component from YAML with this function, not
    `yaml.safe_load`, to get the same check.

    Args:
      text: The YAML text.
      source: Names the text in errors (the file's path).

    Raises:
      ConfigError: the text is not YAML, or a mapping repeats a key (naming
        the key's dotted path and both line numbers).
    """
    try:
        _refuse_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), source)
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config: {source} is not valid YAML: {e}") from e


def _refuse_duplicate_keys(root: yaml.Node | None, source: str) -> None:
    """Walks the composed YAML nodes (which, unlike the loaded data, still hold every key)."""
    todo: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())] if root is not None else []
    seen_nodes: set[int] = set()  # an anchor's node is reached again through each alias
    while todo:
        node, path = todo.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend((item, (*path, f"[{i}]")) for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                line = key.start_mark.line + 1
                if key.value in lines:
                    where = ".".join((*path, key.value)).replace(".[", "[")
                    raise ConfigError(
                        f"{where}: given twice in {source}, at lines {lines[key.value]} and "
                        f"{line}; YAML would keep only the second, silently. Merge the two into "
                        "one and delete the other"
                    )
                lines[key.value] = line
                todo.append((value, (*path, key.value)))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a config file, with the `Attributes:` docs as field descriptions."""
    schema = adapter(PipelineConfig).json_schema()
    # A config file describes its data (`from_dict`); only a config for a
    # user's own module, which is no file, goes without (`module_config_from_dict`).
    data = schema["properties"]["data"]
    schema["properties"]["data"] = {
        "$ref": "#/$defs/DataConfig",
        "description": data["description"],
    }
    schema["required"] = ["data"]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
