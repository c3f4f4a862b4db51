"""A small student for TFX's taxi native-Keras example (a Distiller `module_file`).

Written as a TFX user writes a module file: tf.keras only, on the features
the example's Transform writes (`<name>_xf`), logits out. One unit, as the
teacher's (a binary logit). Its serving signatures are the teacher's: the
Distiller exports it that way.
"""

import tensorflow as tf

DENSE_FEATURES = ["trip_miles", "fare", "trip_seconds"]


def student_fn(fn_args):
    del fn_args  # nothing to read: the student's shape is fixed
    inputs = {
        f"{name}_xf": tf.keras.layers.Input(shape=(1,), name=f"{name}_xf")
        for name in DENSE_FEATURES
    }
    hidden = tf.keras.layers.Dense(16, activation="relu")(
        tf.keras.layers.concatenate(list(inputs.values()))
    )
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(hidden))
