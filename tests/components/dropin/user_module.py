"""A stock-style TFX Trainer module (no tfxkit imports) for the drop-in tests.

`run_fn` reads through `fn_args.data_accessor.tf_dataset_factory` in a fixed
order, trains a linear model with SGD, records the strategy it ran under and
saves the model where TFX asks.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf
from tfx_bsl.public import tfxio

LABEL = "label"
BATCH = 8


def run_fn(fn_args) -> None:
    schema = tfxio.TensorFlowDatasetOptions  # noqa: F841  (stock modules import tfxio like this)
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx.utils import io_utils

    parsed = io_utils.parse_pbtxt_file(fn_args.schema_path, schema_pb2.Schema())
    dataset = fn_args.data_accessor.tf_dataset_factory(
        fn_args.train_files,
        tfxio.TensorFlowDatasetOptions(batch_size=BATCH, shuffle=False, label_key=LABEL),
        parsed,
    ).map(lambda features, label: (features["x"], tf.cast(label, tf.float32)))
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    model.fit(dataset, steps_per_epoch=fn_args.train_steps, epochs=1, verbose=0)
    model.save(fn_args.serving_model_dir, save_format="tf")
    strategy = tf.distribute.get_strategy()
    with open(os.path.join(fn_args.model_run_dir, "ran_under.json"), "w") as f:
        json.dump(
            {
                "strategy": type(strategy).__name__,
                "replicas": strategy.num_replicas_in_sync,
                "keras": type(model).__module__,
                "weights": [w.tolist() for w in model.get_weights()],
            },
            f,
        )
