"""ExampleGen executors that make the examples follow the `data` config.

`conform` (`select`, then retype) rewrites each `tf.Example` the stock executors read:
unused and excluded columns dropped, `column`s written under their `name`, whole-number
floats as int64 ids, values as the configured kind. `CsvExampleGen` / `ImportExampleGen`
are TFX's with these executors; `ExampleRules` are the rules they apply.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import apache_beam as beam
import tensorflow as tf
from tfx.components.example_gen import component as example_gen_component
from tfx.components.example_gen.csv_example_gen import executor as csv_executor
from tfx.components.example_gen.import_example_gen import executor as import_executor
from tfx.dsl.components.base import executor_spec
from tfx.proto import example_gen_pb2

from components.config import DataConfig, payload
from components.data.sources import BOM

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
        (`int_categorical`), keyed by `name`: the value list type the
        examples must use. When set, keys not listed here (nor in
        `columns`) are removed too: only configured columns reach any
        component.
      columns: `(raw column, name)` of every feature or label read from a
        column other than its name: the example carries it under `name`.
    """

    exclude: tuple[str, ...] = ()
    kinds: tuple[tuple[str, str], ...] = ()
    columns: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_data(cls, data: DataConfig) -> ExampleRules:
        kinds = {f.name: f.kind for f in data.features}
        kinds[data.label.name] = "int_categorical"
        columns = {
            c.raw_column: c.name for c in (*data.features, data.label) if c.raw_column != c.name
        }
        return cls(
            exclude=tuple(sorted(data.exclude)),
            kinds=tuple(sorted(kinds.items())),
            columns=tuple(sorted(columns.items())),
        )

    def custom_config(self) -> example_gen_pb2.CustomConfig:
        """ExampleGen's `custom_config` (a proto holding an `Any`): the rules as a Struct."""
        rules: dict[str, Any] = {"exclude": list(self.exclude), "kinds": dict(self.kinds)}
        if self.columns:  # absent otherwise: configs without renames keep their cache
            rules["columns"] = dict(self.columns)
        return payload.encode_example_rules(rules)

    @classmethod
    def from_exec_properties(cls, exec_properties: dict[str, Any]) -> ExampleRules:
        rules = payload.decode_example_rules(exec_properties)
        return cls(
            exclude=tuple(rules.get("exclude", ())),
            kinds=tuple(sorted(rules.get("kinds", {}).items())),
            columns=tuple(sorted(rules.get("columns", {}).items())),
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


# Whole numbers beyond int64 stay floats (DataGate then names them).
_INT64_LIMIT = 2**63


def _is_whole(value: float) -> bool:
    return math.isfinite(value) and abs(value) < _INT64_LIMIT and value == int(value)


def _as_ids(feature: tf.train.Feature) -> None:
    """A float list of whole numbers, rewritten as the int64 ids it holds."""
    values = [int(v) for v in feature.float_list.value]
    feature.ClearField("float_list")
    feature.int64_list.SetInParent()
    feature.int64_list.value.extend(values)


class WholeNumberColumns(beam.CombineFn):
    """The integer-kind keys whose float values, over all examples, are whole numbers.

    Reads `select`ed examples (keys are names).

    Accumulator: key -> whether every float value seen so far is whole (keys
    with no float value are absent).
    """

    def __init__(self, rules: ExampleRules):
        self._int_keys = tuple(k for k, kind in rules.kinds if kind == "int_categorical")

    def create_accumulator(self) -> dict[str, bool]:
        return {}

    def add_input(self, accumulator: dict[str, bool], example) -> dict[str, bool]:
        if not isinstance(example, tf.train.Example):
            return accumulator
        features = example.features.feature
        for key in self._int_keys:
            if key in features and features[key].WhichOneof("kind") == "float_list":
                whole = all(_is_whole(v) for v in features[key].float_list.value)
                accumulator[key] = accumulator.get(key, True) and whole
        return accumulator

    def merge_accumulators(self, accumulators) -> dict[str, bool]:
        merged: dict[str, bool] = {}
        for accumulator in accumulators:
            for key, whole in accumulator.items():
                merged[key] = merged.get(key, True) and whole
        return merged

    def extract_output(self, accumulator: dict[str, bool]) -> frozenset[str]:
        return frozenset(key for key, whole in accumulator.items() if whole)


def select(example: tf.train.Example, rules: ExampleRules) -> tf.train.Example:
    """Keeps only the configured columns of one example (in place), each under its `name`.

    Strips a byte-order mark from the first column's key, drops excluded and
    unconfigured keys and moves each renamed column (`rules.columns`) to its
    name. A raw key that is some feature's `name` while that feature reads
    another column is dropped too: the feature's value comes from its column
    only (and two features may swap names).
    """
    if not isinstance(example, tf.train.Example):
        return example  # other payloads (serialized protos, sequence examples) pass as read
    features = example.features.feature
    for key in [k for k in features if k.startswith(BOM)]:
        features[key.lstrip(BOM)].CopyFrom(features[key])
        del features[key]
    kinds, columns = dict(rules.kinds), dict(rules.columns)
    targets = set(columns.values())
    moved = {}
    for key in [k for k in features if k in columns]:
        moved[columns[key]] = tf.train.Feature()
        moved[columns[key]].CopyFrom(features[key])
    for key in [
        k
        for k in features
        if k in columns or k in targets or k in rules.exclude or (kinds and k not in kinds)
    ]:
        del features[key]
    for name, feature in moved.items():
        features[name].CopyFrom(feature)
    return example


def _retype_all(
    example: tf.train.Example, rules: ExampleRules, whole_floats: frozenset[str]
) -> tf.train.Example:
    """Writes each configured key of a `select`ed example as its kind's value list."""
    if not isinstance(example, tf.train.Example):
        return example
    features = example.features.feature
    for key, kind in rules.kinds:
        if key in features:
            if key in whole_floats and features[key].WhichOneof("kind") == "float_list":
                _as_ids(features[key])
            _retype(features[key], kind)
    return example


def conform(
    example: tf.train.Example, rules: ExampleRules, whole_floats: frozenset[str] = frozenset()
) -> tf.train.Example:
    """Applies `rules` to one raw example (in place) and returns it: `select`, then retype.

    Args:
      example: A raw example.
      rules: What to drop, what to rename and which value list each
        configured key uses.
      whole_floats: Integer-kind keys (names) whose float values are whole
        numbers in every example (`WholeNumberColumns`): written as int64 ids.
    """
    return _retype_all(select(example, rules), rules, whole_floats)


def _conforming(stock_transform):
    @beam.ptransform_fn
    @beam.typehints.with_input_types(beam.Pipeline)
    @beam.typehints.with_output_types(tf.train.Example)
    def ConformedRecords(  # noqa: N802 - TFX's naming of ExampleGen PTransforms
        pipeline: beam.Pipeline, exec_properties: dict[str, Any], split_pattern: str
    ) -> beam.pvalue.PCollection:
        rules = ExampleRules.from_exec_properties(exec_properties)
        records = (
            pipeline
            | "StockRead" >> stock_transform(exec_properties, split_pattern)
            | "SelectColumns" >> beam.Map(select, rules)
        )
        # Whether a float column is whole numbers is known only after every
        # example: one fractional label must keep the whole column float.
        whole_floats = records | "WholeNumberColumns" >> beam.CombineGlobally(
            WholeNumberColumns(rules)
        )
        return records | "ConformToConfig" >> beam.Map(
            _retype_all, rules, beam.pvalue.AsSingleton(whole_floats)
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
