"""DataGate checks on real TFDV statistics of small DataFrames."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import tensorflow as tf
import tensorflow_data_validation as tfdv

from components.config import DataConfig, FeatureConfig, LabelConfig
from components.validation.checks import config_messages, gate_messages

DATA = DataConfig(
    builtin="taxi",
    label=LabelConfig(name="label", num_classes=2),
    features=(
        FeatureConfig(name="fare", kind="float"),
        FeatureConfig(name="company", kind="string_categorical"),
        FeatureConfig(name="hour", kind="int_categorical"),
    ),
)


def _frame(**overrides):
    frame = pd.DataFrame(
        {
            "fare": [1.0, 2.5, 3.0, 4.0],
            "company": ["a", "b", "a", "c"],
            "hour": [1, 2, 3, 4],
            "extra": [9, 9, 9, 9],
            "label": [0, 1, 1, 0],
        }
    )
    for column, values in overrides.items():
        if values is None:
            frame = frame.drop(columns=[column])
        else:
            frame[column] = values
    return frame


def _stats(frame):
    return tfdv.generate_statistics_from_dataframe(frame)


def test_good_data_passes():
    stats = _stats(_frame())
    baseline = tfdv.infer_schema(stats)
    assert gate_messages({"train": stats, "eval": stats}, {}, DATA, baseline) == []


def test_label_outside_classes_names_field_and_range():
    messages = config_messages("train", _stats(_frame(label=[0, 1, 3, 0])), DATA)
    assert len(messages) == 1
    assert messages[0].startswith(
        "data.label.num_classes: label 'label' takes values in [0, 3] in split 'train'"
    )


def test_negative_label_is_rejected():
    assert config_messages("eval", _stats(_frame(label=[0, -1, 1, 0])), DATA)


def test_missing_label_values_are_rejected():
    messages = config_messages("train", _stats(_frame(label=[0.0, None, 1.0, 0.0])), DATA)
    assert any("is empty or missing in 1 examples of split 'train'" in m for m in messages)


def test_string_label_is_rejected():
    messages = config_messages("train", _stats(_frame(label=["yes", "no", "no", "yes"])), DATA)
    assert messages == [
        "data.label.name: label 'label' has STRING values in split 'train'; labels must be integer class ids "
        "in [0, 2): map the class names to ids 0, 1, ... in the data, or point data.label.name at the class-id column"
    ]


def test_string_in_float_column_names_feature():
    messages = config_messages("train", _stats(_frame(fare=["1.0", "abc", "3", "4"])), DATA)
    assert len(messages) == 1
    assert messages[0].startswith(
        "data.features[0]: 'fare' is configured as float but split 'train' has STRING values"
    )


def test_float_in_int_categorical_names_feature():
    messages = config_messages("train", _stats(_frame(hour=[1.5, 2.0, 3.0, 4.0])), DATA)
    assert messages and messages[0].startswith(
        "data.features[2]: 'hour' is configured as int_categorical"
    )


def test_empty_split_is_rejected():
    empty = _stats(_frame().iloc[0:0])
    assert config_messages("eval", empty, DATA) == [
        "split 'eval' has no examples; check data.path and the train/eval buckets"
    ]


def test_dropped_column_is_drift_against_the_baseline():
    baseline = tfdv.infer_schema(_stats(_frame()))
    stats = _stats(_frame(company=None))
    messages = gate_messages({"train": stats}, {}, DATA, baseline)
    drift = [m for m in messages if m.endswith("[schema drift against the last validated run]")]
    assert len(drift) == 1
    assert drift[0].startswith("split 'train', feature 'company': Column dropped")


def test_type_change_is_drift_against_the_baseline():
    baseline = tfdv.infer_schema(_stats(_frame()))
    stats = _stats(_frame(company=[1, 2, 3, 4]))
    messages = gate_messages({"train": stats}, {}, DATA, baseline)
    assert any("feature 'company'" in m and "drift" in m for m in messages)


@pytest.mark.parametrize(
    "column, values", [("company", ["a", "b", "new-cab", "c"]), ("fare", [1.0, None, 3.0, 4.0])]
)
def test_new_category_and_missing_values_are_not_drift(column, values):
    # New categories go to OOV buckets and missing floats are imputed by design.
    baseline = tfdv.infer_schema(_stats(_frame()))
    assert gate_messages({"train": _stats(_frame(**{column: values}))}, {}, DATA, baseline) == []


def test_example_validator_anomalies_are_reported():
    stats = _stats(_frame(extra=None))
    anomalies = tfdv.validate_statistics(stats, tfdv.infer_schema(_stats(_frame())))
    messages = gate_messages({"train": stats}, {"train": anomalies}, DATA, None)
    assert messages and messages[0].endswith("[ExampleValidator]")


def test_all_empty_column_has_no_type_to_check():
    # pandas gives an all-None column object dtype, which TFDV records as STRING.
    assert config_messages("train", _stats(_frame(hour=[None, None, None, None])), DATA) == []


def test_fractional_label_is_refused_not_truncated():
    messages = config_messages("train", _stats(_frame(label=[0.7, 1.9, 0.0, 1.0])), DATA)
    assert messages[0] == (
        "data.label.name: label 'label' has FLOAT values (between 0 and 1.9) in split 'train'; labels must be "
        "integer class ids in [0, 2): fractional labels are refused, not truncated (a column of whole-number "
        "floats such as 1.0 is read as the ids it holds)"
    )


def _int_example(**values):
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
                for k, v in values.items()
            }
        )
    ).SerializeToString()


def test_empty_label_cells_are_refused(tmp_path):
    # CsvExampleGen writes an empty cell as an empty value list (present, no
    # value), which TFDV does not count as missing.
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for label in ([0], [], [1], [1]):
            writer.write(_int_example(label=label, hour=[3]))
    data = DataConfig(
        builtin="taxi",
        label=LabelConfig(name="label", num_classes=2),
        features=(FeatureConfig(name="hour", kind="int_categorical"),),
    )
    messages = config_messages("train", tfdv.generate_statistics_from_tfrecord(path), data)
    assert messages == [
        "data.label.name: label 'label' is empty or missing in some examples of split 'train'; "
        "every example needs a class id: fill in or drop those rows"
    ]


IDENTITY = DataConfig(
    builtin="taxi",
    label=LabelConfig(name="label", num_classes=2),
    features=(
        FeatureConfig(name="hour", kind="int_categorical", transform="identity", num_buckets=4),
    ),
)


def test_identity_ids_outside_num_buckets_name_feature_and_largest_value():
    messages = config_messages("train", _stats(_frame(hour=[0, 3, 4, 9])), IDENTITY)
    assert messages == [
        "data.features[0].num_buckets: 'hour' (transform 'identity') takes values in [0, 9] in split 'train', "
        "outside its ids [0, 4); set num_buckets: 10 or more, or use transform: vocabulary"
    ]
    assert config_messages("train", _stats(_frame(hour=[0, 1, 2, 3])), IDENTITY) == []


def test_kind_contradicted_on_the_eval_split_only_names_that_split():
    good, bad = _stats(_frame()), _stats(_frame(hour=[1.5, 2.0, 3.0, 4.0]))
    messages = gate_messages({"train": good, "eval": bad}, {}, DATA, None)
    assert len(messages) == 1
    assert messages[0].startswith(
        "data.features[2]: 'hour' is configured as int_categorical but split 'eval' has FLOAT values"
    )


def test_unconfigured_column_absent_from_the_data_is_not_drift():
    # A baseline recorded before ExampleGen dropped excluded and unconfigured
    # columns still lists them; only configured columns reach the statistics now.
    baseline = tfdv.infer_schema(_stats(_frame()))
    stats = _stats(_frame(extra=None))
    excluded = dataclasses.replace(DATA, exclude=("extra",))
    assert gate_messages({"train": stats}, {}, excluded, baseline) == []
    assert gate_messages({"train": stats}, {}, DATA, baseline) == []
    # A configured column is another matter.
    assert gate_messages({"train": _stats(_frame(company=None))}, {}, DATA, baseline)


def test_a_feature_read_from_another_column_is_named_with_its_column():
    # The statistics know the feature's name; the user fixes the CSV column.
    renamed = dataclasses.replace(
        DATA,
        label=LabelConfig(name="label", column="Tipped?", num_classes=2),
        features=(
            FeatureConfig(name="fare", column="fare/usd", kind="float"),
            *DATA.features[1:],
        ),
    )
    stats = _stats(_frame(fare=["1.0", "abc", "3", "4"], label=[0, 1, 3, 0]))
    messages = config_messages("train", stats, renamed)
    assert messages[0].startswith(
        "data.label.num_classes: label 'label' (column 'Tipped?') takes values in [0, 3]"
    )
    assert messages[1].startswith(
        "data.features[0]: 'fare' (column 'fare/usd') is configured as float but split 'train' "
        "has STRING values"
    )
