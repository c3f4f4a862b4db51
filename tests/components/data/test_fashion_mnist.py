"""Fashion-MNIST loading from IDX files: tiny files written here, and the real ones when installed."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

from components.data import fashion_mnist
from components.data.sources import DataError, write_fashion_mnist
from tests.conftest import write_fashion_idx


@pytest.fixture
def tiny_idx_dir(tmp_path):
    return tmp_path, write_fashion_idx(str(tmp_path))


def test_load_split_reads_images_and_labels(tiny_idx_dir):
    directory, expected = tiny_idx_dir
    for split in ("train", "eval"):
        images, labels = fashion_mnist.load_split(split, str(directory))
        assert images.shape == (len(expected[split][0]), 28, 28) and images.dtype == np.uint8
        np.testing.assert_array_equal(images, expected[split][0])
        np.testing.assert_array_equal(labels, expected[split][1].astype(np.int64))


def test_write_fashion_mnist_keeps_the_official_splits_as_tf_examples(tiny_idx_dir, tmp_path):
    directory, expected = tiny_idx_dir
    out = write_fashion_mnist(str(tmp_path / "out"), source_dir=str(directory))
    for split in ("train", "eval"):
        records = list(
            tf.data.TFRecordDataset(os.path.join(out, split, "data.tfrecord")).as_numpy_iterator()
        )
        assert len(records) == len(expected[split][1])
        for record, image, label in zip(records, *expected[split], strict=True):
            feature = tf.train.Example.FromString(record).features.feature
            np.testing.assert_allclose(
                feature["image"].float_list.value, image.reshape(-1) / 255.0, rtol=1e-6
            )
            assert feature["label"].int64_list.value == [label]


def test_missing_files_name_both_ways_to_get_them(tmp_path, monkeypatch):
    # Whatever this host has installed, search only empty places.
    monkeypatch.setattr(fashion_mnist, "DEBIAN_DIR", str(tmp_path / "debian"))
    environ = {
        fashion_mnist.ENV_DIR: str(tmp_path / "nowhere"),
        "KERAS_HOME": str(tmp_path / "keras"),
    }
    with pytest.raises(fashion_mnist.FashionMnistMissing) as raised:
        fashion_mnist.find_dir(environ)
    message = str(raised.value)
    assert "apt-get install -y dataset-fashion-mnist" in message
    assert "fashion_mnist.load_data()" in message
    for searched in ("nowhere", "debian", os.path.join("keras", "datasets", "fashion-mnist")):
        assert str(tmp_path / searched) in message
    with pytest.raises(DataError, match="dataset-fashion-mnist"):
        _write_without_files(tmp_path, environ, monkeypatch)


def _write_without_files(tmp_path, environ, monkeypatch):
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    write_fashion_mnist(str(tmp_path / "out"))


def test_a_truncated_file_fails_naming_it(tiny_idx_dir):
    directory, _ = tiny_idx_dir
    path = directory / fashion_mnist.FILES["eval"][0]
    data = gzip.open(path).read()
    with gzip.open(path, "wb") as f:
        f.write(data[:-10])
    with pytest.raises(ValueError, match=str(path)):
        fashion_mnist.load_split("eval", str(directory))


@pytest.mark.skipif(
    not os.path.isdir(fashion_mnist.DEBIAN_DIR),
    reason="dataset-fashion-mnist is not installed (make fashion-mnist)",
)
def test_real_files_have_the_published_sizes():
    for split, size in fashion_mnist.SPLIT_SIZES.items():
        images, labels = fashion_mnist.load_split(split, fashion_mnist.DEBIAN_DIR)
        assert images.shape == (size, 28, 28)
        assert np.bincount(labels, minlength=10).tolist() == [size // 10] * 10


def test_a_truncated_header_fails_naming_the_file(tmp_path):
    path = tmp_path / "short-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, 3, 0, 0]))
    with pytest.raises(ValueError, match=rf"{path}: truncated IDX header"):
        fashion_mnist.read_idx(str(path))


def test_records_are_rewritten_when_the_source_files_change(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    write_fashion_idx(str(first), {"train": 5, "eval": 3})
    write_fashion_idx(str(second), {"train": 7, "eval": 2}, seed=1)
    out = str(tmp_path / "out")

    def count(split):
        return sum(1 for _ in tf.data.TFRecordDataset(os.path.join(out, split, "data.tfrecord")))

    write_fashion_mnist(out, source_dir=str(first))
    assert (count("train"), count("eval")) == (5, 3)
    write_fashion_mnist(out, source_dir=str(first))  # same source: reused
    assert (count("train"), count("eval")) == (5, 3)
    write_fashion_mnist(out, source_dir=str(second))
    assert (count("train"), count("eval")) == (7, 2)
