"""A small student for TFX's penguin Keras example (a Distiller `module_file`).

Written as a TFX user writes a module file: tf.keras only, on the features
the example's Transform writes (`<name>_xf`), one logit per species.
"""

import tensorflow as tf

FEATURES = ["culmen_length_mm", "culmen_depth_mm", "flipper_length_mm", "body_mass_g"]


def student_fn(fn_args):
    del fn_args  # nothing to read: the student's shape is fixed
    inputs = [tf.keras.layers.Input(shape=(1,), name=f"{name}_xf") for name in FEATURES]
    hidden = tf.keras.layers.Dense(4, activation="relu")(tf.keras.layers.concatenate(inputs))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(3)(hidden))
