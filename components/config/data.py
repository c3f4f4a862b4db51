"""The `data` section: where the raw data is, its features and its label."""

from __future__ import annotations

import math
import re
import typing
from dataclasses import field
from typing import Literal, Self

from pydantic import model_validator

from components.config.validation import fail, section

BUILTIN_DATASETS = ("taxi", "digits", "fashion_mnist")
BUILTIN_FORMATS = {"taxi": "csv", "digits": "tfrecord", "fashion_mnist": "tfrecord"}

FeatureKind = Literal["float", "int_categorical", "string_categorical"]
FloatTransform = Literal["zscore", "bucketize", "identity"]
CategoricalTransform = Literal["vocabulary", "identity"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_identifier(name: str) -> None:
    """Refuses a `name` that is not an identifier, saying how to read such a column."""
    if _IDENTIFIER.fullmatch(name):
        return
    suggestion = re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "feature"
    if not _IDENTIFIER.fullmatch(suggestion):
        suggestion = f"_{suggestion}"
    fail(
        "name",
        f"expected an identifier ([A-Za-z_][A-Za-z0-9_]*), got {name!r}; the name is used in "
        "transformed feature names, model inputs and the serving signature, so to read a column "
        "whose header is not an identifier give it an identifier name and put the header in "
        f"`column`: {{name: {suggestion}, column: {name!r}}}",
    )


@section()
class FeatureConfig:
    """One input feature.

    Attributes:
      name: The feature's identifier everywhere after ExampleGen: in the
        examples, statistics and schema, the transformed feature
        (`<name>_xf`), the model's inputs and the pushed model's serving
        signature (clients send the feature under `name`).
      column: The column (CSV header) or feature key (tf.Example) that holds
        the feature in the raw data, when it is not `name` (empty: `name`),
        e.g. `trip miles` or `fare/usd`. ExampleGen writes it under `name`.
      kind: `float` (dense numeric, may have missing values), `int_categorical`
        or `string_categorical`.
      transform: For floats `zscore` (default), `bucketize` or `identity`;
        for categoricals `vocabulary` (default) or `identity` (integers in
        `[0, num_buckets)` only).
      size: Number of values per example (1 for scalars, 64 for 8x8 pixels).
      num_buckets: Buckets for `bucketize`, or the id range for an integer
        `identity` categorical.
      oov_buckets: Out-of-vocabulary buckets for `vocabulary`.
      top_k: Keep only the most frequent `top_k` vocabulary entries (0: all).
      fill_value: Value imputed for a missing float; None imputes the mean.
      shape: Image shape of a float feature, `[height, width, channels]`
        (e.g. `[28, 28, 1]`; the product must equal `size`): the values are
        row-major pixels, which a model's `conv` tower and
        `train.augmentation` treat as an image. Empty for plain vectors.
    """

    name: str
    kind: FeatureKind
    column: str = ""
    transform: str | None = None
    size: int = 1
    num_buckets: int = 0
    oov_buckets: int = 1
    top_k: int = 0
    fill_value: float | None = None
    shape: tuple[int, ...] = ()

    @property
    def raw_column(self) -> str:
        """The column or key that holds the feature in the raw data."""
        return self.column or self.name

    @property
    def effective_transform(self) -> str:
        if self.transform is not None:
            return self.transform
        return "zscore" if self.kind == "float" else "vocabulary"

    @property
    def transformed_name(self) -> str:
        return f"{self.name}_xf"

    @property
    def is_categorical(self) -> bool:
        """Whether the transformed feature is an integer id (embedded by the model)."""
        return self.kind != "float" or self.effective_transform == "bucketize"

    @model_validator(mode="after")
    def _check(self) -> Self:
        _check_identifier(self.name)
        allowed = typing.get_args(FloatTransform if self.kind == "float" else CategoricalTransform)
        if self.transform is not None and self.transform not in allowed:
            fail(
                "transform",
                f"expected one of {list(allowed)} for kind {self.kind!r}, got {self.transform!r}",
            )
        if self.size < 1:
            fail("size", f"expected an integer >= 1, got {self.size}")
        t = self.effective_transform
        if t == "bucketize" and self.num_buckets < 2:
            fail(
                "num_buckets",
                f"expected an integer >= 2 for transform 'bucketize', got {self.num_buckets}",
            )
        if self.kind != "float" and t == "identity":
            if self.kind == "string_categorical":
                fail("transform", "'identity' needs integer values; use 'vocabulary' for strings")
            if self.num_buckets < 1:
                fail(
                    "num_buckets",
                    "expected the id range (>= 1) for an 'identity' integer categorical",
                )
        if t == "vocabulary" and self.oov_buckets < 1:
            fail(
                "oov_buckets",
                f"expected an integer >= 1 (unseen values need a bucket), got {self.oov_buckets}",
            )
        if self.top_k < 0:
            fail("top_k", f"expected an integer >= 0 (0 keeps all), got {self.top_k}")
        if self.kind != "float" and self.size != 1:
            fail("size", "categorical features must be scalars (size 1)")
        if self.shape:
            if self.kind != "float" or self.effective_transform == "bucketize":
                fail(
                    "shape",
                    f"an image shape needs a float feature with transform 'zscore' or 'identity', got kind {self.kind!r} with transform {self.effective_transform!r}",
                )
            if len(self.shape) != 3 or any(d < 1 for d in self.shape):
                fail(
                    "shape",
                    f"expected [height, width, channels] of positive integers, got {list(self.shape)}",
                )
            if math.prod(self.shape) != self.size:
                fail(
                    "shape",
                    f"{list(self.shape)} holds {math.prod(self.shape)} values but size is {self.size}; make size the product of the shape",
                )
        return self


@section("data.label")
class LabelConfig:
    """The classification target.

    Attributes:
      name: The label's identifier after ExampleGen (examples, schema,
        the Evaluator's label key).
      column: The column (CSV header) or feature key (tf.Example) of the
        integer class label in the raw data, when it is not `name` (empty:
        `name`). ExampleGen writes it under `name`.
      num_classes: Number of classes; labels are ints in `[0, num_classes)`.
        Binary tasks use 2 (two-logit softmax form).
    """

    name: str = "label"
    column: str = ""
    num_classes: int = 2

    @property
    def raw_column(self) -> str:
        """The column or key that holds the label in the raw data."""
        return self.column or self.name

    @model_validator(mode="after")
    def _check(self) -> Self:
        _check_identifier(self.name)
        if self.num_classes < 2:
            fail("num_classes", f"expected an integer >= 2, got {self.num_classes}")
        return self


@section("data")
class DataConfig:
    """Where the raw data is and what it contains.

    Attributes:
      builtin: `taxi` or `digits` to use data that ships in installed packages,
        `fashion_mnist` for Fashion-MNIST from local IDX files (see
        `components.fashion_mnist`; its official test set is the eval split);
        empty to use `path`.
      path: A CSV / TFRecord file or a directory of them (user data).
      format: `csv` or `tfrecord` (of tf.Example).
      label: The label column.
      features: The model's input features; the label must not be one of them.
      exclude: Raw columns (CSV headers, tf.Example keys) that must never
        become features (for example the raw source of the label).
        ExampleGen drops them, so no component sees them (statistics,
        schema, drift check, Transform, serving, Evaluator) and data
        without them is not a schema change.
      labeled_fraction: Fraction of the training split whose labels may be
        used (1: all). Below 1 the rest is an unlabeled transfer set: the
        teacher Trainers train on the labeled examples only, and the
        Distiller learns the teachers' soft targets on every example and
        the hard labels where they are kept (the few-labels, many-images
        case where distillation pays most). Which examples keep their label
        is decided by a fingerprint of their features, the same everywhere.
      train_buckets: Hash buckets of the train split (ExampleGen).
      eval_buckets: Hash buckets of the eval split. Both are unused for data
        that comes already split (`fashion_mnist`).
    """

    builtin: str = ""
    path: str = ""
    format: Literal["csv", "tfrecord"] = "csv"
    label: LabelConfig = field(default_factory=LabelConfig)
    features: tuple[FeatureConfig, ...] = ()
    exclude: tuple[str, ...] = ()
    labeled_fraction: float = 1.0
    train_buckets: int = 4
    eval_buckets: int = 1

    @model_validator(mode="after")
    def _check(self) -> Self:
        if bool(self.builtin) == bool(self.path):
            fail(
                "",
                f"set exactly one of 'builtin' ({', '.join(BUILTIN_DATASETS)}) or 'path' (your CSV/TFRecord files)",
            )
        if self.builtin and self.builtin not in BUILTIN_DATASETS:
            fail("builtin", f"expected one of {list(BUILTIN_DATASETS)}, got {self.builtin!r}")
        if self.builtin and self.format != BUILTIN_FORMATS[self.builtin]:
            fail(
                "format",
                f"built-in {self.builtin!r} is {BUILTIN_FORMATS[self.builtin]}; set format: {BUILTIN_FORMATS[self.builtin]}",
            )
        if not self.features:
            fail("features", "expected at least one feature")
        seen: set[str] = set()
        # Raw column -> the field reading it: two fields reading one column
        # would be two copies of one value under different names.
        readers: dict[str, str] = {self.label.raw_column: f"the label ({self.label.name!r})"}
        for i, feat in enumerate(self.features):
            if feat.name in seen:
                fail(f"features[{i}].name", f"duplicate feature {feat.name!r}")
            seen.add(feat.name)
            if feat.name == self.label.name:
                fail(
                    f"features[{i}].name",
                    f"{feat.name!r} is the label; a label cannot also be a feature",
                )
            reader = f"data.features[{i}] ({feat.name!r})"
            if feat.raw_column in readers:
                where = "column" if feat.column else "name"
                fail(
                    f"features[{i}].{where}",
                    f"{reader} reads column {feat.raw_column!r}, which "
                    f"{readers[feat.raw_column]} already reads; a column can feed one feature "
                    "or the label only: fix the column of one of them",
                )
            readers[feat.raw_column] = reader
            if self.format == "csv" and feat.size != 1:
                fail(
                    f"features[{i}].size",
                    f"feature {feat.name!r}: a CSV cell holds one value, so a CSV feature has size 1, got {feat.size} "
                    "(vector features need format: tfrecord)",
                )
            for where, value in (("name", feat.name), ("column", feat.column)):
                if value and value in self.exclude:
                    fail(
                        f"features[{i}].{where}",
                        f"{value!r} is listed in data.exclude (it leaks the label)",
                    )
        for value in dict.fromkeys((self.label.name, self.label.raw_column)):
            if value in self.exclude:
                fail("exclude", f"the label {value!r} cannot be excluded")
        if not 0.0 < self.labeled_fraction <= 1.0:
            fail(
                "labeled_fraction",
                f"expected a number in (0, 1] (1 uses every label), got {self.labeled_fraction}",
            )
        for name in ("train_buckets", "eval_buckets"):
            if getattr(self, name) < 1:
                fail(name, f"expected an integer >= 1, got {getattr(self, name)}")
        return self
