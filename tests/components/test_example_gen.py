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


def _read(executor, input_base: str, pattern: str) -> list[tf.train.Example]:
    exec_properties = {
        "input_base": input_base,
        "custom_config": proto_utils.proto_to_json(ExampleRules.from_data(DATA).custom_config()),
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
