"""The Transform executor on temp-dir artifacts: ingestion-ready output and its layout record.

Two real runs (TFX's executor, TFT on Beam's DirectRunner) over the first
rows of the taxi CSV that ships with TFX, on eight of its features:

- `packed`: `transform.num_shards: 3`, `compression: none`,
  `pack_features: true`, with an analyzer cache output;
- `stock_format`: the defaults (`num_shards: 0` with 5 workers, `gzip`, no
  packing) and an explicit splits config, i.e. stock TFX's record format.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
from tensorflow_transform.tf_metadata import schema_utils
from tfx.components.transform import executor as tfx_transform_executor
from tfx.proto import transform_pb2
from tfx.types import Channel, artifact_utils, standard_artifacts
from tfx.types import standard_component_specs as specs
from tfx.utils import io_utils, proto_utils
from tfx_bsl.public import tfxio

from components.compat import tfx_transform as tfx_compat
from components.config import PipelineConfig
from components.config.payload import CONFIG_KEY
from components.data import codes, writer
from components.data import layout as transform_layout
from components.data.sources import taxi_csv_path
from components.trainer import component as trainer_component
from components.training import fit as training
from components.training.inputs import make_datasets
from components.transform import executor
from testkit.reliability_cases import CATALOGUE_FEATURES, catalogue_pipeline
from testkit.tiny import tiny

TRAIN_ROWS, EVAL_ROWS = 600, 240
BEAM_ARGS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
USER_MODULE = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "trainer", "stock_user_module.py"
)
DTYPES = {"float": tf.float32, "int_categorical": tf.int64, "string_categorical": tf.string}


@pytest.fixture(scope="module")
def taxi_config(taxi_config):
    """The shipped taxi config on the reliability catalogue's 8 features (one of each
    kind and transform, with the three z-scored floats the stock user module trains
    on): TFT traces every feature several times, and this module runs Transform twice.
    The runs' raw examples hold only these."""
    config = catalogue_pipeline(taxi_config)
    assert len(config.data.features) == len(CATALOGUE_FEATURES)
    return config


def _raw_spec(config: PipelineConfig) -> dict:
    # Taxi columns have gaps, so features are VarLen as SchemaGen infers them.
    spec = {f.name: tf.io.VarLenFeature(DTYPES[f.kind]) for f in config.data.features}
    spec[config.data.label.name] = tf.io.FixedLenFeature([], tf.int64)
    return spec


def _example(row: dict, spec: dict) -> bytes:
    feature = {}
    for key, s in spec.items():
        value = row[key]
        if value == "":
            continue
        if s.dtype == tf.string:
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        elif s.dtype == tf.int64:
            feature[key] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=[int(float(value))])
            )
        else:
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def raw_artifacts(tmp_path_factory, taxi_config):
    """ExampleGen-style Examples (train / eval, GZIP) and a Schema artifact."""
    root = str(tmp_path_factory.mktemp("raw"))
    spec = _raw_spec(taxi_config)
    with open(taxi_csv_path()) as f:
        rows = [
            row for _, row in zip(range(TRAIN_ROWS + EVAL_ROWS), csv.DictReader(f), strict=False)
        ]
    examples = standard_artifacts.Examples()
    examples.uri = os.path.join(root, "examples")
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    for split, part in (("train", rows[:TRAIN_ROWS]), ("eval", rows[TRAIN_ROWS:])):
        os.makedirs(os.path.join(examples.uri, f"Split-{split}"))
        with tf.io.TFRecordWriter(
            os.path.join(examples.uri, f"Split-{split}", "data.gz"), "GZIP"
        ) as w:
            for row in part:
                w.write(_example(row, spec))
    schema = standard_artifacts.Schema()
    schema.uri = os.path.join(root, "schema")
    os.makedirs(schema.uri)
    io_utils.write_pbtxt_file(
        os.path.join(schema.uri, "schema.pbtxt"), schema_utils.schema_from_feature_spec(spec)
    )
    return examples, schema


def run_transform(root: str, config: PipelineConfig, raw_artifacts, **exec_properties):
    """Runs the tfxkit Transform executor; returns (transform graph uri, transformed examples, cache)."""
    examples, schema = raw_artifacts
    graph = standard_artifacts.TransformGraph()
    graph.uri = os.path.join(root, "transform_graph")
    transformed = standard_artifacts.Examples()
    transformed.uri = os.path.join(root, "transformed_examples")
    cache = standard_artifacts.TransformCache()
    cache.uri = os.path.join(root, "updated_analyzer_cache")
    properties = {
        specs.PREPROCESSING_FN_KEY: "components.data.preprocessing.preprocessing_fn",
        specs.CUSTOM_CONFIG_KEY: json.dumps({CONFIG_KEY: config.to_json()}),
        specs.DISABLE_STATISTICS_KEY: True,
        **exec_properties,
    }
    context = executor.Executor.Context(
        beam_pipeline_args=BEAM_ARGS, tmp_dir=os.path.join(root, "tmp")
    )
    executor.Executor(context).Do(
        {specs.EXAMPLES_KEY: [examples], specs.SCHEMA_KEY: [schema]},
        {
            specs.TRANSFORM_GRAPH_KEY: [graph],
            specs.TRANSFORMED_EXAMPLES_KEY: [transformed],
            specs.UPDATED_ANALYZER_CACHE_KEY: [cache],
        },
        properties,
    )
    return graph.uri, transformed, cache.uri


def _with_transform(config: PipelineConfig, **transform) -> PipelineConfig:
    return dataclasses.replace(config, transform=dataclasses.replace(config.transform, **transform))


@pytest.fixture(scope="module")
def packed(tmp_path_factory, taxi_config, raw_artifacts):
    config = _with_transform(
        tiny(taxi_config), num_shards=3, compression="none", pack_features=True
    )
    return config, run_transform(str(tmp_path_factory.mktemp("packed")), config, raw_artifacts)


@pytest.fixture(scope="module")
def stock_format(tmp_path_factory, taxi_config, raw_artifacts):
    config = dataclasses.replace(
        tiny(taxi_config), strategy=dataclasses.replace(taxi_config.strategy, workers=5)
    )
    config = _with_transform(config, num_shards=0, compression="gzip", pack_features=False)
    splits = transform_pb2.SplitsConfig(analyze=["train"], transform=["train", "eval"])
    run = run_transform(
        str(tmp_path_factory.mktemp("stock_format")),
        config,
        raw_artifacts,
        **{specs.SPLITS_CONFIG_KEY: proto_utils.proto_to_json(splits)},
    )
    return config, run


def _split_files(transformed, split: str) -> list[str]:
    return sorted(
        tf.io.gfile.glob(os.path.join(artifact_utils.get_split_uri([transformed], split), "*"))
    )


def test_packed_run_writes_configured_shards_uncompressed(packed):
    config, (graph_uri, transformed, _) = packed
    layout = transform_layout.read_layout(graph_uri)
    assert (layout.compression, layout.num_shards) == ("none", 3)
    for split, rows in (("train", TRAIN_ROWS), ("eval", EVAL_ROWS)):
        files = _split_files(transformed, split)
        assert [os.path.basename(f) for f in files] == [
            f"transformed_examples-0000{i}-of-00003.tfrecord" for i in range(3)
        ]
        assert layout.split_files(split) == files
        # Uncompressed: readable as plain TFRecords, record counts as recorded.
        counts = [sum(1 for _ in tf.data.TFRecordDataset(f)) for f in files]
        assert counts == [layout.shard_stats()[f].records for f in files]
        assert sum(counts) == rows
    # The module-wide processor swap is undone after the run.
    assert tfx_transform_executor.TransformProcessor is tfx_compat.STOCK_PROCESSOR
    assert not tf.io.gfile.exists(os.path.join(graph_uri, writer.STAGING_DIR))


def test_default_run_writes_two_gzip_shards_per_worker(stock_format):
    config, (graph_uri, transformed, _) = stock_format
    layout = transform_layout.read_layout(graph_uri)
    assert layout.num_shards == transform_layout.default_num_shards(5) == 10
    assert layout.compression == "gzip" and layout.packing is None
    for split, rows in (("train", TRAIN_ROWS), ("eval", EVAL_ROWS)):
        files = _split_files(transformed, split)
        assert len(files) == 10 and all(f.endswith(".gz") for f in files)
        with open(files[0], "rb") as f:
            assert f.read(2) == b"\x1f\x8b", "not a gzip file"
        assert sum(1 for _ in tf.data.TFRecordDataset(files, compression_type="GZIP")) == rows
        assert sum(layout.shard_stats()[f].records for f in files) == rows
        # The recorded stats are what a full read of each file finds.
        for f in files:
            assert layout.shard_stats()[f] == transform_layout.scan_shard(f, "gzip")


@pytest.mark.parametrize("run", ["packed", "stock_format"])
def test_recorded_parse_spec_matches_the_files(run, request):
    _, (graph_uri, transformed, _) = request.getfixturevalue(run)
    layout = transform_layout.read_layout(graph_uri)
    graph_spec = tft.TFTransformOutput(graph_uri).transformed_feature_spec()
    spec = layout.feature_spec(graph_spec)
    if layout.packing is None:
        assert spec == graph_spec
    else:
        assert set(spec) == {transform_layout.PACKED_FEATURE}
        assert {m.name for m in layout.packing.members} == set(graph_spec)
        assert layout.packing.width == len(graph_spec)  # every taxi feature is one value
    ctype = transform_layout.compression_type(layout.compression)
    for f in layout.files:
        records = tf.data.TFRecordDataset(f.path, compression_type=ctype)
        first = tf.train.Example.FromString(next(iter(records)).numpy())
        assert set(first.features.feature) == set(spec)
        for batch in records.batch(1000):
            parsed = tf.io.parse_example(batch, spec)
            assert all(v.shape[0] == batch.shape[0] for v in parsed.values())


@pytest.mark.parametrize("run", ["packed", "stock_format"])
def test_recorded_codebooks_are_each_float_features_distinct_values(run, request):
    """Over every split's files: a codebook exactly where a float feature takes at most
    256 values, holding them (what the service's codes are checked against)."""
    _, (graph_uri, _, _) = request.getfixturevalue(run)
    layout = transform_layout.read_layout(graph_uri)
    graph_spec = tft.TFTransformOutput(graph_uri).transformed_feature_spec()
    spec = layout.feature_spec(graph_spec)
    floats = sorted(k for k, s in graph_spec.items() if s.dtype == tf.float32)
    seen: dict[str, set] = {k: set() for k in floats}
    ctype = transform_layout.compression_type(layout.compression)
    for f in layout.files:
        for batch in tf.data.TFRecordDataset(f.path, compression_type=ctype).batch(1000):
            parsed = tf.io.parse_example(batch, spec)
            if layout.packing is not None:
                parsed = layout.packing.unpack(parsed[layout.packing.feature])
            for k in floats:
                seen[k].update(parsed[k].numpy().reshape(-1).tolist())
    expected = {k: tuple(sorted(v)) for k, v in seen.items() if len(v) <= codes.MAX_CODES}
    assert expected  # the small taxi sample: each float feature takes under 256 values
    assert dict(layout.codebooks) == expected


def _canonical(features: dict, label) -> list[tuple]:
    keys = sorted(features)
    columns = [np.asarray(features[k]).reshape(len(np.asarray(label)), -1) for k in keys]
    return [
        tuple(round(float(c[i][0]), 4) for c in columns) + (int(np.asarray(label)[i]),)
        for i in range(len(np.asarray(label)))
    ]


def test_packed_and_stock_format_outputs_hold_the_same_examples(packed, stock_format):
    config, (graph_uri, transformed, _) = packed
    _, (stock_graph, stock_transformed, _) = stock_format
    label = config.data.label.name
    inputs = training.TrainingInputs(
        train_files=(os.path.join(artifact_utils.get_split_uri([transformed], "train"), "*"),),
        eval_files=(os.path.join(artifact_utils.get_split_uri([transformed], "eval"), "*"),),
        transform_output=graph_uri,
        serving_model_dir="",
        model_run_dir="",
        train_steps=1,
        eval_steps=1,
    )
    train_ds, eval_ds = make_datasets(config, inputs, tft.TFTransformOutput(graph_uri))
    ours = [row for features, y in eval_ds for row in _canonical(features, y)]
    epoch = []
    for features, y in train_ds:
        epoch.extend(_canonical(features, y))
        if len(epoch) >= TRAIN_ROWS:
            break
    stock_tft = tft.TFTransformOutput(stock_graph)
    source = tfxio.TFExampleRecord(
        _split_files(stock_transformed, "eval"), schema=stock_tft.transformed_metadata.schema
    )
    stock = source.TensorFlowDataset(
        tfxio.TensorFlowDatasetOptions(batch_size=64, num_epochs=1, shuffle=False, label_key=label)
    )
    reference = [row for features, y in stock for row in _canonical(features, y)]
    assert len(ours) == EVAL_ROWS
    assert sorted(ours) == sorted(reference)
    assert len(epoch[:TRAIN_ROWS]) == TRAIN_ROWS and len(set(epoch[:TRAIN_ROWS])) > TRAIN_ROWS * 0.9


def test_make_datasets_shards_the_packed_output_across_workers(packed):
    config, (graph_uri, transformed, _) = packed
    # Global batches split evenly across 3 replicas.
    config = dataclasses.replace(
        config, ingestion=dataclasses.replace(config.ingestion, batch_size=96, eval_batch_size=96)
    )
    inputs = training.TrainingInputs(
        train_files=(os.path.join(artifact_utils.get_split_uri([transformed], "train"), "*"),),
        eval_files=(os.path.join(artifact_utils.get_split_uri([transformed], "eval"), "*"),),
        transform_output=graph_uri,
        serving_model_dir="",
        model_run_dir="",
        train_steps=1,
        eval_steps=1,
    )
    tft_output = tft.TFTransformOutput(graph_uri)
    seen = []
    for worker in range(3):
        context = tf.distribute.InputContext(3, worker, 3)
        _, eval_ds = make_datasets(config, inputs, tft_output, input_context=context)
        seen.extend(row for features, y in eval_ds for row in _canonical(features, y))
    _, everything = make_datasets(config, inputs, tft_output)
    assert sorted(seen) == sorted(
        row for features, y in everything for row in _canonical(features, y)
    )
    assert len(seen) == EVAL_ROWS


def test_make_datasets_names_a_missing_shard(packed):
    config, (graph_uri, transformed, _) = packed
    split_dir = artifact_utils.get_split_uri([transformed], "eval")
    inputs = training.TrainingInputs(
        train_files=(os.path.join(split_dir, "*"),),
        # As if shard 00001 had been lost: the pattern no longer finds it.
        eval_files=(os.path.join(split_dir, "transformed_examples-0000[02]-*"),),
        transform_output=graph_uri,
        serving_model_dir="",
        model_run_dir="",
        train_steps=1,
        eval_steps=1,
    )
    with pytest.raises(
        transform_layout.LayoutError,
        match=r"shard '.*Split-eval/transformed_examples-00001-of-00003\.tfrecord' \(80 records of split 'eval'\) is missing",
    ):
        make_datasets(config, inputs, tft.TFTransformOutput(graph_uri))


def test_analyzer_cache_still_written(packed):
    _, (_, _, cache_uri) = packed
    assert tf.io.gfile.listdir(cache_uri)


def test_stock_user_run_fn_trains_through_the_tfxkit_trainer(stock_format, tmp_path):
    config, (graph_uri, transformed, _) = stock_format
    transformed.split_names = artifact_utils.encode_split_names(["train", "eval"])
    graph = standard_artifacts.TransformGraph()
    graph.uri = graph_uri
    component = trainer_component.Trainer(
        config=config,
        examples=Channel(type=standard_artifacts.Examples),
        transform_graph=Channel(type=standard_artifacts.TransformGraph),
        module_file=USER_MODULE,
    )
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    model_run = standard_artifacts.ModelRun()
    model_run.uri = str(tmp_path / "model_run")
    properties = {k: v for k, v in component.exec_properties.items() if v is not None}
    component.executor_spec.executor_class(
        component.executor_spec.executor_class.Context(tmp_dir=str(tmp_path))
    ).Do(
        {specs.EXAMPLES_KEY: [transformed], specs.TRANSFORM_GRAPH_KEY: [graph]},
        {specs.MODEL_KEY: [model], specs.MODEL_RUN_KEY: [model_run]},
        properties,
    )
    saved = tf.saved_model.load(os.path.join(model.uri, "Format-Serving"))
    features = {
        k: tf.constant([[0.5], [-1.0]]) for k in ("fare_xf", "trip_miles_xf", "trip_seconds_xf")
    }
    assert saved.signatures["serving_default"](**features)
    assert len(list(saved.signatures["serving_default"](**features).values())[0].shape) == 2
