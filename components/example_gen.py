"""ExampleGen executors that make the examples follow the `data` config.

TFX's CsvExampleGen infers each column's type from its values and keeps every
column; ImportExampleGen keeps every key. Three things the config promises
would otherwise break downstream:

- `data.exclude`: excluded columns must reach no component. They are dropped
  here, so statistics, the inferred schema, the drift check, Transform (and
  with it the serving signature) and the Evaluator never see them, and data
  that lacks an excluded column is not a schema change;
- a feature's configured kind: a `kind: float` column whose values happen to
  be whole numbers is inferred as int64, and a column left empty in the
  sample as string, which would make those the serving input types. Values
  are written as the configured kind where nothing is lost (integers as
  floats or as text for a `string_categorical`, empty lists as any type);
  anything else (text in a numeric column, fractions in an integer one) is
  left for the DataGate to report;
- a CSV saved with a UTF-8 byte-order mark: the invisible mark would become
  part of the first column's name; it is stripped.

The stock executors do the reading; `conform` rewrites each `tf.Example`.
`CsvExampleGen` / `ImportExampleGen` here are TFX's with these executors.
The rules travel in `custom_config` (through `components.payload`) and hold
only what the rewrite needs, so other config changes do not invalidate ExampleGen's cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import apache_beam as beam
import tensorflow as tf
from tfx.components.example_gen import component as example_gen_component
from tfx.components.example_gen.csv_example_gen import executor as csv_executor
from tfx.components.example_gen.import_example_gen import executor as import_executor
from tfx.dsl.components.base import executor_spec
from tfx.proto import example_gen_pb2

from components import payload
from components.config import DataConfig
from components.data import BOM

# The tf.Example value list each configured kind is written as.
VALUE_LISTS = {
    "float": "float_list",
    "int_categorical": "int64_list",
    "string_categorical": "bytes_list",
}


@dataclasses.dataclass(frozen=True)
class ExampleRules:
    """How raw examples are rewritten before anything else sees them.

    Attributes:
      exclude: Keys removed from every example (`data.exclude`).
      kinds: `(key, kind)` of every feature and of the label
        (`int_categorical`): the value list type the examples must use.
    """

    exclude: tuple[str, ...] = ()
    kinds: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_data(cls, data: DataConfig) -> ExampleRules:
        kinds = {f.name: f.kind for f in data.features}
        kinds[data.label.name] = "int_categorical"
        return cls(exclude=tuple(sorted(data.exclude)), kinds=tuple(sorted(kinds.items())))

    def custom_config(self) -> example_gen_pb2.CustomConfig:
        """ExampleGen's `custom_config` (a proto holding an `Any`): the rules as a Struct."""
        return payload.encode_example_rules(
            {"exclude": list(self.exclude), "kinds": dict(self.kinds)}
        )

    @classmethod
    def from_exec_properties(cls, exec_properties: dict[str, Any]) -> ExampleRules:
        rules = payload.decode_example_rules(exec_properties)
        return cls(
            exclude=tuple(rules.get("exclude", ())),
            kinds=tuple(sorted(rules.get("kinds", {}).items())),
        )


def _retype(feature: tf.train.Feature, kind: str) -> None:
    """Writes `feature` as `kind`'s value list where that loses nothing."""
    have, want = feature.WhichOneof("kind"), VALUE_LISTS[kind]
    if have == want:
        return
    # No list at all: a CSV column empty in every row has no inferred type.
    values = list(getattr(feature, have).value) if have else []
    if values and not (have == "int64_list" and kind in ("float", "string_categorical")):
        return  # text in a numeric column, fractions in an integer one: the DataGate reports them
    if have:
        feature.ClearField(have)
    target = getattr(feature, want)
    target.SetInParent()  # an empty list still carries its type
    if kind == "float":
        target.value.extend(float(v) for v in values)
    elif kind == "string_categorical":
        target.value.extend(str(v).encode() for v in values)


def conform(example: tf.train.Example, rules: ExampleRules) -> tf.train.Example:
    """Applies `rules` to one example (in place) and returns it."""
    if not isinstance(example, tf.train.Example):
        return example  # other payloads (serialized protos, sequence examples) pass as read
    features = example.features.feature
    for key in [k for k in features if k.startswith(BOM)]:
        features[key.lstrip(BOM)].CopyFrom(features[key])
        del features[key]
    for key in rules.exclude:
        if key in features:
            del features[key]
    for key, kind in rules.kinds:
        if key in features:
            _retype(features[key], kind)
    return example


def _conforming(stock_transform):
    @beam.ptransform_fn
    @beam.typehints.with_input_types(beam.Pipeline)
    @beam.typehints.with_output_types(tf.train.Example)
    def ConformedRecords(  # noqa: N802 - TFX's naming of ExampleGen PTransforms
        pipeline: beam.Pipeline, exec_properties: dict[str, Any], split_pattern: str
    ) -> beam.pvalue.PCollection:
        rules = ExampleRules.from_exec_properties(exec_properties)
        return (
            pipeline
            | "StockRead" >> stock_transform(exec_properties, split_pattern)
            | "ConformToConfig" >> beam.Map(conform, rules)
        )

    return ConformedRecords


class CsvExecutor(csv_executor.Executor):
    """TFX's CSV ExampleGen, then `conform`."""

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:  # noqa: N802 - TFX API
        return _conforming(super().GetInputSourceToExamplePTransform())


class ImportExecutor(import_executor.Executor):
    """TFX's import (TFRecord of tf.Example) ExampleGen, then `conform`."""

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:  # noqa: N802 - TFX API
        return _conforming(super().GetInputSourceToExamplePTransform())


class CsvExampleGen(example_gen_component.FileBasedExampleGen):
    """TFX's CsvExampleGen (same id) with `CsvExecutor`; pass `ExampleRules(...).custom_config()`."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(CsvExecutor)


class ImportExampleGen(example_gen_component.FileBasedExampleGen):
    """TFX's ImportExampleGen (same id) with `ImportExecutor`; pass `ExampleRules(...).custom_config()`."""

    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(ImportExecutor)
