"""TFX's MNIST example as `benchmarks/drop_in.py` runs it: its data and its swapped pipeline."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from components.data import fashion_mnist
from components.trainer.component import Trainer as TfxkitTrainer
from components.transform.component import Transform as TfxkitTransform
from testkit import tfx_examples
from tests.conftest import write_fashion_idx


def test_mnist_data_root_writes_the_images_in_the_examples_own_format(tmp_path, monkeypatch):
    idx = tmp_path / "idx"
    idx.mkdir()
    written = write_fashion_idx(str(idx), {"train": 6, "eval": 2})
    monkeypatch.setenv(fashion_mnist.ENV_DIR, str(idx))

    root = tfx_examples.mnist_data_root(str(tmp_path / "work"), images=4)

    (name,) = os.listdir(root)
    records = list(tf.data.TFRecordDataset(os.path.join(root, name)).as_numpy_iterator())
    assert len(records) == 4
    images, labels = written["train"]
    for record, image, label in zip(records, images, labels, strict=False):
        features = tf.train.Example.FromString(record).features.feature
        floats = np.array(features["image_floats"].float_list.value, dtype=np.float32)
        # The example's preprocessing_fn scales [-0.5, 0.5] by min-max: pixels / 255 - 0.5.
        np.testing.assert_allclose(floats, image.reshape(-1) / 255.0 - 0.5, atol=1e-6)
        assert list(features["image_class"].int64_list.value) == [int(label)]


def test_swapped_mnist_pipeline_uses_tfxkit_components_at_the_given_steps(tmp_path):
    module = tfx_examples.load_pipeline(
        tfx_examples.MNIST, str(tmp_path / "code"), swapped=True, train_steps=7
    )
    pipeline = tfx_examples.create_pipeline(
        tfx_examples.MNIST, module, str(tmp_path), str(tmp_path / "data")
    )
    by_id = {c.id: c for c in pipeline.components}
    assert isinstance(by_id["Transform"], TfxkitTransform)
    assert isinstance(by_id["Trainer.mnist"], TfxkitTrainer)
    assert json.loads(by_id["Trainer.mnist"].exec_properties["train_args"]) == {"num_steps": 7}

    stock = tfx_examples.load_pipeline(tfx_examples.MNIST, str(tmp_path / "stock"), swapped=False)
    stock_ids = {
        c.id: type(c)
        for c in tfx_examples.create_pipeline(
            tfx_examples.MNIST, stock, str(tmp_path / "s"), str(tmp_path / "data")
        ).components
    }
    assert stock_ids.keys() == by_id.keys()
    assert not issubclass(stock_ids["Trainer.mnist"], TfxkitTrainer)


def test_a_module_copy_reads_the_given_batch_size_and_the_pipeline_trains_it(tmp_path):
    path = tfx_examples.module_file_with_batch(tfx_examples.MNIST, str(tmp_path), 256)

    with open(tfx_examples.MNIST.module_file, encoding="utf-8") as f:
        own = f.read()
    with open(path, encoding="utf-8") as f:
        copy = f.read()
    # Training and evaluation batches both change; nothing else does.
    assert own.count("tf_transform_output, 40)") == 2
    assert copy == own.replace("tf_transform_output, 40)", "tf_transform_output, 256)")
    module = tfx_examples.load_pipeline(tfx_examples.MNIST, str(tmp_path / "code"), swapped=True)
    pipeline = tfx_examples.create_pipeline(
        tfx_examples.MNIST, module, str(tmp_path), str(tmp_path / "data"), path
    )
    (trainer,) = [c for c in pipeline.components if c.id == "Trainer.mnist"]
    assert trainer.exec_properties["module_file"] == path


def test_an_example_without_a_batch_template_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match="taxi_native_keras: its module file's batch size"):
        tfx_examples.module_file_with_batch(tfx_examples.TAXI, str(tmp_path), 256)
