"""Which Keras user code gets: what stock TFX gives it, tf_keras only inside the Distiller.

Each case runs in a fresh interpreter, since the import order is the thing
under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TIMEOUT_S = 300
USER_MODULE = textwrap.dedent(
    """
    import tensorflow as tf

    def run_fn(fn_args):
        return tf.keras.Model.__module__
    """
)
# Loads a user module file the way TFX's Trainer does, and prints what it sees.
LOAD_USER_MODULE = textwrap.dedent(
    """
    from tfx.utils import import_utils
    run_fn = import_utils.import_func_from_source({path!r}, "run_fn")
    import tensorflow as tf
    print("USER", run_fn(None))
    print("TF", tf.keras.Model.__module__)
    """
)


def _run(tmp_path, code: str, **env_overrides) -> subprocess.CompletedProcess:
    module = tmp_path / "user_module.py"
    module.write_text(USER_MODULE)
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.update(env_overrides)
    script = textwrap.dedent(code) + LOAD_USER_MODULE.format(path=str(module))
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _seen(result) -> dict[str, str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


# The stock scripts' results by their statements: two of the cases below run the
# same stock script (one with a leading blank line), in one fresh interpreter.
_STOCK_SEEN: dict[str, dict[str, str]] = {}


def _stock_seen(tmp_path, script: str) -> dict[str, str]:
    key = script.strip()
    if key not in _STOCK_SEEN:
        _STOCK_SEEN[key] = _seen(_run(tmp_path, script))
    return _STOCK_SEEN[key]


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "imports",
    [
        # A pipeline script as TFX's examples start: tfx first, then the swap.
        "from tfx import v1 as tfx\n{product}",
        # The product imported first.
        "{product}\nfrom tfx import v1 as tfx\n",
        # TFT first, which asks for tf_keras before anything resolved tf.keras.
        "import tensorflow_transform\n{product}\nfrom tfx import v1 as tfx\n",
    ],
)
def test_importing_the_product_leaves_a_user_module_the_keras_stock_gives_it(tmp_path, imports):
    stock = _stock_seen(tmp_path, imports.format(product=""))
    swapped = _seen(
        _run(tmp_path, imports.format(product="from components import Trainer, Transform"))
    )
    assert swapped["USER"] == stock["USER"] and swapped["TF"] == stock["TF"]
    assert swapped["USER"].split(".")[0] in ("keras", "tf_keras")


@pytest.mark.multiprocess
def test_the_tfx_first_script_gives_keras_3_with_and_without_the_product(tmp_path):
    """What the swap keeps: TFX's examples hand their module Keras 3 here (keras_tuner needs it)."""
    seen = _seen(_run(tmp_path, "from tfx import v1 as tfx\nimport components\n"))
    assert seen["USER"].startswith("keras.")


# --------------------------------------------------------------------------- #
# AutoGraph: tf_keras's code called as it is, what user code is reached through converted
# --------------------------------------------------------------------------- #


def test_tf_keras_is_called_as_it_is_except_its_training_engine():
    import tf_keras as keras
    from tensorflow.python.autograph.core import config as autograph_config
    from tensorflow.python.autograph.impl import conversion

    from components.compat import legacy_keras

    legacy_keras.keep_libraries_unconverted()
    rules = [
        rule
        for rule in autograph_config.CONVERSION_RULES
        if rule.matches("tf_keras.src.engine.training") or rule.matches("tf_keras.src.layers")
    ]
    assert [type(r).__name__ for r in rules] == ["Convert", "DoNotConvert"]
    assert conversion.is_allowlisted(keras.layers.Dense.call)
    assert conversion.is_allowlisted(keras.losses.Loss.__call__)
    assert not conversion.is_allowlisted(keras.Model.make_train_function)

    def user_function(x):
        return x

    assert not conversion.is_allowlisted(user_function)


def test_tfx_libraries_a_serving_function_reaches_are_called_as_they_are():
    # TFX's examples call these inside their serving tf.function.
    import tensorflow_transform as tft
    from tensorflow.python.autograph.impl import conversion
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.tfxio import tensor_representation_util

    from components.compat import legacy_keras

    legacy_keras.keep_libraries_unconverted()
    assert conversion.is_allowlisted(tft.TFTransformOutput.raw_feature_spec)
    assert conversion.is_allowlisted(tft.TransformFeaturesLayer.call)
    assert conversion.is_allowlisted(
        tensor_representation_util.InferTensorRepresentationsFromSchema
    )
    assert conversion.is_allowlisted(schema_pb2.Schema)


def test_user_code_that_needs_autograph_still_trains_evaluates_and_saves(tmp_path):
    """A user's layer `call`, `train_step`, `test_step` and loss that branch
    in Python on tensors work inside Keras's tf.functions only when AutoGraph
    converts them: under the rules they still are."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from components.compat import legacy_keras

    legacy_keras.keep_libraries_unconverted()

    class SignFlip(keras.layers.Layer):
        def call(self, x):
            if tf.reduce_sum(x) > 0:
                return x
            return -x

    class Counting(keras.Model):
        def train_step(self, data):
            result = super().train_step(data)
            if tf.reduce_sum(data[0]) > 0:
                self.positive.assign_add(1)
            return result

        def test_step(self, data):
            result = super().test_step(data)
            if tf.reduce_sum(data[0]) < 0:
                self.negative.assign_add(1)
            return result

    def loss(y_true, y_pred):
        error = tf.reduce_mean(tf.square(y_true - y_pred))
        if error > 1e6:
            return tf.zeros_like(error)
        return error

    def counting(outputs, inputs):
        model = Counting(inputs, outputs)
        model.positive = tf.Variable(0, trainable=False)
        model.negative = tf.Variable(0, trainable=False)
        model.compile(optimizer="sgd", loss=loss)
        return model

    inputs = keras.Input([3])
    model = counting(keras.layers.Dense(2)(SignFlip()(inputs)), inputs)
    x = np.concatenate([np.ones([4, 3]), -np.ones([4, 3])]).astype("float32")
    y = np.zeros([8, 2], "float32")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    model.evaluate(x, y, batch_size=4, verbose=0)
    assert (int(model.positive.numpy()), int(model.negative.numpy())) == (1, 1)
    signs = keras.Model(inputs, model.layers[1].output)
    np.testing.assert_allclose(signs.predict(x, batch_size=4, verbose=0), np.abs(x))
    # tf_keras saves no layer that branches in Python on a tensor, with or
    # without the rules; the user's steps and loss are saved with a plain layer.
    plain = counting(keras.layers.Dense(2)(inputs), inputs)
    plain.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    plain.save(str(tmp_path / "model"), save_format="tf")
    loaded = keras.models.load_model(str(tmp_path / "model"), custom_objects={"loss": loss})
    np.testing.assert_allclose(loaded.predict(x, verbose=0), plain.predict(x, verbose=0))
