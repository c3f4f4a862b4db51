"""Bring your own TFX pipeline: stock module files under the tfxkit components.

A team with a stock TFX pipeline swaps two imports (`Transform`, `Trainer`)
and keeps its module file. This module holds what that needs beyond TFX's own
constructors:

- `DropInSettings`: the product settings a user module can use (Transform
  output layout, input pipeline tuning, strategy, mixed precision, backup
  frequency); every field has a default and there is no data section, since
  the user's `preprocessing_fn` / `run_fn` decide the features;
- `resolve_settings`: what the components accept as `config` (nothing, these
  settings, a mapping of them, or a full `PipelineConfig`) -> settings;
- construction-time checks of the stock arguments (module file, function
  paths, `train_args` / `eval_args`) that name the argument;
- `backup_and_restore(fn_args)`: the one-line crash-recovery helper for a
  user's `run_fn`.

The settings travel to the executors through `components.payload`, beside
the user's own `custom_config` entries.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal, Self

import pydantic
from pydantic import model_validator

from components import backup
from components.config import (
    ConfigError,
    IngestionConfig,
    PipelineConfig,
    StrategyConfig,
    TransformConfig,
    module_config_from_dict,
)
from components.config.validation import config_error, fail, section


@section()
class DropInSettings:
    """Product settings for a user's own module file (no data section).

    Attributes:
      transform: How the Transform writes its output (shards, compression;
        `pack_features` is read back by the Trainer's `tf_dataset_factory`).
      stock_output: Write the Transform output exactly as stock TFX does
        (no ingestion-ready layout, no layout record).
      ingestion: Input pipeline tuning of `fn_args.data_accessor.tf_dataset_factory`
        (parallel reads and parses, prefetch, determinism, cache); batch size,
        shuffling and epochs come from the user's `TensorFlowDatasetOptions`.
      strategy: The `tf.distribute` strategy the user's `run_fn` runs under.
      mixed_precision: Keras dtype policy while the `run_fn` runs: `none`,
        `mixed_float16` (GPU) or `mixed_bfloat16` (TPU / CPU).
      checkpoint_every_steps: Save frequency of `backup_and_restore(fn_args)`.
    """

    transform: TransformConfig = field(default_factory=TransformConfig)
    stock_output: bool = False
    ingestion: IngestionConfig = field(default_factory=IngestionConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    mixed_precision: Literal["none", "mixed_float16", "mixed_bfloat16"] = "none"
    checkpoint_every_steps: int = 100

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.checkpoint_every_steps < 1:
            fail(
                "checkpoint_every_steps",
                f"expected an integer >= 1, got {self.checkpoint_every_steps}",
            )
        if self.stock_output and self.transform.pack_features:
            fail("transform.pack_features", "packing is tfxkit output; stock_output writes none")
        return self

    def to_json(self) -> str:
        return json.dumps(_adapter().dump_python(self, mode="json"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DropInSettings:
        return from_mapping(json.loads(text))


def _adapter() -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(DropInSettings)


def from_mapping(data: Mapping[str, Any]) -> DropInSettings:
    """Validates plain data (as a YAML mapping) into `DropInSettings`.

    Raises:
      ConfigError: naming the field (`config.<field>`).
    """
    try:
        return _adapter().validate_json(json.dumps(dict(data)))
    except pydantic.ValidationError as e:
        raise config_error(e, DropInSettings, "config") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config: expected plain data (mappings, lists, numbers): {e}") from e


def settings_of(config: PipelineConfig) -> DropInSettings:
    """The drop-in settings a full `PipelineConfig` implies for a user module."""
    return DropInSettings(
        transform=config.transform,
        ingestion=config.ingestion,
        strategy=config.strategy,
        mixed_precision=config.train.mixed_precision,
        checkpoint_every_steps=config.train.checkpoint_every_steps,
    )


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


# --------------------------------------------------------------------------- #
# What a user's run_fn gets
# --------------------------------------------------------------------------- #


def backup_dir(fn_args) -> str:
    """Where `backup_and_restore(fn_args)` keeps its backup.

    Beside the execution's model run directories (`backup.location`), keyed
    by the training inputs and arguments, so a re-run of a killed Trainer (a
    new execution, a new model run directory) finds it and anything changed
    starts afresh.
    """
    key = [
        list(fn_args.train_files or []),
        list(fn_args.eval_files or []),
        fn_args.transform_output,
        fn_args.train_steps,
        {k: v for k, v in (fn_args.custom_config or {}).items() if isinstance(v, str)},
    ]
    return backup.location(fn_args.model_run_dir, key, prefix="user-")


def backup_and_restore(fn_args, **kwargs):
    """A `BackupAndRestore` callback for a user's `run_fn`: one line to resume after a crash.

    `model.fit(..., callbacks=[backup_and_restore(fn_args)])` saves every
    `checkpoint_every_steps` steps of the Trainer's settings; a Trainer killed
    mid-training and started again with the same inputs resumes from the
    last backup. The tfxkit Trainer removes the backup after a successful
    export (chief only).

    Args:
      fn_args: The `FnArgs` the tfxkit Trainer passed to `run_fn`.
      **kwargs: Passed on to `BackupAndRestore` (e.g. `save_freq`).
    """
    # Imported here: `components.payload` decodes these settings, so it imports this module.
    from components import payload

    settings = payload.of(fn_args).settings or DropInSettings()
    kwargs.setdefault("save_freq", settings.checkpoint_every_steps)
    kwargs.setdefault("delete_checkpoint", False)
    return backup.TrainingBackup(backup_dir(fn_args), **kwargs)
