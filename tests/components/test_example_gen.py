"""The ExampleGen executors: excluded columns dropped, float kinds kept, BOM stripped."""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
import tensorflow as tf
from tfx.utils import proto_utils

from components.config import DataConfig, FeatureConfig, LabelConfig
from components.example_gen import CsvExecutor, ExampleRules, ImportExecutor, conform

DATA = DataConfig(
    path="unused.csv",
    label=LabelConfig(name="label", num_classes=2),
    features=(
        FeatureConfig(name="fare", kind="float"),
        FeatureConfig(name="hour", kind="int_categorical"),
        FeatureConfig(name="tract", kind="int_categorical"),
        FeatureConfig(name="zip", kind="string_categorical"),
    ),
    exclude=("leak",),
)


def _read(
    executor, input_base: str, pattern: str, data: DataConfig = DATA
) -> list[tf.train.Example]:
    exec_properties = {
        "input_base": input_base,
        "custom_config": proto_utils.proto_to_json(ExampleRules.from_data(data).custom_config()),
        "output_data_format": 6,  # FORMAT_TF_EXAMPLE
    }
    out = _output_path(input_base)
    with beam.Pipeline() as pipeline:
        _ = (
            pipeline
            | executor.GetInputSourceToExamplePTransform()(exec_properties, pattern)
            | beam.Map(lambda e: e.SerializeToString())
            | beam.io.WriteToTFRecord(out, shard_name_template="")
        )
    return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(out)]


def _output_path(input_base: str) -> str:
    return os.path.join(input_base, "out", "examples.tfrecord")


def _feature(example: tf.train.Example, key: str):
    feature = example.features.feature[key]
    return feature.WhichOneof("kind"), list(getattr(feature, feature.WhichOneof("kind")).value)


def test_csv_drops_excluded_columns_keeps_float_kind_and_strips_bom(tmp_path):
    # Saved as a spreadsheet does: a byte-order mark before the header. The
    # fare values happen to be whole numbers, which CSV type inference reads as int.
    # tract is empty in every row (inferred as string); zip codes look like integers.
    (tmp_path / "data.csv").write_text(
        "\ufefffare,hour,tract,zip,leak,label\n3,1,,60601,9,0\n4,2,,60602,9,1\n", "utf-8"
    )
    examples = _read(CsvExecutor(), str(tmp_path), "data.csv")
    assert len(examples) == 2
    for example in examples:
        assert sorted(example.features.feature) == ["fare", "hour", "label", "tract", "zip"]
        assert _feature(example, "tract") == ("int64_list", [])
    assert sorted(_feature(e, "fare") for e in examples) == [
        ("float_list", [3.0]),
        ("float_list", [4.0]),
    ]
    assert sorted(_feature(e, "hour") for e in examples) == [
        ("int64_list", [1]),
        ("int64_list", [2]),
    ]


def test_tfrecord_drops_excluded_keys_and_writes_configured_floats_as_floats(tmp_path):
    example = tf.train.Example()
    example.features.feature["fare"].int64_list.value.append(7)
    example.features.feature["leak"].int64_list.value.append(1)
    example.features.feature["label"].int64_list.value.append(1)
    with tf.io.TFRecordWriter(str(tmp_path / "data.tfrecord")) as writer:
        writer.write(example.SerializeToString())
    (read,) = _read(ImportExecutor(), str(tmp_path), "data.tfrecord")
    assert sorted(read.features.feature) == ["fare", "label"]
    assert _feature(read, "fare") == ("float_list", [7.0])


def test_conform_leaves_values_it_cannot_convert_exactly_for_the_data_gate():
    example = tf.train.Example()
    example.features.feature["fare"].bytes_list.value.append(b"abc")
    example.features.feature["hour"].float_list.value.append(1.5)
    example.features.feature["label"].float_list.value.append(0.7)
    conform(example, ExampleRules.from_data(DATA))
    assert _feature(example, "fare") == ("bytes_list", [b"abc"])
    assert _feature(example, "hour") == ("float_list", [1.5])
    assert _feature(example, "label") == ("float_list", [pytest.approx(0.7)])


def test_columns_neither_features_nor_label_reach_no_component(tmp_path):
    # A wide CSV: an id and a date beside the configured columns. Kept, they
    # would become required inputs of the served model's signature.
    (tmp_path / "data.csv").write_text(
        "row_id,fare,hour,tract,zip,day,label\n17,3.5,1,4,60601,2024-01-02,0\n"
    )
    (example,) = _read(CsvExecutor(), str(tmp_path), "data.csv")
    assert sorted(example.features.feature) == ["fare", "hour", "label", "tract", "zip"]


def test_whole_number_float_ids_are_written_as_int64(tmp_path):
    # pandas writes an integer column holding a NaN as floats: 0.0, 1.0, ...
    (tmp_path / "data.csv").write_text(
        "fare,hour,tract,zip,label\n3.5,1.0,4,60601,0.0\n4.5,2.0,,60602,1.0\n5.5,3.0,5,60603,\n"
    )
    examples = _read(CsvExecutor(), str(tmp_path), "data.csv")
    assert sorted(_feature(e, "label") for e in examples) == [
        ("int64_list", []),
        ("int64_list", [0]),
        ("int64_list", [1]),
    ]
    assert sorted(_feature(e, "hour") for e in examples) == [
        ("int64_list", [1]),
        ("int64_list", [2]),
        ("int64_list", [3]),
    ]
    assert sorted(_feature(e, "fare") for e in examples)[0] == ("float_list", [3.5])


def test_one_fractional_value_keeps_the_whole_column_float(tmp_path):
    # Rewriting only the whole rows would mix types in one column; the
    # DataGate refuses the float column, naming the fractional values.
    (tmp_path / "data.csv").write_text(
        "fare,hour,tract,zip,label\n3.5,1,4,60601,1.0\n4.5,2,5,60602,0.7\n"
    )
    examples = _read(CsvExecutor(), str(tmp_path), "data.csv")
    assert sorted(_feature(e, "label") for e in examples) == [
        ("float_list", [pytest.approx(0.7)]),
        ("float_list", [1.0]),
    ]


# Headers as many real CSVs have them: a space, a slash, a question mark.
RENAMED = DataConfig(
    path="unused.csv",
    label=LabelConfig(name="tipped", column="Tipped?", num_classes=2),
    features=(
        FeatureConfig(name="trip_miles", column="trip miles", kind="float"),
        FeatureConfig(name="fare", column="fare/usd", kind="float"),
        FeatureConfig(name="hour", kind="int_categorical"),
    ),
)


def test_csv_columns_are_written_under_their_feature_names(tmp_path):
    # `fare` is also a raw column here (another currency): not configured,
    # it must not shadow the feature `fare`, which reads `fare/usd`. The
    # label is written as whole-number floats under its own header.
    (tmp_path / "data.csv").write_text(
        "trip miles,fare/usd,hour,fare,Tipped?\n1.5,3,1,99,1.0\n2.5,4,2,99,0.0\n"
    )
    examples = _read(CsvExecutor(), str(tmp_path), "data.csv", RENAMED)
    assert len(examples) == 2
    for example in examples:
        assert sorted(example.features.feature) == ["fare", "hour", "tipped", "trip_miles"]
    assert sorted(_feature(e, "trip_miles") for e in examples) == [
        ("float_list", [1.5]),
        ("float_list", [2.5]),
    ]
    assert sorted(_feature(e, "fare") for e in examples) == [
        ("float_list", [3.0]),
        ("float_list", [4.0]),
    ]
    assert sorted(_feature(e, "tipped") for e in examples) == [
        ("int64_list", [0]),
        ("int64_list", [1]),
    ]


def test_tfrecord_keys_are_renamed_and_two_features_may_swap_names():
    data = DataConfig(
        path="unused.tfrecord",
        format="tfrecord",
        features=(
            FeatureConfig(name="a", column="b", kind="float"),
            FeatureConfig(name="b", column="a", kind="string_categorical"),
        ),
    )
    example = tf.train.Example()
    example.features.feature["a"].bytes_list.value.append(b"x")
    example.features.feature["b"].float_list.value.append(2.0)
    example.features.feature["label"].int64_list.value.append(1)
    conform(example, ExampleRules.from_data(data))
    assert sorted(example.features.feature) == ["a", "b", "label"]
    assert _feature(example, "a") == ("float_list", [2.0])
    assert _feature(example, "b") == ("bytes_list", [b"x"])


def test_renames_travel_in_custom_config_and_plain_configs_keep_theirs():
    rules = ExampleRules.from_data(RENAMED)
    assert rules.columns == (
        ("Tipped?", "tipped"),
        ("fare/usd", "fare"),
        ("trip miles", "trip_miles"),
    )
    decoded = ExampleRules.from_exec_properties(
        {"custom_config": proto_utils.proto_to_json(rules.custom_config())}
    )
    assert decoded == rules
    # No `columns` entry without renames: ExampleGen's cache key is unchanged.
    assert "columns" not in proto_utils.proto_to_json(ExampleRules.from_data(DATA).custom_config())
