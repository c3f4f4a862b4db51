"""`DropInSettings`: the product settings for a user's own module file.

A section like the others (`components.config.validation.section`), but not
part of a `PipelineConfig`: a team that brings its own `preprocessing_fn` /
`run_fn` decides its features, so there is no data section. It lives here,
with the config, so that `components.config.payload` decodes it without importing
the drop-in helpers (`components.config.stock_args`) that read the payload.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal, Self

import pydantic
from pydantic import model_validator

from components.config.pipeline import PipelineConfig
from components.config.runtime import (
    IngestionConfig,
    StrategyConfig,
    TransformConfig,
    check_service,
)
from components.config.validation import ConfigError, config_error, fail, section


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
        check_service(self.ingestion, self.strategy, image_views=None)
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
