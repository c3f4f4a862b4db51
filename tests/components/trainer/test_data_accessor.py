"""`tf_dataset_factory` under the tfxkit Trainer gives the batches stock TFX gives.

Reading order differs by design (blocks of records per file instead of one
record per file in turn), so batches are compared as multisets of examples,
together with their structure, shapes, dtypes and sizes.
"""

from __future__ import annotations

import collections
import gzip  # noqa: F401  (the stock reader detects GZIP from the `.gz` name)

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx.components.util import tfxio_utils
from tfx.types import artifact_utils, standard_artifacts
from tfx_bsl.public.tfxio import TensorFlowDatasetOptions

from components.config.dropin import DropInSettings
from components.trainer import data_accessor

NUM_FILES = 3
PER_FILE = 25  # 75 examples: batches of 8 leave a partial last batch
LABEL = "label"


def _schema() -> schema_pb2.Schema:
    schema = schema_pb2.Schema()
    for name, kind in (("x", schema_pb2.FLOAT), ("k", schema_pb2.INT), (LABEL, schema_pb2.INT)):
        feature = schema.feature.add(name=name, type=kind)
        feature.shape.dim.add(size=1 if name != "x" else 2)
        feature.presence.min_fraction = 1.0
    # A variable-length feature: a SparseTensor in both readers.
    schema.feature.add(name="tags", type=schema_pb2.BYTES)
    return schema


def _example(i: int) -> bytes:
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 10.0, -i / 10.0])),
        "k": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 7])),
        LABEL: tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
        "tags": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"t"] * (i % 3))),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module", params=["gzip", "none"])
def examples(request, tmp_path_factory):
    """An Examples artifact with a `train` split of NUM_FILES shards."""
    root = tmp_path_factory.mktemp(f"examples_{request.param}")
    split = root / "Split-train"
    split.mkdir()
    suffix = ".gz" if request.param == "gzip" else ".tfrecord"
    options = tf.io.TFRecordOptions(compression_type="GZIP" if request.param == "gzip" else "")
    for f in range(NUM_FILES):
        with tf.io.TFRecordWriter(str(split / f"data-{f}{suffix}"), options) as writer:
            for i in range(f * PER_FILE, (f + 1) * PER_FILE):
                writer.write(_example(i))
    artifact = standard_artifacts.Examples()
    artifact.uri = str(root)
    artifact.split_names = artifact_utils.encode_split_names(["train"])
    return [artifact], str(split / "*")


def _factories(examples, tmp_path):
    artifacts, pattern = examples
    stock = tfxio_utils.get_tf_dataset_factory_from_artifact(artifacts, ["test"])
    ours = data_accessor.make_tf_dataset_factory(DropInSettings(), None, str(tmp_path))
    return stock, ours, [pattern]


def _rows(batch) -> list[tuple]:
    """One hashable row per example of a `(features, label)` or features-only batch."""
    features, label = batch if isinstance(batch, tuple) else (batch, None)
    tags = tf.sparse.to_dense(features["tags"], default_value=b"").numpy()
    n = features["x"].shape[0]
    return [
        (
            tuple(np.round(features["x"][i].numpy(), 5)),
            int(features["k"][i, 0]),
            tuple(t for t in tags[i] if t),
            None if label is None else int(label[i, 0]),
            None if LABEL not in features else int(features[LABEL][i, 0]),
        )
        for i in range(n)
    ]


def _structure(batch):
    def describe(t):
        # A sparse batch's dense width is its longest row: data, not structure.
        shape = t.shape.rank if isinstance(t, tf.SparseTensor) else tuple(t.shape[1:])
        return type(t).__name__, t.dtype, shape

    return tf.nest.map_structure(describe, batch)


def _collect(ds, max_batches=None):
    batches = list(ds.take(max_batches) if max_batches else ds)
    return (
        collections.Counter(r for b in batches for r in _rows(b)),
        [int(tf.nest.flatten(b)[0].shape[0]) for b in batches],
        _structure(batches[0]),
    )


@pytest.mark.parametrize(
    "options",
    [
        TensorFlowDatasetOptions(batch_size=8, num_epochs=1, shuffle=False, label_key=LABEL),
        TensorFlowDatasetOptions(
            batch_size=8, num_epochs=1, shuffle=False, drop_final_batch=True, label_key=LABEL
        ),
        TensorFlowDatasetOptions(
            batch_size=8, num_epochs=2, shuffle=True, shuffle_seed=3, label_key=LABEL
        ),
        TensorFlowDatasetOptions(batch_size=10, num_epochs=1, shuffle=True),
    ],
    ids=["one_pass", "drop_final", "two_shuffled_epochs", "no_label"],
)
def test_finite_datasets_hold_the_same_batches_as_stock(examples, tmp_path, options):
    stock, ours, pattern = _factories(examples, tmp_path)
    schema = _schema()
    stock_rows, stock_sizes, stock_structure = _collect(stock(pattern, options, schema))
    our_rows, our_sizes, our_structure = _collect(ours(pattern, options, schema))
    assert our_rows == stock_rows
    # Every batch is full except possibly the last one, in both.
    assert sorted(our_sizes) == sorted(stock_sizes)
    assert our_sizes[:-1] == [options.batch_size] * (len(our_sizes) - 1)
    assert our_structure == stock_structure


def test_repeating_dataset_yields_full_batches_covering_every_example(examples, tmp_path):
    stock, ours, pattern = _factories(examples, tmp_path)
    options = TensorFlowDatasetOptions(batch_size=5, label_key=LABEL, shuffle_seed=1)
    total = NUM_FILES * PER_FILE
    # num_epochs None repeats forever: the first `total` examples are one pass, each once.
    stock_rows, stock_sizes, stock_structure = _collect(
        stock(pattern, options, _schema()), total // 5
    )
    our_rows, our_sizes, our_structure = _collect(ours(pattern, options, _schema()), total // 5)
    assert our_rows == stock_rows
    assert our_sizes == stock_sizes == [5] * (total // 5)
    assert our_structure == stock_structure


def test_unknown_label_key_is_named(examples, tmp_path):
    _, ours, pattern = _factories(examples, tmp_path)
    with pytest.raises(ValueError, match=r"label_key 'nope' is not in the schema"):
        ours(pattern, TensorFlowDatasetOptions(batch_size=4, label_key="nope"), _schema())


def _dense_schema() -> schema_pb2.Schema:
    # Fixed-length features only: the reader's re-batching path (the sparse
    # path batches example by example).
    schema = _schema()
    del schema.feature[-1]
    return schema


@pytest.mark.parametrize("schema", [_schema, _dense_schema], ids=["sparse", "dense"])
def test_repeating_dataset_is_infinite_to_tf_data_as_stock(examples, tmp_path, schema):
    stock, ours, pattern = _factories(examples, tmp_path)
    for options in (
        TensorFlowDatasetOptions(batch_size=5, label_key=LABEL),
        TensorFlowDatasetOptions(batch_size=5, label_key=LABEL, shuffle=False),
        TensorFlowDatasetOptions(batch_size=5),
    ):
        assert (
            int(ours(pattern, options, schema()).cardinality())
            == int(stock(pattern, options, schema()).cardinality())
            == tf.data.INFINITE_CARDINALITY
        )


class _StopAfter(tf_keras.callbacks.Callback):
    """Bounds a fit that should have been refused: it stops instead of running forever."""

    def __init__(self, batches: int):
        super().__init__()
        self.batches, self.seen = batches, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen >= self.batches:
            self.model.stop_training = True


@pytest.mark.parametrize("schema", [_schema, _dense_schema], ids=["sparse", "dense"])
def test_fit_without_steps_on_the_repeating_dataset_is_refused_as_stock(examples, tmp_path, schema):
    # A run_fn's fit(steps_per_epoch=fn_args.train_steps) with train_steps None:
    # stock's INFINITE dataset makes Keras refuse it at once; so must ours (the
    # dense path's used to train forever). The callback bounds the test if not.
    _, ours, pattern = _factories(examples, tmp_path)
    ds = ours(pattern, TensorFlowDatasetOptions(batch_size=5, label_key=LABEL), schema()).map(
        lambda features, label: (features["x"], label)
    )
    model = tf_keras.Sequential([tf_keras.Input(shape=(2,)), tf_keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    stop = _StopAfter(50)
    with pytest.raises(ValueError, match=r"infinite"):
        model.fit(ds, steps_per_epoch=None, epochs=1, verbose=0, callbacks=[stop])
    assert stop.seen == 0
    # Reached only when fit was refused, so the dataset is INFINITE to Keras.
    with pytest.raises(ValueError, match=r"infinite"):
        model.evaluate(ds, steps=None, verbose=0)


def _on_service(address: str) -> DropInSettings:
    from components.config import IngestionConfig, ServiceConfig

    service = ServiceConfig(dispatcher=address, compression="none")
    return DropInSettings(ingestion=IngestionConfig(service=service))


@pytest.mark.multiprocess
def test_the_repeating_factory_reads_through_the_service(examples, tmp_path):
    from testkit.data_service import LocalService

    stock, _, pattern = _factories(examples, tmp_path)
    # Unshuffled: on the service the passes repeat on the worker, and a shuffle
    # buffer here would mix them (stock shuffles within a pass).
    options = TensorFlowDatasetOptions(batch_size=5, label_key=LABEL, shuffle=False)
    total = NUM_FILES * PER_FILE
    with LocalService(str(tmp_path / "service"), workers=1) as local:
        ours = data_accessor.make_tf_dataset_factory(
            _on_service(local.address), None, str(tmp_path)
        )
        dataset = ours(pattern, options, _schema())
        graph = tf.compat.v1.GraphDef()
        graph.ParseFromString(dataset._as_serialized_graph().numpy())
        assert any(node.op.startswith("DataServiceDataset") for node in graph.node)
        our_rows, our_sizes, our_structure = _collect(dataset, 3 * total // 5)
    stock_rows, _, stock_structure = _collect(stock(pattern, options, _schema()), total // 5)
    # Full batches, stock's structure (sparse `tags` included), every example read.
    assert our_sizes == [5] * (3 * total // 5)
    assert our_structure == stock_structure
    assert set(our_rows) == set(stock_rows)


def test_exact_passes_on_the_service_are_refused_naming_the_fix(examples, tmp_path):
    _, pattern = examples
    ours = data_accessor.make_tf_dataset_factory(_on_service("127.0.0.1:1"), None, str(tmp_path))
    options = TensorFlowDatasetOptions(batch_size=8, num_epochs=2, label_key=LABEL)
    with pytest.raises(
        ValueError, match=r"cannot give exactly num_epochs=2 passes.*num_epochs=None"
    ):
        ours([pattern], options, _schema())
