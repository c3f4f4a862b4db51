"""Raw-input checks: what is read, and what is refused before any component runs."""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from components.config import DataConfig, FeatureConfig, LabelConfig
from components.data.sources import DataError, check_data_path, check_input, resolve_input

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# A fresh interpreter that imports no TensorFlow answers in seconds; the
# bound only stops a hung process.
CHECK_TIMEOUT_SECONDS = 120


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


def test_columns_neither_features_label_nor_excluded_are_named_in_a_warning(tmp_path, caplog):
    (tmp_path / "wine.csv").write_text("row_id,alcohol,region,label,taste\n7,12.5,north,1,dry\n")
    data = _data(str(tmp_path / "wine.csv"))
    check_input(data, resolve_input(data, str(tmp_path)))
    warning = (
        f"data: column(s) 'region', 'row_id', 'taste' in {str(tmp_path / 'wine.csv')!r} are "
        "neither data.features, the label nor data.exclude; they are dropped at ExampleGen"
    )
    assert warning in caplog.text
    assert "add them to data.features to train on them, or to data.exclude" in caplog.text
    caplog.clear()
    excluded = dataclasses.replace(data, exclude=("row_id", "region", "taste"))
    check_input(excluded, resolve_input(excluded, str(tmp_path)))
    assert "data: column(s)" not in caplog.text


def test_gzip_compressed_csv_is_refused_naming_file_and_fix(tmp_path):
    path = tmp_path / "wine.csv"
    path.write_bytes(gzip.compress(b"alcohol,label\n12.5,1\n"))
    data = _data(str(path))
    with pytest.raises(DataError) as e:
        check_input(data, resolve_input(data, str(tmp_path)))
    assert str(e.value).startswith(
        f"data.path: {str(path)!r} is gzip-compressed (it starts with the gzip signature 1f 8b)"
    )
    assert "decompress it first" in str(e.value)


def test_csv_files_whose_headers_differ_in_column_order_are_refused(tmp_path):
    (tmp_path / "a.csv").write_text("alcohol,label\n12.5,1\n")
    (tmp_path / "b.csv").write_text("label,alcohol\n0,11.0\n")
    data = _data(str(tmp_path))
    with pytest.raises(DataError) as e:
        check_input(data, resolve_input(data, str(tmp_path / "out")))
    assert str(e.value) == (
        f"data.path: {str(tmp_path / 'b.csv')!r} has the same columns in another order (label, alcohol) "
        f"than {str(tmp_path / 'a.csv')!r} (alcohol, label); the CSV files of one input must share one "
        "header line: re-save them with the header of 'a.csv'"
    )


def test_csv_file_given_format_tfrecord_is_refused_naming_the_format(tmp_path):
    path = tmp_path / "wine.csv"
    path.write_text("alcohol,label\n12.5,1\n")
    data = _data(str(path), fmt="tfrecord")
    with pytest.raises(DataError) as e:
        check_input(data, resolve_input(data, str(tmp_path)))
    assert str(e.value) == (
        f"data.path: {str(path)!r} is not a readable TFRecord file: it holds text (it starts "
        "'alcohol,label'), yet data.format is 'tfrecord'; for a CSV file set data.format: csv"
    )
    assert "function_node" not in str(e.value)


def test_missing_relative_path_names_the_directory_it_was_resolved_against(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as e:
        check_data_path(_data("data/wine.csv"))
    assert str(e.value) == (
        f"data.path: 'data/wine.csv' (resolved against the current directory {str(tmp_path)!r}: "
        f"{str(tmp_path / 'data' / 'wine.csv')!r}) does not exist; point it at a CSV file or a "
        "directory of them (an absolute path does not depend on where tfxkit runs)"
    )
    (tmp_path / "data").mkdir()
    with pytest.raises(DataError, match=r"is an empty directory; put the CSV files there"):
        check_data_path(_data("data"))
    (tmp_path / "data" / "wine.csv").write_text("alcohol,label\n12.5,1\n")
    check_data_path(_data("data/wine.csv"))


@pytest.mark.multiprocess
def test_data_path_check_imports_no_tensorflow(tmp_path):
    code = (
        "import sys\n"
        "from components.config import DataConfig, FeatureConfig, LabelConfig\n"
        "from components.data.sources import DataError, check_data_path\n"
        "data = DataConfig(path=sys.argv[1], label=LabelConfig(name='label', num_classes=2),\n"
        "                  features=(FeatureConfig(name='alcohol', kind='float'),))\n"
        "try:\n    check_data_path(data)\nexcept DataError as e:\n    print(e)\n"
        "print('imported tensorflow' if 'tensorflow' in sys.modules else 'no tensorflow')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "missing.csv")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_SECONDS,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"data.path: {str(tmp_path / 'missing.csv')!r} does not exist")
    assert lines[-1] == "no tensorflow"


def test_csv_files_with_other_columns_are_refused_naming_the_difference(tmp_path):
    (tmp_path / "a.csv").write_text("alcohol,label,region\n12.5,1,north\n")
    (tmp_path / "b.csv").write_text("alcohol,label,taste\n11.0,0,dry\n")
    data = _data(str(tmp_path))
    with pytest.raises(DataError) as e:
        check_input(data, resolve_input(data, str(tmp_path / "out")))
    assert str(e.value).startswith(
        f"data.path: {str(tmp_path / 'b.csv')!r} has other columns (also taste; without region) "
        f"than {str(tmp_path / 'a.csv')!r} (alcohol, label, region); the CSV files of one input "
        "must share one header line"
    )


def _wine_with_headers(path: str, column: str = "alcohol %", label_column: str = "") -> DataConfig:
    return DataConfig(
        path=path,
        label=LabelConfig(name="label", column=label_column, num_classes=2),
        features=(FeatureConfig(name="alcohol", column=column, kind="float"),),
    )


def test_a_feature_is_looked_up_under_its_column_not_its_name(tmp_path, caplog):
    (tmp_path / "wine.csv").write_text("alcohol %,good/bad\n12.5,1\n")
    data = _wine_with_headers(str(tmp_path / "wine.csv"), label_column="good/bad")
    check_input(data, resolve_input(data, str(tmp_path)))
    assert "data: column(s)" not in caplog.text  # both headers are configured columns


def test_a_column_missing_from_the_csv_is_refused_naming_feature_column_and_file(tmp_path):
    path = tmp_path / "wine.csv"
    path.write_text("alcohol,label\n12.5,1\n")
    data = _wine_with_headers(str(path))
    with pytest.raises(DataError) as e:
        check_input(data, resolve_input(data, str(tmp_path)))
    assert str(e.value) == (
        "data.features[0].column: feature 'alcohol' reads column 'alcohol %', which is not in "
        f"{str(path)!r} (it has: alcohol, label); set column to the header as the file spells it"
    )
    # The label's column likewise.
    data = _wine_with_headers(str(path), column="alcohol", label_column="good/bad")
    with pytest.raises(
        DataError, match=r"^data\.label\.column: label 'label' reads column 'good/bad'"
    ):
        check_input(data, resolve_input(data, str(tmp_path)))


def test_a_missing_column_without_column_points_to_the_column_field(tmp_path):
    path = tmp_path / "wine.csv"
    path.write_text("alcohol %,label\n12.5,1\n")
    data = _data(str(path))
    with pytest.raises(DataError) as e:
        check_input(data, resolve_input(data, str(tmp_path)))
    assert str(e.value).startswith(
        f"data.features: feature column 'alcohol' is not in {str(path)!r} (it has: alcohol %, label)"
    )
    assert "column: '<header>' beside an identifier name" in str(e.value)
