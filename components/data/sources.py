"""Locating and checking the raw input data (no TFX types).

`resolve_input` turns the `data` section into an ExampleGen input, writing built-in
datasets once; `check_input` fails with a `DataError` naming the file and column before
any component runs; `check_data_path` is the part that needs no TensorFlow.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import io
import json
import os
import re

from absl import logging

from components.config import DataConfig


class _TensorFlow:
    """`tensorflow`, imported on first use: importing this module (for
    `check_data_path`, `DataError`) stays free of it."""

    def __getattr__(self, name: str):
        import tensorflow

        return getattr(tensorflow, name)


tf = _TensorFlow()

# The UTF-8 byte-order mark some spreadsheet programs put before a CSV's header.
BOM = "\ufeff"


class DataError(ValueError):
    """The input data cannot be used; the message names the file and column."""


@dataclasses.dataclass(frozen=True)
class ResolvedInput:
    """ExampleGen input: a directory and a file pattern relative to it.

    Attributes:
      input_base: Directory of the input files.
      pattern: File pattern relative to `input_base` (all files).
      format: `csv` or `tfrecord`.
      splits: Split name -> pattern when the data comes already split (the
        built-in Fashion-MNIST keeps its official test set as `eval`); empty
        when ExampleGen hash-splits `pattern` into train / eval.
    """

    input_base: str
    pattern: str
    format: str
    splits: tuple[tuple[str, str], ...] = ()

    @property
    def files(self) -> list[str]:
        return sorted(tf.io.gfile.glob(os.path.join(self.input_base, self.pattern)))


def taxi_csv_path() -> str:
    """The big_tipper Chicago taxi CSV that ships inside the installed tfx wheel."""
    import tfx

    path = os.path.join(
        os.path.dirname(tfx.__file__),
        "examples",
        "chicago_taxi_pipeline",
        "data",
        "big_tipper_label",
        "data.csv",
    )
    if not tf.io.gfile.exists(path):
        raise DataError(
            f"data.builtin: the taxi CSV is missing from the installed tfx package ({path})"
        )
    return path


def write_digits(directory: str) -> str:
    """Writes scikit-learn's bundled digits once as a TFRecord of tf.Examples.

    Each example has `pixels` (64 floats, 0..16) and `label` (int 0..9).

    Returns:
      The path of the TFRecord file.
    """
    from sklearn.datasets import load_digits

    path = os.path.join(directory, "digits.tfrecord")
    if tf.io.gfile.exists(path):
        return path
    tf.io.gfile.makedirs(directory)
    digits = load_digits()
    tmp = path + ".tmp"
    with tf.io.TFRecordWriter(tmp) as writer:
        for image, label in zip(digits.data, digits.target, strict=True):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "pixels": tf.train.Feature(
                            float_list=tf.train.FloatList(value=image.astype("float32"))
                        ),
                        "label": tf.train.Feature(
                            int64_list=tf.train.Int64List(value=[int(label)])
                        ),
                    }
                )
            )
            writer.write(example.SerializeToString())
    # Rename last so an interrupted write never leaves a truncated input file.
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return path


def image_example(image, label: int) -> bytes:
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "image": tf.train.Feature(float_list=tf.train.FloatList(value=image)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
        )
    ).SerializeToString()


FASHION_MNIST_SPLITS = (("train", "train/*.tfrecord"), ("eval", "eval/*.tfrecord"))


def write_fashion_mnist(directory: str, source_dir: str | None = None) -> str:
    """Writes Fashion-MNIST once as TFRecords of tf.Examples, split as published.

    Each example has `image` (784 floats in [0, 1], row-major 28x28) and
    `label` (int 0..9). `train/` holds the 60,000 training images and
    `eval/` the official 10,000 test images.

    Args:
      directory: Where to write (`<directory>/train/`, `<directory>/eval/`).
      source_dir: Directory of the IDX files (default: searched, see
        `components.data.fashion_mnist`).

    Returns:
      `directory`.

    Raises:
      DataError: when the IDX files cannot be found or read, saying how to get them.
    """
    from components.data import fashion_mnist

    marker = os.path.join(directory, "source.json")
    try:
        source_dir = os.path.abspath(source_dir or fashion_mnist.find_dir())
    except OSError as e:
        raise DataError(str(e)) from e
    # Written once per source: records from other IDX files are rewritten.
    if tf.io.gfile.exists(marker):
        with tf.io.gfile.GFile(marker) as f:
            if json.load(f).get("source") == source_dir:
                return directory
    try:
        for split, _ in FASHION_MNIST_SPLITS:
            images, labels = fashion_mnist.load_split(split, source_dir)
            path = os.path.join(directory, split, "data.tfrecord")
            tf.io.gfile.makedirs(os.path.dirname(path))
            pixels = images.reshape(len(images), -1).astype("float32") / 255.0
            with tf.io.TFRecordWriter(path + ".tmp") as writer:
                for image, label in zip(pixels, labels, strict=True):
                    writer.write(image_example(image, int(label)))
            # Rename last so an interrupted write never leaves a truncated input file.
            tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
    except (OSError, ValueError) as e:
        raise DataError(str(e)) from e
    with tf.io.gfile.GFile(marker, "w") as f:
        json.dump({"source": source_dir}, f)
    return directory


def check_data_path(data: DataConfig) -> None:
    """Checks that a local `data.path` exists and is not an empty directory.

    Needs no TensorFlow (see the module docstring). A relative path is
    resolved against the current directory, and the message says so. URIs
    (`gs://...`) and built-in data are left to `resolve_input`.

    Raises:
      DataError: naming the path as given, the absolute path and the fix.
    """
    path = data.path
    if data.builtin or not path or "://" in path:
        return
    absolute = os.path.abspath(path)
    where = (
        repr(path)
        if os.path.isabs(path)
        else f"{path!r} (resolved against the current directory {os.getcwd()!r}: {absolute!r})"
    )
    if not os.path.exists(absolute):
        raise DataError(
            f"data.path: {where} does not exist; point it at a {data.format.upper()} file or a "
            "directory of them (an absolute path does not depend on where tfxkit runs)"
        )
    if os.path.isdir(absolute) and not any(not n.startswith(".") for n in os.listdir(absolute)):
        raise DataError(
            f"data.path: {where} is an empty directory; put the {data.format.upper()} files there"
        )


def resolve_input(data: DataConfig, data_root: str) -> ResolvedInput:
    """Returns the ExampleGen input for `data`.

    Args:
      data: The `data` config section.
      data_root: Directory where built-in datasets are materialised.

    Raises:
      DataError: if `data.path` does not exist or holds no matching files.
    """
    check_data_path(data)
    if data.builtin == "taxi":
        path = taxi_csv_path()
    elif data.builtin == "digits":
        path = write_digits(os.path.join(data_root, "digits"))
    elif data.builtin == "fashion_mnist":
        path = write_fashion_mnist(os.path.join(data_root, "fashion_mnist"))
        return ResolvedInput(path, "*/*.tfrecord", data.format, splits=FASHION_MNIST_SPLITS)
    else:
        path = data.path
    if not tf.io.gfile.exists(path):
        raise DataError(
            f"data.path: {path!r} does not exist; point it at a {data.format.upper()} file or a directory of them"
        )
    if tf.io.gfile.isdir(path):
        resolved = ResolvedInput(path, _directory_pattern(path, data.format), data.format)
    else:
        resolved = ResolvedInput(os.path.dirname(path) or ".", os.path.basename(path), data.format)
    if not resolved.files:
        raise DataError(
            f"data.path: no files match {os.path.join(resolved.input_base, resolved.pattern)!r}"
        )
    return resolved


def _directory_pattern(path: str, fmt: str) -> str:
    """`*.csv` for a CSV directory that also holds other files (a README), else `*`.

    The skipped files are named in a warning, so a misnamed data file is not
    ignored silently.
    """
    names = sorted(os.path.basename(f) for f in tf.io.gfile.glob(os.path.join(path, "*")))
    csvs = [n for n in names if n.endswith(".csv")]
    others = [n for n in names if not n.endswith(".csv")]
    if fmt != "csv" or not csvs or not others:
        return "*"
    logging.warning(
        "data.path: reading the %d .csv file(s) in %r and ignoring %s (not .csv)",
        len(csvs),
        path,
        ", ".join(others),
    )
    return "*.csv"


# Delimiters a CSV saved by a spreadsheet in another locale (or a TSV) uses.
_OTHER_DELIMITERS = {";": "semicolon", "\t": "tab", "|": "pipe"}


GZIP_MAGIC = b"\x1f\x8b"


def _first_bytes(path: str, n: int) -> bytes:
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read(n)
    except tf.errors.OpError as e:
        raise DataError(f"data.path: cannot read {path!r}: {e.message}") from e


def _csv_header(path: str) -> list[str]:
    if _first_bytes(path, len(GZIP_MAGIC)) == GZIP_MAGIC:
        raise DataError(
            f"data.path: {path!r} is gzip-compressed (it starts with the gzip signature 1f 8b), "
            "and CSV input is read as plain text; decompress it first (gunzip, or "
            "gzip -dc FILE > FILE.csv), or write the data as TFRecord (data.format: tfrecord "
            "reads .gz shards)"
        )
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            first = f.readline()
    except (tf.errors.OpError, UnicodeDecodeError) as e:
        raise DataError(
            f"data.path: cannot read {path!r} as UTF-8 CSV text ({e}); save it as "
            "comma-separated UTF-8 text, or set data.format: tfrecord for TFRecord files"
        ) from e
    # A UTF-8 byte-order mark (spreadsheet exports) is not part of the first
    # column's name; the ExampleGen executor strips it too.
    first = first.lstrip(BOM)
    if not first.strip():
        raise DataError(f"data.path: {path!r} is empty; expected a CSV header line")
    columns = next(csv.reader(io.StringIO(first)))
    if len(columns) == 1:
        for delimiter, name in _OTHER_DELIMITERS.items():
            if delimiter in columns[0]:
                raise DataError(
                    f"data.path: {path!r} looks {name}-delimited: its header {first.strip()[:120]!r} is a single "
                    f"comma-separated column; tfxkit reads comma-separated CSV, so re-save the file with ',' as the delimiter"
                )
    return columns


# tf.Examples omit missing values, so a column counts as present if any of
# the first records of a file has it.
_RECORDS_TO_CHECK = 1000


def _first_example_sizes(path: str) -> dict[str, int]:
    """Key -> the most values it has in one of the first records of `path`."""
    sizes: dict[str, int] = {}
    seen = 0
    try:
        for record in tf.data.TFRecordDataset(path, compression_type=_compression_of(path)).take(
            _RECORDS_TO_CHECK
        ):
            for key, feature in tf.train.Example.FromString(
                record.numpy()
            ).features.feature.items():
                kind = feature.WhichOneof("kind")
                count = len(getattr(feature, kind).value) if kind else 0
                sizes[key] = max(sizes.get(key, 0), count)
            seen += 1
    except tf.errors.OpError as e:
        if not seen:
            _refuse_text_as_tfrecord(path)
        # TensorFlow prefixes the function it ran ({{function_node ...}}): not the cause.
        cause = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", e.message).strip()
        raise DataError(f"data.path: {path!r} is not a readable TFRecord file: {cause}") from e
    if not seen:
        raise DataError(f"data.path: {path!r} holds no records")
    return sizes


def _refuse_text_as_tfrecord(path: str) -> None:
    """Raises when the file starts like text (a CSV given `data.format: tfrecord`)."""
    head = _first_bytes(path, 200)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:
            return  # binary, not a character cut at the end of `head`
        text = head[: e.start].decode("utf-8")
    text = text.lstrip(BOM)
    line = text.splitlines()[0] if text.strip() else ""
    if line and all(c.isprintable() or c in "\t\r\n" for c in text):
        raise DataError(
            f"data.path: {path!r} is not a readable TFRecord file: it holds text (it starts "
            f"{line[:80]!r}), yet data.format is 'tfrecord'; for a CSV file set data.format: csv"
        )


def _compression_of(path: str) -> str:
    return "GZIP" if fnmatch.fnmatch(path, "*.gz") else ""


def check_input(data: DataConfig, resolved: ResolvedInput) -> None:
    """Checks that every input file carries the label and every feature.

    Raises:
      DataError: naming the file and the missing column.
    """
    # The raw data holds each feature and the label under its column.
    wanted = [data.label.raw_column] + [f.raw_column for f in data.features]
    first_header: tuple[str, list[str]] | None = None
    unused: dict[str, str] = {}  # column -> the first file that has it
    for path in resolved.files:
        if data.format == "csv":
            header = _csv_header(path)
            columns, sizes = set(header), {}
            if first_header is None:
                first_header = (path, header)
            else:
                _check_same_header(first_header, path, header)
        else:
            sizes = _first_example_sizes(path)
            columns = set(sizes)
        for column in sorted(columns - set(wanted) - set(data.exclude)):
            unused.setdefault(column, path)
        _check_columns_present(data, path, columns)
        for i, feature in enumerate(data.features):
            # tf.Examples may omit values; no full-length record at all is a wrong size.
            found = sizes.get(feature.raw_column, feature.size)
            if found != feature.size:
                raise DataError(
                    f"data.features[{i}].size: feature {feature.name!r} is configured with size {feature.size} "
                    f"but has at most {found} value(s) per example in the first records of {path!r}; "
                    f"set size: {found} (1 for a scalar)"
                )
    if unused:
        _warn_unused(unused)


def _check_columns_present(data: DataConfig, path: str, columns: set[str]) -> None:
    """Raises naming the first feature (or the label) whose column `path` lacks."""
    readers = [("data.label", data.label)] + [
        (f"data.features[{i}]", f) for i, f in enumerate(data.features)
    ]
    for where, reader in readers:
        if reader.raw_column in columns:
            continue
        role = "label" if reader is data.label else "feature"
        has = f"(it has: {', '.join(repr(c) if c != c.strip() else c for c in sorted(columns))})"
        if reader.column:
            raise DataError(
                f"{where}.column: {role} {reader.name!r} reads column {reader.column!r}, which is "
                f"not in {path!r} {has}; set column to the header as the file spells it"
            )
        field = "data.label.name" if role == "label" else "data.features"
        raise DataError(
            f"{field}: {role} column {reader.name!r} is not in {path!r} {has}; fix the config or "
            "the data (a column whose header is not an identifier is read with "
            "column: '<header>' beside an identifier name)"
        )


def _check_same_header(first: tuple[str, list[str]], path: str, header: list[str]) -> None:
    """CsvExampleGen reads the files of one input with one header: refused up front."""
    first_path, first_header = first
    if header == first_header:
        return
    if sorted(header) == sorted(first_header):
        found = f"the same columns in another order ({', '.join(header)})"
    else:
        extra = sorted(set(header) - set(first_header))
        missing = sorted(set(first_header) - set(header))
        found = (
            "other columns ("
            + "; ".join(
                part
                for part in (
                    f"also {', '.join(extra)}" if extra else "",
                    f"without {', '.join(missing)}" if missing else "",
                )
                if part
            )
            + ")"
        )
    raise DataError(
        f"data.path: {path!r} has {found} than {first_path!r} ({', '.join(first_header)}); "
        "the CSV files of one input must share one header line: re-save them with the "
        f"header of {os.path.basename(first_path)!r}"
    )


def _warn_unused(unused: dict[str, str]) -> None:
    """Names the columns dropped because they are neither features, the label nor excluded."""
    names = sorted(unused)
    where = sorted(set(unused.values()))
    logging.warning(
        "data: column(s) %s in %s are neither data.features, the label nor data.exclude; "
        "they are dropped at ExampleGen, so the model and its serving signature do not use "
        "them: add them to data.features to train on them, or to data.exclude to silence "
        "this warning",
        ", ".join(repr(n) for n in names),
        ", ".join(repr(w) for w in where[:3])
        + (f" and {len(where) - 3} more" if len(where) > 3 else ""),
    )
