"""A small student for TFX's MNIST native-Keras example (a Distiller `module_file`).

Written as a TFX 1.21 user writes a module file: `from tensorflow import keras`,
on the image the example's Transform writes (`image_floats_xf`, 784 floats), one
logit per class.
"""

from tensorflow import keras


def student_fn(fn_args):
    del fn_args  # nothing to read: the student's shape is fixed
    image = keras.layers.Input(shape=(784,), name="image_floats_xf")
    hidden = keras.layers.Dense(16, activation="relu")(image)
    return keras.Model(image, keras.layers.Dense(10)(hidden))
