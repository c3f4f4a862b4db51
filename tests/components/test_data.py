"""Raw-input checks: what is read, and what is refused before any component runs."""

from __future__ import annotations

import re

import pytest
import tensorflow as tf

from components.config import DataConfig, FeatureConfig, LabelConfig
from components.data import DataError, check_input, resolve_input


def _data(path: str, fmt: str = "csv", size: int = 1) -> DataConfig:
    return DataConfig(
        path=path,
        format=fmt,
        label=LabelConfig(name="label", num_classes=2),
        features=(FeatureConfig(name="alcohol", kind="float", size=size),),
    )


def test_csv_with_a_byte_order_mark_is_read_as_its_columns(tmp_path):
    path = tmp_path / "wine.csv"
    path.write_text("\ufeffalcohol,label\n12.5,1\n", "utf-8")
    data = _data(str(path))
    check_input(data, resolve_input(data, str(tmp_path)))


@pytest.mark.parametrize("delimiter, name", [(";", "semicolon"), ("\t", "tab")])
def test_csv_with_another_delimiter_is_refused_naming_file_and_fix(tmp_path, delimiter, name):
    path = tmp_path / "wine.csv"
    path.write_text(f"alcohol{delimiter}label\n12.5{delimiter}1\n")
    data = _data(str(path))
    with pytest.raises(DataError) as e:
        check_input(data, resolve_input(data, str(tmp_path)))
    assert str(e.value).startswith(f"data.path: {str(path)!r} looks {name}-delimited")
    assert "re-save the file with ',' as the delimiter" in str(e.value)


def test_directory_with_a_readme_reads_only_the_csv_files(tmp_path, caplog):
    (tmp_path / "wine.csv").write_text("alcohol,label\n12.5,1\n")
    (tmp_path / "README.txt").write_text("Wine data, from the UCI repository.\n")
    data = _data(str(tmp_path))
    resolved = resolve_input(data, str(tmp_path / "out"))
    assert resolved.files == [str(tmp_path / "wine.csv")]
    check_input(data, resolved)
    assert re.search(r"ignoring README\.txt \(not \.csv\)", caplog.text)


def test_directory_of_csv_files_without_extension_is_read_whole(tmp_path):
    (tmp_path / "part-00000").write_text("alcohol,label\n12.5,1\n")
    assert resolve_input(_data(str(tmp_path)), str(tmp_path)).pattern == "*"


def _write_examples(path: str, values_per_example: int) -> None:
    with tf.io.TFRecordWriter(path) as writer:
        example = tf.train.Example()
        example.features.feature["alcohol"].float_list.value.extend([1.0] * values_per_example)
        example.features.feature["label"].int64_list.value.append(1)
        writer.write(example.SerializeToString())


def test_tfrecord_feature_size_the_data_does_not_have_is_refused_naming_feature(tmp_path):
    path = str(tmp_path / "wine.tfrecord")
    _write_examples(path, values_per_example=1)
    data = _data(path, fmt="tfrecord", size=100000)
    with pytest.raises(DataError) as e:
        check_input(data, resolve_input(data, str(tmp_path)))
    assert str(e.value) == (
        f"data.features[0].size: feature 'alcohol' is configured with size 100000 but has at most 1 value(s) "
        f"per example in the first records of {path!r}; set size: 1 (1 for a scalar)"
    )
    check_input(_data(path, fmt="tfrecord"), resolve_input(data, str(tmp_path)))
