"""The generated preprocessing_fn, run through TFT's real Beam implementation."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata, schema_utils

from components.config import DataConfig, FeatureConfig, LabelConfig, PipelineConfig
from components.data.preprocessing import build_preprocessing_fn, num_ids, vocabulary_name

FEATURES = (
    FeatureConfig(name="fare", kind="float"),
    FeatureConfig(name="miles", kind="float", transform="bucketize", num_buckets=3),
    FeatureConfig(name="company", kind="string_categorical", oov_buckets=2),
    FeatureConfig(name="area", kind="int_categorical"),
    FeatureConfig(name="hour", kind="int_categorical", transform="identity", num_buckets=24),
    FeatureConfig(name="pixels", kind="float", size=2, fill_value=0.0),
)
CONFIG = PipelineConfig(
    name="unit",
    data=DataConfig(
        # TFRecord input: a CSV cell cannot hold the two-value `pixels`.
        builtin="digits",
        format="tfrecord",
        label=LabelConfig(name="label", num_classes=2),
        features=FEATURES,
    ),
)
# Missing values arrive as empty lists (VarLenFeature -> SparseTensor), as
# SchemaGen infers them for CSV columns with gaps.
ROWS = [
    {
        "fare": [10.0],
        "miles": [1.0],
        "company": [b"a"],
        "area": [7],
        "hour": [3],
        "pixels": [1.0, 2.0],
        "label": [1],
    },
    {
        "fare": [],
        "miles": [2.0],
        "company": [b"b"],
        "area": [],
        "hour": [30],
        "pixels": [3.0, 4.0],
        "label": [0],
    },
    {
        "fare": [20.0],
        "miles": [],
        "company": [b"a"],
        "area": [7],
        "hour": [],
        "pixels": [5.0, 6.0],
        "label": [1],
    },
    {
        "fare": [30.0],
        "miles": [3.0],
        "company": [],
        "area": [8],
        "hour": [23],
        "pixels": [7.0, 8.0],
        "label": [0],
    },
    # Non-finite floats are treated as missing.
    {
        "fare": [float("nan")],
        "miles": [float("inf")],
        "company": [b"b"],
        "area": [8],
        "hour": [1],
        "pixels": [3.0, 4.0],
        "label": [1],
    },
]
SPEC = {
    "fare": tf.io.VarLenFeature(tf.float32),
    "miles": tf.io.VarLenFeature(tf.float32),
    "company": tf.io.VarLenFeature(tf.string),
    "area": tf.io.VarLenFeature(tf.int64),
    "hour": tf.io.VarLenFeature(tf.int64),
    "pixels": tf.io.FixedLenFeature([2], tf.float32),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


@pytest.fixture(scope="module")
def transformed(tmp_path_factory):
    temp = str(tmp_path_factory.mktemp("tft"))
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(SPEC))
    rows = [dict(r, pixels=np.array(r["pixels"], np.float32), label=r["label"][0]) for r in ROWS]
    with tft_beam.Context(temp_dir=temp, force_tf_compat_v1=False):
        (data, _), transform_fn = (rows, metadata) | tft_beam.AnalyzeAndTransformDataset(
            build_preprocessing_fn(CONFIG), output_record_batches=False
        )
        out_dir = str(tmp_path_factory.mktemp("tft_out"))
        _ = transform_fn | tft_beam.WriteTransformFn(out_dir)
    return data, tft.TFTransformOutput(out_dir)


def _column(data, key):
    return np.array([np.asarray(row[key]) for row in data])


def test_zscore_has_zero_mean_and_imputes_with_mean(transformed):
    data, _ = transformed
    fare = _column(data, "fare_xf").reshape(-1)
    present = np.array([10.0, 20.0, 30.0])
    expected_present = (present - present.mean()) / present.std()
    np.testing.assert_allclose(fare[[0, 2, 3]], expected_present, rtol=1e-5)
    # The missing and the NaN fare are imputed with the mean, i.e. z-score 0.
    assert fare[1] == pytest.approx(0.0, abs=1e-6)
    assert fare[4] == pytest.approx(0.0, abs=1e-6)
    assert fare.mean() == pytest.approx(0.0, abs=1e-6)
    assert np.isfinite(_column(data, "miles_xf")).all()


def test_vector_feature_keeps_its_width(transformed):
    data, _ = transformed
    pixels = _column(data, "pixels_xf")
    assert pixels.shape == (5, 2)
    # z-scored over all values of the vector feature (elementwise=False).
    assert pixels.mean() == pytest.approx(0.0, abs=1e-5)


def test_bucketize_gives_ids_in_range(transformed):
    data, _ = transformed
    miles = _column(data, "miles_xf").reshape(-1)
    assert miles.dtype == np.int64
    assert set(miles) <= {0, 1, 2}
    assert miles[0] < miles[3]


def test_vocabularies_are_built_with_oov(transformed):
    data, tft_output = transformed
    company_vocab = tft_output.vocabulary_by_name(vocabulary_name(FEATURES[2]))
    # TFT drops empty strings from vocabularies: a missing value is OOV.
    assert set(company_vocab) == {b"a", b"b"}
    assert num_ids(FEATURES[2], tft_output) == 2 + 2
    ids = _column(data, "company_xf").reshape(-1)
    assert ids[0] == ids[2]  # both "a"
    assert ids[1] == ids[4]  # both "b"
    assert ids[3] >= 2 and ids[3] < 4
    area_vocab = tft_output.vocabulary_by_name(vocabulary_name(FEATURES[3]))
    assert {int(v) for v in area_vocab} == {7, 8, -1}


def test_identity_maps_out_of_range_and_missing_to_extra_bucket(transformed):
    data, tft_output = transformed
    hours = _column(data, "hour_xf").reshape(-1)
    assert list(hours) == [3, 24, 24, 23, 1]
    assert num_ids(FEATURES[4], tft_output) == 25


def test_label_passes_through(transformed):
    data, _ = transformed
    assert list(_column(data, "label")) == [1, 0, 1, 0, 1]


def test_every_output_is_rank_two_except_label(transformed):
    _, tft_output = transformed
    spec = tft_output.transformed_feature_spec()
    assert spec["label"].shape == []
    for feature in FEATURES:
        assert spec[feature.transformed_name].shape == [feature.size]
