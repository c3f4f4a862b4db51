"""What crosses from a component into its executor: the one codec of `custom_config`.

Components `encode`; executors `decode` into a frozen `Payload` on their first line. Keys:

- `CONFIG_KEY`: the `PipelineConfig` as JSON;
- `DROPIN_KEY`: the `DropInSettings` as JSON (a user module's Trainer / Transform);
- `TEACHER_DIRS_KEY`, `STUDENT_MODULE_KEY`: the Distiller's inputs (`with_distiller_inputs`);
- `RULES_KEY`: ExampleGen's rules, in its proto `CustomConfig` (`encode_example_rules`).
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, struct_pb2
from tfx.proto import example_gen_pb2
from tfx.types import standard_component_specs
from tfx.utils import proto_utils

from components.config import ConfigError, PipelineConfig
from components.config.dropin import DropInSettings
from components.config.runtime import local_workers_outside_run

CONFIG_KEY = "tfxkit_config"
DROPIN_KEY = "tfxkit_dropin"
TEACHER_DIRS_KEY = "tfxkit_teacher_model_dirs"
STUDENT_MODULE_KEY = "tfxkit_student_module"
RESERVED_KEYS = frozenset({CONFIG_KEY, DROPIN_KEY, TEACHER_DIRS_KEY, STUDENT_MODULE_KEY})
# The execution properties that locate a user module (TFX's names).
MODULE_KEYS = ("module_file", "module_path")
RULES_KEY = "tfxkit_example_rules"

# The field of the tfxkit Trainer's `FnArgs` (`components.trainer.fn_args`)
# that carries the executor's decoded payload to the `run_fn`, so the run_fn
# does not parse it again.
_FN_ARGS_FIELD = "tfxkit_payload"


@dataclasses.dataclass(frozen=True)
class Payload:
    """What a component passed to its executor, decoded and validated.

    Attributes:
      config: The full pipeline config, or None (a user module without one,
        or a stock `custom_config`).
      settings: The drop-in settings of a user module, or None (the product's
        own `run_fn` / `preprocessing_fn`).
      teacher_dirs: The Distiller's teacher serving model directories, in
        the order of its teacher inputs (empty elsewhere).
      student_module: The Distiller's module file holding `student_fn`
        (`module_file` and / or TFX's packaged `module_path`); empty for
        the configured student.
      user: The user's own `custom_config` entries (read-only), every key
        but the reserved ones.
    """

    config: PipelineConfig | None = None
    settings: DropInSettings | None = None
    teacher_dirs: tuple[str, ...] = ()
    student_module: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    user: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))


def check_user(custom_config: Any) -> dict[str, Any]:
    """The user's `custom_config` as a new dict, checked.

    Raises:
      ConfigError: naming `custom_config` when it is not a dict or uses a
        key reserved for tfxkit.
    """
    if custom_config is not None and not isinstance(custom_config, dict):
        raise ConfigError(f"custom_config: expected a dict, got {type(custom_config).__name__}")
    user = dict(custom_config or {})
    clash = sorted(RESERVED_KEYS & set(user))
    if clash:
        raise ConfigError(f"custom_config: keys {clash} are reserved for tfxkit; rename them")
    return user


def encode(
    custom_config: Any = None,
    *,
    config: PipelineConfig | None = None,
    settings: DropInSettings | None = None,
) -> dict[str, Any]:
    """The `custom_config` a component hands to its executor.

    Args:
      custom_config: The user's own entries (kept as they are), or None.
      config: The pipeline config to carry (or the view of it the component
        reads, e.g. `transform_view()`), or None.
      settings: The drop-in settings of a user module, or None.

    Returns:
      A new dict: the user's entries plus the given settings.

    Raises:
      ConfigError: naming `custom_config` when it is not a dict or already
        uses a tfxkit key; naming `ingestion.service.local_workers` when it
        is set (a local run hands its components the started dispatcher
        instead, so here nobody started one).
    """
    for carried in (config, settings):
        if carried is not None and carried.ingestion.service.local_workers:
            raise ConfigError(local_workers_outside_run(carried.ingestion.service.local_workers))
    encoded = check_user(custom_config)
    if settings is not None:
        encoded[DROPIN_KEY] = settings.to_json()
    if config is not None:
        encoded[CONFIG_KEY] = config.to_json()
    return encoded


def _as_dict(custom_config: Any) -> dict[str, Any]:
    if custom_config is None:
        return {}
    if isinstance(custom_config, str):
        if not custom_config:
            return {}
        try:
            custom_config = json.loads(custom_config)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"custom_config: expected a JSON object (as a tfxkit component writes it), got "
                f"text that is not JSON: {e}"
            ) from None
        if custom_config is None:  # TFX serializes an absent custom_config as 'null'
            return {}
    if not isinstance(custom_config, Mapping):
        raise ConfigError(
            f"custom_config: expected a JSON object (a mapping), got {type(custom_config).__name__}"
        )
    return dict(custom_config)


def _decode_json_entry(custom_config: dict[str, Any], key: str, cls: type, what: str):
    text = custom_config[key]
    if not isinstance(text, str):
        raise ConfigError(
            f"custom_config[{key!r}]: expected the JSON text of {what}, got {type(text).__name__}"
        )
    try:
        return cls.from_json(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"custom_config[{key!r}]: expected the JSON text of {what}, got text that is not JSON: {e}"
        ) from None
    except ConfigError as e:
        # The field path stays in the message; the key says where it came from.
        raise ConfigError(f"custom_config[{key!r}]: not a valid {cls.__name__}: {e}") from None


def decode(custom_config: Any) -> Payload:
    """Decodes and validates what a component carries in `custom_config`.

    Args:
      custom_config: The JSON text TFX passes to executors, the decoded dict
        (TFX's `FnArgs.custom_config`, Transform's `custom_config` argument),
        or None.

    Returns:
      The `Payload`; every field empty for a stock `custom_config`.

    Raises:
      ConfigError: naming the key and what was expected, when the text is
        not a JSON object or an entry does not parse or validate.
    """
    raw = _as_dict(custom_config)
    config = settings = None
    if CONFIG_KEY in raw:
        config = _decode_json_entry(raw, CONFIG_KEY, PipelineConfig, "a PipelineConfig")
    if DROPIN_KEY in raw:
        settings = _decode_json_entry(raw, DROPIN_KEY, DropInSettings, "DropInSettings")
    teacher_dirs = raw.get(TEACHER_DIRS_KEY, [])
    if not isinstance(teacher_dirs, list) or not all(isinstance(d, str) for d in teacher_dirs):
        raise ConfigError(
            f"custom_config[{TEACHER_DIRS_KEY!r}]: expected a list of model directories, got "
            f"{teacher_dirs!r}"
        )
    student_module = raw.get(STUDENT_MODULE_KEY, {})
    if not isinstance(student_module, dict) or not all(
        k in MODULE_KEYS and isinstance(v, str) for k, v in student_module.items()
    ):
        raise ConfigError(
            f"custom_config[{STUDENT_MODULE_KEY!r}]: expected a mapping of {list(MODULE_KEYS)} to paths, got "
            f"{student_module!r}"
        )
    user = {k: v for k, v in raw.items() if k not in RESERVED_KEYS}
    return Payload(
        config=config,
        settings=settings,
        teacher_dirs=tuple(teacher_dirs),
        student_module=types.MappingProxyType(dict(student_module)),
        user=types.MappingProxyType(user),
    )


def decode_exec_properties(exec_properties: Mapping[str, Any]) -> Payload:
    """`decode` of an executor's `custom_config` execution property."""
    return decode(exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY))


def with_distiller_inputs(
    exec_properties: Mapping[str, Any],
    teacher_dirs: list[str],
    student_module: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The execution properties with the Distiller's inputs moved into `custom_config`.

    The teachers' directories, and the module file of a `student_fn` (taken
    out of `module_file` / `module_path`, so the Trainer executor resolves
    `run_fn` as the dotted path it is, not from the user's module). They
    travel in the execution properties, not beside them, because the
    replicas of a multi-worker job re-run the executor on the recorded ones.
    """
    key = standard_component_specs.CUSTOM_CONFIG_KEY
    custom_config = {**_as_dict(exec_properties.get(key)), TEACHER_DIRS_KEY: list(teacher_dirs)}
    if student_module:
        custom_config[STUDENT_MODULE_KEY] = dict(student_module)
    out = {k: v for k, v in exec_properties.items() if not (student_module and k in MODULE_KEYS)}
    return {**out, key: json.dumps(custom_config)}


def of(fn_args) -> Payload:
    """The payload of a run_fn's `FnArgs`: the executor's, else decoded from `custom_config`."""
    # A plain TFX FnArgs (a run_fn called directly) has no such field.
    attached = getattr(fn_args, _FN_ARGS_FIELD, None)
    return attached if attached is not None else decode(fn_args.custom_config)


def encode_example_rules(rules: Mapping[str, Any]) -> example_gen_pb2.CustomConfig:
    """ExampleGen's `custom_config` (a proto holding an `Any`): `rules` as a Struct under `RULES_KEY`."""
    struct = struct_pb2.Struct()
    struct.update({RULES_KEY: dict(rules)})
    out = example_gen_pb2.CustomConfig()
    out.custom_config.Pack(struct)
    return out


def decode_example_rules(exec_properties: Mapping[str, Any]) -> dict[str, Any]:
    """The rules `encode_example_rules` wrote, from ExampleGen's execution properties ({} if none).

    Raises:
      ConfigError: naming `custom_config` when it is not a `CustomConfig` proto's JSON.
    """
    raw = exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY)
    if not raw:
        return {}
    try:
        config = proto_utils.json_to_proto(raw, example_gen_pb2.CustomConfig())
    except json_format.ParseError as e:
        raise ConfigError(
            f"custom_config: expected the JSON of an ExampleGen CustomConfig proto: {e}"
        ) from None
    struct = struct_pb2.Struct()
    if not config.custom_config.Unpack(struct):
        return {}
    return json_format.MessageToDict(struct).get(RULES_KEY, {})
