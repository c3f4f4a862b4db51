"""Tiny real training inputs: Palmer penguins through real TFT.

`materialize` runs the config-generated `preprocessing_fn` with TFT's Beam implementation
and writes what the Transform component would (transform graph, transformed train and
eval examples); `inputs_for` turns that into one run's training inputs.
"""

from __future__ import annotations

import csv
import dataclasses
import os

from components.config import PipelineConfig, from_dict, to_dict

# Real data the repository ships (tests/data/README.md).
PENGUINS_CSV = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "tests",
    "data",
    "penguins_processed.csv",
)
FLOAT_FEATURES = ("culmen_length_mm", "culmen_depth_mm", "flipper_length_mm")
# A bucketized feature makes the model embed ids, so sparse (IndexedSlices)
# gradients go through accumulation and all-reduce too.
BUCKETIZED_FEATURE = "body_mass_g"
LABEL = "species"
EVAL_ROWS = 64


def penguins_config(**sections) -> PipelineConfig:
    """A small validated config over the penguins CSV; `sections` override whole sections' keys.

    Example: `penguins_config(strategy={"kind": "mirrored", "num_cpu_devices": 2})`.
    """
    data = {
        "name": "penguins",
        "data": {
            "path": PENGUINS_CSV,
            "label": {"name": LABEL, "num_classes": 3},
            "features": [{"name": n, "kind": "float"} for n in FLOAT_FEATURES]
            + [
                {
                    "name": BUCKETIZED_FEATURE,
                    "kind": "float",
                    "transform": "bucketize",
                    "num_buckets": 4,
                }
            ],
        },
        # Reproducible element order so that different strategies see the same
        # examples in each global batch.
        "ingestion": {
            "batch_size": 32,
            "eval_batch_size": 32,
            "shuffle_buffer": 0,
            "deterministic": True,
        },
        "strategy": {"kind": "one_device"},
        "train": {
            "train_steps": 6,
            "eval_steps": 2,
            "steps_per_epoch": 3,
            "checkpoint_every_steps": 3,
            "learning_rate": 0.01,
        },
        "teacher": {"hidden_units": [16, 8], "embedding_dim": 3},
        "evaluation": {"min_accuracy": 0.0},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return from_dict(data)


def with_sections(config: PipelineConfig, **sections) -> PipelineConfig:
    """`config` with some section keys replaced (validated again)."""
    data = to_dict(config)
    for section, values in sections.items():
        data[section] = {**data[section], **values}
    return from_dict(data)


def read_rows() -> list[dict[str, str]]:
    with open(PENGUINS_CSV) as f:
        return list(csv.DictReader(f))


def raw_examples(rows: list[dict[str, str]]) -> list[bytes]:
    """Serialized raw tf.Examples (label left out, as at serving time)."""
    import tensorflow as tf

    out = []
    for row in rows:
        feature = {
            k: tf.train.Feature(float_list=tf.train.FloatList(value=[float(row[k])]))
            for k in (*FLOAT_FEATURES, BUCKETIZED_FEATURE)
        }
        out.append(
            tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
        )
    return out


@dataclasses.dataclass(frozen=True)
class Materialized:
    transform_output: str
    train_files: tuple[str, ...]
    eval_files: tuple[str, ...]


def materialize(config: PipelineConfig, out_dir: str, train_shards: int = 1) -> Materialized:
    """Runs real TFT on the penguins rows and writes Transform-like output under `out_dir`."""
    import numpy as np
    import tensorflow as tf

    from testkit.transform import analyze_and_transform

    rows = read_rows()
    spec = {
        name: tf.io.FixedLenFeature([1], tf.float32)
        for name in (*FLOAT_FEATURES, BUCKETIZED_FEATURE)
    }
    spec[LABEL] = tf.io.FixedLenFeature([1], tf.int64)
    instances = [
        {k: [int(v)] if k == LABEL else [float(v)] for k, v in row.items()} for row in rows
    ]
    transformed, coder, transform_output = analyze_and_transform(instances, spec, config, out_dir)
    # The CSV is sorted by species; a fixed permutation mixes the classes.
    transformed = [transformed[i] for i in np.random.RandomState(0).permutation(len(transformed))]
    split = len(transformed) - EVAL_ROWS
    train_dir, eval_dir = os.path.join(out_dir, "train"), os.path.join(out_dir, "eval")
    os.makedirs(train_dir)
    os.makedirs(eval_dir)
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    train_files = []
    for shard in range(train_shards):
        path = os.path.join(train_dir, f"data-{shard:05d}-of-{train_shards:05d}.gz")
        with tf.io.TFRecordWriter(path, options) as writer:
            for instance in transformed[shard:split:train_shards]:
                writer.write(coder.encode(instance))
        train_files.append(path)
    eval_path = os.path.join(eval_dir, "data-00000-of-00001.gz")
    with tf.io.TFRecordWriter(eval_path, options) as writer:
        for instance in transformed[split:]:
            writer.write(coder.encode(instance))
    return Materialized(transform_output, tuple(train_files), (eval_path,))


def inputs_for(data: Materialized, root: str, name: str, config: PipelineConfig) -> dict:
    """JSON-ready `TrainingInputs` fields for one run named `name` under `root`."""
    return {
        "train_files": list(data.train_files),
        "eval_files": list(data.eval_files),
        "transform_output": data.transform_output,
        "serving_model_dir": os.path.join(root, name, "serving_model_dir"),
        "model_run_dir": os.path.join(root, name, "model_run"),
        "train_steps": config.train.train_steps,
        "eval_steps": config.train.eval_steps,
    }


def layer_weights(model) -> dict:
    """Trainable weight name -> value, comparable across strategies and reloads."""
    return {v.name: v.numpy() for v in model.trainable_weights}
