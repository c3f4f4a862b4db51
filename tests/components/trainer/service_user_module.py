"""A stock TFX Trainer module reading `fn_args.data_accessor` for many steps, for the
tf.data service watch test: after `KILL_AFTER_STEPS` steps it kills the process group
named by `$KILL_PGID` (the service's only worker), as a lost node would."""

from __future__ import annotations

import os
import signal

import tensorflow as tf
import tensorflow_transform as tft
from tfx_bsl.public import tfxio

LABEL = "species"
KILL_AFTER_STEPS = 5


class _KillAfter(tf.keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == KILL_AFTER_STEPS:
            os.killpg(int(os.environ["KILL_PGID"]), signal.SIGKILL)


def run_fn(fn_args) -> None:
    tft_output = tft.TFTransformOutput(fn_args.transform_output)
    options = tfxio.TensorFlowDatasetOptions(batch_size=8, label_key=LABEL)
    ds = fn_args.data_accessor.tf_dataset_factory(
        fn_args.train_files, options, tft_output.transformed_metadata.schema
    )
    features = sorted(
        k
        for k, s in tft_output.transformed_feature_spec().items()
        if k != LABEL and s.dtype == tf.float32
    )
    ds = ds.map(lambda x, y: (tf.concat([x[k] for k in features], axis=-1), y))
    model = tf.keras.Sequential([tf.keras.layers.Dense(3)])
    model.compile(
        optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(
        ds, steps_per_epoch=fn_args.train_steps, epochs=1, callbacks=[_KillAfter()], verbose=0
    )
    tf.saved_model.save(model, fn_args.serving_model_dir)
