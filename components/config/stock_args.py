"""What the drop-in components accept beyond TFX's own constructors.

`resolve_settings` turns their `config` argument (nothing, `DropInSettings`, a mapping of
them, or a full `PipelineConfig`) into settings; `check_module_file`,
`check_function_path` and `check_steps` check the stock arguments at construction,
naming the argument.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from components.config import ConfigError, PipelineConfig, module_config_from_dict
from components.config.dropin import DropInSettings, from_mapping, settings_of


def resolve_settings(config: Any) -> tuple[PipelineConfig | None, DropInSettings]:
    """What a component's `config` argument means when the user brings a module.

    Args:
      config: None (defaults), `DropInSettings`, a mapping of its fields, or a
        full config: a `PipelineConfig` or a mapping of config-file sections
        (one naming a section settings lack, such as `train`). Neither needs
        a data section.

    Returns:
      `(the PipelineConfig or None, the drop-in settings)`.

    Raises:
      ConfigError: naming `config` for anything else or an invalid value.
    """
    if config is None:
        return None, DropInSettings()
    if isinstance(config, PipelineConfig):
        return config, settings_of(config)
    if isinstance(config, DropInSettings):
        return None, config
    if isinstance(config, Mapping):
        settings_keys = {f.name for f in dataclasses.fields(DropInSettings)}
        if ({f.name for f in dataclasses.fields(PipelineConfig)} - settings_keys) & set(config):
            full = module_config_from_dict(config, "config")
            return full, settings_of(full)
        return None, from_mapping(config)
    raise ConfigError(
        f"config: expected a PipelineConfig, DropInSettings, a mapping of DropInSettings fields or "
        f"None, got {type(config).__name__}"
    )


# --------------------------------------------------------------------------- #
# Construction-time checks of the stock arguments
# --------------------------------------------------------------------------- #


def _is_parameter(value: Any) -> bool:
    # A RuntimeParameter is only known when the pipeline runs.
    return value is not None and not isinstance(value, str)


def _top_level_names(source: str, path: str, arg: str) -> set[str]:
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        raise ConfigError(f"{arg}: {path!r} is not valid Python: {e}") from e
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def check_module_file(module_file: Any, functions: dict[str, str]) -> None:
    """Checks a local module file exists and defines `functions` (name -> argument).

    Remote paths (`gs://...`) and runtime parameters are only known where the
    pipeline runs; they are left to the executor.

    Raises:
      ConfigError: naming `module_file` (missing, unreadable, not Python) or
        the argument that asked for a function the file lacks.
    """
    if module_file is None or _is_parameter(module_file) or "://" in module_file:
        return
    if not os.path.isfile(module_file):
        raise ConfigError(f"module_file: {module_file!r} does not exist or is not a file")
    with open(module_file, encoding="utf-8") as f:
        names = _top_level_names(f.read(), module_file, "module_file")
    for name, arg in functions.items():
        if name not in names:
            raise ConfigError(f"{arg}: module_file {module_file!r} defines no top-level {name!r}")


def check_function_path(path: Any, arg: str) -> None:
    """Checks a `package.module.function` path names a function that exists.

    The module's source is read, not imported (importing could run training
    code); a module without readable source is left to the executor.

    Raises:
      ConfigError: naming `arg` when the path is malformed, the module cannot
        be found, or it defines no such function.
    """
    if path is None or _is_parameter(path):
        return
    module, _, name = path.rpartition(".")
    if not module or not name:
        raise ConfigError(f"{arg}: expected 'package.module.function', got {path!r}")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:
        raise ConfigError(f"{arg}: cannot find module {module!r} of {path!r}: {e}") from e
    if spec is None:
        raise ConfigError(f"{arg}: cannot find module {module!r} of {path!r}")
    origin = spec.origin
    if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
        return
    with open(origin, encoding="utf-8") as f:
        names = _top_level_names(f.read(), origin, arg)
    if name not in names:
        raise ConfigError(f"{arg}: module {module!r} ({origin}) defines no top-level {name!r}")


def check_steps(train_args: Any, eval_args: Any, config: PipelineConfig | None) -> None:
    """Checks `train_args` / `eval_args` and that a full config agrees with them.

    Raises:
      ConfigError: naming `train_args.num_steps` (zero steps given) or the
        config field that contradicts the args.
    """
    for arg, args in (("train_args", train_args), ("eval_args", eval_args)):
        if args is None or _is_parameter(args) and not hasattr(args, "num_steps"):
            continue
        if args.num_steps < 0 or (arg == "train_args" and args.num_steps == 0):
            raise ConfigError(
                f"{arg}.num_steps: expected an integer >= 1 (steps to {arg[:-5]}), got {args.num_steps}"
            )
    if config is None:
        return
    if train_args is not None and train_args.num_steps != config.train.train_steps:
        raise ConfigError(
            f"train_args.num_steps: {train_args.num_steps} contradicts config train.train_steps "
            f"{config.train.train_steps}; give one of them, or the same value"
        )
    if (
        eval_args is not None
        and eval_args.num_steps
        and eval_args.num_steps != config.train.eval_steps
    ):
        raise ConfigError(
            f"eval_args.num_steps: {eval_args.num_steps} contradicts config train.eval_steps "
            f"{config.train.eval_steps}; give one of them, or the same value"
        )
