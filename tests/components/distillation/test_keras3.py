"""A Keras 3 student in the tf_keras Distiller: the view computes the user's model,
trains its own variables, carries its losses and state, checkpoints and saves them."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from components.distillation import keras3

FEATURES = {"a": np.float32([[0.5, -1.0, 2.0]] * 4), "b": np.float32([[1.0, 0.0]] * 4)}


def _dict_model(keys=("a", "b")) -> keras.Model:
    """Dict inputs named by `keys`."""
    keras.utils.set_random_seed(0)
    inputs = {
        keys[0]: keras.Input((3,), name=keys[0]),
        keys[1]: keras.Input((2,), name=keys[1]),
    }
    x = keras.layers.Concatenate()(list(inputs.values()))
    x = keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.l2(0.1))(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Dropout(0.5)(x)
    return keras.Model(inputs, keras.layers.Dense(3)(x), name="k3_student")


def _features(names=("a", "b")) -> dict[str, tf.Tensor]:
    return {n: tf.constant(v) for n, v in zip(names, FEATURES.values(), strict=True)}


def test_a_keras3_model_is_recognised_and_a_tf_keras_one_is_not():
    assert keras3.is_keras3_model(_dict_model())
    assert not keras3.is_keras3_model(tf_keras.Sequential([tf_keras.layers.Dense(1)]))
    assert not keras3.is_keras3_model(object())


@pytest.mark.parametrize("keys", [("a", "b"), ("x_xf", "y_xf")])
def test_the_view_reads_the_dict_keys_and_computes_the_users_model(keys):
    model = _dict_model(keys)
    view = keras3.as_tf_keras(model)
    features = _features(keys)
    assert isinstance(view, tf_keras.Model)
    assert view.input_names == list(keys) and view.output_shape == (None, 3)
    np.testing.assert_array_equal(view(features, training=False), model(features, training=False))


def test_a_list_input_model_is_fed_by_its_inputs_names():
    keras.utils.set_random_seed(0)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    model = keras.Model([a, b], keras.layers.Dense(2)(keras.layers.Concatenate()([a, b])))
    view = keras3.as_tf_keras(model)
    assert view.input_names == ["a", "b"]
    features = _features()
    np.testing.assert_array_equal(view(features), model([features["a"], features["b"]]))


def test_a_training_step_on_the_view_trains_the_keras3_weights_and_its_state():
    model = _dict_model()
    view = keras3.as_tf_keras(model)
    assert len(view.trainable_variables) == len(model.trainable_variables) == 6
    # The regularization penalty reaches the view's losses, as the Distiller reads them.
    assert len(view.losses) == 1
    np.testing.assert_allclose(float(view.losses[0]), float(tf.add_n(model.losses)), rtol=1e-6)
    kernel_before = model.trainable_variables[0].numpy().copy()
    mean_before = model.layers[-3].moving_mean.numpy().copy()
    optimizer = tf_keras.optimizers.SGD(0.5)
    features, labels = _features(), tf.constant([0, 1, 2, 0])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = view(features, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
            loss += tf.add_n(view.losses)
        grads = tape.gradient(loss, view.trainable_variables)
        assert all(g is not None for g in grads)
        optimizer.apply_gradients(zip(grads, view.trainable_variables, strict=True))

    step()
    assert not np.allclose(model.trainable_variables[0].numpy(), kernel_before)
    assert not np.allclose(model.layers[-3].moving_mean.numpy(), mean_before)
    # Training mode reached the user's dropout: two training calls differ, inference does not.
    assert not np.allclose(view(features, training=True), view(features, training=True))
    np.testing.assert_array_equal(view(features), view(features))


def test_a_checkpoint_and_a_savedmodel_of_the_view_hold_the_keras3_weights(tmp_path):
    model = _dict_model()
    view = keras3.as_tf_keras(model)
    features = _features()
    expected = view(features).numpy()
    path = tf.train.Checkpoint(model=view).save(str(tmp_path / "ckpt"))
    for variable in model.variables:
        variable.assign(tf.zeros(variable.shape, variable.dtype))
    assert not np.allclose(view(features), expected)
    tf.train.Checkpoint(model=view).restore(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(view(features), expected)

    @tf.function(input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec([None, 2])])
    def serve(a, b):
        return {"logits": view({"a": a, "b": b}, training=False)}

    view.save(str(tmp_path / "saved"), save_format="tf", signatures={"serving_default": serve})
    loaded = tf.saved_model.load(str(tmp_path / "saved")).signatures["serving_default"]
    np.testing.assert_allclose(loaded(**features)["logits"], expected, rtol=1e-6)


def test_a_subclassed_keras3_model_is_refused_naming_the_fix():
    class Subclassed(keras.Model):
        def call(self, inputs):
            return inputs["a"]

    with pytest.raises(
        ValueError, match=r"must be a functional model \(keras.Model\(inputs, outputs\)\)"
    ):
        keras3.as_tf_keras(Subclassed())
