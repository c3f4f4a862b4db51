"""A Keras 3 student (what `from tensorflow import keras` gives on TFX 1.21) trained by the
tf_keras Distiller.

The Distiller, its strategies, callbacks and export run on tf_keras. A user's
`student_fn` keeps whatever Keras its module imports: a Keras 3 model is wrapped,
not rebuilt. `as_tf_keras` gives a tf_keras functional model with the same named
inputs whose one layer (`Keras3Model`) calls the user's model and owns its
variables, so gradients, the optimizer, checkpoints and the SavedModel all reach
the Keras 3 weights themselves.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras


def is_keras3_model(obj: Any) -> bool:
    """Whether `obj` is a Keras 3 model (imported as `keras`, or as `tf.keras` under Keras 3)."""
    return any(
        klass.__name__ == "Model" and klass.__module__.split(".", 1)[0] == "keras"
        for klass in type(obj).__mro__
    )


def _tf_variables(variables) -> list[tf.Variable]:
    # A Keras 3 variable on the TensorFlow backend holds a tf.Variable (a
    # distributed one under a strategy's scope) as its value.
    found = [v.value for v in variables]
    wrong = [type(v).__name__ for v in found if not isinstance(v, tf.Variable)]
    if wrong:
        raise TypeError(
            f"a Keras 3 student's variables must be TensorFlow variables (Keras 3 on the "
            f"TensorFlow backend, KERAS_BACKEND=tensorflow); found {sorted(set(wrong))}"
        )
    return found


class Keras3Model(tf_keras.layers.Layer):
    """A tf_keras layer running a Keras 3 model and tracking its variables.

    The layer's trainable and non-trainable weights are the Keras 3 model's own
    `tf.Variable`s (batch-norm statistics and dropout seed state included), and
    its losses are the model's (its regularization penalties).
    """

    def __init__(self, model, **kwargs: Any):
        super().__init__(name=kwargs.pop("name", model.name), **kwargs)
        self.keras3_model = model
        self.input_structure = model.input
        # Assigned as attributes, tf.Variables become this layer's weights.
        self.keras3_trainable = _tf_variables(model.trainable_variables)
        self.keras3_non_trainable = _tf_variables(model.non_trainable_variables)
        if model.losses:
            self.add_loss(lambda: tf.add_n([tf.cast(x, tf.float32) for x in model.losses]))

    def call(self, inputs, training=None):
        structure = self.input_structure
        if isinstance(structure, dict):
            arguments = {k: inputs[k] for k in structure}
        elif isinstance(structure, (list, tuple)):
            arguments = [inputs[t.name] for t in structure]
        else:
            arguments = inputs[structure.name]
        return self.keras3_model(arguments, training=training)


def wraps_keras3(model: tf_keras.Model) -> bool:
    """Whether `model` is a view made by `as_tf_keras` (its student is a Keras 3 model)."""
    return any(isinstance(layer, Keras3Model) for layer in model.layers)


def named_inputs(structure) -> dict:
    """A Keras 3 functional model's inputs (`model.input`) by the name each is fed by:
    its dict's keys, else each input's own name."""
    if isinstance(structure, dict):
        return dict(structure)
    tensors = structure if isinstance(structure, (list, tuple)) else [structure]
    return {t.name: t for t in tensors}


def as_tf_keras(model) -> tf_keras.Model:
    """A tf_keras functional model over a built Keras 3 functional `model`.

    Same input names, specs and output; training it trains `model`'s variables.

    Raises:
      ValueError: when `model` has no symbolic inputs (a subclassed model not
        built functionally).
    """
    try:
        structure = model.input
    except (AttributeError, ValueError) as e:
        raise ValueError(
            f"a Keras 3 student must be a functional model (keras.Model(inputs, outputs)); "
            f"{type(model).__name__} has no inputs: {e}"
        ) from None
    inputs = {
        name: tf_keras.Input(
            shape=tuple(tensor.shape[1:]),
            dtype=tf.as_dtype(tensor.dtype),
            sparse=bool(getattr(tensor, "sparse", False)),
            ragged=bool(getattr(tensor, "ragged", False)),
            name=name,
        )
        for name, tensor in named_inputs(structure).items()
    }
    outputs = Keras3Model(model)(inputs)
    return tf_keras.Model(inputs, outputs, name=model.name)
