"""A stock TFX Trainer module, as users already have them (no tfxkit imports).

`run_fn` reads the transformed examples through TFX's
`fn_args.data_accessor.tf_dataset_factory` with the transform graph's schema,
trains a small Keras model on the taxi float features and saves it.
"""

from __future__ import annotations

import tensorflow_transform as tft
import tf_keras as keras
from tfx_bsl.public import tfxio

LABEL = "big_tipper"
FEATURES = ("fare_xf", "trip_miles_xf", "trip_seconds_xf")


def _dataset(fn_args, files, tft_output, batch_size=32):
    options = tfxio.TensorFlowDatasetOptions(batch_size=batch_size, label_key=LABEL)
    ds = fn_args.data_accessor.tf_dataset_factory(
        files, options, tft_output.transformed_metadata.schema
    )
    return ds.map(lambda features, label: ({k: features[k] for k in FEATURES}, label))


def run_fn(fn_args) -> None:
    tft_output = tft.TFTransformOutput(fn_args.transform_output)
    inputs = {k: keras.Input(shape=(1,), name=k) for k in FEATURES}
    x = keras.layers.Concatenate()(list(inputs.values()))
    x = keras.layers.Dense(8, activation="relu")(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(x))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(
        _dataset(fn_args, fn_args.train_files, tft_output),
        steps_per_epoch=fn_args.train_steps,
        epochs=1,
    )
    model.evaluate(_dataset(fn_args, fn_args.eval_files, tft_output), steps=fn_args.eval_steps)
    model.save(fn_args.serving_model_dir, save_format="tf")
