"""How config sections are declared, validated, converted from and to plain data, and report errors.

`section` declares a pydantic-dataclass section and `from_plain` / `to_plain` convert it;
every failure is a `ConfigError` whose message starts with the field's dotted path
(`train.learning_rate: expected a number > 0, got -0.1`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import re
import types
import typing
from typing import Any, Literal

import pydantic
from pydantic import ConfigDict


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field path."""


class _RuleViolation(ValueError):
    """A cross-field rule failed at `path`, relative to the section that checks it."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def fail(path: str, message: str) -> typing.NoReturn:
    """Rejects the value at `path` (relative to the section whose validator runs)."""
    raise _RuleViolation(path, message)


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _describe_fields(schema: dict[str, Any], cls: type) -> None:
    """Puts a section's summary and its `Attributes:` entries into its JSON Schema."""
    summary, attributes = _parse_docstring(cls.__doc__ or "")
    schema["description"] = summary
    for name, prop in schema.get("properties", {}).items():
        if name in attributes:
            prop["description"] = attributes[name]


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Splits a Google-style class docstring into its first paragraph and `Attributes:` entries.

    An entry may name several attributes (`cpu_request / cpu_limit: ...`,
    `data, transform, ...: ...`), possibly over several lines.
    """
    lines = inspect.cleandoc(doc).splitlines()
    summary = " ".join(line.strip() for line in lines[: (lines + [""]).index("")])
    if "Attributes:" not in lines:
        return summary, {}
    entries: list[str] = []
    body = lines[lines.index("Attributes:") + 1 :]
    indent = min((len(line) - len(line.lstrip()) for line in body if line.strip()), default=0)
    for line in body:
        if not line.strip():
            continue
        starts_entry = len(line) - len(line.lstrip()) == indent and (
            not entries or ":" in entries[-1]
        )
        if starts_entry:
            entries.append(line.strip())
        else:
            entries[-1] += " " + line.strip()
    attributes: dict[str, str] = {}
    for entry in entries:
        names, _, text = entry.partition(": ")
        for name in re.split(r"[,/]", names):
            attributes[name.strip()] = text
    return summary, attributes


# Extra keys are errors (a typo must not be ignored); scalars are strict (see the module docstring).
# NaN and infinity are never meaningful settings (a NaN weight passes every `<` check).
SECTION_CONFIG = ConfigDict(
    extra="forbid", strict=True, allow_inf_nan=False, json_schema_extra=_describe_fields
)


def section(path: str = ""):
    """Declares a config section: a frozen, validated pydantic dataclass.

    Args:
      path: Where the section sits in a `PipelineConfig` (`train`), used to
        name fields when the section is constructed on its own; '' where it
        is not unique (a feature, a model shape, a placement).
    """

    def wrap(cls: type) -> type:
        cls = pydantic.dataclasses.dataclass(frozen=True, config=SECTION_CONFIG)(cls)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            try:
                init(self, *args, **kwargs)
            except pydantic.ValidationError as e:
                raise config_error(e, cls, path) from None

        cls.__init__ = __init__
        return cls

    return wrap


# --------------------------------------------------------------------------- #
# Plain data <-> sections
# --------------------------------------------------------------------------- #


@functools.cache
def adapter(cls: type) -> pydantic.TypeAdapter:
    """pydantic's validator and serialiser of a section class (one per class)."""
    return pydantic.TypeAdapter(cls)


def from_plain(cls: type, data: Any, prefix: str = "") -> Any:
    """Builds and validates a `cls` section from plain (YAML / JSON) data.

    `prefix` starts every error path (e.g. `config`, a component argument).

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
        return adapter(cls).validate_json(text)
    except pydantic.ValidationError as e:
        raise config_error(e, cls, prefix) from None


def to_plain(config: Any) -> dict[str, Any]:
    """A section as plain JSON/YAML-serialisable data (`from_plain` reads it back)."""
    return adapter(type(config)).dump_python(config, mode="json")


# --------------------------------------------------------------------------- #
# pydantic errors -> ConfigError
# --------------------------------------------------------------------------- #


def config_error(error: pydantic.ValidationError, root: type, prefix: str = "") -> ConfigError:
    """The `ConfigError` of the first error in `error`, raised validating `root`.

    Unknown keys are reported first (a misspelt key also leaves its intended
    field at its default). The path is `prefix` followed by pydantic's `loc`.
    """
    errors = error.errors(include_url=False)
    errors.sort(key=lambda e: e["type"] not in ("unexpected_keyword_argument", "extra_forbidden"))
    e = errors[0]
    loc = tuple(e["loc"])
    path = prefix
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else join(path, str(part))
    kind, value = e["type"], e.get("input")
    if kind == "value_error" and isinstance(e["ctx"]["error"], _RuleViolation):
        violation = e["ctx"]["error"]
        return ConfigError(
            f"{join(path, violation.path) if violation.path else path or 'config'}: {violation.message}"
        )
    if kind == "value_error" and isinstance(e["ctx"]["error"], ConfigError):
        return e["ctx"]["error"]
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        allowed = sorted(
            f.name for f in dataclasses.fields(_non_null(_annotation_at(root, loc[:-1])))
        )
        return ConfigError(f"{path}: unknown key {loc[-1]!r}; allowed keys: {', '.join(allowed)}")
    if kind in ("missing", "missing_argument"):
        return ConfigError(f"{path}: required key is missing")
    if kind == "finite_number":
        return ConfigError(
            f"{path or 'config'}: expected a finite number (inf and NaN are never settings), got {value!r}"
        )
    annotation = _annotation_at(root, loc)
    if kind == "tuple_type" and annotation is not None and isinstance(value, list):
        # A list refused: only Python callers meet this (YAML and JSON lists are accepted);
        # frozen configs hold tuples.
        return ConfigError(
            f"{path or 'config'}: expected a tuple (a list in YAML) of {_expected_form(typing.get_args(annotation)[0])}, got {value!r}"
        )
    expected = (
        _expected_form(annotation)
        if annotation is not None
        else e["msg"].removeprefix("Input should be ")
    )
    return ConfigError(f"{path or 'config'}: expected {expected}, got {value!r}")


def _annotation_at(root: Any, loc: tuple) -> Any:
    """The declared type at `loc` below the dataclass `root` (None where it cannot be told)."""
    tp = root
    for part in loc:
        tp = _non_null(tp)
        if dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp).get(part)
        elif typing.get_origin(tp) is tuple:
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return tp


def _expected_form(tp: Any) -> str:
    """How an error message names the values of type `tp` (`a list of an integer`)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return f"one of {list(args)}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected_form(a) for a in args)
    if origin is tuple:
        return f"a list of {_expected_form(args[0])}"
    if origin is dict:
        return f"a mapping of {_expected_form(args[1])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        bool: "true or false",
        type(None): "null",
    }
    return names.get(tp, str(tp))


def _non_null(tp: Any) -> Any:
    """`X` for `X | None`, else `tp`."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp
